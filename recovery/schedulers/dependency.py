"""A Slurm job's dependency, as squeue and scontrol print it while the job is pending.

``sbatch --dependency=afterany:123`` (or ``afternotok``) makes a job the next of a chain: it
runs once job 123 ended (or failed). The jobs of such a chain share a workflow
(``recovery.loop.workflows``). Slurm prints the dependencies still waited for, each with its
state: ``afterany:123(unfulfilled)``, several joined by ``,`` (all of them) or ``?`` (any of
them), and forgets a dependency once it is satisfied, so it is recorded while it shows.

Django-free, like the rest of this package. A value in a shape this reader does not know is
unknown (None), never "no dependency".
"""

from __future__ import annotations

import re

# The dependency types that chain a job after another's end, whatever it was (afterany) or
# after its failure (afternotok): the next job of a workflow.
CHAINING = frozenset({"afterany", "afternotok"})
# Every type sbatch knows (its man page); another word means a shape this reader does not know.
KNOWN_TYPES = CHAINING | {"after", "afterok", "aftercorr", "afterburstbuffer", "singleton"}
# Longer than any dependency a person writes: not parsed at all.
MAX_DEPENDENCY_LENGTH = 4096
# NO_VAL-like words Slurm prints for "none".
_NONE = frozenset({"", "(null)", "None", "N/A"})
_ELEMENT = re.compile(r"(?P<type>[a-z]+)(?::(?P<targets>[^()]*))?(?:\((?P<state>[a-z_]+)\))?")
# A job id (123) or an array task (123_4); "123_*" (every task) names no one job.
_TARGET = re.compile(r"(?P<job>[1-9][0-9]{0,18}(?:_(?:[0-9]{1,9}|\*))?)(?:\+[0-9]+)?")


def chained_after(text: object) -> tuple[str, ...] | None:
    """The job ids the job waits for with ``afterany`` or ``afternotok``, in order.

    ``()`` when it waits for none (other types, such as ``afterok`` or ``singleton``, do not
    chain a workflow); None when ``text`` is not a dependency this reader can read.
    """
    if not isinstance(text, str) or len(text) > MAX_DEPENDENCY_LENGTH:
        return None
    text = text.strip()
    if text in _NONE:
        return ()
    found: list[str] = []
    for element in re.split(r"[,?]", text):
        match = _ELEMENT.fullmatch(element.strip())
        if match is None or match["type"] not in KNOWN_TYPES:
            return None
        targets = match["targets"]
        if match["type"] == "singleton":
            if targets is not None:
                return None
            continue
        if not targets:
            return None
        for target in targets.split(":"):
            named = _TARGET.fullmatch(target)
            if named is None:
                return None
            job_id = named["job"]
            if match["type"] in CHAINING and not job_id.endswith("*") and job_id not in found:
                found.append(job_id)
    return tuple(found)
