"""A loss that jumped and stayed up is a divergence; a whole job slower than it was, a slowdown."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

import pytest

from recovery.detection.trends import (
    TrendPolicy,
    TrendSample,
    detect_loss_spike,
    detect_throughput_collapse,
)

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
POLICY = TrendPolicy(window_seconds=600, baseline_seconds=1800, min_samples=3)


def series(losses: Sequence[float | None], every: float = 60.0) -> list[TrendSample]:
    """One sample a minute, the last one now."""
    count = len(losses)
    return [
        TrendSample(at=NOW - timedelta(seconds=every * (count - 1 - i)), step=100 + i, loss=loss)
        for i, loss in enumerate(losses)
    ]


def test_a_loss_that_jumped_and_stayed_up_is_a_divergence() -> None:
    samples = series(
        [2.1, 2.0, 2.05, 1.98] * 5 + [6.3, 6.1, 6.4, 6.2, 6.0, 6.5, 6.3, 6.2, 6.1, 6.4]
    )
    finding = detect_loss_spike(samples, now=NOW, policy=POLICY)
    assert finding is not None
    assert (finding.kind, finding.category, finding.signature) == (
        "divergence",
        "nan_divergence",
        "loss-spike",
    )
    assert finding.detail["since_step"] == samples[-10].step
    assert finding.detail["ratio"] > 2.9
    assert "since step" in finding.evidence


def test_a_spike_that_came_back_down_is_not() -> None:
    samples = series([2.1, 2.0, 2.05, 1.98] * 5 + [6.3, 6.1, 2.2, 2.1, 2.0, 2.1, 2.0, 1.9, 2.0])
    assert detect_loss_spike(samples, now=NOW, policy=POLICY) is None


def test_a_falling_loss_is_not() -> None:
    samples = series([10.0 - 0.25 * i for i in range(30)])
    assert detect_loss_spike(samples, now=NOW, policy=POLICY) is None


@pytest.mark.parametrize(
    "losses",
    [
        [2.0] * 30,  # flat
        [2.0] * 25 + [5.0, 5.0],  # too few window samples
        [-1.0, -2.0] * 10 + [5.0] * 10,  # a series that is not a positive loss
        [None] * 20 + [5.0] * 10,  # no baseline
    ],
)
def test_too_little_or_no_change_is_not(losses: list[float | None]) -> None:
    assert detect_loss_spike(series(losses), now=NOW, policy=POLICY) is None


def test_the_factor_is_a_setting() -> None:
    samples = series([2.0] * 20 + [3.5] * 10)
    assert detect_loss_spike(samples, now=NOW, policy=POLICY) is None
    assert detect_loss_spike(samples, now=NOW, policy=TrendPolicy(loss_spike_factor=1.5))


def throughput(per_member: dict[str, list[float]], every: float = 60.0) -> list[TrendSample]:
    samples = []
    for member, values in per_member.items():
        count = len(values)
        for i, value in enumerate(values):
            at = NOW - timedelta(seconds=every * (count - 1 - i))
            samples.append(TrendSample(at=at, step=i, throughput=value, node=member))
    return samples


def test_a_whole_job_slower_than_it_was_is_a_slowdown() -> None:
    samples = throughput({f"gpu-{n}": [4000.0] * 20 + [900.0] * 10 for n in range(4)})
    finding = detect_throughput_collapse(samples, now=NOW, policy=POLICY)
    assert finding is not None
    assert (finding.kind, finding.signature) == ("slowdown", "throughput-collapse")
    assert finding.detail["members_slowed"] == 4
    assert finding.detail["ratio"] == pytest.approx(0.225)


def test_one_slow_member_is_a_straggler_not_a_slowdown() -> None:
    members = {f"gpu-{n}": [4000.0] * 30 for n in range(3)}
    members["gpu-3"] = [4000.0] * 20 + [900.0] * 10
    assert detect_throughput_collapse(throughput(members), now=NOW, policy=POLICY) is None


def test_a_checkpoint_pause_inside_the_window_is_not_a_slowdown() -> None:
    values = [4000.0] * 20 + [
        4000.0,
        300.0,
        250.0,
        4000.0,
        3900.0,
        4100.0,
        4000.0,
        4000.0,
        3950.0,
        4000.0,
    ]
    assert detect_throughput_collapse(throughput({"gpu-0": values}), now=NOW, policy=POLICY) is None


def test_a_member_that_stopped_reporting_is_left_to_the_hang_check() -> None:
    samples = throughput({"gpu-0": [4000.0] * 20})  # nothing in the window
    assert detect_throughput_collapse(samples, now=NOW, policy=POLICY) is None


def test_the_evidence_shows_the_samples_either_side_of_the_change() -> None:
    samples = series([2.0] * 20 + [6.0] * 10)
    finding = detect_loss_spike(samples, now=NOW, policy=POLICY)
    assert finding is not None
    excerpt = finding.detail["excerpt"].splitlines()
    assert excerpt[-1] == finding.evidence
    assert excerpt[0].endswith("loss 2") and excerpt[-2].endswith("loss 6")
