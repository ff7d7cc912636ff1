"""Trends in a running job's progress: a loss that jumped and stayed up, a job that slowed down.

Both compare the latest window of a job's own progress with the window before it, so they need
no knowledge of the model: a loss of 2.1 is neither good nor bad, a loss that went from 2.1 to
6.3 and stayed there is a divergence; 400 tokens a second is neither, a job that went from 4,000
to 400 on every rank slowed down. Transients (one bad batch, a checkpoint being written) do not
count: every sample of the window must show the change, or its median must.

One slow member among fast peers is a straggler (``recovery.detection.straggler``); the whole job
slower than it was is a slowdown, found here.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from recovery.detection.findings import DIVERGENCE, SLOWDOWN, Finding, FindingSource
from recovery.detection.hang import format_duration
from recovery.detection.taxonomy import NO_CATEGORY, Attribution, FailureCategory, Severity

LOSS_SPIKE = "loss-spike"
THROUGHPUT_COLLAPSE = "throughput-collapse"


@dataclass(frozen=True)
class TrendPolicy:
    """A loss spike is every loss of the window above ``loss_spike_factor`` times the median of
    the baseline before it; a slowdown is the job's throughput in the window below
    ``throughput_collapse_percent`` of its baseline. Each window needs ``min_samples``."""

    loss_spike_factor: float = 2.0
    throughput_collapse_percent: float = 50
    window_seconds: float = 600
    baseline_seconds: float = 1800
    min_samples: int = 3


@dataclass(frozen=True)
class TrendSample:
    """One progress line of the current attempt: when, which step, and what it reported."""

    at: datetime
    step: int
    loss: float | None = None
    throughput: float | None = None
    node: str | None = None
    rank: int | None = None


def _windows(
    samples: Sequence[TrendSample], now: datetime, policy: TrendPolicy
) -> tuple[list[TrendSample], list[TrendSample]]:
    """The baseline and the window, oldest first; future samples (clock skew) in neither."""
    window_start = now - timedelta(seconds=policy.window_seconds)
    baseline_start = window_start - timedelta(seconds=policy.baseline_seconds)
    ordered = sorted((s for s in samples if s.at <= now), key=lambda s: s.at)
    baseline = [s for s in ordered if baseline_start < s.at <= window_start]
    window = [s for s in ordered if s.at > window_start]
    return baseline, window


def _positive_finite(values: list[float | None]) -> list[float]:
    return [v for v in values if v is not None and math.isfinite(v) and v > 0]


def detect_loss_spike(
    samples: Sequence[TrendSample], *, now: datetime, policy: TrendPolicy | None = None
) -> Finding | None:
    """A loss that jumped and stayed up for the whole window: the run diverged.

    Losses are compared as printed (one series for the job: frameworks print the reduced loss).
    Only positive losses are judged (cross-entropy and its kin); a series with negative values
    (an ELBO, a reward) has no factor that means "worse".
    """
    policy = policy or TrendPolicy()
    baseline, window = _windows(samples, now, policy)
    if any(s.loss is not None and s.loss <= 0 for s in (*baseline, *window)):
        return None
    before = _positive_finite([s.loss for s in baseline])
    recent = [s for s in window if s.loss is not None and math.isfinite(s.loss)]
    if len(before) < policy.min_samples or len(recent) < policy.min_samples:
        return None
    reference = statistics.median(before)
    lowest = min(s.loss for s in recent if s.loss is not None)
    if lowest <= policy.loss_spike_factor * reference:
        return None
    # The divergence began at the first of the elevated samples that lead into the window.
    first = recent[0]
    threshold = policy.loss_spike_factor * reference
    for sample in reversed(baseline):
        if sample.loss is None or not math.isfinite(sample.loss) or sample.loss <= threshold:
            break
        first = sample
    ratio = lowest / reference
    evidence = (
        f"loss {lowest:.4g} or more since step {first.step} "
        f"({format_duration((now - first.at).total_seconds())}), "
        f"{ratio:.1f}x its median of {reference:.4g} before"
    )
    shown = [*baseline[-3:], *recent[-3:]]
    return Finding(
        kind=DIVERGENCE,
        category=FailureCategory.NAN_DIVERGENCE,
        attribution=Attribution.APPLICATION,
        severity=Severity.ERROR,
        signature=LOSS_SPIKE,
        evidence=evidence,
        source=FindingSource.PROGRESS,
        count=len(recent),
        at=first.at,
        detail={
            "since_step": first.step,
            "baseline_loss": reference,
            "lowest_loss": lowest,
            "ratio": round(ratio, 2),
            "factor": policy.loss_spike_factor,
            "excerpt": _excerpt(shown, "loss", evidence),
        },
    )


def detect_throughput_collapse(
    samples: Sequence[TrendSample], *, now: datetime, policy: TrendPolicy | None = None
) -> Finding | None:
    """The whole job slower than it was: the median member's throughput in the window below
    ``throughput_collapse_percent`` of its own baseline.

    Each member (node, else rank, else the job's one series) is compared with itself, so
    members reporting different units or shares do not mix. Fewer than half the members
    slowing is not a slowdown of the job (it may be stragglers).
    """
    policy = policy or TrendPolicy()
    baseline, window = _windows(samples, now, policy)
    ratios: dict[str, float] = {}
    firsts: dict[str, TrendSample] = {}
    members = {_member(s) for s in (*baseline, *window)}
    for member in members:
        before = _positive_finite([s.throughput for s in baseline if _member(s) == member])
        mine = [s for s in window if _member(s) == member and s.throughput is not None]
        recent = _positive_finite([s.throughput for s in mine])
        # A member that stopped reporting altogether is a hang's business, not a slowdown's.
        if len(before) < policy.min_samples or len(recent) < policy.min_samples:
            continue
        ratios[member] = statistics.median(recent) / statistics.median(before)
        firsts[member] = mine[0]
    if not ratios:
        return None
    threshold = policy.throughput_collapse_percent / 100
    slowed = sorted(m for m, ratio in ratios.items() if ratio < threshold)
    if len(slowed) * 2 <= len(ratios):
        return None
    ratio = statistics.median(ratios.values())
    first = min((firsts[m] for m in slowed), key=lambda s: s.at)
    evidence = (
        f"throughput at {ratio:.0%} of its median before, on {len(slowed)} of "
        f"{len(ratios)} members, for the last {format_duration(policy.window_seconds)}"
    )
    member = slowed[0]
    shown = [
        *[s for s in baseline if _member(s) == member][-3:],
        *[s for s in window if _member(s) == member][-3:],
    ]
    return Finding(
        kind=SLOWDOWN,
        category=NO_CATEGORY,
        attribution=Attribution.UNKNOWN,
        severity=Severity.WARNING,
        signature=THROUGHPUT_COLLAPSE,
        evidence=evidence,
        source=FindingSource.PROGRESS,
        count=len(slowed),
        at=first.at,
        detail={
            "since_step": first.step,
            "ratio": round(ratio, 3),
            "threshold_percent": policy.throughput_collapse_percent,
            "members_slowed": len(slowed),
            "members": len(ratios),
            "excerpt": _excerpt(shown, "throughput", evidence),
        },
    )


def _excerpt(samples: Sequence[TrendSample], field: str, evidence: str) -> str:
    """The samples either side of the change, as the Console shows evidence, then the verdict."""
    lines = []
    for sample in samples:
        value = getattr(sample, field)
        where = f" {_member(sample)}" if _member(sample) else ""
        shown = f"{value:.4g}" if value is not None else "-"
        lines.append(f"{sample.at:%Y-%m-%d %H:%M:%S}{where} step {sample.step}: {field} {shown}")
    return "\n".join([*lines, evidence])


def _member(sample: TrendSample) -> str:
    if sample.node:
        return sample.node
    return f"rank {sample.rank}" if sample.rank is not None else ""
