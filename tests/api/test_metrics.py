"""``/metrics``: the system's own figures in Prometheus' text exposition format 0.0.4."""

from __future__ import annotations

import math
import os
import re
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import timedelta

import pytest
import redis
from django.conf import settings as django_settings
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from pytest_django.fixtures import Settings as SettingsWrapper

from recovery.choices import (
    AnomalyKind,
    Attribution,
    AuditKind,
    Confirmation,
    FailureCategory,
    RecommendationStatus,
)
from recovery.models import (
    Anomaly,
    AuditEvent,
    Cluster,
    ControllerToken,
    LogCursor,
    Recommendation,
    Workload,
)
from recovery.read import self_metrics as figures
from tasks.failures import record_task_failure
from tests.factories import (
    AnomalyFactory,
    ClusterFactory,
    RecommendationFactory,
    WorkloadFactory,
)

pytestmark = pytest.mark.django_db

URL = "/metrics"
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


# ---------------------------------------------------------------------------------------------
# A strict parser of the text format, enough to hold the output to the rules Prometheus applies.

NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
LABEL = r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\\n]|\\[\\"n])*)"'
HELP_LINE = re.compile(rf"^# HELP ({NAME}) (.*)$")
TYPE_LINE = re.compile(rf"^# TYPE ({NAME}) (counter|gauge|histogram|summary|untyped)$")
SAMPLE_LINE = re.compile(
    rf"^({NAME})(?:\{{((?:{LABEL})(?:,{LABEL})*)?\}})? "
    r"(-?[0-9.eE+-]+|\+Inf|-Inf|NaN)$"
)
HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")


@dataclass
class Family:
    name: str
    type: str
    help: str
    samples: list[tuple[str, dict[str, str], float]] = field(default_factory=list)


def unescape(value: str) -> str:
    return re.sub(r"\\(.)", lambda m: {"n": "\n"}.get(m.group(1), m.group(1)), value)


def parse(text: str) -> dict[str, Family]:
    """Families by name; fails on any line Prometheus would reject or a family out of order."""
    assert text.endswith("\n"), "the exposition ends with a line feed"
    families: dict[str, Family] = {}
    current: Family | None = None
    pending_help: tuple[str, str] | None = None
    seen_series: set[tuple[str, tuple[tuple[str, str], ...]]] = set()
    for number, line in enumerate(text[:-1].split("\n"), start=1):
        if match := HELP_LINE.match(line):
            assert match.group(1) not in families, f"line {number}: family repeated"
            pending_help = (match.group(1), match.group(2))
            continue
        if match := TYPE_LINE.match(line):
            name, kind = match.groups()
            assert pending_help is not None and pending_help[0] == name, (
                f"line {number}: TYPE without its HELP just before"
            )
            current = families[name] = Family(name, kind, pending_help[1])
            pending_help = None
            continue
        match = SAMPLE_LINE.match(line)
        assert match, f"line {number} is not a valid sample: {line!r}"
        sample_name, labels_text, value_text = match.group(1), match.group(2), match.groups()[-1]
        assert current is not None, f"line {number}: sample before any TYPE"
        allowed = (
            {current.name + suffix for suffix in HISTOGRAM_SUFFIXES}
            if current.type == "histogram"
            else {current.name}
        )
        assert sample_name in allowed, f"line {number}: {sample_name} outside its family"
        labels = {name: unescape(value) for name, value in re.findall(LABEL, labels_text or "")}
        series = (sample_name, tuple(sorted(labels.items())))
        assert series not in seen_series, f"line {number}: series repeated"
        seen_series.add(series)
        current.samples.append((sample_name, labels, float(value_text)))
    for family in families.values():
        if family.type == "histogram":
            check_histogram(family)
    return families


def check_histogram(family: Family) -> None:
    buckets_of: dict[tuple[tuple[str, str], ...], list[tuple[float, float]]] = {}
    totals_of: dict[tuple[tuple[str, str], ...], dict[str, float]] = {}
    for name, labels, value in family.samples:
        key = tuple(sorted((k, v) for k, v in labels.items() if k != "le"))
        if name.endswith("_bucket"):
            buckets_of.setdefault(key, []).append((float(labels["le"]), value))
        else:
            totals_of.setdefault(key, {})[name.removeprefix(family.name)] = value
    assert buckets_of.keys() == totals_of.keys(), f"{family.name}: series without buckets"
    for key, buckets in buckets_of.items():
        totals = totals_of.get(key, {})
        bounds = [bound for bound, _ in buckets]
        counts = [count for _, count in buckets]
        assert bounds == sorted(bounds) and bounds[-1] == math.inf, f"{key}: bounds"
        assert counts == sorted(counts), f"{family.name}{key}: buckets not cumulative"
        assert counts[-1] == totals.get("_count"), f"{family.name}{key}: +Inf differs from _count"
        assert "_sum" in totals


def value(families: dict[str, Family], sample: str, **labels: str) -> float:
    family_name = next(name for name in families if sample.startswith(name))
    matches = [
        v for name, ls, v in families[family_name].samples if name == sample and ls == labels
    ]
    assert len(matches) == 1, f"{sample}{labels}: {len(matches)} samples"
    return matches[0]


def series(families: dict[str, Family], sample: str, **labels: str) -> list[dict[str, str]]:
    return [
        ls
        for name, ls, _ in families[sample].samples
        if name == sample and labels.items() <= ls.items()
    ]


# ---------------------------------------------------------------------------------------------
# Fixtures


@pytest.fixture(autouse=True)
def task_failures_key(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A Redis key of the test's own: other tests may share the Redis database."""
    key = f"wr:test:task_failures:{uuid.uuid4().hex}"
    redis_url = django_settings.REDIS_URL  # before a test points it elsewhere
    monkeypatch.setattr(figures, "TASK_FAILURES_KEY", key)
    yield key
    redis.Redis.from_url(redis_url).delete(key)


def anomaly(workload: Workload, latency_s: float, **fields: object) -> Anomaly:
    detected_at = timezone.now() - timedelta(minutes=30)
    return AnomalyFactory(
        workload=workload,
        detected_at=detected_at,
        evidence_at=detected_at - timedelta(seconds=latency_s),
        **fields,
    )


def executed(workload: Workload, cause: Anomaly, after_s: float) -> Recommendation:
    recommendation = RecommendationFactory(
        workload=workload, anomaly=cause, status=RecommendationStatus.EXECUTED
    )
    # updated_at is auto_now: set the time the action was reported done afterwards.
    Recommendation.objects.filter(pk=recommendation.pk).update(
        updated_at=cause.detected_at + timedelta(seconds=after_s)
    )
    return recommendation


def audit(cluster: Cluster, kind: str) -> None:
    AuditEvent.objects.create(cluster=cluster, kind=kind, actor="test", payload={})


@pytest.fixture
def two_clusters() -> tuple[Cluster, Cluster]:
    """alpha polls fine; beta's last poll failed after its last success.

    alpha: detections after 0.2 s, 3 s and 45 s; evidence stamped after its detection (0 s);
    actions 4 s and 90 s after detection; one recommendation awaiting approval; its job logs
    read 20 s ago. beta: a detection after 700 s (beyond the last bucket), a rejected
    recommendation, one policy failure and two failed actions.
    """
    now = timezone.now()
    alpha = ClusterFactory(name="alpha", last_polled_at=now - timedelta(seconds=30))
    beta = ClusterFactory(
        name="beta",
        last_polled_at=now - timedelta(seconds=600),
        last_poll_error="ssh: connection refused",
        last_poll_error_at=now - timedelta(seconds=10),
    )
    job = WorkloadFactory(cluster=alpha)
    quick = anomaly(job, 0.2)
    anomaly(job, 3)
    slow = anomaly(
        job,
        45,
        kind=AnomalyKind.HANG,
        category=FailureCategory.NCCL_TIMEOUT,
        attribution=Attribution.SYSTEM_SOFTWARE,
    )
    anomaly(job, -5)  # the node's clock runs ahead
    executed(job, quick, 4)
    executed(job, slow, 90)
    RecommendationFactory(workload=job, status=RecommendationStatus.AWAITING_APPROVAL)
    cursor = LogCursor.objects.create(workload=job, path="/jobs/out.log", offset=10)
    LogCursor.objects.filter(pk=cursor.pk).update(updated_at=now - timedelta(seconds=20))

    other = WorkloadFactory(cluster=beta)
    anomaly(other, 700, category="", attribution=Attribution.UNKNOWN)
    RecommendationFactory(workload=other, status=RecommendationStatus.REJECTED)
    audit(beta, AuditKind.POLICY_FAILED)
    audit(beta, AuditKind.ACTION_FAILED)
    audit(beta, AuditKind.ACTION_FAILED)
    audit(beta, AuditKind.DETECTED)
    return alpha, beta


def scrape(client: Client | None = None, **headers: str) -> dict[str, Family]:
    response = (client or Client()).get(URL, headers=headers)
    assert response.status_code == 200, response.content
    assert response["Content-Type"] == CONTENT_TYPE
    return parse(response.content.decode())


# ---------------------------------------------------------------------------------------------
# The figures


def test_it_serves_every_family_in_the_text_format(two_clusters: object) -> None:
    families = scrape()
    assert {name: family.type for name, family in families.items()} == {
        "wr_detection_latency_seconds": "histogram",
        "wr_crash_confirmation_seconds": "histogram",
        "wr_action_latency_seconds": "histogram",
        "wr_crash_confirmations_total": "counter",
        "wr_anomalies_total": "counter",
        "wr_unexplained_failures_total": "counter",
        "wr_recommendations": "gauge",
        "wr_recommendation_dispositions": "gauge",
        "wr_poll_lag_seconds": "gauge",
        "wr_poll_error": "gauge",
        "wr_controller_seen_seconds": "gauge",
        "wr_ingestion_lag_seconds": "gauge",
        "wr_policy_failures_total": "counter",
        "wr_action_failures_total": "counter",
        "wr_action_retries_total": "counter",
        "wr_reports_refused_total": "counter",
        "wr_task_failures_total": "counter",
        "wr_task_failures_readable": "gauge",
    }
    assert all(family.help for family in families.values())


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool (Debian prometheus) absent")
def test_promtool_accepts_the_exposition_without_lint_warnings(two_clusters: object) -> None:
    """Prometheus' own checker, when installed: format and naming conventions."""
    body = Client().get(URL).content
    result = subprocess.run(
        ["promtool", "check", "metrics"], input=body, capture_output=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout + result.stderr == b""


def test_it_buckets_detection_latency_per_cluster(two_clusters: object) -> None:
    families = scrape()
    bucket = "wr_detection_latency_seconds_bucket"
    # alpha: 0 (clock ahead), 0.2, 3 and 45 seconds.
    assert value(families, bucket, cluster="alpha", le="0.5") == 2
    assert value(families, bucket, cluster="alpha", le="2.0") == 2
    assert value(families, bucket, cluster="alpha", le="5.0") == 3
    assert value(families, bucket, cluster="alpha", le="30.0") == 3
    assert value(families, bucket, cluster="alpha", le="60.0") == 4
    assert value(families, bucket, cluster="alpha", le="+Inf") == 4
    assert value(families, "wr_detection_latency_seconds_count", cluster="alpha") == 4
    assert value(families, "wr_detection_latency_seconds_sum", cluster="alpha") == pytest.approx(
        48.2
    )
    # beta: one detection beyond the last bound.
    assert value(families, bucket, cluster="beta", le="600.0") == 0
    assert value(families, bucket, cluster="beta", le="+Inf") == 1
    assert value(families, "wr_detection_latency_seconds_sum", cluster="beta") == 700


def test_it_buckets_action_latency_from_executed_recommendations(two_clusters: object) -> None:
    families = scrape()
    bucket = "wr_action_latency_seconds_bucket"
    assert value(families, bucket, cluster="alpha", le="2.0") == 0
    assert value(families, bucket, cluster="alpha", le="5.0") == 1
    assert value(families, bucket, cluster="alpha", le="60.0") == 1
    assert value(families, bucket, cluster="alpha", le="120.0") == 2
    assert value(families, "wr_action_latency_seconds_count", cluster="alpha") == 2
    assert value(families, "wr_action_latency_seconds_sum", cluster="alpha") == pytest.approx(94)
    # A cluster without an executed action still has its (empty) series.
    assert value(families, bucket, cluster="beta", le="+Inf") == 0
    assert value(families, "wr_action_latency_seconds_count", cluster="beta") == 0


def test_it_counts_unexplained_failures_per_cluster(two_clusters: tuple[Cluster, Cluster]) -> None:
    """
    GIVEN two failures of beta that nothing explained, and a hang and a crash of known
          category on alpha
    WHEN /metrics is scraped
    THEN beta counts two unexplained failures and alpha none, still listed with 0; they are
         also among the anomalies by category
    """
    _, beta = two_clusters
    other = WorkloadFactory(cluster=beta)
    for _ in range(2):
        anomaly(
            other,
            1,
            category=FailureCategory.UNEXPLAINED,
            attribution=Attribution.UNKNOWN,
            implicated_nodes=[],
        )

    families = scrape()

    assert value(families, "wr_unexplained_failures_total", cluster="beta") == 2
    assert value(families, "wr_unexplained_failures_total", cluster="alpha") == 0
    assert (
        value(
            families,
            "wr_anomalies_total",
            cluster="beta",
            kind="crash",
            category="unexplained",
            attribution="unknown",
        )
        == 2
    )


def test_it_times_confirmation_apart_from_detection_and_counts_survived_crashes() -> None:
    """
    GIVEN a traceback detected 1 s after it was printed and confirmed 4 s after, a crash the
          job survived, one that stalled, and one still suspected
    WHEN /metrics is scraped
    THEN detection says 1 s, confirmation 4 s, and each settled state is counted once
    """
    cluster = ClusterFactory(name="gamma")
    job = WorkloadFactory(cluster=cluster)
    confirmed = anomaly(job, 1, confirmation=Confirmation.CONFIRMED)
    Anomaly.objects.filter(pk=confirmed.pk).update(
        confirmation_at=confirmed.evidence_at + timedelta(seconds=4)
    )
    for state in (Confirmation.SURVIVED, Confirmation.STALLED):
        settled = anomaly(job, 1, confirmation=state)
        Anomaly.objects.filter(pk=settled.pk).update(confirmation_at=settled.detected_at)
    anomaly(job, 1, confirmation=Confirmation.SUSPECTED)

    families = scrape()

    assert value(families, "wr_detection_latency_seconds_sum", cluster="gamma") == 4
    assert value(families, "wr_crash_confirmation_seconds_count", cluster="gamma") == 1
    assert value(families, "wr_crash_confirmation_seconds_sum", cluster="gamma") == 4
    bucket = "wr_crash_confirmation_seconds_bucket"
    assert value(families, bucket, cluster="gamma", le="2.0") == 0
    assert value(families, bucket, cluster="gamma", le="5.0") == 1
    settled_total = "wr_crash_confirmations_total"
    for settled_state in ("confirmed", "survived", "stalled"):
        assert value(families, settled_total, cluster="gamma", state=settled_state) == 1


def test_it_counts_anomalies_by_category_kind_and_attribution(two_clusters: object) -> None:
    families = scrape()
    total = "wr_anomalies_total"
    crash_gpu = {"kind": "crash", "category": "gpu_hardware", "attribution": "hardware"}
    assert value(families, total, cluster="alpha", **crash_gpu) == 3
    hang = {"kind": "hang", "category": "nccl_timeout", "attribution": "system_software"}
    assert value(families, total, cluster="alpha", **hang) == 1
    uncategorised = {"kind": "crash", "category": "", "attribution": "unknown"}
    assert value(families, total, cluster="beta", **uncategorised) == 1
    assert len(series(families, total)) == 3


def test_it_gives_recommendations_by_status_with_zeros(two_clusters: object) -> None:
    families = scrape()
    gauge = "wr_recommendations"
    assert value(families, gauge, cluster="alpha", status="executed") == 2
    assert value(families, gauge, cluster="alpha", status="awaiting_approval") == 1
    assert value(families, gauge, cluster="alpha", status="rejected") == 0
    assert value(families, gauge, cluster="beta", status="rejected") == 1
    # Every status of every cluster, so a series does not vanish when it drops to zero.
    assert len(series(families, gauge)) == 2 * len(RecommendationStatus.values)


def test_it_counts_what_came_of_the_actions(two_clusters: object) -> None:
    alpha = Cluster.objects.get(name="alpha")
    for disposition, acknowledged in (
        ("abandoned", False),
        ("abandoned", True),
        ("converged", False),
    ):
        RecommendationFactory(
            workload__cluster=alpha,
            status=RecommendationStatus.EXECUTED,
            disposition=disposition,
            acknowledged_at=timezone.now() if acknowledged else None,
        )
    families = scrape()
    gauge = "wr_recommendation_dispositions"
    alpha_says = {"cluster": "alpha"}
    assert value(families, gauge, **alpha_says, disposition="abandoned", acknowledged="false") == 1
    assert value(families, gauge, **alpha_says, disposition="abandoned", acknowledged="true") == 1
    assert value(families, gauge, **alpha_says, disposition="converged", acknowledged="false") == 1
    assert value(families, gauge, cluster="beta", disposition="pending", acknowledged="false") == 0


def test_it_reports_poll_lag_and_a_failing_poll(two_clusters: object) -> None:
    families = scrape()
    assert value(families, "wr_poll_lag_seconds", cluster="alpha") == pytest.approx(30, abs=5)
    assert value(families, "wr_poll_lag_seconds", cluster="beta") == pytest.approx(600, abs=5)
    assert value(families, "wr_poll_error", cluster="alpha") == 0
    assert value(families, "wr_poll_error", cluster="beta") == 1


def test_a_poll_error_older_than_the_last_success_is_over(two_clusters: object) -> None:
    Cluster.objects.filter(name="beta").update(last_polled_at=timezone.now())
    assert value(scrape(), "wr_poll_error", cluster="beta") == 0


def test_a_cluster_never_polled_has_no_poll_lag() -> None:
    ClusterFactory(name="fresh", last_polled_at=None)
    families = scrape()
    assert series(families, "wr_poll_lag_seconds") == []
    assert value(families, "wr_poll_error", cluster="fresh") == 0


def test_it_reports_when_a_controller_of_each_cluster_was_last_seen() -> None:
    """
    GIVEN two controllers of one cluster, one seen 20 s ago, one 5 min ago; a revoked token
         seen just now; and a cluster whose controller never called
    WHEN /metrics is scraped
    THEN the cluster's figure is the most recent unrevoked call, the other cluster has none
    """
    seen, never = ClusterFactory(name="seen"), ClusterFactory(name="never")
    for name, ago in (("login1", 20), ("login2", 300)):
        token, _ = ControllerToken.issue(seen, name)
        ControllerToken.objects.filter(pk=token.pk).update(
            last_used_at=timezone.now() - timedelta(seconds=ago)
        )
    revoked, _ = ControllerToken.issue(seen, "old")
    ControllerToken.objects.filter(pk=revoked.pk).update(
        last_used_at=timezone.now(), revoked_at=timezone.now()
    )
    ControllerToken.issue(never, "login1")

    families = scrape()

    assert value(families, "wr_controller_seen_seconds", cluster="seen") == pytest.approx(20, abs=5)
    assert series(families, "wr_controller_seen_seconds") == [{"cluster": "seen"}]


def test_it_reports_ingestion_lag_from_the_newest_log_cursor(
    two_clusters: tuple[Cluster, Cluster],
) -> None:
    alpha, _ = two_clusters
    newer = WorkloadFactory(cluster=alpha)
    cursor = LogCursor.objects.create(workload=newer, path="/jobs/newer.log")
    LogCursor.objects.filter(pk=cursor.pk).update(updated_at=timezone.now() - timedelta(seconds=5))
    families = scrape()
    lag = value(families, "wr_ingestion_lag_seconds", cluster="alpha", source="job_output")
    assert lag == pytest.approx(5, abs=4)
    # beta has no log read yet: no series rather than a made-up lag.
    assert series(families, "wr_ingestion_lag_seconds", cluster="beta") == []


def test_it_counts_policy_and_action_failures_from_the_audit_trail(two_clusters: object) -> None:
    families = scrape()
    assert value(families, "wr_policy_failures_total") == 1
    assert value(families, "wr_action_failures_total") == 2
    assert value(families, "wr_action_retries_total") == 0
    assert value(families, "wr_reports_refused_total") == 0


def test_it_counts_failed_celery_tasks_through_the_signal(task_failures_key: str) -> None:
    """GIVEN the Celery app, which connects the task_failure hook itself
    WHEN a task raises twice and another once
    THEN /metrics counts the failures per task name, read from Redis."""
    from tasks.celery import app

    @app.task(name="tests.metrics.explodes")
    def explodes() -> None:
        raise RuntimeError("boom")

    @app.task(name="tests.metrics.also_explodes")
    def also_explodes() -> None:
        raise RuntimeError("boom")

    explodes.apply()
    explodes.apply()
    also_explodes.apply()
    families = scrape()
    assert value(families, "wr_task_failures_total", task="tests.metrics.explodes") == 2
    assert value(families, "wr_task_failures_total", task="tests.metrics.also_explodes") == 1
    assert value(families, "wr_task_failures_readable") == 1


def test_it_still_serves_the_database_figures_when_redis_is_down(
    settings: SettingsWrapper, two_clusters: object
) -> None:
    settings.REDIS_URL = "redis://127.0.0.1:1/0"
    record_task_failure(sender=None)  # logged, not raised
    families = scrape()
    assert value(families, "wr_task_failures_readable") == 0
    assert families["wr_task_failures_total"].samples == []
    assert value(families, "wr_poll_error", cluster="beta") == 1


def test_an_empty_installation_still_parses() -> None:
    families = scrape()
    assert families["wr_detection_latency_seconds"].samples == []
    assert value(families, "wr_task_failures_readable") == 1


# ---------------------------------------------------------------------------------------------
# Cost: a fixed number of queries


def count_queries() -> int:
    with CaptureQueriesContext(connection) as queries:
        scrape()
    return len(queries)


def test_its_query_count_does_not_grow_with_the_data() -> None:
    cluster = ClusterFactory(name="grow", last_polled_at=timezone.now())
    job = WorkloadFactory(cluster=cluster)
    anomaly(job, 1)
    with_one = count_queries()
    for n in range(19):
        other = WorkloadFactory(cluster=ClusterFactory() if n % 5 == 0 else cluster)
        cause = anomaly(other, n)
        executed(other, cause, n * 2)
        LogCursor.objects.create(workload=other, path=f"/jobs/{n}.log")
        audit(cluster, AuditKind.ACTION_FAILED)
    assert Anomaly.objects.count() == 20
    assert count_queries() == with_one
    assert with_one <= 9


# ---------------------------------------------------------------------------------------------
# Escaping and values


@pytest.mark.parametrize(
    ("raw", "escaped"),
    [
        ("plain", "plain"),
        ('say "hi"', 'say \\"hi\\"'),
        ("back\\slash", "back\\\\slash"),
        ("two\nlines", "two\\nlines"),
        ('\\"', '\\\\\\"'),
    ],
)
def test_it_escapes_label_values(raw: str, escaped: str) -> None:
    ClusterFactory(name=raw, last_polled_at=None)
    body = Client().get(URL).content.decode()
    assert f'wr_poll_error{{cluster="{escaped}"}} 0.0\n' in body
    assert value(parse(body), "wr_poll_error", cluster=raw) == 0


def test_help_text_is_written_as_declared(two_clusters: object) -> None:
    """Only backslash and newline are escaped in HELP: quotes stay as they are."""
    body = Client().get(URL).content.decode()
    help_text = figures.FAILURE_EVENT_COUNTERS[AuditKind.ACTION_FAILED][1]
    assert f"# HELP wr_action_failures_total {help_text}\n" in body
    assert 'wr_recommendations{status="failed"}' in help_text


def test_it_writes_bucket_bounds_and_values_as_prometheus_parses_them(
    two_clusters: object,
) -> None:
    body = Client().get(URL).content.decode()
    alpha_bucket = r'wr_detection_latency_seconds_bucket\{cluster="alpha",le="([^"]+)"\}'
    bounds = re.findall(alpha_bucket, body)
    assert bounds == [
        "0.5", "1.0", "2.0", "5.0", "10.0", "30.0", "60.0", "120.0", "300.0", "600.0", "+Inf"
    ]  # fmt: skip
    assert "buckets 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0." in body
    assert 'wr_detection_latency_seconds_sum{cluster="alpha"} 48.2' in body


def test_it_writes_no_openmetrics_only_lines(two_clusters: object) -> None:
    """No ``_created`` series (the figures are recomputed from the tables, not created at a
    time) and no ``# EOF``: the plain text format 0.0.4, as the content type says."""
    body = Client().get(URL).content.decode()
    assert "_created" not in body
    assert "# EOF" not in body
    assert body.count("# TYPE ") == 18


# ---------------------------------------------------------------------------------------------
# Access


def test_it_is_open_without_a_token(settings: SettingsWrapper) -> None:
    settings.METRICS_TOKEN = ""
    assert Client().get(URL).status_code == 200


def test_it_requires_the_bearer_token_when_one_is_set(settings: SettingsWrapper) -> None:
    settings.METRICS_TOKEN = "s3cret-scrape"
    missing = Client().get(URL)
    assert missing.status_code == 401
    assert missing["WWW-Authenticate"].startswith("Bearer")
    assert missing["Content-Type"] == CONTENT_TYPE
    assert b"bearer token" in missing.content
    wrong = Client().get(URL, headers={"Authorization": "Bearer nope"})
    assert wrong.status_code == 401
    non_ascii = Client().get(URL, headers={"Authorization": "Bearer s3cret-scrapé"})
    assert non_ascii.status_code == 401
    basic = Client().get(URL, headers={"Authorization": "Basic czNjcmV0LXNjcmFwZQ=="})
    assert basic.status_code == 401
    assert scrape(Authorization="Bearer s3cret-scrape")


def test_it_lets_configured_networks_scrape_without_the_token(settings: SettingsWrapper) -> None:
    settings.METRICS_TOKEN = "s3cret-scrape"
    settings.METRICS_ALLOWED_NETWORKS = ["not-a-network", "10.0.0.0/8"]
    assert Client(REMOTE_ADDR="10.1.2.3").get(URL).status_code == 200
    assert Client(REMOTE_ADDR="192.0.2.7").get(URL).status_code == 401
    # A token presented is checked even from an allowed network.
    wrong = Client(REMOTE_ADDR="10.1.2.3").get(URL, headers={"Authorization": "Bearer nope"})
    assert wrong.status_code == 401
    # A forwarded header does not make a client part of the network.
    forwarded = Client(REMOTE_ADDR="192.0.2.7").get(URL, headers={"X-Forwarded-For": "10.1.2.3"})
    assert forwarded.status_code == 401


def test_networks_alone_restrict_the_endpoint(settings: SettingsWrapper) -> None:
    settings.METRICS_TOKEN = ""
    settings.METRICS_ALLOWED_NETWORKS = ["127.0.0.0/8", "::1/128"]
    assert Client().get(URL).status_code == 200  # the test client comes from 127.0.0.1
    assert Client(REMOTE_ADDR="192.0.2.7").get(URL).status_code == 401


@pytest.mark.parametrize("method", ["post", "put", "patch", "delete", "options"])
def test_it_allows_only_get_and_head(method: str) -> None:
    response = getattr(Client(), method)(URL)
    assert response.status_code == 405
    assert response["Allow"] == "GET, HEAD"


def test_head_answers_without_computing_the_figures() -> None:
    with CaptureQueriesContext(connection) as queries:
        response = Client().head(URL)
    assert response.status_code == 200
    assert response["Content-Type"] == CONTENT_TYPE
    assert len(queries) == 0


def test_the_task_failure_hook_imports_before_django_is_set_up() -> None:
    """tasks/celery.py imports the hook when the worker starts, before django.setup()."""
    code = "import tasks.celery; from tasks.failures import record_task_failure"
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "workload_recovery.settings"}
    result = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
