"""The system's own figures, for Prometheus, and their text exposition (format 0.0.4).

Every figure is an aggregate query (GROUP BY, conditional counts for histogram buckets): a
scrape runs eight queries whatever the size of the tables, and loads no row. Counters and
histograms count over the whole tables, so they only grow, as Prometheus' ``rate()`` expects (a
deleted workload takes its anomalies with it: Prometheus reads the drop as a counter reset).
The one scan that grows with history is the anomalies' (about 110 ms for 30,000 anomalies on
MariaDB; the scrape as a whole took about 210 ms with 10,000 workloads, 20,000 recommendations
and 1,000,000 audit events, of which only an index is read).

The models are imported inside the functions that read them: the Celery app imports this module
for its ``task_failure`` hook (``record_task_failure``) before Django is set up.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
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

from recovery.choices import AnomalyKind, AuditKind, Confirmation, RecommendationStatus

logger = logging.getLogger(__name__)

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

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

    anomalies = Anomaly.objects.annotate(latency=_non_negative(F("detected_at"), F("evidence_at")))
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
    ).annotate(latency=_non_negative(F("confirmation_at"), F("evidence_at")))
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
    ).annotate(latency=_non_negative(F("updated_at"), F("anomaly__detected_at")))
    return {
        cluster: histogram
        for (cluster,), histogram in _histograms(executed, "workload__cluster_id").items()
    }


def _non_negative(end: F, start: F) -> Case:
    return Case(
        When(**{f"{start.name}__gt": end}, then=Value(timedelta(0))),
        default=ExpressionWrapper(end - start, output_field=DurationField()),
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


def recommendation_counts() -> dict[tuple[int, str], int]:
    """Recommendations per (cluster id, status), now."""
    from recovery.models import Recommendation

    rows = (
        Recommendation.objects.order_by()
        .values_list("workload__cluster_id", "status")
        .annotate(n=Count("pk"))
    )
    return {(cluster, status): n for cluster, status, n in rows}


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
        with _redis() as client:
            raw: Mapping[bytes, bytes] = client.hgetall(TASK_FAILURES_KEY)  # type: ignore[assignment]
    except redis.RedisError as exc:
        logger.warning("task failure counts unavailable: %s", exc)
        return None
    return {name.decode(errors="replace"): int(count) for name, count in raw.items()}


def record_task_failure(sender: Any = None, **_signal: Any) -> None:
    """Celery ``task_failure`` receiver: count one failure of the task ``sender``.

    A Redis outage must not turn a task failure into a crash of the worker's signal dispatch:
    the failure is then only logged (Celery logs the task's own error anyway).
    """
    name = str(getattr(sender, "name", None) or sender or "unknown")
    try:
        with _redis() as client:
            client.hincrby(TASK_FAILURES_KEY, name, 1)
    except redis.RedisError as exc:
        logger.warning("could not count the failure of task %s: %s", name, exc)


def _redis() -> redis.Redis:
    return redis.Redis.from_url(
        settings.REDIS_URL,
        socket_timeout=REDIS_TIMEOUT_S,
        socket_connect_timeout=REDIS_TIMEOUT_S,
    )


# ---------------------------------------------------------------------------------------------
# The text exposition format, 0.0.4
# https://prometheus.io/docs/instrumenting/exposition_formats/#text-based-format


def escape_label_value(value: str) -> str:
    """A label value as it goes between double quotes: backslash, quote and newline escaped."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def escape_help(text: str) -> str:
    """HELP text: only backslash and newline are escaped."""
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def format_value(value: float) -> str:
    """A sample value as Prometheus parses it (Go's float syntax, +Inf, -Inf, NaN)."""
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, int):
        return str(value)
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value))


def _format_labels(labels: Sequence[tuple[str, str]]) -> str:
    if not labels:
        return ""
    inner = ",".join(f'{name}="{escape_label_value(value)}"' for name, value in labels)
    return "{" + inner + "}"


@dataclass
class MetricFamily:
    """One metric: its HELP and TYPE lines, then its samples (name suffix, labels, value)."""

    name: str
    type: str  # counter, gauge or histogram
    help: str
    samples: list[tuple[str, tuple[tuple[str, str], ...], float]] = field(default_factory=list)

    def add(self, value: float, suffix: str = "", **labels: str) -> None:
        self.samples.append((suffix, tuple(labels.items()), value))

    def add_histogram(self, histogram: LatencyHistogram, **labels: str) -> None:
        for bound, cumulative in zip(LATENCY_BUCKETS_S, histogram.cumulative, strict=True):
            self.add(cumulative, "_bucket", **labels, le=format_value(float(bound)))
        self.add(histogram.count, "_bucket", **labels, le="+Inf")
        self.add(histogram.sum_s, "_sum", **labels)
        self.add(histogram.count, "_count", **labels)

    def render(self) -> Iterable[str]:
        yield f"# HELP {self.name} {escape_help(self.help)}"
        yield f"# TYPE {self.name} {self.type}"
        for suffix, labels, value in self.samples:
            yield f"{self.name}{suffix}{_format_labels(labels)} {format_value(value)}"


def exposition(families: Iterable[MetricFamily]) -> str:
    return "".join(line + "\n" for family in families for line in family.render())


def collect(now: datetime | None = None) -> list[MetricFamily]:
    """Every figure, as metric families (a fixed number of queries: see the module docstring)."""
    now = now or timezone.now()
    cluster_list = clusters()
    names = {cluster.id: cluster.name for cluster in cluster_list}

    buckets = ", ".join(format_value(float(b)) for b in LATENCY_BUCKETS_S)
    detection = MetricFamily(
        "wr_detection_latency_seconds",
        "histogram",
        "Seconds from an anomaly's evidence to its detection (detected_at - evidence_at), "
        f"every anomaly recorded; buckets {buckets}.",
    )
    action = MetricFamily(
        "wr_action_latency_seconds",
        "histogram",
        "Seconds from an anomaly's detection to the executed scheduler action of the "
        "recommendation made for it, every executed recommendation.",
    )
    anomaly_data = anomaly_figures()
    detection_figures = anomaly_data.detection_latency
    action_figures = action_latency_by_cluster()
    for cluster in cluster_list:
        empty = LatencyHistogram.empty()
        detection.add_histogram(detection_figures.get(cluster.id, empty), cluster=cluster.name)
        action.add_histogram(action_figures.get(cluster.id, empty), cluster=cluster.name)

    confirmation = MetricFamily(
        "wr_crash_confirmation_seconds",
        "histogram",
        "Seconds from a crash's evidence to its confirmation (confirmation_at - evidence_at), "
        "every confirmed crash; crashes from the scheduler, kernel logs or metrics are "
        "confirmed when detected, crashes a job printed once its process is seen to end.",
    )
    settled_crashes = MetricFamily(
        "wr_crash_confirmations_total",
        "counter",
        "Crashes by how they were settled: confirmed, survived (training went on, nothing "
        "done) or stalled (no exit, no progress: decided as a hang).",
    )
    settled = confirmation_figures()
    for cluster in cluster_list:
        confirmed = settled.get((cluster.id, Confirmation.CONFIRMED), LatencyHistogram.empty())
        confirmation.add_histogram(confirmed, cluster=cluster.name)
        for state in (Confirmation.CONFIRMED, Confirmation.SURVIVED, Confirmation.STALLED):
            found = settled.get((cluster.id, state))
            settled_crashes.add(found.count if found else 0, cluster=cluster.name, state=state)

    anomalies = MetricFamily(
        "wr_anomalies_total",
        "counter",
        "Anomalies recorded, by cluster, kind, failure category and attribution.",
    )
    for (cluster_id, kind, category, attribution), n in sorted(
        anomaly_data.counts.items(), key=lambda item: (names.get(item[0][0], ""), item[0][1:])
    ):
        anomalies.add(
            n,
            cluster=names.get(cluster_id, str(cluster_id)),
            kind=kind,
            category=category,
            attribution=attribution,
        )

    recommendations = MetricFamily(
        "wr_recommendations",
        "gauge",
        "Recommendations now in each status, by cluster.",
    )
    by_status = recommendation_counts()
    for cluster in cluster_list:
        for status in RecommendationStatus.values:
            recommendations.add(
                by_status.get((cluster.id, status), 0), cluster=cluster.name, status=status
            )

    poll_lag = MetricFamily(
        "wr_poll_lag_seconds",
        "gauge",
        "Seconds since the cluster's scheduler was last polled successfully (absent until the "
        "first poll).",
    )
    poll_error = MetricFamily(
        "wr_poll_error",
        "gauge",
        "1 if the cluster's last poll failed, 0 otherwise.",
    )
    for cluster in cluster_list:
        if cluster.last_polled_at is not None:
            poll_lag.add(_age_s(now, cluster.last_polled_at), cluster=cluster.name)
        poll_error.add(int(cluster.poll_failing), cluster=cluster.name)

    ingestion_lag = MetricFamily(
        "wr_ingestion_lag_seconds",
        "gauge",
        "Seconds since the cluster's logs were last read, by source: job_output (workloads' "
        "output files) or node_log (nodes' kernel logs); absent before the first read.",
    )
    reads = last_log_reads()
    for cluster in cluster_list:
        for source in ("job_output", "node_log"):
            read_at = reads.get((cluster.id, source))
            if read_at is not None:
                ingestion_lag.add(_age_s(now, read_at), cluster=cluster.name, source=source)

    failures = failure_event_counts()
    failure_counters = []
    for kind, (name, help_text) in FAILURE_EVENT_COUNTERS.items():
        counter = MetricFamily(name, "counter", help_text)
        counter.add(failures.get(kind, 0))
        failure_counters.append(counter)

    task_counts = task_failure_counts()
    task_failures = MetricFamily(
        "wr_task_failures_total",
        "counter",
        "Celery tasks that raised, by task name (counted in Redis by the workers).",
    )
    for name, n in sorted((task_counts or {}).items()):
        task_failures.add(n, task=name)
    task_counter_up = MetricFamily(
        "wr_task_failures_readable",
        "gauge",
        "1 if the task failure counts could be read from Redis, 0 otherwise.",
    )
    task_counter_up.add(int(task_counts is not None))

    return [
        detection,
        confirmation,
        action,
        settled_crashes,
        anomalies,
        recommendations,
        poll_lag,
        poll_error,
        ingestion_lag,
        *failure_counters,
        task_failures,
        task_counter_up,
    ]


def _age_s(now: datetime, then: datetime) -> float:
    return max((now - then).total_seconds(), 0.0)
