"""factory_boy factories for the models, typed so that ``ClusterFactory()`` is a ``Cluster``."""

from __future__ import annotations

from datetime import timedelta
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

