"""Straggler detection compares each member with its peers. Pure Python: no Django."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import pytest

from recovery.detection.straggler import (
    StragglerPolicy,
    ThroughputObservation,
    detect_stragglers,
)

NOW = datetime(2025, 3, 1, 13, 0, 0, tzinfo=UTC)
POLICY = StragglerPolicy()  # 20 %, 10 min window, 30 min baseline before it, 3 samples


def samples(
    value_at: Callable[[int], float],
    *,
    node: str | None = None,
    rank: int | None = None,
    minutes: int = 40,
) -> list[ThroughputObservation]:
    """One sample a minute over the last ``minutes``; ``value_at(minutes_ago)`` gives each."""
    return [
        ThroughputObservation(
            at=NOW - timedelta(minutes=ago), value=value_at(ago), node=node, rank=rank
        )
        for ago in range(minutes - 1, -1, -1)
    ]


def constant(value: float) -> Callable[[int], float]:
    return lambda ago: value


def drops_to(
    value: float, *, before: float = 100.0, minutes_ago: int = 9
) -> Callable[[int], float]:
    return lambda ago: value if ago <= minutes_ago else before


def healthy_nodes(count: int = 7, value: float = 100.0) -> list[ThroughputObservation]:
    observations = []
    for index in range(count):
        observations += samples(constant(value + index % 3), node=f"gpu-{index + 1:03d}")
    return observations


def test_it_flags_one_slow_node_by_name() -> None:
    observations = healthy_nodes() + samples(drops_to(61.0), node="gpu-007x")

    findings = detect_stragglers(observations, now=NOW, policy=POLICY)

    assert len(findings) == 1
    finding = findings[0]
    assert (finding.kind, finding.category, finding.attribution) == ("straggler", "", "unknown")
    assert finding.signature == "throughput-below-peers"
    assert finding.nodes == ["gpu-007x"]
    assert finding.ranks == []
    assert finding.evidence.startswith(
        "gpu-007x at 60% of its peers' median throughput over the last 10 min"
    )
    assert finding.detail["ratio"] == pytest.approx(61 / 101)
    assert finding.detail["member_median"] == pytest.approx(61)
    assert finding.detail["peer_median"] == pytest.approx(101)
    assert finding.detail["window"] == 600
    assert finding.detail["own_baseline"] == pytest.approx(100)


def test_it_does_not_flag_a_job_that_slowed_down_uniformly() -> None:
    observations = []
    for index in range(8):
        observations += samples(drops_to(55.0 + index), node=f"gpu-{index:03d}")

    assert detect_stragglers(observations, now=NOW, policy=POLICY) == []


def test_it_does_not_flag_a_single_slow_sample() -> None:
    spike = lambda ago: 10.0 if ago == 4 else 100.0  # noqa: E731
    observations = healthy_nodes() + samples(spike, node="gpu-blip")

    assert detect_stragglers(observations, now=NOW, policy=POLICY) == []


def test_it_does_not_flag_a_slowdown_that_has_not_lasted_most_of_the_window() -> None:
    observations = healthy_nodes() + samples(drops_to(40.0, minutes_ago=3), node="gpu-late")

    assert detect_stragglers(observations, now=NOW, policy=POLICY) == []


def test_it_needs_more_than_half_of_the_window_below_the_line() -> None:
    # Ten window samples: five slow ones put the median below the line, but that is not "most".
    half = healthy_nodes() + samples(drops_to(40.0, minutes_ago=4), node="gpu-half")
    most = healthy_nodes() + samples(drops_to(40.0, minutes_ago=5), node="gpu-most")

    assert detect_stragglers(half, now=NOW, policy=POLICY) == []
    findings = detect_stragglers(most, now=NOW, policy=POLICY)
    assert [(finding.nodes, finding.count) for finding in findings] == [(["gpu-most"], 6)]


def test_it_does_not_judge_a_member_with_too_few_samples() -> None:
    sparse = [
        ThroughputObservation(at=NOW - timedelta(minutes=2), value=10.0, node="gpu-sparse"),
        ThroughputObservation(at=NOW - timedelta(minutes=1), value=10.0, node="gpu-sparse"),
    ]

    assert detect_stragglers(healthy_nodes() + sparse, now=NOW, policy=POLICY) == []


def test_a_member_with_too_few_samples_is_nobodys_yardstick() -> None:
    # Two steady members at 100; a member seen twice at 1000 would make both look slow.
    observations = samples(constant(100.0), node="a") + samples(constant(100.0), node="b")
    observations += [
        ThroughputObservation(at=NOW - timedelta(minutes=ago), value=1000.0, node="sparse")
        for ago in (1, 2)
    ]

    assert detect_stragglers(observations, now=NOW, policy=POLICY) == []
    # The contrast: once two samples are enough, it does count, and both look slow beside it.
    lenient = StragglerPolicy(min_samples=2)
    flagged = detect_stragglers(observations, now=NOW, policy=lenient)
    assert sorted(finding.nodes[0] for finding in flagged) == ["a", "b"]


def test_it_does_not_flag_a_node_that_was_always_a_bit_slower_by_design() -> None:
    observations = healthy_nodes() + samples(constant(72.0), node="gpu-old")

    assert detect_stragglers(observations, now=NOW, policy=POLICY) == []


def test_a_steady_slower_node_stays_unflagged_when_the_whole_job_slows_down() -> None:
    observations = []
    for index in range(7):
        observations += samples(drops_to(60.0, before=100.0), node=f"gpu-{index:03d}")
    observations += samples(drops_to(43.0, before=72.0), node="gpu-old")

    assert detect_stragglers(observations, now=NOW, policy=POLICY) == []


def test_it_flags_a_slower_by_design_node_that_degrades_further() -> None:
    observations = healthy_nodes() + samples(drops_to(40.0, before=72.0), node="gpu-old")

    findings = detect_stragglers(observations, now=NOW, policy=POLICY)

    assert [finding.nodes for finding in findings] == [["gpu-old"]]
    assert findings[0].detail["baseline_ratio"] == pytest.approx(72 / 101)


def test_without_history_the_peer_comparison_decides() -> None:
    observations = []
    for index in range(5):
        observations += samples(constant(100.0), node=f"gpu-{index:03d}", minutes=8)
    observations += samples(constant(50.0), node="gpu-new", minutes=8)

    findings = detect_stragglers(observations, now=NOW, policy=POLICY)

    assert [finding.nodes for finding in findings] == [["gpu-new"]]
    assert findings[0].detail["own_baseline"] is None


def test_it_compares_ranks_when_samples_name_no_node() -> None:
    observations = []
    for rank in range(8):
        value_at = drops_to(50.0) if rank == 5 else constant(200.0)
        observations += samples(value_at, rank=rank)

    findings = detect_stragglers(observations, now=NOW, policy=POLICY)

    assert len(findings) == 1
    assert findings[0].ranks == [5]
    assert findings[0].nodes == []
    assert findings[0].evidence.startswith("rank 5 at 25% of its peers' median throughput")


def test_it_pools_a_nodes_ranks_and_lists_them() -> None:
    observations = []
    for node in ("gpu-001", "gpu-002", "gpu-003"):
        for rank in range(2):
            global_rank = int(node[-1]) * 2 + rank
            value_at = drops_to(30.0) if node == "gpu-002" else constant(100.0)
            observations += samples(value_at, node=node, rank=global_rank)

    findings = detect_stragglers(observations, now=NOW, policy=POLICY)

    assert len(findings) == 1
    assert findings[0].nodes == ["gpu-002"]
    assert findings[0].ranks == [4, 5]


def test_it_reads_gpu_utilisation_the_same_way() -> None:
    observations = healthy_nodes(value=95.0) + samples(drops_to(40.0, before=96.0), node="gpu-009")

    findings = detect_stragglers(
        observations, now=NOW, policy=POLICY, metric="gpu_utilisation", source="metrics"
    )

    assert len(findings) == 1
    assert findings[0].signature == "gpu_utilisation-below-peers"
    assert findings[0].source == "metrics"
    assert "median gpu utilisation" in findings[0].evidence


def test_it_forgets_a_slowdown_that_ended_before_the_window() -> None:
    recovered = lambda ago: 30.0 if 15 <= ago <= 25 else 100.0  # noqa: E731
    observations = healthy_nodes() + samples(recovered, node="gpu-recovered")

    assert detect_stragglers(observations, now=NOW, policy=POLICY) == []


def test_it_needs_peers_to_compare_with() -> None:
    assert detect_stragglers(samples(constant(10.0), node="alone"), now=NOW, policy=POLICY) == []


def test_it_ignores_samples_that_name_no_member_or_lie_in_the_future() -> None:
    anonymous = [
        ThroughputObservation(at=NOW - timedelta(seconds=30 * index), value=1.0)
        for index in range(12)
    ]
    future = [
        ThroughputObservation(at=NOW + timedelta(seconds=30 * index), value=1.0, node="gpu-001")
        for index in range(1, 25)
    ]
    observations = [*healthy_nodes(), *anonymous, *future]

    assert detect_stragglers(observations, now=NOW, policy=POLICY) == []


def test_it_honours_the_policy_threshold() -> None:
    observations = healthy_nodes() + samples(drops_to(85.0), node="gpu-mild")

    assert detect_stragglers(observations, now=NOW, policy=POLICY) == []
    strict = StragglerPolicy(threshold_percent=10)
    assert [f.nodes for f in detect_stragglers(observations, now=NOW, policy=strict)] == [
        ["gpu-mild"]
    ]


def test_it_refuses_a_naive_now() -> None:
    with pytest.raises(ValueError, match="timezone-aware"):
        detect_stragglers([], now=datetime(2025, 3, 1, 13, 0), policy=POLICY)
