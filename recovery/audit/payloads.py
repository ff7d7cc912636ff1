"""The payload each kind of audit event carries, as the loop records it.

One ``TypedDict`` per ``AuditKind``, read off the ``record_event`` calls that write that kind
(``recovery.loop``: anomalies, confirmation, attribution, logs, policy, recommendations,
watchdog, poll, push, suspects). ``payload_problems`` checks a payload against its kind's
declaration: anything that writes events on the loop's behalf (the demo history, tests) can
prove it writes what the loop writes, and a change to one of the loop's payloads shows up as a
failing check.

Optional keys are declared in a ``total=False`` subclass of the required ones rather than with
``NotRequired``: under ``from __future__ import annotations`` Python 3.11 cannot tell a string
``NotRequired[...]`` annotation from a required one, and ``__required_keys__`` would be wrong.

Django-free: kinds are compared by their string values.
"""

from __future__ import annotations

import types
import typing
from collections.abc import Mapping
from typing import Any, TypedDict

# --- findings ------------------------------------------------------------------------------


class DetectedPayload(TypedDict):
    """A finding stored as an anomaly (``recovery.loop.anomalies``)."""

    anomaly: int
    kind: str
    category: str
    attribution: str
    signature: str
    evidence: str
    count: int
    nodes: list[str]
    ranks: list[int]
    evidence_at: str
    confirmation: str


class DetectedAgainPayload(DetectedPayload, total=False):
    # ``again``: a crash survived before was printed again; ``ignored_nodes``: names in the
    # evidence that no node could have.
    again: bool
    ignored_nodes: list[dict[str, str]]


class AnomaliesFoldedPayload(TypedDict):
    """An attempt reached a cap on new anomalies (``recovery.loop.anomaly_caps``); once per attempt.

    ``cap`` is ``per_read`` or ``per_attempt`` and ``limit`` its value; the distinct findings
    past it in that read (``folded_findings``, with their ``occurrences``) were counted on the
    anomalies listed in ``into`` instead of being recorded. Later folds only add to the counts.
    """

    cap: str
    limit: int
    folded_findings: int
    occurrences: int
    into: list[int]
    signatures: list[str]


class SettledPayload(TypedDict):
    """A suspected crash confirmed, survived or stalled (``recovery.loop.confirmation``)."""

    anomaly: int
    reason: str
    evidence: str
    evidence_to_settled_s: float
    suspected_for_s: float | None


class _AttributedRequired(TypedDict):
    anomaly: int
    attribution: str
    confidence: float
    nodes: list[str]
    provider: str
    degraded: bool


class AttributedPayload(_AttributedRequired, total=False):
    """The verdict that decides an anomaly (``recovery.loop.attribution``).

    ``degraded_reason`` without a usable provider verdict; ``provider_host`` when a provider is
    configured; ``builtin`` and ``external`` when the provider gave a valid verdict.
    """

    degraded_reason: str
    provider_host: str
    builtin: dict[str, Any]
    external: dict[str, Any]


class AttributionDegradedPayload(TypedDict):
    """The attribution provider started failing (``recovery.loop.attribution``)."""

    provider_host: str
    reason: str
    anomaly: int
    workload: int


class NodeSuspectPayload(TypedDict):
    """A node implicated in several workloads' failures (``recovery.loop.suspects``)."""

    node: str
    workloads: list[int]
    window_hours: int
    reason: str
    recommendation: str


class NodeReturnedPayload(TypedDict):
    """An operator says a node is fit again: no longer kept out of any job's restart
    (``recovery.loop.node_health``). ``before`` is what kept it out."""

    node: str
    before: dict[str, Any]
    note: str


# --- decisions -----------------------------------------------------------------------------


class _RecommendedRequired(TypedDict):
    """The policy's decision on an anomaly (``recovery.loop.policy.recommend``)."""

    recommendation: int
    anomaly: int
    action: str
    excluded_nodes: list[str]
    # Why each excluded node is excluded (``Recommendation.exclusion_sources``).
    exclusion_sources: dict[str, str]
    reason: str
    policy: str
    mode: str
    # The job's own opt-in mode: "observe" waits for an operator in any cluster mode.
    job_mode: str
    would_have_done: bool


class RecommendedPayload(_RecommendedRequired, total=False):
    """A drain (``recovery.loop.drains``) also names its node, the site fact's source and
    whether the cluster drains without approval. A restart or stop also names the policy for
    effects beyond the job, and why the job's environment was not taken for it."""

    node: str
    evidence_source: str
    drain_automatically: bool
    site_policy: str
    environment_refused: str
    # Whether the job was in the part of the cluster action mode reaches (its canary).
    in_action_scope: bool


class DrainWithheldPayload(TypedDict):
    """A drain that was due and not recommended: the cluster's blast radius is reached."""

    anomaly: int
    node: str
    reason: str


class DrainRefusedPayload(TypedDict):
    """A drain that was due and not recommended: the node is not recovery's to drain (taken
    out of service by an administrator or Slurm, a reason of someone else's, or its state
    unknown). ``node_state`` is the node as the poll read it (``NodeInfo.facts``)."""

    anomaly: int
    node: str
    reason: str
    node_state: dict[str, Any]


class SupersededPayload(TypedDict):
    """An open recommendation replaced by a sharper one for the same attempt."""

    recommendation: int
    by: int


class PolicyFailedPayload(TypedDict):
    """The policy engine raised on an anomaly (``recovery.loop.policy``)."""

    anomaly: int
    error: str
    tries: int
    given_up: bool


class _DecisionRequired(TypedDict):
    """An operator approved or rejected a recommendation (``recovery.loop.recommendations``)."""

    recommendation: int
    action: str
    excluded_nodes: list[str]
    note: str


class DecisionPayload(_DecisionRequired, total=False):
    """A node action names its node; a resume, asked and approved by the same person
    (``recovery.loop.drains.request_resume``), says with what reason the node was drained."""

    node: str
    drained_with: str


class AbandonmentAcknowledgedPayload(TypedDict):
    """An operator saw that an action was abandoned (``recommendations.acknowledge``)."""

    recommendation: int
    reason: str
    note: str


class _ClaimedRequired(TypedDict):
    recommendation: int
    lease_seconds: int
    previous_owner: str


class ClaimedPayload(_ClaimedRequired, total=False):
    """A controller took a recommendation for the length of its lease. The controller process's
    instance id, and the previous holder's, are left out of claims recorded before leases were
    held by instance."""

    controller_instance: str
    previous_instance: str


class _LeaseExpiredRequired(TypedDict):
    recommendation: int
    previous_owner: str


class LeaseExpiredPayload(_LeaseExpiredRequired, total=False):
    """A claim handed back because its controller's lease ran out."""

    previous_instance: str


class _DispatchedRequired(TypedDict):
    recommendation: int | None
    action: str
    argv: list[str]
    sequence: int


class DispatchedPayload(_DispatchedRequired, total=False):
    """A scheduler command its controller (or the watchdog) is about to run, recorded before it
    runs.

    ``sequence`` numbers the commands of one controller's handling of a claim from 1, or of one
    watchdog release; the watchdog's have no recommendation (``action``: ``watchdog_release``)
    and no ``controller_instance``, the id of the controller process that dispatched it. A
    restart's also carry ``step_reached``, the job's last progress step, where it is known.
    """

    controller_instance: str
    step_reached: int


class _ReportRequired(TypedDict):
    recommendation: int
    action: str
    excluded_nodes: list[str]
    outcome: str
    state_before: dict[str, Any]
    commands: list[dict[str, Any]]
    converged: bool | None
    detail: str


class ReportPayload(_ReportRequired, total=False):
    """What a controller reports it did (executed, skipped, failed, to be retried), and which
    controller process said so."""

    controller_instance: str


class ReportRefusedPayload(ReportPayload):
    """A report from a controller that does not hold the lease, kept with why it was refused."""

    refused: str


class _ExpiredRequired(TypedDict):
    recommendation: int
    action: str
    expires_at: str | None
    reason: str


class ExpiredPayload(_ExpiredRequired, total=False):
    """A ready recommendation nobody executed before its deadline (``recovery.loop.watchdog``);
    ``abandoned`` when an operator had approved it (events before it was recorded lack it)."""

    abandoned: bool


class WatchdogReleasedPayload(TypedDict):
    """A job held for a decision past its timeout, released (``recovery.loop.watchdog``)."""

    held_since: str
    held_seconds: float
    decision_timeout_seconds: int
    hold_reason: str
    excluded_nodes: list[str]
    command: dict[str, Any]
    commands: list[dict[str, Any]]


# --- the scheduler and the job's own progress ----------------------------------------------


# Keyed "from" in the trail, which no class attribute can be called.
_StateChangedRequired = TypedDict("_StateChangedRequired", {"from": str, "to": str, "reason": str})


class StateChangedPayload(_StateChangedRequired, total=False):
    """The scheduler's state of a job changed (``recovery.loop.poll``).

    A job the scheduler no longer lists has only ``from``, ``to`` and ``reason``.
    """

    scheduler_state: str | None
    restart_count: int
    nodes: list[str]


class RestartAllocatedPayload(TypedDict):
    """A restarted job runs again, on these nodes (``recovery.loop.poll``)."""

    nodes: list[str]
    excluded_nodes: list[str] | None


class TrainingCompletedPayload(TypedDict):
    """A job ended successfully (``recovery.loop.poll``)."""

    exit_code: int | None


class ProgressResumedPayload(TypedDict):
    """The first step an attempt after the first reported (``recovery.loop.progress``)."""

    step: int


class CheckpointSavedPayload(TypedDict):
    """A checkpoint the job finished writing (``recovery.loop.progress``)."""

    step: int | None
    path: str


class _SchedulerHookRequired(TypedDict):
    source: str
    event: str
    key: str
    state: str
    note: str


class SchedulerHookPayload(_SchedulerHookRequired, total=False):
    """A site's scheduler hook said a job ended or a node went down
    (``recovery.loop.scheduler_hooks``).

    ``job_ended`` carries the job's keys, ``node_down`` the node's.
    """

    job_id: str
    exit_code: int | None
    exit_code_text: str
    nodes: list[str]
    restart_count: int | None
    node: str
    reason: str


class InputIgnoredPayload(TypedDict):
    """A job's output file the poller did not read, and why (``recovery.loop.logs``).

    ``reason`` is an ``OutputRefusal`` value; ``detail`` says what broke the rule.
    """

    path: str
    reason: str
    detail: str


# --- people changing what a cluster may do -------------------------------------------------

# Keyed "from", like StateChangedPayload. A cluster created with a value other than a new
# cluster's default records the change from that default (``recovery.audit.cluster_controls``).
# ``reason``: what the person said when the Console asked them why (admin asks nothing).
_ModeChangedRequired = TypedDict("_ModeChangedRequired", {"from": str, "to": str})


class ModeChangedPayload(_ModeChangedRequired, total=False):
    reason: str


_FlagChangedRequired = TypedDict("_FlagChangedRequired", {"from": bool, "to": bool})


class AcknowledgementChangedPayload(_FlagChangedRequired, total=False):
    reason: str


class AutomaticDrainChangedPayload(_FlagChangedRequired, total=False):
    reason: str


# The canary before and after: {"partitions": [...], "share_percent": N}.
_ActionScopeChangedRequired = TypedDict(
    "_ActionScopeChangedRequired", {"from": dict[str, Any], "to": dict[str, Any]}
)


class ActionScopeChangedPayload(_ActionScopeChangedRequired, total=False):
    reason: str


class _PatternTaughtRequired(TypedDict):
    pattern_id: int
    name: str
    pattern: str
    category: str
    attribution: str
    anomaly: int
    line: str


class PatternTaughtPayload(_PatternTaughtRequired, total=False):
    """An operator taught a detection pattern from a line of an unexplained failure
    (``recovery.loop.teaching``). ``changed_cases`` are the labelled cases whose verdict the
    preview showed it changes; ``also_matches`` the other unexplained failures it matches."""

    printed_by: str
    changed_cases: list[str]
    also_matches: list[int]


class StoppedPayload(TypedDict):
    """A stop took hold: the job ended and recovery will not restart it
    (``recovery.loop.recommendations.report``). ``stop_reason`` is a ``StopReason``."""

    recommendation: int
    stop_reason: str
    reason: str


PAYLOADS: dict[str, type] = {
    "detected": DetectedAgainPayload,
    "confirmed": SettledPayload,
    "survived": SettledPayload,
    "stalled": SettledPayload,
    "attributed": AttributedPayload,
    "recommended": RecommendedPayload,
    "approved": DecisionPayload,
    "rejected": DecisionPayload,
    "abandonment_acknowledged": AbandonmentAcknowledgedPayload,
    "superseded": SupersededPayload,
    "expired": ExpiredPayload,
    "claimed": ClaimedPayload,
    "lease_expired": LeaseExpiredPayload,
    "dispatched": DispatchedPayload,
    "scheduler_action": ReportPayload,
    "action_skipped": ReportPayload,
    "action_failed": ReportPayload,
    "action_retry": ReportPayload,
    "report_refused": ReportRefusedPayload,
    "watchdog_released": WatchdogReleasedPayload,
    "state_changed": StateChangedPayload,
    "restart_allocated": RestartAllocatedPayload,
    "progress_resumed": ProgressResumedPayload,
    "checkpoint_saved": CheckpointSavedPayload,
    "training_completed": TrainingCompletedPayload,
    "stopped": StoppedPayload,
    "input_ignored": InputIgnoredPayload,
    "node_suspect": NodeSuspectPayload,
    "node_returned": NodeReturnedPayload,
    "policy_failed": PolicyFailedPayload,
    "attribution_degraded": AttributionDegradedPayload,
    "anomalies_folded": AnomaliesFoldedPayload,
    "scheduler_hook": SchedulerHookPayload,
    "mode_changed": ModeChangedPayload,
    "acknowledgement_changed": AcknowledgementChangedPayload,
    "automatic_drain_changed": AutomaticDrainChangedPayload,
    "action_scope_changed": ActionScopeChangedPayload,
    "drain_withheld": DrainWithheldPayload,
    "drain_refused": DrainRefusedPayload,
    "pattern_taught": PatternTaughtPayload,
}


def payload_problems(kind: str, payload: Mapping[str, Any]) -> list[str]:
    """What is wrong with ``payload`` for an event of ``kind``; empty when nothing is.

    Checks that the kind is known, that every required key is there, that no key is unexpected
    and that each value has its declared basic type (``int``, ``float``, ``str``, ``bool``,
    list, mapping, or ``None`` where allowed). Element types inside lists are not checked.
    """
    declared = PAYLOADS.get(str(kind))
    if declared is None:
        return [f"unknown audit kind {kind!r}"]
    hints = typing.get_type_hints(declared)
    required: frozenset[str] = declared.__required_keys__  # type: ignore[attr-defined]
    problems = [f"{kind}: missing key {key!r}" for key in sorted(required - payload.keys())]
    problems += [f"{kind}: unexpected key {key!r}" for key in sorted(payload.keys() - hints)]
    for key in sorted(payload.keys() & hints.keys()):
        value = payload[key]
        if not _has_type(value, hints[key]):
            problems.append(
                f"{kind}: {key!r} is {type(value).__name__}, expected {_shown(hints[key])}"
            )
    return problems


def _has_type(value: object, hint: Any) -> bool:
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return any(_has_type(value, option) for option in typing.get_args(hint))
    if hint is None or hint is type(None):
        return value is None
    if hint is Any:
        return True
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if hint is str:
        return isinstance(value, str)
    if origin is list or hint is list:
        return isinstance(value, list)
    if origin is dict or hint is dict or typing.is_typeddict(hint):
        return isinstance(value, Mapping)
    raise TypeError(f"no check for the payload type {hint!r}")


def _shown(hint: Any) -> str:
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return " or ".join(_shown(option) for option in typing.get_args(hint))
    if hint is type(None):
        return "None"
    origin = typing.get_origin(hint) or hint
    return getattr(origin, "__name__", str(hint))
