from __future__ import annotations

from datetime import timedelta

import factory
from django.utils import timezone

from recovery.choices import (
    AnomalyKind,
    Attribution,
    FailureCategory,
    RecommendationAction,
    RecommendationStatus,
    WorkloadState,
)
from recovery.models import Anomaly, Attempt, Cluster, Recommendation, Workload


class ClusterFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Cluster

    name = factory.Sequence(lambda n: f"cluster-{n}")


class WorkloadFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Workload

    cluster = factory.SubFactory(ClusterFactory)
    job_id = factory.Sequence(lambda n: str(40000 + n))
    submit_time = factory.LazyFunction(lambda: timezone.now() - timedelta(hours=2))
    name = factory.Sequence(lambda n: f"pretrain-{n}")
    user = "alice"
    partition = "gpu"
    opted_in = True
    state = WorkloadState.RUNNING
    current_attempt = 1


class AttemptFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Attempt

    workload = factory.SubFactory(WorkloadFactory)
    number = 1
    nodes = factory.LazyFunction(lambda: ["gpu-001", "gpu-002"])
    started_at = factory.LazyFunction(timezone.now)


class AnomalyFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Anomaly

    workload = factory.SubFactory(WorkloadFactory)
    kind = AnomalyKind.CRASH
    category = FailureCategory.GPU_HARDWARE
    attribution = Attribution.HARDWARE
    evidence_line = "NVRM: Xid (PCI:0000:3b:00): 79, pid=2231, GPU has fallen off the bus."
    implicated_nodes = factory.LazyFunction(lambda: ["gpu-002"])
    fingerprint = factory.Sequence(lambda n: f"fp-{n}")
    evidence_at = factory.LazyFunction(lambda: timezone.now() - timedelta(seconds=5))


class RecommendationFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Recommendation

    workload = factory.SubFactory(WorkloadFactory)
    action = RecommendationAction.RESTART_EXCLUDING
    excluded_nodes = factory.LazyFunction(lambda: ["gpu-002"])
    reason = "Xid 79 on gpu-002: GPU fell off the bus"
    status = RecommendationStatus.AWAITING_APPROVAL
    idempotency_key = factory.Sequence(lambda n: f"test:{n}")
