"""GPU metrics from the DCGM exporter turned into findings: Xid events, uncorrectable ECC errors,
failed row remapping, and a GPU idle while the job's other GPUs work.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

from recovery.detection.facts.xid import XID_MEANINGS, xid_meaning
from recovery.detection.findings import CRASH, STRAGGLER, Finding
from recovery.detection.hang import format_duration
from recovery.detection.taxonomy import NO_CATEGORY, Attribution, FailureCategory, Severity

XID_METRIC = "DCGM_FI_DEV_XID_ERRORS"
GPU_UTIL_METRIC = "DCGM_FI_DEV_GPU_UTIL"
ECC_DBE_METRIC = "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"
ROW_REMAP_FAILURE_METRIC = "DCGM_FI_DEV_ROW_REMAP_FAILURE"


@dataclass(frozen=True)
class MetricSample:
    """One sample of one metric for one GPU."""

    at: datetime
    node: str
    gpu: str
    name: str
    value: float


GpuKey = tuple[str, str]


def _series(samples: Sequence[MetricSample], name: str) -> dict[GpuKey, list[MetricSample]]:
    series: dict[GpuKey, list[MetricSample]] = {}
    for sample in samples:
        if sample.name == name and math.isfinite(sample.value):
            series.setdefault((sample.node, sample.gpu), []).append(sample)
    for values in series.values():
        values.sort(key=lambda sample: sample.at)
    return dict(sorted(series.items()))


def latest_values(samples: Sequence[MetricSample], name: str) -> dict[GpuKey, float]:
    """The last value of metric ``name`` per (node, gpu): the ``previous_*`` of the next call."""
    return {key: values[-1].value for key, values in _series(samples, name).items()}


def findings_from_gpu_metrics(
    samples: Sequence[MetricSample],
    *,
    previous_xid: Mapping[GpuKey, float] | None = None,
    previous_ecc_dbe: Mapping[GpuKey, float] | None = None,
    idle_threshold: float = 1.0,
    busy_threshold: float = 20.0,
    min_idle_samples: int = 3,
) -> list[Finding]:
    """Findings from DCGM exporter samples, one per (node, GPU, cause) with a count.

    * ``DCGM_FI_DEV_XID_ERRORS`` holds the last Xid code seen on a GPU. A change to a non-zero
      code (from ``previous_xid`` or the sample before) is an event, and so is a non-zero first
      value when nothing earlier is known. The same code twice in a row cannot be told apart
      from one event: the gauge does not change.
    * ``DCGM_FI_DEV_ECC_DBE_VOL_TOTAL`` is a counter: an increase over the sample before (or
      over ``previous_ecc_dbe``) is an uncorrectable ECC error; a decrease is a driver reload.
    * ``DCGM_FI_DEV_ROW_REMAP_FAILURE`` non-zero: the GPU ran out of spare memory rows.
    * ``DCGM_FI_DEV_GPU_UTIL``: a GPU at or below ``idle_threshold`` % for at least
      ``min_idle_samples`` consecutive samples while the median of the job's other GPUs over
      that time is at least ``busy_threshold`` % is stuck while its peers work (or spin in a
      collective waiting for it). When all GPUs are idle the job is not computing at all; that
      is for the hang detector, not this one.
    """
    findings: list[Finding] = []
    findings += _xid_findings(_series(samples, XID_METRIC), previous_xid or {})
    findings += _ecc_findings(_series(samples, ECC_DBE_METRIC), previous_ecc_dbe or {})
    findings += _row_remap_findings(_series(samples, ROW_REMAP_FAILURE_METRIC))
    findings += _stuck_idle_findings(
        _series(samples, GPU_UTIL_METRIC),
        idle_threshold=idle_threshold,
        busy_threshold=busy_threshold,
        min_idle_samples=min_idle_samples,
    )
    return findings


def _xid_findings(
    series: dict[GpuKey, list[MetricSample]], previous: Mapping[GpuKey, float]
) -> list[Finding]:
    findings = []
    for (node, gpu), values in series.items():
        last = previous.get((node, gpu))
        last_code = int(last) if last is not None and math.isfinite(last) else None
        events: dict[int, list[MetricSample]] = {}
        for sample in values:
            code = int(sample.value)
            if code != 0 and code != last_code:
                events.setdefault(code, []).append(sample)
            last_code = code
        for code, seen in sorted(events.items()):
            meaning = xid_meaning(code)
            evidence = f"Xid {code} on {node} GPU {gpu}: {meaning.description}"
            if len(seen) > 1:
                evidence += f" ({len(seen)} times)"
            findings.append(
                Finding(
                    kind=CRASH,
                    category=meaning.category,
                    attribution=meaning.attribution,
                    severity=meaning.severity,
                    signature=f"xid-{code}",
                    evidence=evidence,
                    source="metrics",
                    count=len(seen),
                    nodes=[node],
                    at=seen[0].at,
                    detail={
                        "metric": XID_METRIC,
                        "gpu": gpu,
                        "xid": code,
                        "description": meaning.description,
                        "known_xid": code in XID_MEANINGS,
                        "first_at": seen[0].at.isoformat(),
                        "last_at": seen[-1].at.isoformat(),
                    },
                )
            )
    return findings


def _ecc_findings(
    series: dict[GpuKey, list[MetricSample]], previous: Mapping[GpuKey, float]
) -> list[Finding]:
    findings = []
    for (node, gpu), values in series.items():
        last = previous.get((node, gpu))
        increases: list[tuple[MetricSample, float]] = []
        for sample in values:
            if last is not None and sample.value > last:
                increases.append((sample, sample.value - last))
            last = sample.value
        if not increases:
            continue
        errors = sum(amount for _, amount in increases)
        findings.append(
            Finding(
                kind=CRASH,
                category=FailureCategory.GPU_HARDWARE,
                attribution=Attribution.HARDWARE,
                severity=Severity.ERROR,
                signature="ecc-dbe-increase",
                evidence=(
                    f"{node} GPU {gpu}: {errors:g} new double-bit (uncorrectable) ECC error(s)"
                ),
                source="metrics",
                count=len(increases),
                nodes=[node],
                at=increases[0][0].at,
                detail={
                    "metric": ECC_DBE_METRIC,
                    "gpu": gpu,
                    "new_errors": errors,
                    "total": values[-1].value,
                    "first_at": increases[0][0].at.isoformat(),
                    "last_at": increases[-1][0].at.isoformat(),
                },
            )
        )
    return findings


def _row_remap_findings(series: dict[GpuKey, list[MetricSample]]) -> list[Finding]:
    findings = []
    for (node, gpu), values in series.items():
        failing = [sample for sample in values if sample.value != 0]
        if not failing:
            continue
        findings.append(
            Finding(
                kind=CRASH,
                category=FailureCategory.GPU_HARDWARE,
                attribution=Attribution.HARDWARE,
                severity=Severity.ERROR,
                signature="row-remap-failure",
                evidence=(
                    f"{node} GPU {gpu}: row remapping failed (no spare memory rows left); "
                    "the GPU needs service"
                ),
                source="metrics",
                count=len(failing),
                nodes=[node],
                at=failing[0].at,
                detail={
                    "metric": ROW_REMAP_FAILURE_METRIC,
                    "gpu": gpu,
                    "first_at": failing[0].at.isoformat(),
                    "last_at": failing[-1].at.isoformat(),
                },
            )
        )
    return findings


def _idle_runs(values: list[MetricSample], idle_threshold: float) -> list[list[MetricSample]]:
    runs: list[list[MetricSample]] = []
    current: list[MetricSample] = []
    for sample in values:
        if sample.value <= idle_threshold:
            current.append(sample)
        else:
            if current:
                runs.append(current)
            current = []
    if current:
        runs.append(current)
    return runs


def _stuck_idle_findings(
    series: dict[GpuKey, list[MetricSample]],
    *,
    idle_threshold: float,
    busy_threshold: float,
    min_idle_samples: int,
) -> list[Finding]:
    findings = []
    for key, values in series.items():
        node, gpu = key
        stuck: list[tuple[list[MetricSample], float]] = []
        for run in _idle_runs(values, idle_threshold):
            if len(run) < min_idle_samples:
                continue
            start, end = run[0].at, run[-1].at
            peers = [
                sample.value
                for other, other_values in series.items()
                if other != key
                for sample in other_values
                if start <= sample.at <= end
            ]
            if not peers:
                continue
            peer_median = statistics.median(peers)
            if peer_median >= busy_threshold:
                stuck.append((run, peer_median))
        if not stuck:
            continue
        longest, peer_median = max(stuck, key=lambda item: len(item[0]))
        idle_samples = sum(len(run) for run, _ in stuck)
        duration = (longest[-1].at - longest[0].at).total_seconds()
        findings.append(
            Finding(
                kind=STRAGGLER,
                category=NO_CATEGORY,
                attribution=Attribution.UNKNOWN,
                severity=Severity.ERROR,
                signature="gpu-stuck-idle",
                evidence=(
                    f"{node} GPU {gpu} stuck at {max(s.value for s in longest):g}% utilisation "
                    f"for {len(longest)} consecutive samples ({format_duration(duration)}) "
                    f"while the job's other GPUs ran at a median {peer_median:.0f}%"
                ),
                source="metrics",
                count=idle_samples,
                nodes=[node],
                at=stuck[0][0][0].at,
                detail={
                    "metric": GPU_UTIL_METRIC,
                    "gpu": gpu,
                    "idle_samples": idle_samples,
                    "longest_run_samples": len(longest),
                    "longest_run_seconds": duration,
                    "peer_median": peer_median,
                    "first_at": stuck[0][0][0].at.isoformat(),
                    "last_at": stuck[-1][0][-1].at.isoformat(),
                },
            )
        )
    return findings
