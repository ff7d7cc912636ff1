"""A transaction MySQL picks as a deadlock victim is run again, once it is safe to."""

from __future__ import annotations

import pytest
from django.db import OperationalError, transaction

from recovery.loop.lock_conflicts import LOCK_CONFLICT_TRIES, retrying_lock_conflicts


def flaky(failures: list[OperationalError]):  # type: ignore[no-untyped-def]
    calls: list[int] = []

    @retrying_lock_conflicts
    def work() -> int:
        calls.append(1)
        if failures:
            raise failures.pop(0)
        return len(calls)

    return work


@pytest.mark.django_db(transaction=True)
def test_a_deadlock_victim_is_run_again() -> None:
    work = flaky([OperationalError(1213, "Deadlock found"), OperationalError(1205, "Lock wait")])
    assert work() == 3


@pytest.mark.django_db(transaction=True)
def test_it_gives_up_after_its_tries() -> None:
    work = flaky([OperationalError(1213, "Deadlock found")] * LOCK_CONFLICT_TRIES)
    with pytest.raises(OperationalError):
        work()


@pytest.mark.django_db(transaction=True)
def test_other_database_errors_and_callers_transactions_are_not_retried() -> None:
    with pytest.raises(OperationalError):
        flaky([OperationalError(2006, "MySQL server has gone away")])()
    work = flaky([OperationalError(1213, "Deadlock found")])
    with pytest.raises(OperationalError), transaction.atomic():
        work()  # the caller's whole transaction was rolled back: only the caller can rerun it
