"""The system's own figures, for Prometheus: a ``prometheus_client`` collector, text format 0.0.4.

Every figure is an aggregate query (GROUP BY, conditional counts for histogram buckets): a
scrape runs nine queries whatever the size of the tables, and loads no row. Counters and
histograms count over the whole tables, so they only grow, as Prometheus' ``rate()`` expects (a
deleted workload takes its anomalies with it: Prometheus reads the drop as a counter reset).
The one scan that grows with history is the anomalies' (about 110 ms for 30,000 anomalies on
MariaDB; the scrape as a whole took about 210 ms with 10,000 workloads, 20,000 recommendations
and 1,000,000 audit events, of which only an index is read).

The models are imported inside the functions that read them: the Celery app's ``task_failure``
hook (``tasks.failures``) imports this module for the key it counts in before Django is set up.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import redis
from django.conf import settings
from django.db.models import (
    Case,
    Count,
    DurationField,
    ExpressionWrapper,
    F,
    Max,
    Q,
    QuerySet,
    Sum,
    Value,
    When,
)
from django.utils import timezone
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4, generate_latest
from prometheus_client.registry import Collector, CollectorRegistry

from recovery.choices import (
    AnomalyKind,
    AuditKind,
    Confirmation,
    Disposition,
    FailureCategory,
    RecommendationStatus,
)

logger = logging.getLogger(__name__)

# Upper bounds, in seconds, of the latency histograms' buckets (+Inf is added).
LATENCY_BUCKETS_S: tuple[float, ...] = (0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600)

# One Redis hash, a field per task name: the failure counts survive worker restarts and every
# worker process adds to the same figure; the scrape reads them with one HGETALL.
TASK_FAILURES_KEY = "wr:metrics:task_failures"
REDIS_TIMEOUT_S = 1.0


# ---------------------------------------------------------------------------------------------
# The figures


@dataclass(frozen=True)
class LatencyHistogram:
    """Observations per cumulative bucket (``LATENCY_BUCKETS_S`` order), their count and sum."""

    cumulative: tuple[int, ...]
    count: int
    sum_s: float

    @classmethod
    def empty(cls) -> LatencyHistogram:
        return cls(tuple(0 for _ in LATENCY_BUCKETS_S), 0, 0.0)

    def __add__(self, other: LatencyHistogram) -> LatencyHistogram:
        return LatencyHistogram(
            tuple(a + b for a, b in zip(self.cumulative, other.cumulative, strict=True)),
            self.count + other.count,
            self.sum_s + other.sum_s,
        )


@dataclass(frozen=True)
class ClusterPoll:
    id: int
    name: str
    last_polled_at: datetime | None
    poll_failing: bool


def clusters() -> list[ClusterPoll]:
    """Every cluster with what its last poll did (one query)."""
    from recovery.models import Cluster

    rows = Cluster.objects.order_by("name").values_list(
        "pk", "name", "last_polled_at", "last_poll_error", "last_poll_error_at"
    )
    return [
        # As the Console judges it: an error older than the last success is over.
        ClusterPoll(
            pk,
            name,
            polled,
            bool(error) and (polled is None or failed is None or failed > polled),
        )
        for pk, name, polled, error, failed in rows
    ]


@dataclass(frozen=True)
class AnomalyFigures:
    """Anomalies per (cluster id, kind, category, attribution), and the detection latency
    histogram of each cluster."""

    counts: dict[tuple[int, str, str, str], int]
    detection_latency: dict[int, LatencyHistogram]


def anomaly_figures() -> AnomalyFigures:
    """Counts and detection latency (``detected_at - evidence_at``) over every anomaly.

    One scan of the table serves both: the buckets are counted per (cluster, kind, category,
    attribution), then added up per cluster. Evidence stamped after its detection (a node's
    clock ahead of ours) counts as 0 s, as in the goodput figures.
    """
    from recovery.models import Anomaly

    anomalies = Anomaly.objects.annotate(latency=_non_negative("detected_at", "evidence_at"))
    groups = _histograms(anomalies, "workload__cluster_id", "kind", "category", "attribution")
    detection: dict[int, LatencyHistogram] = {}
    for (cluster, *_), histogram in groups.items():
        detection[cluster] = detection.get(cluster, LatencyHistogram.empty()) + histogram
    counts = {
        (cluster, kind, category, attribution): histogram.count
        for (cluster, kind, category, attribution), histogram in groups.items()
    }
    return AnomalyFigures(counts=counts, detection_latency=detection)


def confirmation_figures() -> dict[tuple[int, str], LatencyHistogram]:
    """Per (cluster id, confirmation state) of crashes: the seconds from evidence to settling.

    For confirmed crashes this is the time to confirmation, which detection latency alone would
    hide: a suspect line is detected in a second, the process may be seen to end later.
    """
    from recovery.models import Anomaly

    settled = Anomaly.objects.filter(
        kind=AnomalyKind.CRASH, confirmation_at__isnull=False
    ).annotate(latency=_non_negative("confirmation_at", "evidence_at"))
    return _histograms(settled, "workload__cluster_id", "confirmation")


def action_latency_by_cluster() -> dict[int, LatencyHistogram]:
    """Per cluster id, from an anomaly's detection to the scheduler action that answered it.

    Read from executed recommendations: executed is final, so ``updated_at`` is the time the
    controller reported the action done (the ``scheduler_action`` audit event is written in the
    same transaction). Recommendations without an anomaly (made by an operator) are left out.
    """
    from recovery.models import Recommendation

    executed = Recommendation.objects.filter(
        status=RecommendationStatus.EXECUTED, anomaly__isnull=False
    ).annotate(latency=_non_negative("updated_at", "anomaly__detected_at"))
    return {
        cluster: histogram
        for (cluster,), histogram in _histograms(executed, "workload__cluster_id").items()
    }


def _non_negative(end: str, start: str) -> Case:
    """``end - start`` of two datetime fields, 0 when ``start`` comes after ``end``."""
    return Case(
        When(**{f"{start}__gt": F(end)}, then=Value(timedelta(0))),
        default=ExpressionWrapper(F(end) - F(start), output_field=DurationField()),
        output_field=DurationField(),
    )


def _histograms(rows: QuerySet[Any], *group_by: str) -> dict[tuple[Any, ...], LatencyHistogram]:
    """Bucket counts of the ``latency`` annotation of ``rows``, per values of ``group_by``."""
    buckets = {
        f"le_{index}": Count("pk", filter=Q(latency__lte=timedelta(seconds=bound)))
        for index, bound in enumerate(LATENCY_BUCKETS_S)
    }
    aggregated = (
        rows.order_by()
        .values(*group_by)
        .annotate(observations=Count("pk"), total=Sum("latency"), **buckets)
    )
    return {
        tuple(row[name] for name in group_by): LatencyHistogram(
            cumulative=tuple(row[f"le_{i}"] for i in range(len(LATENCY_BUCKETS_S))),
            count=row["observations"],
            sum_s=(row["total"] or timedelta(0)).total_seconds(),
        )
        for row in aggregated
    }


@dataclass(frozen=True)
class RecommendationCounts:
    by_status: dict[tuple[int, str], int]
    # Per (cluster id, disposition, acknowledged), of those a controller took up.
    by_disposition: dict[tuple[int, str, bool], int]


def recommendation_counts() -> RecommendationCounts:
    """Recommendations per cluster by status and by disposition, now, in one query."""
    from recovery.models import Recommendation

    rows = (
        Recommendation.objects.order_by()
        .values_list("workload__cluster_id", "status", "disposition")
        .annotate(n=Count("pk"), acknowledged=Count("acknowledged_at"))
    )
    counts = RecommendationCounts({}, {})
    for cluster, status, disposition, n, acknowledged in rows:
        counts.by_status[(cluster, status)] = counts.by_status.get((cluster, status), 0) + n
        if disposition:
            for key, value in (
                ((cluster, disposition, True), acknowledged),
                ((cluster, disposition, False), n - acknowledged),
            ):
                counts.by_disposition[key] = counts.by_disposition.get(key, 0) + value
    return counts


# The audit events that say something failed, each counted over the whole trail as a counter:
# kind → (metric name, help).
FAILURE_EVENT_COUNTERS = {
    AuditKind.POLICY_FAILED: (
        "wr_policy_failures_total",
        "Times the policy engine failed on an anomaly (policy_failed audit events, all clusters).",
    ),
    AuditKind.ACTION_FAILED: (
        "wr_action_failures_total",
        "Scheduler actions a controller reported as failed (action_failed audit events, all "
        'clusters; per cluster: wr_recommendations{status="failed"}).',
    ),
    AuditKind.ACTION_RETRY: (
        "wr_action_retries_total",
        "Actions a controller gave back to be continued from the scheduler's state (a read "
        "failed, a fact was unknown, or the action was cut off half done; action_retry events).",
    ),
    AuditKind.REPORT_REFUSED: (
        "wr_reports_refused_total",
        "Controller reports refused because another controller held the lease "
        "(report_refused events).",
    ),
}
FAILURE_EVENT_KINDS = tuple(FAILURE_EVENT_COUNTERS)


def failure_event_counts() -> dict[str, int]:
    """Audit events of ``FAILURE_EVENT_KINDS``, per kind, over the whole trail.

    Not split per cluster on purpose: counted per kind alone, the query reads only the (kind,
    occurred_at) index; per cluster it would fetch every matching row of the million-row table.
    The failed actions of a cluster are ``wr_recommendations{status="failed"}``.
    """
    from recovery.models import AuditEvent

    rows = (
        AuditEvent.objects.filter(kind__in=FAILURE_EVENT_KINDS)
        .order_by()
        .values_list("kind")
        .annotate(n=Count("pk"))
    )
    return dict(rows)


def last_log_reads() -> dict[tuple[int, str], datetime]:
    """When each cluster's logs were last read, per (cluster id, source).

    Ingestion saves a log cursor on every pass, moved or not, so the newest cursor of a cluster
    is the last time anything of it was read. Sources: ``job_output`` (workloads' output files)
    and ``node_log`` (nodes' kernel logs).
    """
    from recovery.models import LogCursor, NodeLogCursor

    reads: dict[tuple[int, str], datetime] = {}
    for source, cursors, cluster_field in (
        ("job_output", LogCursor.objects, "workload__cluster_id"),
        ("node_log", NodeLogCursor.objects, "node__cluster_id"),
    ):
        rows = cursors.order_by().values_list(cluster_field).annotate(last=Max("updated_at"))
        reads.update({(cluster, source): last for cluster, last in rows if last is not None})
    return reads


def task_failure_counts() -> dict[str, int] | None:
    """Failed Celery tasks per task name since Redis was last emptied; None if Redis is down."""
    try:
        with redis_for_figures() as client:
            raw: Mapping[bytes, bytes] = client.hgetall(TASK_FAILURES_KEY)
    except redis.RedisError as exc:
        logger.warning("task failure counts unavailable: %s", exc)
        return None
    return {name.decode(errors="replace"): int(count) for name, count in raw.items()}


def redis_for_figures() -> redis.Redis:
    """A client that gives up on Redis within ``REDIS_TIMEOUT_S``: a figure is not worth a
    scrape's (or a worker's) wait."""
    return redis.Redis.from_url(
        settings.REDIS_URL,
        socket_timeout=REDIS_TIMEOUT_S,
        socket_connect_timeout=REDIS_TIMEOUT_S,
    )


# ---------------------------------------------------------------------------------------------
# The exposition: prometheus_client renders custom collectors' families in the text format 0.0.4.
# The families carry no ``created`` time, so no ``_created`` series are written, and the plain
# text format has no ``# EOF`` line (that is OpenMetrics').

CONTENT_TYPE = CONTENT_TYPE_PLAIN_0_0_4


def _bucket_bound(seconds: float) -> str:
    """A bucket's ``le`` label as Prometheus writes it (``0.5``, ``1.0``): Python's repr of a
    float is Go's for these finite bounds, under a million."""
    return repr(float(seconds))


def _add_histogram(
    family: HistogramMetricFamily, labels: Sequence[str], histogram: LatencyHistogram
) -> None:
    buckets: list[tuple[str, float]] = [
        (_bucket_bound(bound), cumulative)
        for bound, cumulative in zip(LATENCY_BUCKETS_S, histogram.cumulative, strict=True)
    ]
    buckets.append(("+Inf", histogram.count))
    family.add_metric(labels, buckets, histogram.sum_s)


def metric_families(now: datetime | None = None) -> list[Metric]:
    """Every figure, as metric families (a fixed number of queries: see the module docstring)."""
    now = now or timezone.now()
    cluster_list = clusters()
    names = {cluster.id: cluster.name for cluster in cluster_list}

    buckets = ", ".join(_bucket_bound(b) for b in LATENCY_BUCKETS_S)
    detection = HistogramMetricFamily(
        "wr_detection_latency_seconds",
        "Seconds from an anomaly's evidence to its detection (detected_at - evidence_at), "
        f"every anomaly recorded; buckets {buckets}.",
        labels=["cluster"],
    )
    action = HistogramMetricFamily(
        "wr_action_latency_seconds",
        "Seconds from an anomaly's detection to the executed scheduler action of the "
        "recommendation made for it, every executed recommendation.",
        labels=["cluster"],
    )
    anomaly_data = anomaly_figures()
    detection_figures = anomaly_data.detection_latency
    action_figures = action_latency_by_cluster()
    for cluster in cluster_list:
        empty = LatencyHistogram.empty()
        _add_histogram(detection, [cluster.name], detection_figures.get(cluster.id, empty))
        _add_histogram(action, [cluster.name], action_figures.get(cluster.id, empty))

    confirmation = HistogramMetricFamily(
        "wr_crash_confirmation_seconds",
        "Seconds from a crash's evidence to its confirmation (confirmation_at - evidence_at), "
        "every confirmed crash; crashes from the scheduler, kernel logs or metrics are "
        "confirmed when detected, crashes a job printed once its process is seen to end.",
        labels=["cluster"],
    )
    settled_crashes = CounterMetricFamily(
        "wr_crash_confirmations_total",
        "Crashes by how they were settled: confirmed, survived (training went on, nothing "
        "done) or stalled (no exit, no progress: decided as a hang).",
        labels=["cluster", "state"],
    )
    settled = confirmation_figures()
    for cluster in cluster_list:
        confirmed = settled.get((cluster.id, Confirmation.CONFIRMED), LatencyHistogram.empty())
        _add_histogram(confirmation, [cluster.name], confirmed)
        for state in (Confirmation.CONFIRMED, Confirmation.SURVIVED, Confirmation.STALLED):
            found = settled.get((cluster.id, state))
            settled_crashes.add_metric([cluster.name, state], found.count if found else 0)

    anomalies = CounterMetricFamily(
        "wr_anomalies_total",
        "Anomalies recorded, by cluster, kind, failure category and attribution.",
        labels=["cluster", "kind", "category", "attribution"],
    )
    for (cluster_id, kind, category, attribution), n in sorted(
        anomaly_data.counts.items(), key=lambda item: (names.get(item[0][0], ""), item[0][1:])
    ):
        anomalies.add_metric(
            [names.get(cluster_id, str(cluster_id)), kind, category, attribution], n
        )

    # From the same counts, per cluster: what an operator may teach a pattern from.
    unexplained = CounterMetricFamily(
        "wr_unexplained_failures_total",
        "Confirmed failures no log, kernel-log or GPU-metrics finding explained (anomalies of "
        "category unexplained), by cluster: the Console's Unexplained failures page lists them.",
        labels=["cluster"],
    )
    unexplained_by_cluster: dict[int, int] = {}
    for (cluster_id, _, category, _), n in anomaly_data.counts.items():
        if category == FailureCategory.UNEXPLAINED:
            unexplained_by_cluster[cluster_id] = unexplained_by_cluster.get(cluster_id, 0) + n
    for cluster in cluster_list:
        unexplained.add_metric([cluster.name], unexplained_by_cluster.get(cluster.id, 0))

    recommendations = GaugeMetricFamily(
        "wr_recommendations",
        "Recommendations now in each status, by cluster.",
        labels=["cluster", "status"],
    )
    counted = recommendation_counts()
    by_status = counted.by_status
    for cluster in cluster_list:
        for status in RecommendationStatus.values:
            recommendations.add_metric(
                [cluster.name, status], by_status.get((cluster.id, status), 0)
            )

    dispositions = GaugeMetricFamily(
        "wr_recommendation_dispositions",
        "Recommendations a controller took up, by what came of them: converged (the scheduler "
        "reached the wanted state), abandoned (it did not; acknowledged or not by an operator), "
        "pending verification.",
        labels=["cluster", "disposition", "acknowledged"],
    )
    by_disposition = counted.by_disposition
    for cluster in cluster_list:
        for disposition in Disposition.values:
            for acknowledged in (False, True):
                if acknowledged and disposition != Disposition.ABANDONED:
                    continue
                dispositions.add_metric(
                    [cluster.name, disposition, str(acknowledged).lower()],
                    by_disposition.get((cluster.id, disposition, acknowledged), 0),
                )

    poll_lag = GaugeMetricFamily(
        "wr_poll_lag_seconds",
        "Seconds since the cluster's scheduler was last polled successfully (absent until the "
        "first poll).",
        labels=["cluster"],
    )
    poll_error = GaugeMetricFamily(
        "wr_poll_error",
        "1 if the cluster's last poll failed, 0 otherwise.",
        labels=["cluster"],
    )
    for cluster in cluster_list:
        if cluster.last_polled_at is not None:
            poll_lag.add_metric([cluster.name], _age_s(now, cluster.last_polled_at))
        poll_error.add_metric([cluster.name], int(cluster.poll_failing))

    controller_seen = GaugeMetricFamily(
        "wr_controller_seen_seconds",
        "Seconds since an Advisor Controller of the cluster last called the Advisor API with an "
        "unrevoked token (absent until one has): a controller passes every few seconds, so a "
        "growing value is a controller down or cut off, and in action mode nothing is carried "
        "out.",
        labels=["cluster"],
    )
    from recovery.models import ControllerToken

    seen = ControllerToken.last_seen_by_cluster()
    for cluster in cluster_list:
        if cluster.id in seen:
            controller_seen.add_metric([cluster.name], _age_s(now, seen[cluster.id]))

    ingestion_lag = GaugeMetricFamily(
        "wr_ingestion_lag_seconds",
        "Seconds since the cluster's logs were last read, by source: job_output (workloads' "
        "output files) or node_log (nodes' kernel logs); absent before the first read.",
        labels=["cluster", "source"],
    )
    reads = last_log_reads()
    for cluster in cluster_list:
        for source in ("job_output", "node_log"):
            read_at = reads.get((cluster.id, source))
            if read_at is not None:
                ingestion_lag.add_metric([cluster.name, source], _age_s(now, read_at))

    failures = failure_event_counts()
    failure_counters = [
        CounterMetricFamily(name, help_text, value=failures.get(kind, 0))
        for kind, (name, help_text) in FAILURE_EVENT_COUNTERS.items()
    ]

    task_counts = task_failure_counts()
    task_failures = CounterMetricFamily(
        "wr_task_failures_total",
        "Celery tasks that raised, by task name (counted in Redis by the workers).",
        labels=["task"],
    )
    for name, n in sorted((task_counts or {}).items()):
        task_failures.add_metric([name], n)
    task_counter_up = GaugeMetricFamily(
        "wr_task_failures_readable",
        "1 if the task failure counts could be read from Redis, 0 otherwise.",
        value=int(task_counts is not None),
    )

    return [
        detection,
        confirmation,
        action,
        settled_crashes,
        anomalies,
        unexplained,
        recommendations,
        dispositions,
        poll_lag,
        poll_error,
        controller_seen,
        ingestion_lag,
        *failure_counters,
        task_failures,
        task_counter_up,
    ]


def _age_s(now: datetime, then: datetime) -> float:
    return max((now - then).total_seconds(), 0.0)


class SelfMetricsCollector(Collector):
    """The figures above, read afresh from the database and Redis on every scrape."""

    def collect(self) -> Iterable[Metric]:
        return metric_families()


# A registry of its own: the default one would add the process and platform collectors, and
# metrics registered by any imported library, to the exposition.
REGISTRY = CollectorRegistry(auto_describe=False)
REGISTRY.register(SelfMetricsCollector())


def exposition() -> bytes:
    """The scrape's body: every family in the text format 0.0.4."""
    return generate_latest(REGISTRY)
