"""Facts the job does not control, turned into findings of the same shape as log findings.

Slurm says *that* a job or node failed, rarely *why*; DCGM says what a GPU reported. Neither is
printed by the user's program, so neither needs the confirmation a crash line does. Each becomes
a ``Finding`` with ``source="scheduler"`` or ``source="metrics"``, so the attribution and policy
steps treat every kind of evidence alike. ("Signals", elsewhere, are the site's log and metric
stores that ``configure_signals`` connects.)

``XID_MEANINGS`` is the one table of NVIDIA Xid codes in the project; log signatures import it.

By source: ``xid`` (the Xid table), ``job_ending`` (how a job ended, by its phase), ``slurm``
(node states), ``dcgm`` (GPU metrics).
"""

from __future__ import annotations

from recovery.detection.facts.dcgm import (
    ECC_DBE_METRIC,
    GPU_UTIL_METRIC,
    ROW_REMAP_FAILURE_METRIC,
    XID_METRIC,
    GpuKey,
    MetricSample,
    findings_from_gpu_metrics,
    latest_values,
)
from recovery.detection.facts.job_ending import finding_from_job_ending
from recovery.detection.facts.slurm import node_state_finding
from recovery.detection.facts.xid import UNKNOWN_XID, XID_MEANINGS, XidMeaning, xid_meaning

__all__ = (
    "ECC_DBE_METRIC",
    "GPU_UTIL_METRIC",
    "ROW_REMAP_FAILURE_METRIC",
    "UNKNOWN_XID",
    "XID_MEANINGS",
    "XID_METRIC",
    "GpuKey",
    "MetricSample",
    "XidMeaning",
    "finding_from_job_ending",
    "findings_from_gpu_metrics",
    "latest_values",
    "node_state_finding",
    "xid_meaning",
)
