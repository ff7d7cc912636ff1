"""Other jobs' recent exclusions, as a decision's blast facts hold them: the index a worker
keeps of a cluster's read gives what walking the rows for each decision gave."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

import pytest

from recovery.loop import exclusions_read
from recovery.loop.decision_facts import (
    _counted_by_minute,
    minutes_before,
    over_blast_radius_from,
)
from recovery.loop.exclusions_read import (
    Exclusion,
    ExclusionsRead,
    _newest_walking,
    _signature_of,
)
from recovery.models import Policy


def random_rows(seed: int, count: int) -> list[Exclusion]:
    rng = random.Random(seed)
    start = datetime(2026, 12, 1, tzinfo=UTC)
    rows = [
        Exclusion(
            pk=pk,
            workload_id=rng.randrange(6),
            # Some restarts at the very same moment: one entry of the facts holds them all.
            at=start + timedelta(seconds=rng.randrange(count // 2 + 1)),
            nodes=rng.sample([f"node{n:03d}" for n in range(12)], rng.randrange(1, 4)),
            length=0,
        )
        for pk in range(1, count + 1)
    ]
    return sorted(rows, key=lambda row: (row.at, row.pk), reverse=True)


@pytest.mark.parametrize("seed", range(25))
def test_the_index_gives_what_walking_every_row_gives(seed: int) -> None:
    """
    GIVEN restarts of six workloads excluding nodes, some at the same moment
    WHEN any of the workloads (or one with no restart) decides
    THEN the facts are each node once at the newest time another workload excluded it, as
         walking the rows newest first gives them
    """
    rows = random_rows(seed, 40)
    read = ExclusionsRead(_signature_of(rows), rows)
    for workload_id in range(8):
        assert read.of_others(workload_id) == dict(_newest_walking(rows, workload_id))


def test_past_the_limit_only_the_newest_restarts_count(monkeypatch: pytest.MonkeyPatch) -> None:
    """
    GIVEN more restarts of other workloads than a decision keeps (3 here)
    WHEN a workload decides
    THEN only the nodes of the 3 newest count, its own restarts not among them
    """
    monkeypatch.setattr(exclusions_read, "MAX_RECENT_EXCLUSIONS", 3)
    at = datetime(2026, 12, 1, tzinfo=UTC)
    rows = [
        Exclusion(5, 1, at + timedelta(minutes=5), ["node005"], 0),
        Exclusion(4, 2, at + timedelta(minutes=4), ["node004"], 0),
        Exclusion(3, 2, at + timedelta(minutes=3), ["node003"], 0),
        Exclusion(2, 3, at + timedelta(minutes=2), ["node002"], 0),
        Exclusion(1, 3, at + timedelta(minutes=1), ["node001"], 0),
    ]
    read = ExclusionsRead(_signature_of(rows), rows)
    assert sorted(read.of_others(1)) == ["node002", "node003", "node004"]


@pytest.mark.parametrize("seed", range(25))
def test_a_read_extended_with_newer_restarts_gives_what_a_fresh_read_gives(seed: int) -> None:
    """
    GIVEN a kept read whose index was made, then newer restarts recorded in a few batches
    WHEN the read is extended with each batch, its index carried over
    THEN every workload's facts are those of a read made from all the rows at once
    """
    rows = random_rows(seed, 60)
    rng = random.Random(seed)
    cuts = sorted(rng.sample(range(1, len(rows)), 3))
    oldest = rows[cuts[-1] :]
    read = ExclusionsRead(_signature_of(oldest), oldest)
    read.of_others(0)  # the index made
    for start, end in reversed(list(zip([0, *cuts[:-1]], cuts, strict=True))):
        read = read.extended(rows[start:end])
        assert read._newest is not None
    fresh = ExclusionsRead(_signature_of(rows), rows)
    assert read.signature == fresh.signature
    for workload_id in range(8):
        assert read.of_others(workload_id) == fresh.of_others(workload_id)


@pytest.mark.parametrize("seed", range(40))
def test_counting_by_the_minute_decides_as_naming_every_node_did(seed: int) -> None:
    """
    GIVEN other workloads' newest exclusions of 30 nodes spread over a day (some a few
          seconds either side of a minute's edge, some at the decision's moment or after it),
          and a restart that would exclude a few nodes, some of them among those
    WHEN the blast radius is judged for windows of 1 minute to a day and several percentages
    THEN the facts of version 2 (counts by the minute, the named nodes' times) give what the
         facts of version 1 (every node named at its time) gave
    """
    rng = random.Random(seed)
    now = datetime(2026, 12, 1, 12, tzinfo=UTC)
    nodes = [f"node{n:03d}" for n in range(40)]

    def moment() -> datetime:
        minutes = rng.choice([0, 1, 2, 5, 59, 60, 61, 600, 1439, 1440])
        return now - timedelta(minutes=minutes, seconds=rng.choice([-1, 0, 0, 1, 30]))

    newest = {node: moment() for node in rng.sample(nodes, 30)}
    excluded = rng.sample(nodes, rng.randrange(0, 6))
    by_time: dict[datetime, list[str]] = {}
    for node, at in newest.items():
        by_time.setdefault(at, []).append(node)
    version_1 = {
        "cluster_size": len(nodes),
        "recent_exclusions": [[at.isoformat(), sorted(by_time[at])] for at in sorted(by_time)],
    }
    version_2 = {
        "cluster_size": len(nodes),
        "excluded_by_minute": [list(entry) for entry in _counted_by_minute(newest.values(), now)],
        "excluded_at": {node: newest[node].isoformat() for node in excluded if node in newest},
    }
    for window in (1, 2, 5, 60, 61, 600, 1440):
        for percent in (0, 10, 25, 50, 75, 100):
            policy = Policy(blast_radius_window_minutes=window, blast_radius_percent=percent)
            assert over_blast_radius_from(
                version_2, excluded, policy, now
            ) == over_blast_radius_from(version_1, excluded, policy, now), (window, percent)


def test_a_node_is_within_a_window_of_whole_minutes_exactly_when_its_minutes_are() -> None:
    """
    GIVEN exclusions just inside, on, and just outside the edge of a five-minute window, and
          one recorded after the decision's moment
    WHEN each is counted by the minute
    THEN the minutes rounded up are at most 5 exactly for those within the window
    """
    now = datetime(2026, 12, 1, 12, tzinfo=UTC)
    edge = now - timedelta(minutes=5)
    assert minutes_before(now, edge + timedelta(microseconds=1)) == 5
    assert minutes_before(now, edge) == 5
    assert minutes_before(now, edge - timedelta(microseconds=1)) == 6
    assert minutes_before(now, now + timedelta(seconds=3)) == 0
    assert minutes_before(now, now) == 0
