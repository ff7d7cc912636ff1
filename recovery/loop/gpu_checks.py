"""GPU health from the cluster's Prometheus: DCGM findings on the nodes of running attempts.

A cluster whose settings name a metric store (``connection_settings["metric_source"]``, as
``configure_signals`` saves it) has its running attempts' nodes checked at every poll over a
short look-back window. Findings the GPU's hardware is blamed for (an Xid the driver
attributes to the hardware, uncorrectable ECC errors, a row remap failure, NVLink errors) are
facts about the node: they become anomalies of every workload running there, recorded like
log evidence, once per attempt and fingerprint, then attributed and decided by the policy.

Which node a series is about is its node label (``Hostname`` by default), which dcgm-exporter
sets from the host it runs on: trusted as far as the store's DCGM series come from the site's
exporters alone. Nothing tells which job a GPU of a shared node belongs to (the exporter's job
mapping is not read here), and a GPU's utilisation, or an Xid whose meaning is the
application's fault, is what the program on that GPU did: such findings would blame whichever
job shares the node. They are counted in ``GpuCheck.ignored`` and act on no job.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta

from recovery.choices import AttemptExitState, Attribution, EvidenceSource
from recovery.detection.findings import Finding
from recovery.loop.anomalies import record_anomalies
from recovery.models import Attempt, Cluster
from recovery.sources.metrics import (
    DcgmLabels,
    MetricSource,
    MetricsSourceError,
    gpu_health,
    source_from_settings,
)

logger = logging.getLogger(__name__)

# Overlapping windows are harmless (an anomaly is stored once per fingerprint) and catch a
# reading Prometheus scraped late.
LOOK_BACK = timedelta(minutes=2)
METRICS_SCOPE = "dcgm"


@dataclass
class GpuCheck:
    nodes_checked: int = 0
    anomalies_new: int = 0
    error: str = ""
    # Findings that are no fact about the node's hardware: they act on no job (see above).
    ignored: int = 0


def metric_store_of(cluster: Cluster) -> tuple[MetricSource, DcgmLabels] | None:
    """The metric store and label mapping the cluster's settings name, or None."""
    try:
        return source_from_settings((cluster.connection_settings or {}).get("metric_source"))
    except (MetricsSourceError, ValueError) as error:
        logger.warning("metric store settings of %s are unusable: %s", cluster.name, error)
        return None


def check_gpu_metrics(
    cluster: Cluster, source: MetricSource, labels: DcgmLabels, now: datetime
) -> GpuCheck:
    """Record the DCGM findings on the nodes of the cluster's running, opted-in attempts."""
    check = GpuCheck()
    running = list(
        Attempt.objects.select_related("workload__cluster").filter(
            workload__cluster=cluster,
            workload__opted_in=True,
            exit_state=AttemptExitState.RUNNING,
        )
    )
    on_node: dict[str, list[Attempt]] = {}
    for attempt in running:
        for node in attempt.nodes:
            on_node.setdefault(node, []).append(attempt)
    if not on_node:
        return check
    check.nodes_checked = len(on_node)
    try:
        health = gpu_health(source, sorted(on_node), now - LOOK_BACK, now, labels=labels)
    except MetricsSourceError as error:
        check.error = str(error)
        return check
    for node, findings in health.by_node().items():
        hardware = [finding for finding in findings if is_node_fact(finding)]
        check.ignored += len(findings) - len(hardware)
        if not hardware:
            continue
        for attempt in on_node.get(node, []):
            new = record_anomalies(
                attempt.workload,
                attempt,
                hardware,
                now,
                scope=METRICS_SCOPE,
                source=EvidenceSource.GPU_METRICS,
            )
            check.anomalies_new += len(new)
    return check


def is_node_fact(finding: Finding) -> bool:
    """A DCGM finding about the GPU's hardware, which every job on its node shares."""
    return finding.attribution == Attribution.HARDWARE
