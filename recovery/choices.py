"""Enumerations shared by the domain, the API and the Console.

The failure taxonomy (``AnomalyKind``, ``FailureCategory``, ``Attribution``, ``Severity``) is
declared once, Django-free, in ``recovery.detection.taxonomy``; the choices here are built from
it with the same names, values and labels, and checked against it when this module is imported.
Its values are shared with the test corpus and must not change.

``Connection``, ``RecommendationAction`` (``Action``) and ``OptInMode`` are declared,
Django-free, where the Advisor Controller reads them (``recovery.schedulers.base``,
``.capabilities`` and ``.optin``); the choices here take their names and values from there, add
the labels, and are checked against them the same way.
"""

from __future__ import annotations

from enum import Enum

from django.db import models

from recovery.detection import taxonomy
from recovery.schedulers import base as schedulers
from recovery.schedulers import capabilities, optin


def _choice(member: taxonomy.LabelledEnum) -> tuple[str, str]:
    """A Django choice (value, label) for a taxonomy member."""
    return member.value, member.label


def _check_mirrors(choices: type[models.TextChoices], source: type[Enum]) -> None:
    """Fail at import when a choices class and its taxonomy enum list different members."""
    mine = [(member.name, member.value) for member in choices]
    theirs = [(member.name, member.value) for member in source]
    if mine != theirs:
        raise TypeError(f"{choices.__name__} does not mirror {source.__module__}.{source.__name__}")


class SchedulerKind(models.TextChoices):
    SLURM = "slurm", "Slurm"
    SIMULATED = "simulated", "Simulated"


class Connection(models.TextChoices):
    LOCAL = schedulers.Connection.LOCAL.value, "Local (commands on this host)"
    SSH = schedulers.Connection.SSH.value, "SSH"
    SIMULATED = schedulers.Connection.SIMULATED.value, "Simulated"


class ClusterMode(models.TextChoices):
    MONITOR = "monitor", "Monitor (recommend, act only on approval)"
    ACTION = "action", "Action (act automatically)"


class NodeHealth(models.TextChoices):
    UNKNOWN = "unknown", "Unknown"
    HEALTHY = "healthy", "Healthy"
    SUSPECT = "suspect", "Suspect"
    UNHEALTHY = "unhealthy", "Unhealthy"


class OptInMode(models.TextChoices):
    OBSERVE = optin.OptInMode.OBSERVE.value, "Observe"
    ACT = optin.OptInMode.ACT.value, "Act"


class WorkloadState(models.TextChoices):
    PENDING = "pending", "Pending"
    RUNNING = "running", "Running"
    REQUEUED = "requeued", "Requeued"
    HELD = "held", "Held"
    COMPLETED = "completed", "Completed"
    FAILED = "failed", "Failed"
    CANCELLED = "cancelled", "Cancelled"
    STOPPED = "stopped", "Stopped by recovery"
    UNKNOWN = "unknown", "Unknown"


class AttemptExitState(models.TextChoices):
    RUNNING = "running", "Running"
    COMPLETED = "completed", "Completed"
    FAILED = "failed", "Failed"
    NODE_FAIL = "node_fail", "Node failure"
    TIMEOUT = "timeout", "Time limit"
    OUT_OF_MEMORY = "out_of_memory", "Out of memory"
    PREEMPTED = "preempted", "Preempted"
    CANCELLED = "cancelled", "Cancelled"
    REQUEUED = "requeued", "Requeued"


class AnomalyKind(models.TextChoices):
    CRASH = _choice(taxonomy.AnomalyKind.CRASH)
    HANG = _choice(taxonomy.AnomalyKind.HANG)
    STRAGGLER = _choice(taxonomy.AnomalyKind.STRAGGLER)
    DIVERGENCE = _choice(taxonomy.AnomalyKind.DIVERGENCE)
    SLOWDOWN = _choice(taxonomy.AnomalyKind.SLOWDOWN)


class EvidenceSource(models.TextChoices):
    """Where an anomaly's evidence came from.

    What a user's job writes or pushes (its output files, pushed lines and heartbeats, a log
    store fed by it, the progress it reports) is the user's to write: it may restart the job
    and exclude nodes from that job's next attempt, nothing more. The scheduler's states, a
    node's kernel log and GPU metrics are facts the user does not control.
    """

    JOB_OUTPUT = "job_output", "job output file"
    PUSHED = "pushed", "pushed by the job"
    LOG_STORE = "log_store", "log store"
    PROGRESS = "progress", "progress the job reported"
    SCHEDULER = "scheduler", "scheduler"
    KERNEL_LOG = "kernel_log", "node kernel log"
    GPU_METRICS = "gpu_metrics", "GPU metrics"


class EvidenceTrust(models.TextChoices):
    """Whether the user whose job it is controls the evidence (blank: recorded before trust
    was, and treated as user-controlled)."""

    USER = "user", "user-controlled"
    SITE = "site", "site fact"


SITE_SOURCES = frozenset(
    {EvidenceSource.SCHEDULER, EvidenceSource.KERNEL_LOG, EvidenceSource.GPU_METRICS}
)


def trust_of(source: EvidenceSource) -> EvidenceTrust:
    return EvidenceTrust.SITE if source in SITE_SOURCES else EvidenceTrust.USER


class Confirmation(models.TextChoices):
    """Whether a crash read from a log was seen to end the process.

    Blank for anomalies that need no confirmation: hangs and stragglers measure progress
    themselves.
    """

    SUSPECTED = "suspected", "Suspected (not yet seen to end the process)"
    CONFIRMED = "confirmed", "Confirmed"
    SURVIVED = "survived", "Survived (training went on)"
    STALLED = "stalled", "Stalled (no exit, no progress: handled as a hang)"


class FailureCategory(models.TextChoices):
    NCCL_TIMEOUT = _choice(taxonomy.FailureCategory.NCCL_TIMEOUT)
    NCCL_ERROR = _choice(taxonomy.FailureCategory.NCCL_ERROR)
    INTERCONNECT = _choice(taxonomy.FailureCategory.INTERCONNECT)
    GPU_HARDWARE = _choice(taxonomy.FailureCategory.GPU_HARDWARE)
    CUDA_ERROR_APP = _choice(taxonomy.FailureCategory.CUDA_ERROR_APP)
    GPU_OOM = _choice(taxonomy.FailureCategory.GPU_OOM)
    HOST_OOM = _choice(taxonomy.FailureCategory.HOST_OOM)
    APP_EXCEPTION = _choice(taxonomy.FailureCategory.APP_EXCEPTION)
    STORAGE_IO = _choice(taxonomy.FailureCategory.STORAGE_IO)
    SCHEDULER_EVENT = _choice(taxonomy.FailureCategory.SCHEDULER_EVENT)
    SEGFAULT = _choice(taxonomy.FailureCategory.SEGFAULT)
    NAN_DIVERGENCE = _choice(taxonomy.FailureCategory.NAN_DIVERGENCE)
    HEALTHY = _choice(taxonomy.FailureCategory.HEALTHY)
    UNEXPLAINED = _choice(taxonomy.FailureCategory.UNEXPLAINED)


# The categories a signature may give (a detection pattern's, a policy's exclusions): what the
# classifier can answer, without the healthy verdict or what only the loop records. An
# unexplained failure is decided as one without a category, so no policy may exclude on it.
SIGNATURE_CATEGORIES = [
    (value, label)
    for value, label in FailureCategory.choices
    if value in taxonomy.FAILURE_CATEGORIES
]


class Attribution(models.TextChoices):
    HARDWARE = _choice(taxonomy.Attribution.HARDWARE)
    SYSTEM_SOFTWARE = _choice(taxonomy.Attribution.SYSTEM_SOFTWARE)
    APPLICATION = _choice(taxonomy.Attribution.APPLICATION)
    UNKNOWN = _choice(taxonomy.Attribution.UNKNOWN)
    NONE = _choice(taxonomy.Attribution.NONE)


class Severity(models.TextChoices):
    FATAL = _choice(taxonomy.Severity.FATAL)
    ERROR = _choice(taxonomy.Severity.ERROR)
    WARNING = _choice(taxonomy.Severity.WARNING)


class RecommendationAction(models.TextChoices):
    RESTART = capabilities.Action.RESTART.value, "Restart"
    RESTART_EXCLUDING = capabilities.Action.RESTART_EXCLUDING.value, "Restart excluding nodes"
    STOP = capabilities.Action.STOP.value, "Stop"
    NONE = capabilities.Action.NONE.value, "Nothing (record only)"
    # Node actions: the recommendation names a node, not a job to restart.
    DRAIN = capabilities.Action.DRAIN.value, "Drain node"
    RESUME = capabilities.Action.RESUME.value, "Resume node"


# What a policy may make of a crash: a job's actions, never a node's.
CRASH_ACTIONS = [
    (value, label)
    for value, label in RecommendationAction.choices
    if value not in (RecommendationAction.DRAIN, RecommendationAction.RESUME)
]
NODE_ACTIONS = frozenset({RecommendationAction.DRAIN, RecommendationAction.RESUME})
# How a node's scheduler reason shows recovery's own drain (defined beside the adapters).
DRAIN_REASON_PREFIX = schedulers.DRAIN_REASON_PREFIX


class ClusterNodeState(models.TextChoices):
    """States of a node on its cluster that keep it out of every job's restart."""

    EXCLUDED = "excluded", "Excluded after a site fact implicated it"
    UNHEALTHY = "unhealthy", "Unhealthy by its kernel log, DCGM or the scheduler"
    SUSPECT = "suspect", "Suspect: implicated in several workloads"


class Disposition(models.TextChoices):
    """What came of a recommendation a controller took up, as the controller verified it."""

    PENDING = "pending", "Pending verification"
    CONVERGED = "converged", "Converged"
    ABANDONED = "abandoned", "Abandoned"


class StopReason(models.TextChoices):
    """Why the policy stopped a job rather than restart it."""

    RETRY_BUDGET = "retry_budget", "Retry budget spent"
    NO_CHECKPOINT = "no_checkpoint", "No new checkpoint"
    APPLICATION_FAULT = "application_fault", "Application fault"
    POLICY = "policy", "The policy stops on this failure"
    DIVERGED = "diverged", "Training diverged"


class DivergenceAction(models.TextChoices):
    """What a policy makes of training that diverged (a loss that stays NaN or jumped and
    stayed up) while the job still runs. Never done without a person's approval."""

    RECORD = "record", "Record only"
    STOP = "stop", "Stop the job"
    RESTART = "restart", "Restart from a checkpoint saved before the divergence"


class StragglerAction(models.TextChoices):
    RECORD = "record", "Record only"
    RESTART_EXCLUDING = "restart_excluding", "Restart excluding the slow node"


class RecommendationStatus(models.TextChoices):
    PROPOSED = "proposed", "Proposed"
    AWAITING_APPROVAL = "awaiting_approval", "Awaiting approval"
    READY = "ready", "Ready"
    CLAIMED = "claimed", "Claimed"
    EXECUTED = "executed", "Executed"
    SKIPPED = "skipped", "Skipped (already done)"
    FAILED = "failed", "Failed"
    REJECTED = "rejected", "Rejected"
    EXPIRED = "expired", "Expired"
    SUPERSEDED = "superseded", "Superseded"


OPEN_RECOMMENDATION_STATUSES = frozenset(
    {
        RecommendationStatus.PROPOSED,
        RecommendationStatus.AWAITING_APPROVAL,
        RecommendationStatus.READY,
        RecommendationStatus.CLAIMED,
    }
)

# Which status may follow which. Every change of status goes through
# ``Recommendation.transition`` which enforces this table with a conditional UPDATE.
RECOMMENDATION_TRANSITIONS: dict[str, frozenset[str]] = {
    RecommendationStatus.PROPOSED: frozenset(
        {
            RecommendationStatus.AWAITING_APPROVAL,
            RecommendationStatus.READY,
            RecommendationStatus.SUPERSEDED,
            RecommendationStatus.EXPIRED,
        }
    ),
    RecommendationStatus.AWAITING_APPROVAL: frozenset(
        {
            RecommendationStatus.READY,
            RecommendationStatus.REJECTED,
            RecommendationStatus.SUPERSEDED,
            RecommendationStatus.EXPIRED,
        }
    ),
    RecommendationStatus.READY: frozenset(
        {
            RecommendationStatus.CLAIMED,
            RecommendationStatus.SUPERSEDED,
            RecommendationStatus.EXPIRED,
        }
    ),
    RecommendationStatus.CLAIMED: frozenset(
        {
            RecommendationStatus.READY,  # the controller's lease ran out
            RecommendationStatus.EXECUTED,
            RecommendationStatus.SKIPPED,
            RecommendationStatus.FAILED,
        }
    ),
}


class AuditKind(models.TextChoices):
    DETECTED = "detected", "Detected"
    CONFIRMED = "confirmed", "Crash confirmed"
    SURVIVED = "survived", "Crash survived"
    STALLED = "stalled", "Stalled after an error"
    ATTRIBUTED = "attributed", "Attributed"
    RECOMMENDED = "recommended", "Recommended"
    APPROVED = "approved", "Approved"
    REJECTED = "rejected", "Rejected"
    SUPERSEDED = "superseded", "Superseded"
    EXPIRED = "expired", "Expired"
    CLAIMED = "claimed", "Claimed by a controller"
    LEASE_EXPIRED = "lease_expired", "Controller lease expired"
    DISPATCHED = "dispatched", "Dispatched"
    SCHEDULER_ACTION = "scheduler_action", "Scheduler action"
    ACTION_SKIPPED = "action_skipped", "Action skipped (already done)"
    ACTION_FAILED = "action_failed", "Action failed"
    ACTION_RETRY = "action_retry", "Action to be retried"
    REPORT_REFUSED = "report_refused", "Controller report refused"
    WATCHDOG_RELEASED = "watchdog_released", "Released by the watchdog"
    STATE_CHANGED = "state_changed", "Scheduler state changed"
    RESTART_ALLOCATED = "restart_allocated", "Restart allocated"
    PROGRESS_RESUMED = "progress_resumed", "Progress resumed"
    CHECKPOINT_SAVED = "checkpoint_saved", "Checkpoint saved"
    TRAINING_COMPLETED = "training_completed", "Training completed"
    STOPPED = "stopped", "Stopped"
    INPUT_IGNORED = "input_ignored", "Input ignored"
    NODE_SUSPECT = "node_suspect", "Node flagged as suspect"
    NODE_RETURNED = "node_returned", "Node returned to service"
    POLICY_FAILED = "policy_failed", "Policy engine failed"
    ATTRIBUTION_DEGRADED = "attribution_degraded", "Attribution provider unavailable"
    ANOMALIES_FOLDED = "anomalies_folded", "Anomaly cap reached"
    SCHEDULER_HOOK = "scheduler_hook", "Scheduler hook received"
    ABANDONMENT_ACKNOWLEDGED = "abandonment_acknowledged", "Abandoned action acknowledged"
    MODE_CHANGED = "mode_changed", "Cluster mode changed"
    ACKNOWLEDGEMENT_CHANGED = (
        "acknowledgement_changed",
        "Acknowledgement of scheduler actions changed",
    )
    AUTOMATIC_DRAIN_CHANGED = "automatic_drain_changed", "Automatic drains changed"
    ACTION_SCOPE_CHANGED = "action_scope_changed", "Action mode's canary changed"
    DRAIN_WITHHELD = "drain_withheld", "Drain withheld (blast radius)"
    DRAIN_REFUSED = "drain_refused", "Drain refused (node not recovery's)"
    PATTERN_TAUGHT = "pattern_taught", "Detection pattern taught"


for _choices, _source in (
    (AnomalyKind, taxonomy.AnomalyKind),
    (FailureCategory, taxonomy.FailureCategory),
    (Attribution, taxonomy.Attribution),
    (Severity, taxonomy.Severity),
    (Connection, schedulers.Connection),
    (RecommendationAction, capabilities.Action),
    (OptInMode, optin.OptInMode),
):
    _check_mirrors(_choices, _source)
