"""Detectors that run on what a poll learnt besides new log lines.

* The scheduler's word on how an attempt ended (NODE_FAIL, OUT_OF_MEMORY, TIMEOUT, a bare
  FAILED) and on its nodes (DOWN, FAIL, not responding, drained with a reason).
* The progress each rank and node reported: a hang (no step for longer than the job's own pace
  allows) and a straggler (one node sustainedly slower than its peers).

* The crashes read from logs that are still suspected: confirmed, survived or stalled
  (``recovery.loop.confirmation``).

Each becomes an anomaly through the same path as a log finding, so attribution, the policy and
the audit trail treat every signal family alike. All of it is level-triggered: the fingerprint
of each finding makes a repeated poll record nothing twice.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any, NamedTuple

from django.db import transaction

from recovery.choices import (
    Attribution,
    Confirmation,
    EvidenceSource,
    FailureCategory,
    NodeHealth,
    WorkloadState,
)
from recovery.detection.facts import finding_from_job_ending, node_state_finding
from recovery.detection.findings import Finding
from recovery.detection.hang import ProgressObservation, check_hang
from recovery.detection.quiet_phases import CHECKPOINT
from recovery.detection.signatures.base import SignatureRole
from recovery.detection.straggler import (
    StragglerPolicy,
    ThroughputObservation,
    detect_stragglers,
)
from recovery.detection.taxonomy import NO_CATEGORY
from recovery.detection.trends import (
    TrendPolicy,
    TrendSample,
    detect_loss_spike,
    detect_throughput_collapse,
)
from recovery.loop.anomalies import record_anomalies
from recovery.loop.confirmation import apply, hang_policy, settle, suspects_of
from recovery.loop.decision_facts import UNCONFIRMED
from recovery.loop.logs import OnNode, attempts_by_node
from recovery.loop.policy import DECISION_HORIZON, decide_when_ready, policy_for
from recovery.models import Anomaly, Attempt, Cluster, Node, Policy, ProgressSample, Workload
from recovery.schedulers.base import JobInfo, is_recovery_drain
from recovery.schedulers.phase import TELLING_ENDINGS, Phase
from recovery.schedulers.slurm_phase import slurm_phase

_PHASES = frozenset(phase.value for phase in Phase)

MAX_SAMPLES = 2000
SAMPLE_LOOK_BACK_SECONDS = 1800.0


def straggler_policy(policy: Policy) -> StragglerPolicy:
    window = policy.straggler_window_minutes * 60.0
    return StragglerPolicy(
        threshold_percent=policy.straggler_threshold_percent,
        window_seconds=window,
        baseline_seconds=3 * window,
    )


@dataclasses.dataclass(frozen=True)
class SchedulerEnding:
    """What the scheduler said when it ended an attempt, as ``Attempt.ending_to_judge`` keeps it:
    the phase the loop judges, and the scheduler's own word for people to read."""

    phase: Phase
    native_state: str
    exit_code: int | None = None
    exit_signal: int | None = None
    reason: str = ""
    end_time: datetime | None = None

    @classmethod
    def of(cls, job: JobInfo) -> SchedulerEnding:
        # The poller keeps endings only of the jobs it synced, and syncs none of unknown state.
        assert job.phase is not None and job.native_state is not None
        return cls(
            job.phase, job.native_state, job.exit_code, job.exit_signal, job.reason, job.end_time
        )

    def to_json(self) -> dict[str, object]:
        return {
            "phase": str(self.phase),
            "state": self.native_state,
            "exit_code": self.exit_code,
            "exit_signal": self.exit_signal,
            "reason": self.reason,
            "end_time": self.end_time.isoformat() if self.end_time else None,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> SchedulerEnding:
        end_time = data.get("end_time")
        native_state = str(data.get("state") or "")
        phase = data.get("phase")
        return cls(
            # Endings kept before phases existed are all Slurm's (or the simulated Slurm's).
            phase=Phase(phase) if phase in _PHASES else slurm_phase(native_state) or Phase.UNKNOWN,
            native_state=native_state,
            exit_code=data.get("exit_code"),
            exit_signal=data.get("exit_signal"),
            reason=str(data.get("reason") or ""),
            end_time=datetime.fromisoformat(end_time) if end_time else None,
        )


def check_job_ending(
    workload: Workload,
    attempt: Attempt,
    job: SchedulerEnding,
    now: datetime,
    output_tail: Callable[[], list[str]] | None = None,
) -> list[Anomaly]:
    """Record what the scheduler says about an attempt that ended abnormally.

    A bare FAILED that nothing the attempt showed explains (no finding from its logs, its
    nodes' kernel logs or GPU metrics) is recorded as ``unexplained``, with the last lines the
    job printed (``output_tail``, read only then) for a person to teach a pattern from. It is
    decided as any uncategorised FAILED: the category names what is missing, not a cause.
    """
    # Implicate only the nodes the scheduler took out, not a whole allocation that ended.
    out = {
        node.name
        for node in Node.objects.filter(cluster=workload.cluster, name__in=attempt.nodes)
        if node.health == NodeHealth.UNHEALTHY or out_of_service(node.scheduler_state)
    }
    finding = finding_from_job_ending(
        job.phase,
        native_state=job.native_state,
        exit_code=job.exit_code,
        signal=job.exit_signal,
        reason=job.reason,
        nodes=sorted(out),
        at=job.end_time or now,
    )
    if finding is None:
        return []
    if job.phase not in TELLING_ENDINGS:
        said = Anomaly.objects.filter(workload=workload, attempt=attempt).exclude(
            confirmation__in=UNCONFIRMED - {Confirmation.SUSPECTED}
        )
        if said.exists():
            return []  # the logs already said more than "it failed" (unless it was survived)
        finding.detail.setdefault("role", SignatureRole.WRAPPER)
        if finding.category == NO_CATEGORY:
            finding.category = FailureCategory.UNEXPLAINED
            finding.detail["last_lines"] = output_tail() if output_tail is not None else []
    finding.detail.setdefault("role", SignatureRole.CAUSE)
    finding.detail.update(
        {"state": job.native_state, "exit_code": job.exit_code, "reason": job.reason}
    )
    return record_anomalies(
        workload, attempt, [finding], now, scope="scheduler", source=EvidenceSource.SCHEDULER
    )


def check_node(
    cluster: Cluster, node: Node, now: datetime, on_nodes: dict[str, list[OnNode]] | None = None
) -> list[Anomaly]:
    """Tie a node the scheduler took out of service to the workloads that ran on it.

    DOWN and FAIL (the node is gone) are evidence for the workloads running there and for
    attempts that ended on it moments ago. A node that stops responding while a workload on it
    is already failing is the likely cause of that failure. A drained node is evidence only for
    attempts that ended on it, and only when the reason names a component: an operator draining
    a node for maintenance does not make the jobs on it fail.

    ``on_nodes`` is ``attempts_by_node`` of the cluster, when the caller checks several nodes.
    """
    state = node.scheduler_state
    tokens = {part.strip().lower().rstrip("*~#!%$@^-") for part in state.split("+")}
    not_responding = "*" in state or "not_responding" in tokens
    gone = bool(tokens & {"down", "fail", "failing"})
    if is_recovery_drain(node.state_reason) and not (gone or not_responding):
        return []  # recovery's own drain repeats a verdict already recorded: no new evidence
    finding = node_state_finding(node.name, state, node.state_reason, at=now)
    if finding is None and not_responding:
        finding = node_state_finding(node.name, "DOWN", node.state_reason or "Not responding")
    if finding is None:
        return []
    hardware = finding.attribution == Attribution.HARDWARE and (gone or not_responding)
    if hardware and node.health != NodeHealth.UNHEALTHY:
        node.health = NodeHealth.UNHEALTHY
        node.last_implicated_at = now
        node.save(update_fields=["health", "last_implicated_at", "updated_at"])
    created: list[Anomaly] = []
    if on_nodes is None:
        on_nodes = attempts_by_node(cluster, now)
    for workload, attempt, running in on_nodes.get(node.name, []):
        if not gone:
            undecided = Anomaly.objects.filter(
                workload=workload, attempt=attempt, decided_at__isnull=True
            ).exists()
            if not_responding and not undecided:
                continue
            if not not_responding and (running or finding.attribution == Attribution.UNKNOWN):
                continue
        node_finding = dataclasses.replace(
            finding, nodes=[node.name], detail={**finding.detail, "role": SignatureRole.CAUSE}
        )
        created += record_anomalies(
            workload,
            attempt,
            [node_finding],
            now,
            scope=f"node:{node.name}",
            source=EvidenceSource.SCHEDULER,
        )
    if created:
        Node.objects.filter(pk=node.pk).update(
            times_implicated=node.times_implicated + 1, last_implicated_at=now
        )
    return created


class _Sample(NamedTuple):
    at: datetime
    step: int
    rank: int | None
    node: str
    attempt: int
    throughput: float | None
    loss: float | None


def trend_policy(policy: Policy) -> TrendPolicy:
    window = policy.straggler_window_minutes * 60.0
    return TrendPolicy(
        loss_spike_factor=policy.loss_spike_factor,
        throughput_collapse_percent=policy.throughput_collapse_percent,
        window_seconds=window,
        baseline_seconds=3 * window,
    )


def _check_trends(
    workload: Workload, attempt: Attempt, samples: list[_Sample], policy: Policy, now: datetime
) -> list[Anomaly]:
    """A loss that jumped and stayed up, a whole job slower than it was: this attempt only."""
    current = [
        TrendSample(
            at=s.at,
            step=s.step,
            loss=s.loss,
            throughput=s.throughput,
            node=s.node or None,
            rank=s.rank,
        )
        for s in samples
        if s.attempt == attempt.number
    ]
    trends = trend_policy(policy)
    found = [
        finding
        for finding in (
            detect_loss_spike(current, now=now, policy=trends),
            detect_throughput_collapse(current, now=now, policy=trends),
        )
        if finding is not None
    ]
    created: list[Anomaly] = []
    for finding in found:
        created += record_anomalies(
            workload,
            attempt,
            [finding],
            now,
            scope=f"trend:{finding.signature}",
            source=EvidenceSource.PROGRESS,
        )
    return created


def check_progress(workload: Workload, now: datetime) -> list[Anomaly]:
    """Hang and straggler checks on a running workload's recent progress samples."""
    return run_progress_check(workload, now).created


@dataclasses.dataclass(frozen=True)
class ProgressCheck:
    created: list[Anomaly]
    # When a check could find more than this one if no more progress came: a hang found, or
    # a slowdown judged once the attempt has run a whole window (None: nothing can be found,
    # the workload is not running or its attempt has not started). Until then, with nothing
    # new read, a check finds what this one found.
    recheck_at: datetime | None = None


def run_progress_check(workload: Workload, now: datetime) -> ProgressCheck:
    """``check_progress``, with when a check is next due if nothing new is read."""
    if workload.state != WorkloadState.RUNNING or not workload.current_attempt:
        return ProgressCheck([])
    attempt = Attempt.objects.filter(workload=workload, number=workload.current_attempt).first()
    if attempt is None or attempt.started_at is None:
        return ProgressCheck([])
    policy = policy_for(workload)
    # The longest look back any check needs: the straggler window and its baseline, the hang
    # allowance (its floor, or many median steps of a slow job).
    window = straggler_policy(policy)
    look_back = max(
        window.window_seconds + window.baseline_seconds,
        4 * hang_policy(policy).floor_seconds,
        SAMPLE_LOOK_BACK_SECONDS,
    )
    # Plain rows, not model instances: up to two thousand of them per check.
    samples = [
        _Sample(*row)
        for row in ProgressSample.objects.filter(
            workload=workload, at__gte=now - timedelta(seconds=look_back)
        )
        .order_by("-at", "-id")
        .values_list("at", "step", "rank", "node", "attempt", "throughput", "loss")[:MAX_SAMPLES]
    ]
    samples.reverse()
    created: list[Anomaly] = []
    observations = [
        ProgressObservation(at=s.at, step=s.step, rank=s.rank, node=s.node or None) for s in samples
    ]
    saving_since = workload.quiet_phase_at if workload.quiet_phase == CHECKPOINT else None
    hang, due = check_hang(
        observations,
        now=now,
        started_at=attempt.started_at,
        policy=hang_policy(policy),
        checkpoint_started_at=saving_since,
        checkpoint_finished_at=workload.last_checkpoint_at,
    )
    if hang is not None:
        created += record_anomalies(
            workload, attempt, [_hang_evidence_time(hang)], now, source=EvidenceSource.PROGRESS
        )
    created += _check_trends(workload, attempt, samples, policy, now)
    current = [s for s in samples if s.attempt == attempt.number and s.throughput]
    if not current or current[0].at > now - timedelta(seconds=window.window_seconds):
        # A slowdown is judged only once the attempt has run a whole window.
        if current:
            due = min(due, current[0].at + timedelta(seconds=window.window_seconds))
        return ProgressCheck(created, due)
    for finding in detect_stragglers(
        [
            ThroughputObservation(at=s.at, value=s.throughput, node=s.node or None, rank=s.rank)
            for s in current
            if s.throughput is not None
        ],
        now=now,
        policy=straggler_policy(policy),
    ):
        member = ",".join(finding.nodes) or ",".join(map(str, finding.ranks))
        created += record_anomalies(
            workload,
            attempt,
            [finding],
            now,
            scope=f"straggler:{member}",
            source=EvidenceSource.PROGRESS,
        )
    return ProgressCheck(created, due)


def check_suspects(cluster: Cluster, now: datetime) -> list[Anomaly]:
    """Settle the cluster's suspected crashes that can be settled now; returns new anomalies.

    A confirmed crash is decided at once; a stalled one becomes the hang it is.
    """
    created: list[Anomaly] = []
    for suspect in suspects_of(cluster.pk, now - DECISION_HORIZON):
        with transaction.atomic():
            settlement = settle(suspect, policy_for(suspect.workload), now)
            if settlement is None or not apply(suspect, settlement, now):
                continue
            if settlement.stall is not None:
                created += record_anomalies(
                    suspect.workload,
                    suspect.attempt,
                    [settlement.stall],
                    now,
                    scope="stall",
                    source=EvidenceSource.PROGRESS,
                )
            decide_when_ready(suspect, now)
    return created


def _hang_evidence_time(finding: Finding) -> Finding:
    """A hang's evidence is the moment the silence became longer than allowed."""
    silent = float(finding.detail.get("silent_seconds") or 0)
    allowed = float(finding.detail.get("allowed_seconds") or 0)
    at = finding.at
    if at is not None and silent > allowed:
        at = at - timedelta(seconds=silent - allowed)
    return dataclasses.replace(
        finding, at=at, detail={**finding.detail, "role": SignatureRole.CAUSE}
    )


# Slurm's words for a node out of service; a trailing "*" means it does not respond.
OUT_OF_SERVICE_WORDS = ("down", "drain", "fail", "not_responding")


def out_of_service(state: str) -> bool:
    """Down, drained, failing or not responding, in any of Slurm's spellings."""
    lowered = state.lower()
    return "*" in lowered or any(word in lowered for word in OUT_OF_SERVICE_WORDS)
