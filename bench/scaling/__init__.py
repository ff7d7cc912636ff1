"""The parts of ``make bench-scale``; its entry point and options are in ``bench/scale.py``.

``steps`` (a load step, its poll tasks and its figures), ``processes`` (the processes started and
their CPU), ``task_events`` (poll start and run times from Celery's task events), ``stack`` (the
measured stack, one step at a time), ``reference`` (the detector alone), ``phases`` (one poll
taken apart) and ``report`` (the tables, the verdict and the notes).

Nothing here imports Django at import time: ``bench/scale.py`` sets the bench's own database,
Redis and var directory first, and ``stack.Bench`` starts Django.
"""
