"""Straggler detection: one node or rank sustainedly slower than its peers.

In synchronous data-parallel training the slowest member sets everybody's pace, so one slow
node costs the whole job. Throughput (samples, tokens or iterations a second) or GPU utilisation
per member is compared with the other members over the same window.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from recovery.detection.findings import STRAGGLER, Finding
from recovery.detection.hang import format_duration
from recovery.detection.taxonomy import NO_CATEGORY, Attribution, Severity


@dataclass(frozen=True)
class StragglerPolicy:
    """A member is a straggler when ``threshold_percent`` below its peers over ``window_seconds``.

    ``baseline_seconds`` is how far before the window its own history is read;
    ``min_samples`` is the fewest window samples a member needs to be judged (or to serve as a
    peer).
    """

    threshold_percent: float = 20
    window_seconds: float = 600
    baseline_seconds: float = 1800
    min_samples: int = 3


@dataclass(frozen=True)
class ThroughputObservation:
    """One throughput (or GPU utilisation) sample from a node and/or rank."""

    at: datetime
    value: float
    node: str | None = None
    rank: int | None = None


@dataclass(frozen=True)
class _MemberSamples:
    name: str
    node: str | None
    ranks: tuple[int, ...]
    window: tuple[float, ...]
    baseline: tuple[float, ...]


def _member_key(observation: ThroughputObservation) -> str | None:
    if observation.node is not None:
        return observation.node
    if observation.rank is not None:
        return f"rank {observation.rank}"
    return None


def _group(
    observations: Sequence[ThroughputObservation], *, now: datetime, policy: StragglerPolicy
) -> list[_MemberSamples]:
    window_start = now - timedelta(seconds=policy.window_seconds)
    baseline_start = window_start - timedelta(seconds=policy.baseline_seconds)
    grouped: dict[str, dict[str, list[Any]]] = {}
    for observation in observations:
        key = _member_key(observation)
        # Samples that name no member cannot be compared with peers, and future samples (clock
        # skew) belong to no window yet.
        if key is None or observation.at > now:
            continue
        entry = grouped.setdefault(key, {"window": [], "baseline": [], "ranks": [], "node": []})
        if observation.rank is not None:
            entry["ranks"].append(observation.rank)
        entry["node"].append(observation.node)
        # The window is (now - window, now]: a sample exactly on its edge belongs to the past.
        if observation.at > window_start:
            entry["window"].append(observation.value)
        elif observation.at > baseline_start:
            entry["baseline"].append(observation.value)
    return [
        _MemberSamples(
            name=name,
            node=entry["node"][0],
            ranks=tuple(sorted(set(entry["ranks"]))),
            window=tuple(entry["window"]),
            baseline=tuple(entry["baseline"]),
        )
        for name, entry in sorted(grouped.items())
    ]


def detect_stragglers(
    observations: Sequence[ThroughputObservation],
    *,
    now: datetime,
    policy: StragglerPolicy,
    metric: str = "throughput",
    source: str = "progress",
) -> list[Finding]:
    """Members sustainedly below their peers, one finding each.

    Members are nodes, or ranks when a sample names no node. A member is a straggler when all
    of these hold:

    1. it has at least ``min_samples`` samples in the window (a member seen too rarely is not
       judged, and is not used as anyone's yardstick either);
    2. its window median is below ``(1 - threshold)`` * the peer median, where the peer median
       is the median of the other qualifying members' window medians — so a job where everybody
       slowed down together has no straggler;
    3. most of its window samples (more than half) are below that line — one slow sample, or a
       slowdown that began a moment ago, is not sustained;
    4. when its own history before the window exists (``min_samples`` there too), its standing
       against its peers has dropped by the threshold: its ratio to the peers now is below
       ``(1 - threshold)`` * its ratio to the peers in the baseline period. A member that was
       always a little slower by design (older GPUs, a busier network link) but steady keeps
       its ratio and is not flagged, even when the whole job slows down. (Comparing with its
       own absolute baseline instead would flag such a member whenever the job as a whole
       slowed down.) When the peers have no baseline, its own absolute baseline is used, and
       with no history at all the peer comparison decides alone. The price of this rule: a
       member slow from its very first sample is flagged only until its own history covers the
       baseline period; after that it looks "slow by design". Its first finding is the one the
       policy acts on.

    ``metric`` names what the values are ("throughput", "gpu_utilisation", ...) in the
    signature and evidence; ``source`` is the finding's signal family.
    """
    if now.tzinfo is None or now.utcoffset() is None:
        raise ValueError("now must be a timezone-aware datetime.")
    members = _group(observations, now=now, policy=policy)
    qualifying = [member for member in members if len(member.window) >= policy.min_samples]
    if len(qualifying) < 2:
        return []
    window_medians = {member.name: statistics.median(member.window) for member in qualifying}
    baseline_medians = {
        member.name: statistics.median(member.baseline)
        for member in members
        if len(member.baseline) >= policy.min_samples
    }
    factor = 1.0 - policy.threshold_percent / 100.0
    label = metric.replace("_", " ")
    findings = []
    for member in qualifying:
        peers = [window_medians[other.name] for other in qualifying if other is not member]
        peer_median = statistics.median(peers)
        if peer_median <= 0:
            continue
        member_median = window_medians[member.name]
        line = factor * peer_median
        if member_median >= line:
            continue
        below = sum(1 for value in member.window if value < line)
        if below * 2 <= len(member.window):
            continue
        ratio = member_median / peer_median
        baseline_ratio = _baseline_ratio(member, qualifying, baseline_medians)
        own_baseline = baseline_medians.get(member.name)
        if baseline_ratio is not None:
            if ratio >= factor * baseline_ratio:
                continue
        elif own_baseline is not None and member_median >= factor * own_baseline:
            continue
        window_text = format_duration(policy.window_seconds)
        findings.append(
            Finding(
                kind=STRAGGLER,
                category=NO_CATEGORY,
                attribution=Attribution.UNKNOWN,
                severity=Severity.WARNING,
                signature=f"{metric}-below-peers",
                evidence=(
                    f"{member.name} at {ratio:.0%} of its peers' median {label} over the last "
                    f"{window_text} ({member_median:g} vs {peer_median:g})"
                ),
                source=source,
                count=below,
                nodes=[member.node] if member.node is not None else [],
                ranks=list(member.ranks),
                at=now,
                detail={
                    "metric": metric,
                    "ratio": ratio,
                    "member_median": member_median,
                    "peer_median": peer_median,
                    "peers": len(peers),
                    "window": policy.window_seconds,
                    "window_samples": len(member.window),
                    "samples_below": below,
                    "own_baseline": own_baseline,
                    "baseline_ratio": baseline_ratio,
                },
            )
        )
    return findings


def _baseline_ratio(
    member: _MemberSamples,
    qualifying: list[_MemberSamples],
    baseline_medians: dict[str, float],
) -> float | None:
    """The member's ratio to its peers before the window, when both had a baseline."""
    own = baseline_medians.get(member.name)
    peers = [
        baseline_medians[other.name]
        for other in qualifying
        if other is not member and other.name in baseline_medians
    ]
    if own is None or not peers:
        return None
    peer_median = statistics.median(peers)
    return own / peer_median if peer_median > 0 else None
