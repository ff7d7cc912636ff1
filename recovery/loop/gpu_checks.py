"""GPU health from the cluster's Prometheus: DCGM findings on the nodes of running attempts.

A cluster whose settings name a metric store (``connection_settings["metric_source"]``, as
``configure_signals`` saves it) has its running attempts' nodes checked at every poll over a
short look-back window. Findings (Xid, uncorrectable ECC, row remap failure, NVLink errors, an
idle GPU while its peers work) become anomalies of the workload running there, recorded like
log evidence: once per attempt and fingerprint, then attributed and decided by the policy.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta

from recovery.choices import AttemptExitState, EvidenceSource
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
    holder = {node: attempt for attempt in running for node in attempt.nodes}
    if not holder:
        return check
    check.nodes_checked = len(holder)
    try:
        health = gpu_health(source, sorted(holder), now - LOOK_BACK, now, labels=labels)
    except MetricsSourceError as error:
        check.error = str(error)
        return check
    for node, findings in health.by_node().items():
        attempt = holder.get(node)
        if attempt is None:
            continue
        new = record_anomalies(
            attempt.workload,
            attempt,
            findings,
            now,
            scope=METRICS_SCOPE,
            source=EvidenceSource.GPU_METRICS,
        )
        check.anomalies_new += len(new)
    return check
