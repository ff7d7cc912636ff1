"""GPU health of a set of nodes over a time window, from NVIDIA DCGM exporter metrics in Prometheus.

The metrics are read with a few bounded queries (one range query per metric, aggregated per
node and GPU) and handed to the detectors' own rules in ``recovery.detection.facts``, so a
GPU metric gives the same finding whether it arrives here or through another path. Findings
this module adds itself: NVLink error counters rising and (opt-in) corrected ECC errors.

Every range point is the *maximum* over its step (``max_over_time(m[step])``): an Xid code or a
counter step that lasted one scrape is never lost between two points, whatever the step.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from recovery.detection.facts import (
    ECC_DBE_METRIC,
    GPU_UTIL_METRIC,
    ROW_REMAP_FAILURE_METRIC,
    XID_METRIC,
    MetricSample,
    findings_from_gpu_metrics,
)
from recovery.detection.findings import CRASH, Finding, FindingSource
from recovery.detection.taxonomy import Attribution, FailureCategory, Severity
from recovery.sources.metrics.base import MetricSource
from recovery.sources.metrics.prometheus import LABEL_NAME, promql_string

GPU_TEMP_METRIC = "DCGM_FI_DEV_GPU_TEMP"
POWER_USAGE_METRIC = "DCGM_FI_DEV_POWER_USAGE"
TENSOR_ACTIVE_METRIC = "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"
ECC_SBE_METRIC = "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL"
NVLINK_ERROR_METRICS = (
    "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL",
    "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL",
    "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL",
    "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL",
)
# Counters: a rise is news, their level is history.
COUNTER_METRICS = (ECC_DBE_METRIC, ECC_SBE_METRIC, *NVLINK_ERROR_METRICS)
# Gauges shown as the latest reading of each GPU (context for an operator, not findings).
READING_METRICS = (GPU_TEMP_METRIC, POWER_USAGE_METRIC, GPU_UTIL_METRIC, TENSOR_ACTIVE_METRIC)
# Every metric gpu_health reads, in the order the configurator lists them.
DETECTOR_METRICS = (
    XID_METRIC,
    ECC_DBE_METRIC,
    ECC_SBE_METRIC,
    ROW_REMAP_FAILURE_METRIC,
    *NVLINK_ERROR_METRICS,
    GPU_UTIL_METRIC,
    TENSOR_ACTIVE_METRIC,
    GPU_TEMP_METRIC,
    POWER_USAGE_METRIC,
)
# The metrics without which gpu_health can say little: reported as missing signals.
ESSENTIAL_METRICS = (XID_METRIC, ECC_DBE_METRIC, ROW_REMAP_FAILURE_METRIC, GPU_UTIL_METRIC)

DEFAULT_MIN_STEP = timedelta(seconds=15)
DEFAULT_MAX_POINTS = 1000
MAX_NODES = 4096

GpuKey = tuple[str, str]


@dataclass(frozen=True)
class DcgmLabels:
    """Which labels of the DCGM exporter's series name the node, the GPU and the job.

    The defaults are dcgm-exporter's own (``Hostname``, ``gpu``, ``UUID``). ``job`` is the label
    holding the scheduler's job id when the exporter maps GPUs to jobs (dcgm-exporter's HPC job
    mapping adds ``hpc_job``); empty when it does not. ``static_selectors`` narrow every query
    (``{"cluster": "a100"}``) when one Prometheus serves several clusters.

    A finding is about the node its node label names, so that label must be one the site's
    exporter sets (``Hostname``, from the host it runs on; or a target label Prometheus's own
    configuration adds), never one a tenant sets: a Kubernetes pod's own labels, which
    dcgm-exporter can copy onto its series, or anything on series a tenant's target exposes.
    The same holds for ``job`` (the HPC job mapping reads files the scheduler's prolog writes)
    and for the static selectors, which should pin the site's scrape job.
    """

    node: str = "Hostname"
    gpu: str = "gpu"
    uuid: str = "UUID"
    job: str = ""
    static_selectors: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        names = [("node", self.node), ("gpu", self.gpu), ("uuid", self.uuid)]
        if self.job:
            names.append(("job", self.job))
        names += [("selector", name) for name in self.static_selectors]
        for role, name in names:
            if not LABEL_NAME.fullmatch(name) or name == "__name__":
                raise ValueError(
                    f"the {role} label {name[:80]!r} is not a Prometheus label name "
                    "([a-zA-Z_][a-zA-Z0-9_]*)"
                )


@dataclass
class GpuHealth:
    """What the DCGM metrics say about ``nodes`` between ``since`` and ``until``.

    ``findings`` carry ``nodes=[node]`` and ``detail["gpu"]`` (and ``detail["uuid"]`` when the
    exporter sends it). A node in ``nodes_without_metrics`` sent nothing in the window: no
    finding there means *unknown*, not healthy. ``readings`` holds the latest temperature,
    power, utilisation and tensor activity per (node, GPU).
    """

    since: datetime
    until: datetime
    step_seconds: float
    findings: list[Finding] = field(default_factory=list)
    gpus: dict[str, list[str]] = field(default_factory=dict)
    nodes_without_metrics: list[str] = field(default_factory=list)
    metrics_present: list[str] = field(default_factory=list)
    metrics_missing: list[str] = field(default_factory=list)
    readings: dict[GpuKey, dict[str, float]] = field(default_factory=dict)

    def by_node(self) -> dict[str, list[Finding]]:
        grouped: dict[str, list[Finding]] = {}
        for finding in self.findings:
            for node in finding.nodes:
                grouped.setdefault(node, []).append(finding)
        return grouped

    def to_dict(self) -> dict[str, Any]:
        return {
            "since": self.since.isoformat(),
            "until": self.until.isoformat(),
            "step_seconds": self.step_seconds,
            "findings": [finding.to_dict() for finding in self.findings],
            "gpus": {node: list(gpus) for node, gpus in self.gpus.items()},
            "nodes_without_metrics": list(self.nodes_without_metrics),
            "metrics_present": list(self.metrics_present),
            "metrics_missing": list(self.metrics_missing),
            "readings": [
                {"node": node, "gpu": gpu, **values}
                for (node, gpu), values in sorted(self.readings.items())
            ],
        }


def gpu_health(
    source: MetricSource,
    nodes: Iterable[str],
    since: datetime,
    until: datetime,
    *,
    labels: DcgmLabels | None = None,
    job_id: str = "",
    step: timedelta | None = None,
    idle_threshold: float = 1.0,
    busy_threshold: float = 20.0,
    min_idle_samples: int = 3,
    nvlink_errors_allowed: float = 0,
    sbe_errors_allowed: float | None = None,
) -> GpuHealth:
    """Findings per node and GPU from DCGM metrics between ``since`` and ``until``.

    * Xid: a GPU's ``DCGM_FI_DEV_XID_ERRORS`` changing to a non-zero code (the code is the
      finding's ``detail["xid"]``, its meaning from the project's Xid table). A code already
      there at ``since`` is old news and is not reported again.
    * ``DCGM_FI_DEV_ECC_DBE_VOL_TOTAL`` rising: uncorrectable memory errors.
    * ``DCGM_FI_DEV_ROW_REMAP_FAILURE`` non-zero: the GPU ran out of spare rows.
    * NVLink error counters (CRC flit/data, replay, recovery) rising by more than
      ``nvlink_errors_allowed`` in the window, summed over the counters.
    * Corrected (single-bit) ECC errors rising by more than ``sbe_errors_allowed``, only when
      given: they are corrected, and Xid 92 already flags a high rate.
    * A GPU idle (utilisation at or below ``idle_threshold`` % for ``min_idle_samples`` points)
      while the other GPUs of ``nodes`` are busy: a hung or straggling rank. Pass the nodes of
      one job and its running window; when ``labels.job`` and ``job_id`` are given,
      utilisation is read for that job's GPUs only (hardware errors stay per node).

    ``step`` defaults to the larger of 15 s and a thousandth of the window. Node names match
    the node label exactly or followed by a domain or port (``gpu-001`` matches
    ``gpu-001.cluster.local`` and ``gpu-001:9400``), and findings use the names given here.
    Raises ``MetricsSourceError`` when Prometheus cannot answer.
    """
    labels = labels or DcgmLabels()
    wanted = sorted({node.strip() for node in nodes if node and node.strip()})
    if not wanted:
        raise ValueError("gpu_health needs at least one node")
    if len(wanted) > MAX_NODES:
        raise ValueError(f"gpu_health reads at most {MAX_NODES} nodes at once")
    window = (until - since).total_seconds()
    if window <= 0:
        raise ValueError("the window ends before it starts")
    step_seconds = _step_seconds(window, step)

    selector = _selector(labels, wanted)
    health = GpuHealth(since=since, until=until, step_seconds=step_seconds)

    names_regex = "|".join(re.escape(name) for name in DETECTOR_METRICS)
    present_match = f"{{__name__=~{promql_string(names_regex)}, {selector}}}"
    present = set(source.label_values("__name__", present_match, since, until))
    health.metrics_present = [name for name in DETECTOR_METRICS if name in present]
    health.metrics_missing = [name for name in DETECTOR_METRICS if name not in present]
    seen_nodes = {
        node
        for value in source.label_values(labels.node, present_match, since, until)
        if (node := _requested_node(value, wanted)) is not None
    }
    health.nodes_without_metrics = [node for node in wanted if node not in seen_nodes]
    if not present:
        return health

    reader = _Reader(source, labels, wanted, selector, health)
    samples: list[MetricSample] = []
    for metric in (XID_METRIC, ECC_DBE_METRIC, ROW_REMAP_FAILURE_METRIC, GPU_UTIL_METRIC):
        if metric in present:
            job_selector = (
                f", {labels.job}={promql_string(job_id)}"
                if metric == GPU_UTIL_METRIC and labels.job and job_id
                else ""
            )
            samples += reader.range_samples(metric, extra_selector=job_selector)

    counters = [metric for metric in COUNTER_METRICS if metric in present]
    baseline = reader.values_at([XID_METRIC, *counters], since)
    findings = findings_from_gpu_metrics(
        samples,
        previous_xid=baseline.get(XID_METRIC, {}),
        previous_ecc_dbe=baseline.get(ECC_DBE_METRIC, {}),
        idle_threshold=idle_threshold,
        busy_threshold=busy_threshold,
        min_idle_samples=min_idle_samples,
    )

    nvlink = [metric for metric in NVLINK_ERROR_METRICS if metric in present]
    if nvlink:
        rises = {
            metric: _counter_rises(reader.range_samples(metric), baseline.get(metric, {}))
            for metric in nvlink
        }
        findings += _nvlink_findings(rises, nvlink_errors_allowed)
    if sbe_errors_allowed is not None and ECC_SBE_METRIC in present:
        sbe_rises = _counter_rises(
            reader.range_samples(ECC_SBE_METRIC), baseline.get(ECC_SBE_METRIC, {})
        )
        findings += _sbe_findings(sbe_rises, sbe_errors_allowed)

    readable = [metric for metric in READING_METRICS if metric in present]
    if readable:
        for metric, values in reader.values_at(readable, until).items():
            for key, value in values.items():
                health.readings.setdefault(key, {})[metric] = value

    for finding in findings:
        gpu = (finding.nodes[0], str(finding.detail.get("gpu", ""))) if finding.nodes else None
        if gpu and gpu in reader.uuids:
            finding.detail.setdefault("uuid", reader.uuids[gpu])
    health.findings = sorted(
        findings,
        key=lambda f: (f.nodes[:1], str(f.detail.get("gpu", "")), f.signature),
    )
    health.gpus = {node: sorted(gpus, key=_gpu_order) for node, gpus in sorted(reader.gpus.items())}
    return health


# ---------------------------------------------------------------------------------------------


class _Reader:
    """The queries of one gpu_health call, keeping track of the GPUs and UUIDs they saw."""

    def __init__(
        self,
        source: MetricSource,
        labels: DcgmLabels,
        wanted: Sequence[str],
        selector: str,
        health: GpuHealth,
    ) -> None:
        self.source = source
        self.labels = labels
        self.wanted = wanted
        self.selector = selector
        self.health = health
        self.gpus: dict[str, set[str]] = {}
        self.uuids: dict[GpuKey, str] = {}
        self.by = f"{labels.node}, {labels.gpu}, {labels.uuid}"

    def range_samples(self, metric: str, *, extra_selector: str = "") -> list[MetricSample]:
        """Per (node, GPU), the maximum of ``metric`` over each step of the window."""
        step = self.health.step_seconds
        query = (
            f"max by ({self.by}) (max_over_time({metric}{{{self.selector}{extra_selector}}}"
            f"[{round(step * 1000)}ms]))"
        )
        samples = []
        for series in self.source.range(query, self.health.since, self.health.until, step):
            key = self._key(series.labels)
            if key is None:
                continue
            for point in series.points:
                if math.isfinite(point.value):
                    samples.append(
                        MetricSample(
                            at=point.at, node=key[0], gpu=key[1], name=metric, value=point.value
                        )
                    )
        return samples

    def values_at(self, metrics: Sequence[str], at: datetime) -> dict[str, dict[GpuKey, float]]:
        """Each metric's value per (node, GPU) at ``at`` (Prometheus' 5-minute lookback)."""
        names = "|".join(re.escape(metric) for metric in metrics)
        query = (
            f"max by (__name__, {self.by}) ({{__name__=~{promql_string(names)}, {self.selector}}})"
        )
        values: dict[str, dict[GpuKey, float]] = {}
        for sample in self.source.instant(query, at):
            key = self._key(sample.labels)
            if key is not None and math.isfinite(sample.value):
                values.setdefault(sample.name, {})[key] = sample.value
        return values

    def _key(self, labels: Mapping[str, str]) -> GpuKey | None:
        node = _requested_node(labels.get(self.labels.node, ""), self.wanted)
        gpu = labels.get(self.labels.gpu, "") or labels.get(self.labels.uuid, "")
        if node is None or not gpu:
            return None
        self.gpus.setdefault(node, set()).add(gpu)
        uuid = labels.get(self.labels.uuid, "")
        if uuid:
            self.uuids[(node, gpu)] = uuid
        return node, gpu


def _step_seconds(window: float, step: timedelta | None) -> float:
    if step is not None:
        seconds = step.total_seconds()
        if seconds <= 0:
            raise ValueError("the step must be positive")
    else:
        seconds = max(DEFAULT_MIN_STEP.total_seconds(), window / DEFAULT_MAX_POINTS)
    # Prometheus refuses more than 11,000 points per series; stay well below.
    return max(seconds, math.ceil(window / 10_000))


def _selector(labels: DcgmLabels, nodes: Sequence[str]) -> str:
    alternatives = "|".join(re.escape(node) for node in nodes)
    matchers = [f"{labels.node}=~{promql_string(f'(?:{alternatives})(?:[.:].*)?')}"]
    matchers += [
        f"{name}={promql_string(value)}" for name, value in sorted(labels.static_selectors.items())
    ]
    return ", ".join(matchers)


def _requested_node(value: str, wanted: Sequence[str]) -> str | None:
    """The requested node name a node label value stands for (``gpu-1.dc:9400`` → ``gpu-1``)."""
    if value in wanted:
        return value
    short = re.split(r"[.:]", value, maxsplit=1)[0]
    return short if short in wanted else None


def _gpu_order(gpu: str) -> tuple[int, str]:
    return (int(gpu), "") if gpu.isdigit() else (1 << 30, gpu)


def _counter_rises(
    samples: Sequence[MetricSample], previous: Mapping[GpuKey, float]
) -> dict[GpuKey, tuple[float, datetime]]:
    """How much a counter rose per (node, GPU), and when it first rose.

    A fall is a restart of the counter (driver reload, exporter restart): the new value counts
    as new errors, as Prometheus' ``increase()`` counts it.
    """
    rises: dict[GpuKey, tuple[float, datetime]] = {}
    last: dict[GpuKey, float] = dict(previous)
    for sample in sorted(samples, key=lambda s: s.at):
        key = (sample.node, sample.gpu)
        before = last.get(key)
        last[key] = sample.value
        if before is None:
            continue
        rise = sample.value - before if sample.value >= before else sample.value
        if rise > 0:
            total, first = rises.get(key, (0.0, sample.at))
            rises[key] = (total + rise, first)
    return rises


def _nvlink_findings(
    rises: Mapping[str, Mapping[GpuKey, tuple[float, datetime]]], allowed: float
) -> list[Finding]:
    per_gpu: dict[GpuKey, dict[str, tuple[float, datetime]]] = {}
    for metric, by_gpu in rises.items():
        for key, rise in by_gpu.items():
            per_gpu.setdefault(key, {})[metric] = rise
    findings = []
    for (node, gpu), counters in sorted(per_gpu.items()):
        total = sum(amount for amount, _ in counters.values())
        if total <= allowed:
            continue
        first = min(at for _, at in counters.values())
        parts = ", ".join(
            f"{_nvlink_counter_name(metric)} +{amount:g}"
            for metric, (amount, _) in sorted(counters.items())
        )
        findings.append(
            Finding(
                kind=CRASH,
                category=FailureCategory.INTERCONNECT,
                attribution=Attribution.HARDWARE,
                severity=Severity.WARNING,
                signature="nvlink-errors-increase",
                evidence=f"{node} GPU {gpu}: {total:g} new NVLink errors ({parts})",
                source=FindingSource.METRICS,
                count=int(total),
                nodes=[node],
                at=first,
                detail={
                    "gpu": gpu,
                    "new_errors": total,
                    "counters": {metric: amount for metric, (amount, _) in counters.items()},
                    "first_at": first.isoformat(),
                },
            )
        )
    return findings


def _nvlink_counter_name(metric: str) -> str:
    return metric.removeprefix("DCGM_FI_DEV_NVLINK_").removesuffix("_COUNT_TOTAL").lower()


def _sbe_findings(rises: Mapping[GpuKey, tuple[float, datetime]], allowed: float) -> list[Finding]:
    findings = []
    for (node, gpu), (total, first) in sorted(rises.items()):
        if total <= allowed:
            continue
        findings.append(
            Finding(
                kind=CRASH,
                category=FailureCategory.GPU_HARDWARE,
                attribution=Attribution.HARDWARE,
                severity=Severity.WARNING,
                signature="ecc-sbe-increase",
                evidence=f"{node} GPU {gpu}: {total:g} new corrected (single-bit) ECC errors",
                source=FindingSource.METRICS,
                count=int(total),
                nodes=[node],
                at=first,
                detail={
                    "metric": ECC_SBE_METRIC,
                    "gpu": gpu,
                    "new_errors": total,
                    "first_at": first.isoformat(),
                },
            )
        )
    return findings
