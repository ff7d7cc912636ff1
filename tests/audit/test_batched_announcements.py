"""Live announcements made inside a batch of work: together, soon, and only of what committed."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import transaction

from recovery.audit import live
from recovery.audit.record import record_event
from recovery.choices import AuditKind
from tests.factories import ClusterFactory

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def sends(monkeypatch: pytest.MonkeyPatch) -> list[list[Any]]:
    """Each round of sends the publisher makes (Redis itself is covered by the socket tests)."""
    rounds: list[list[Any]] = []
    monkeypatch.setattr(live, "publish_many", lambda messages: rounds.append(messages))
    return rounds


def event(cluster: Any) -> None:
    record_event(cluster=cluster, kind=AuditKind.STATE_CHANGED, actor="poller")


def test_events_committed_in_a_batch_go_out_together(sends: list[list[Any]]) -> None:
    cluster = ClusterFactory()
    with live.announcements_batched():
        for _ in range(3):
            with transaction.atomic():
                event(cluster)
        assert sends == []
    assert [len(round_) for round_ in sends] == [3]


def test_a_rolled_back_event_is_never_announced(sends: list[list[Any]]) -> None:
    cluster = ClusterFactory()
    with live.announcements_batched():
        with transaction.atomic():
            event(cluster)
        with pytest.raises(RuntimeError), transaction.atomic():
            event(cluster)
            raise RuntimeError
    assert [len(round_) for round_ in sends] == [1]


def test_a_long_batch_announces_at_the_first_commit_past_its_wait(
    sends: list[list[Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(live, "BATCH_SECONDS", 0.0)
    cluster = ClusterFactory()
    with live.announcements_batched():
        with transaction.atomic():
            event(cluster)
        assert [len(round_) for round_ in sends] == [1]  # not held until the block ends
        with transaction.atomic():
            event(cluster)
    assert sum(len(round_) for round_ in sends) == 2
