"""Running a transaction again when MySQL chose it as a deadlock victim.

The status changes of recommendations (``recovery.loop.recommendations``) and the lease
holder's writes (``recovery.loop.leases``) both take this retry; it knows nothing of either.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import ParamSpec, TypeVar

from django.db import OperationalError, transaction

# MySQL's lock wait timeout and deadlock: the server rolled the transaction back, and running it
# again is the documented answer. The poller writing the same workload's rows causes them.
LOCK_CONFLICT_CODES = frozenset({1205, 1213})
LOCK_CONFLICT_TRIES = 4

P = ParamSpec("P")
R = TypeVar("R")


def retrying_lock_conflicts(function: Callable[P, R]) -> Callable[P, R]:
    """Run ``function`` (one transaction) again when the database chose it as a deadlock victim.

    Only at the outermost level: inside a caller's transaction the whole of it was rolled back,
    and only the caller can run it again.
    """

    @functools.wraps(function)
    def retrying(*args: P.args, **kwargs: P.kwargs) -> R:
        for attempt in range(LOCK_CONFLICT_TRIES):
            try:
                return function(*args, **kwargs)
            except OperationalError as exc:
                code = exc.args[0] if exc.args else None
                last = attempt == LOCK_CONFLICT_TRIES - 1
                if last or code not in LOCK_CONFLICT_CODES or transaction.get_autocommit() is False:
                    raise
                time.sleep(0.02 * 2**attempt)
        raise AssertionError("unreachable")

    return retrying
