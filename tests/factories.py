"""factory_boy factories for the models, typed so that ``ClusterFactory()`` is a ``Cluster``."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, TypeVar

import factory
from django.db.models import Model
from django.utils import timezone
from factory.declarations import LazyAttribute, LazyFunction, Sequence, SubFactory

from recovery.choices import (
    AnomalyKind,
    Attribution,
    EvidenceSource,
    FailureCategory,
    OptInMode,
    RecommendationAction,
    RecommendationStatus,
    WorkloadState,
)
from recovery.detection.findings import Finding
from recovery.loop.anomalies import record_anomalies
from recovery.models import Anomaly, Attempt, Cluster, Recommendation, Workload

ModelT = TypeVar("ModelT", bound=Model)


class ModelFactory(factory.django.DjangoModelFactory[ModelT]):
    """factory_boy leaves ``Factory()`` unannotated; calling one returns the model it builds."""

    class Meta:
        abstract = True

    if TYPE_CHECKING:

        def __new__(cls, *args: Any, **kwargs: Any) -> ModelT:  # type: ignore[misc]
            ...


class ClusterFactory(ModelFactory[Cluster]):
    class Meta:
        model = Cluster

    name = Sequence(lambda n: f"cluster-{n}")


class WorkloadFactory(ModelFactory[Workload]):
    class Meta:
        model = Workload

    cluster = SubFactory(ClusterFactory)
    job_id = Sequence(lambda n: str(40000 + n))
    submit_time = LazyFunction(lambda: timezone.now() - timedelta(hours=2))
    name = Sequence(lambda n: f"pretrain-{n}")
    user = "alice"
    partition = "gpu"
    opted_in = True
    # Opted in with "mode": "act", as tests.fakes.COMMENT: the cluster's mode decides.
    opt_in_mode = OptInMode.ACT
    state = WorkloadState.RUNNING
    current_attempt = 1


class AttemptFactory(ModelFactory[Attempt]):
    class Meta:
        model = Attempt

    workload = SubFactory(WorkloadFactory)
    number = 1
    nodes = LazyFunction(lambda: ["gpu-001", "gpu-002"])
    started_at = LazyFunction(timezone.now)


class AnomalyFactory(ModelFactory[Anomaly]):
    class Meta:
        model = Anomaly

    workload = SubFactory(WorkloadFactory)
    kind = AnomalyKind.CRASH
    category = FailureCategory.GPU_HARDWARE
    attribution = Attribution.HARDWARE
    evidence_line = "NVRM: Xid (PCI:0000:3b:00): 79, pid=2231, GPU has fallen off the bus."
    implicated_nodes = LazyFunction(lambda: ["gpu-002"])
    fingerprint = Sequence(lambda n: f"fp-{n}")
    evidence_at = LazyFunction(lambda: timezone.now() - timedelta(seconds=5))


class RecommendationFactory(ModelFactory[Recommendation]):
    class Meta:
        model = Recommendation

    workload = SubFactory(WorkloadFactory)
    action = RecommendationAction.RESTART_EXCLUDING
    excluded_nodes = LazyFunction(lambda: ["gpu-002"])
    reason = "Xid 79 on gpu-002: GPU fell off the bus"
    status = RecommendationStatus.AWAITING_APPROVAL
    # The factory's clusters are in monitor mode, where only an operator's approval makes a
    # recommendation ready: one created ready, or further along, was approved.
    approved_by = LazyAttribute(
        lambda recommendation: (
            ""
            if recommendation.status
            in {RecommendationStatus.PROPOSED, RecommendationStatus.AWAITING_APPROVAL}
            else "otto"
        )
    )
    idempotency_key = Sequence(lambda n: f"test:{n}")


def xid_79(node: str) -> Finding:
    """Xid 79 (the GPU fell off the bus) on ``node``: a crash blamed on the node's hardware."""
    return Finding(
        kind="crash",
        category="gpu_hardware",
        attribution="hardware",
        severity="fatal",
        signature="xid-79",
        evidence="NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, GPU has fallen off the bus.",
        nodes=[node],
        detail={"role": "cause", "xid": 79},
    )


def kernel_log_blames(cluster: Cluster, node: str, *, partition: str = "gpu") -> Workload:
    """Xid 79 in ``node``'s kernel log, for another job on it each call: a drain is due."""
    workload = Workload.objects.create(
        cluster=cluster,
        job_id=str(990001 + Workload.objects.count()),
        submit_time=timezone.now(),
        user="alice",
        partition=partition,
        opted_in=True,
        current_attempt=1,
    )
    attempt = Attempt.objects.create(workload=workload, number=1, nodes=[node])
    record_anomalies(
        workload,
        attempt,
        [xid_79(node)],
        timezone.now(),
        scope=f"kernel:{node}",
        source=EvidenceSource.KERNEL_LOG,
    )
    return workload


# What a controller and operators record of the loop's actions, at given times: what
# ``recovery.read.precision`` judges them by.
def _recorded(
    cluster: Cluster, kind: str, actor: str, payload: dict[str, Any], **where: Any
) -> None:
    """One audit event with the payload its kind declares (``recovery.audit.payloads``)."""
    from recovery.audit.payloads import payload_problems
    from recovery.audit.record import record_event

    assert payload_problems(kind, payload) == []
    record_event(cluster=cluster, kind=kind, actor=actor, payload=payload, **where)


def carried_out(
    recommendation: Recommendation,
    at: datetime,
    *,
    step_reached: int | None = None,
    controller: str = "controller:c1",
) -> Recommendation:
    """A controller ran ``recommendation`` at ``at``, as the loop records it: its command's
    ``dispatched`` event (with the step the job had reached, for a restart) a few seconds
    before, then ``scheduler_action``; the row executed."""
    from recovery.choices import AuditKind

    workload = recommendation.workload
    attempt = workload.current_attempt or None
    dispatched: dict[str, Any] = {
        "recommendation": recommendation.pk,
        "action": recommendation.action,
        "argv": ["scontrol", "requeuehold", workload.job_id],
        "sequence": 1,
        "controller_instance": "i-1",
    }
    if step_reached is not None:
        dispatched["step_reached"] = step_reached
    where = {"workload": workload, "attempt": attempt}
    _recorded(
        workload.cluster,
        AuditKind.DISPATCHED,
        controller,
        dispatched,
        occurred_at=at - timedelta(seconds=5),
        **where,
    )
    outcome = {"outcome": RecommendationStatus.EXECUTED, "state_before": {}, "commands": []}
    _recorded(
        workload.cluster,
        AuditKind.SCHEDULER_ACTION,
        controller,
        {
            "recommendation": recommendation.pk,
            "action": recommendation.action,
            "excluded_nodes": recommendation.excluded_nodes,
            **outcome,
            "converged": True,
            "detail": "",
            "controller_instance": "i-1",
        },
        occurred_at=at,
        **where,
    )
    Recommendation.objects.filter(pk=recommendation.pk).update(
        status=RecommendationStatus.EXECUTED, result=outcome
    )
    recommendation.refresh_from_db()
    return recommendation


def rejected_by(
    recommendation: Recommendation, operator: str, at: datetime, note: str = ""
) -> Recommendation:
    """An operator rejected ``recommendation`` at ``at``: its ``rejected`` event; the row
    rejected."""
    from recovery.choices import AuditKind

    workload = recommendation.workload
    _recorded(
        workload.cluster,
        AuditKind.REJECTED,
        operator,
        {
            "recommendation": recommendation.pk,
            "action": recommendation.action,
            "excluded_nodes": recommendation.excluded_nodes,
            "note": note,
            **({"node": recommendation.node.name} if recommendation.node else {}),
        },
        workload=workload,
        attempt=workload.current_attempt or None,
        occurred_at=at,
    )
    Recommendation.objects.filter(pk=recommendation.pk).update(
        status=RecommendationStatus.REJECTED, decided_by=operator, decided_at=at, decision_note=note
    )
    recommendation.refresh_from_db()
    return recommendation


def progress_resumed(workload: Workload, attempt: int, step: int, at: datetime) -> None:
    """Attempt ``attempt`` of ``workload`` printed its first step, ``step``, at ``at``."""
    from recovery.audit.actors import Actor
    from recovery.choices import AuditKind

    Workload.objects.filter(pk=workload.pk).update(current_attempt=attempt)
    workload.current_attempt = attempt
    _recorded(
        workload.cluster,
        AuditKind.PROGRESS_RESUMED,
        Actor.DETECTOR,
        {"step": step},
        workload=workload,
        attempt=attempt,
        occurred_at=at,
    )


def node_returned(cluster: Cluster, node: str, operator: str, at: datetime) -> None:
    """An operator pressed "Return to service" for ``node`` at ``at`` (its ``node_returned``)."""
    from recovery.choices import AuditKind

    before = {"health": "unhealthy", "excluded_until": None, "suspect_since": None}
    _recorded(
        cluster,
        AuditKind.NODE_RETURNED,
        operator,
        {"node": node, "before": before, "note": ""},
        occurred_at=at,
    )


def resume_requested(drain: Recommendation, operator: str, at: datetime) -> None:
    """An operator asked for ``drain``'s node to be resumed in the scheduler at ``at`` (the
    ``approved`` event of the resume it makes)."""
    from recovery.choices import AuditKind

    assert drain.node is not None
    resume = RecommendationFactory(
        workload=drain.workload,
        node=drain.node,
        action=RecommendationAction.RESUME,
        excluded_nodes=[],
        status=RecommendationStatus.READY,
        decided_by=operator,
        approved_by=operator,
    )
    _recorded(
        drain.workload.cluster,
        AuditKind.APPROVED,
        operator,
        {
            "recommendation": resume.pk,
            "action": RecommendationAction.RESUME,
            "excluded_nodes": [],
            "node": drain.node.name,
            "drained_with": "workload-recovery: hardware",
            "note": "",
        },
        workload=drain.workload,
        occurred_at=at,
    )
