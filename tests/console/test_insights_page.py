"""The Insights page: goodput figures from snapshots, anomalies over time, for Console roles."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse
from django.utils import timezone
from pytest_django import DjangoAssertNumQueries
from pytest_django.fixtures import Settings as SettingsWrapper

from console.charts import colour_for_attribution, colour_for_category
from recovery.audit.record import record_event
from recovery.choices import AuditKind, RecommendationStatus
from recovery.models import Cluster, ClusterGoodputSnapshot, Recommendation
from recovery.read.insights import DETECTION_LATENCY_EDGES
from tests.conftest import TEST_PASSWORD
from tests.factories import (
    AnomalyFactory,
    ClusterFactory,
    carried_out,
    node_returned,
    progress_resumed,
    rejected_by,
)
from tests.read.test_precision import drain, restart

pytestmark = pytest.mark.django_db

URL = reverse("console:insights")
CHART_IDS = [
    "insights-chart-detection",
    "insights-chart-action",
    "insights-chart-productive",
    "insights-chart-ettr",
    "insights-chart-by-category",
    "insights-chart-by-attribution",
]


def logged_in(user: User) -> Client:
    client = Client()
    assert client.login(username=user.username, password=TEST_PASSWORD)
    return client


def snapshot(cluster: Cluster, minutes_ago: float = 1, **fields: object) -> ClusterGoodputSnapshot:
    values: dict[str, object] = {
        "window_seconds": 7 * 86400,
        "workloads": 12,
        "failures": 3,
        "ettr": 0.925,
        "detection_latency_median": 4.0,
        "detection_latency_p95": 9.0,
        "action_latency_median": 80.0,
        "action_latency_p95": 200.0,
        "time_to_productive_median": 600.0,
        "work_lost_median": 50.0,
        "detection_latency_histogram": {
            "edges": list(DETECTION_LATENCY_EDGES),
            "counts": [0, 0, 2, 1, 0, 0, 0, 0, 0, 0],
        },
    }
    values.update(fields)
    return ClusterGoodputSnapshot.objects.create(
        cluster=cluster, taken_at=timezone.now() - timedelta(minutes=minutes_ago), **values
    )


def figure(body: str, chart_id: str) -> dict[str, Any]:
    match = re.search(
        rf'<script id="{chart_id}" type="application/json">(.*?)</script>', body, re.S
    )
    assert match, f"no figure {chart_id}"
    document: dict[str, Any] = json.loads(match.group(1))
    return document


def region(body: str, region_id: str) -> str:
    """The HTML of the element with this id, up to its matching closing tag."""
    start = body.rindex("<", 0, body.index(f'id="{region_id}"'))
    tag = re.match(r"<(\w+)", body[start:]).group(1)  # type: ignore[union-attr]
    depth = 0
    for match in re.finditer(rf"<(/?){tag}\b", body[start:]):
        depth += -1 if match.group(1) else 1
        if depth == 0:
            return body[start : start + match.end()]
    raise AssertionError(f"unclosed {region_id}")


def test_anonymous_users_are_sent_to_log_in() -> None:
    response = Client().get(URL)
    assert response.status_code == 302
    assert response["Location"].startswith(reverse("login"))


def test_a_user_without_a_role_is_refused(outsider: User) -> None:
    assert logged_in(outsider).get(URL).status_code == 403


def test_before_the_first_snapshot_the_page_says_when_figures_come(
    viewer: User, settings: SettingsWrapper
) -> None:
    settings.INSIGHTS_SECONDS = 300
    ClusterFactory(name="lab")
    response = logged_in(viewer).get(URL)
    assert response.status_code == 200
    body = response.content.decode()
    headline = region(body, "insights-headline")
    assert "No goodput figures yet." in headline
    assert "computed every 5 minutes; the first appears after the worker has run" in headline
    # Every chart is still there, saying why it is empty.
    for chart_id in CHART_IDS:
        assert f'data-chart-source="{chart_id}"' in body
    assert figure(body, "insights-chart-ettr")["layout"]["annotations"][0]["text"]


def test_a_viewer_sees_each_clusters_headline_figures_as_of_its_snapshot(viewer: User) -> None:
    lab, prod = ClusterFactory(name="lab"), ClusterFactory(name="prod")
    snapshot(lab, minutes_ago=60, ettr=0.5)
    taken = snapshot(lab, minutes_ago=2)
    snapshot(prod, minutes_ago=3, ettr=None, failures=0, detection_latency_median=None)

    body = logged_in(viewer).get(URL).content.decode()

    lab_row = region(body, f"insights-headline-{lab.pk}")
    assert "92.5 %" in lab_row
    assert "50.0 %" not in lab_row  # the older snapshot
    assert "4.0 s" in lab_row  # median detection latency
    assert "p95 9.0 s" in lab_row
    assert "1 min 20 s" in lab_row  # median action latency
    assert ">3<" in lab_row  # failures
    assert "over 12 workloads" in lab_row
    assert "Over the last 7 days, as of" in lab_row
    assert timezone.localtime(taken.taken_at).strftime("%Y-%m-%d %H:%M") in lab_row
    prod_row = region(body, f"insights-headline-{prod.pk}")
    assert "—" in prod_row
    assert "Figures as of" in region(body, "insights-as-of")


def test_a_cluster_without_a_snapshot_says_so_beside_the_others(viewer: User) -> None:
    lab = ClusterFactory(name="lab")
    fresh = ClusterFactory(name="fresh")
    snapshot(lab)
    body = logged_in(viewer).get(URL).content.decode()
    assert "No figures for this cluster yet" in region(body, f"insights-headline-{fresh.pk}")


def test_old_snapshots_warn_that_the_worker_may_not_run(
    viewer: User, settings: SettingsWrapper
) -> None:
    settings.INSIGHTS_SECONDS = 300
    snapshot(ClusterFactory(), minutes_ago=60)
    body = logged_in(viewer).get(URL).content.decode()
    assert "is the worker (Celery beat) running?" in body


def test_the_charts_are_built_from_snapshots_and_anomalies(viewer: User) -> None:
    lab = ClusterFactory(name="lab")
    snapshot(lab, minutes_ago=90, ettr=0.8)
    snapshot(lab, minutes_ago=1, ettr=0.9)
    now = timezone.now()
    AnomalyFactory(
        workload__cluster=lab,
        category="gpu_hardware",
        attribution="hardware",
        detected_at=now - timedelta(hours=2),
    )
    AnomalyFactory(
        workload__cluster=lab,
        category="gpu_oom",
        attribution="application",
        detected_at=now - timedelta(hours=1),
    )
    AnomalyFactory(workload__cluster=lab, detected_at=now - timedelta(days=8))  # out of range

    body = logged_in(viewer).get(URL).content.decode()

    assert '<script src="/static/vendor/plotly/plotly.min.js" defer></script>' in body
    assert body.index("vendor/plotly/plotly.min.js") < body.index("console/charts.js")
    assert "/static/console/insights.css" in body
    detection = figure(body, "insights-chart-detection")
    (bars,) = detection["data"]
    assert bars["name"] == "lab"
    assert bars["y"] == [0, 0, 2, 1, 0, 0, 0, 0, 0, 0]
    assert bars["x"][2] == "2\N{EN DASH}5 s"
    ettr = figure(body, "insights-chart-ettr")
    # The anomaly 8 days ago makes the cluster older than the snapshots' 7-day window.
    (line,) = ettr["data"]
    assert line["name"] == "lab: over the trailing window"
    assert 1 <= len(line["y"]) <= 2
    by_category = figure(body, "insights-chart-by-category")
    assert by_category["layout"]["barmode"] == "stack"
    colours = {trace["name"]: trace["marker"]["color"] for trace in by_category["data"]}
    assert colours == {
        "GPU hardware": colour_for_category("gpu_hardware"),
        "GPU out of memory": colour_for_category("gpu_oom"),
    }
    by_attribution = figure(body, "insights-chart-by-attribution")
    colours = {trace["name"]: trace["marker"]["color"] for trace in by_attribution["data"]}
    assert colours == {
        "Hardware": colour_for_attribution("hardware"),
        "Application": colour_for_attribution("application"),
    }
    assert sum(sum(trace["y"]) for trace in by_attribution["data"]) == 2
    assert "2 anomalies in the last 7 days" in body


def test_the_cluster_filter_narrows_every_figure(viewer: User) -> None:
    lab, prod = ClusterFactory(name="lab"), ClusterFactory(name="prod")
    snapshot(lab)
    snapshot(prod)
    AnomalyFactory(workload__cluster=prod, detected_at=timezone.now() - timedelta(hours=1))
    body = logged_in(viewer).get(URL, {"cluster": "lab", "range": "24h"}).content.decode()
    assert f'id="insights-headline-{lab.pk}"' in body
    assert f'id="insights-headline-{prod.pk}"' not in body
    assert [t["name"] for t in figure(body, "insights-chart-detection")["data"]] == ["lab"]
    assert figure(body, "insights-chart-by-category")["data"] == []
    assert '<option value="24h" selected>' in body
    assert '<option value="lab" selected>' in body


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"range": "1y"}, "Unknown range “1y”: showing the last 7 days"),
        ({"cluster": "nope"}, "Unknown cluster “nope”: showing every cluster."),
        ({"range": "<b>x</b>"}, "Unknown range “&lt;b&gt;x&lt;/b&gt;”"),
    ],
)
def test_bad_parameters_are_named_and_the_defaults_used(
    viewer: User, params: dict[str, str], message: str
) -> None:
    lab = ClusterFactory(name="lab")
    snapshot(lab)
    response = logged_in(viewer).get(URL, params)
    assert response.status_code == 200
    body = response.content.decode()
    assert message in body
    assert '<option value="7d" selected>' in body
    assert f'id="insights-headline-{lab.pk}"' in body


def test_the_page_refreshes_live_around_its_charts(viewer: User) -> None:
    snapshot(ClusterFactory())
    body = logged_in(viewer).get(URL).content.decode()
    assert 'data-live-url="/ws/live/"' in body
    figures = region(body, "insights-figures")
    for chart_id in CHART_IDS:
        # The figures' data is inside a refreshed region, the chart elements are not.
        assert f'id="{chart_id}"' in figures
        assert f'data-chart-source="{chart_id}"' not in figures
    head = body[: body.index('id="insights-figures"')]
    assert 'id="insights-figures" hidden data-live-refresh' in body
    assert 'id="insights-headline"' in head
    assert "data-live-refresh" in region(body, "insights-as-of") or (
        'id="insights-as-of" class="page-head__meta" data-live-refresh' in body
    )


def test_the_page_reads_a_bounded_number_of_rows(
    viewer: User, django_assert_max_num_queries: DjangoAssertNumQueries
) -> None:
    """
    GIVEN many clusters, each with many snapshots and anomalies
    WHEN a viewer opens the page
    THEN the number of queries does not grow with them
    """
    client = logged_in(viewer)
    client.get(URL)  # warm the session and the attribution status

    def add_cluster() -> None:
        cluster = ClusterFactory()
        for minutes in range(0, 600, 60):
            snapshot(cluster, minutes_ago=minutes + 1)
        for hours in range(3):
            AnomalyFactory(
                workload__cluster=cluster, detected_at=timezone.now() - timedelta(hours=hours)
            )

    # 14: with the query for where each cluster's data begins, and the page's own (base.html).
    add_cluster()
    with django_assert_max_num_queries(14):
        assert client.get(URL, {"range": "30d"}).status_code == 200
    for _ in range(4):
        add_cluster()
    with django_assert_max_num_queries(14):
        assert client.get(URL, {"range": "30d"}).status_code == 200


def test_the_headline_counts_workloads_given_up_apart_from_failures(viewer: User) -> None:
    snapshot(ClusterFactory(name="lab"), given_up=2)
    headline = region(logged_in(viewer).get(URL).content.decode(), "insights-headline")
    assert re.search(r"Given up</dt><dd[^>]*>2</dd>.*workloads recovery stopped", headline)


# --- action precision ---------------------------------------------------------------------------


def precision_trail(lab: Cluster, prod: Cluster, now: datetime) -> dict[str, Recommendation]:
    """On lab: four restarts, one after which the job resumed where it was, and a restart an
    operator rejected. On prod: two drains, one whose node an operator returned within 10
    minutes, and a restart from two days ago."""
    made = {}
    for index in range(4):
        made[f"restart-{index}"] = carried_out(
            restart(lab), now - timedelta(hours=3), step_reached=1150
        )
    progress_resumed(made["restart-0"].workload, 2, 1200, now - timedelta(hours=2))
    made["rejected"] = rejected_by(
        restart(lab, status=RecommendationStatus.AWAITING_APPROVAL),
        "otto",
        now - timedelta(hours=1),
        note="it saves checkpoints itself",
    )
    made["returned"] = carried_out(drain(prod, "gpu-007"), now - timedelta(hours=2))
    node_returned(prod, "gpu-007", "otto", now - timedelta(hours=1, minutes=50))
    made["drained"] = carried_out(drain(prod, "gpu-008"), now - timedelta(hours=2))
    made["old"] = carried_out(restart(prod), now - timedelta(days=2), step_reached=10)
    return made


def test_the_precision_section_shows_each_clusters_actions_and_the_judged_ones(
    viewer: User,
) -> None:
    lab, prod = ClusterFactory(name="lab"), ClusterFactory(name="prod")
    made = precision_trail(lab, prod, timezone.now())

    body = logged_in(viewer).get(URL).content.decode()

    section = region(body, "insights-precision")
    assert "Action precision" in section
    lab_row = region(body, f"insights-precision-{lab.pk}")
    assert re.search(r"Actions taken</dt><dd[^>]*>4</dd>", lab_row)
    assert "4 restarts · 0 stops · 0 drains" in lab_row
    assert re.search(r"Judged unnecessary</dt><dd[^>]*>1</dd>", lab_row)
    assert "1 resumed where it was · 0 drained nodes returned within an hour" in lab_row
    assert re.search(r"Precision</dt><dd[^>]*>75.0 %</dd>", lab_row)
    assert re.search(r"Rejected by an operator</dt><dd[^>]*>1</dd>", lab_row)
    prod_row = region(body, f"insights-precision-{prod.pk}")
    assert "1 restart · 0 stops · 2 drains" in prod_row
    assert re.search(r"Precision</dt><dd[^>]*>66.7 %</dd>", prod_row)
    assert "1 drained node returned within an hour" in prod_row

    resumed = region(body, f"insights-judged-{made['restart-0'].pk}-resumed_in_place")
    workload = made["restart-0"].workload
    assert f'href="/workloads/{workload.pk}/#recommendation-{made["restart-0"].pk}"' in resumed
    assert workload.job_id in resumed
    assert "Resumed at step 1200, at or past step 1150 reached before the restart" in resumed
    assert "GPU has fallen off the bus." in resumed
    returned = region(body, f"insights-judged-{made['returned'].pk}-returned_within_an_hour")
    node = made["returned"].node
    assert node is not None
    assert f'href="/nodes/?cluster=prod#node-{node.pk}">gpu-007</a>' in returned
    assert "otto returned the node to service 10 min 00 s after the drain" in returned
    rejected = region(body, f"insights-judged-{made['rejected'].pk}-rejected")
    assert "(proposed)" in rejected
    assert "Rejected by otto: “it saves checkpoints itself”" in rejected
    for standing in ("restart-1", "drained", "old"):
        assert f"insights-judged-{made[standing].pk}-" not in body


def test_without_actions_the_precision_is_a_dash(viewer: User) -> None:
    lab = ClusterFactory(name="lab")
    body = logged_in(viewer).get(URL).content.decode()
    row = region(body, f"insights-precision-{lab.pk}")
    assert re.search(r"Precision</dt><dd[^>]*>—</dd>", row)
    assert "no action taken" in row
    assert "Judged unnecessary</h3>" not in region(body, "insights-precision")


def test_the_cluster_and_range_filters_narrow_the_precision(viewer: User) -> None:
    lab, prod = ClusterFactory(name="lab"), ClusterFactory(name="prod")
    made = precision_trail(lab, prod, timezone.now())
    client = logged_in(viewer)

    body = client.get(URL, {"cluster": "prod", "range": "24h"}).content.decode()
    section = region(body, "insights-precision")
    assert "Action precision on prod" in section
    assert f'id="insights-precision-{lab.pk}"' not in section
    assert "0 restarts · 0 stops · 2 drains" in region(body, f"insights-precision-{prod.pk}")
    assert f"insights-judged-{made['returned'].pk}-" in section
    assert f"insights-judged-{made['rejected'].pk}-" not in section

    week = client.get(URL, {"cluster": "prod", "range": "7d"}).content.decode()
    assert "1 restart · 0 stops · 2 drains" in region(week, f"insights-precision-{prod.pk}")


def test_the_precision_section_reads_a_bounded_number_of_rows(
    viewer: User, django_assert_max_num_queries: DjangoAssertNumQueries
) -> None:
    """
    GIVEN clusters with many actions, some judged unnecessary
    WHEN a viewer opens the page
    THEN the queries do not grow with the clusters or the actions
    """
    client = logged_in(viewer)
    client.get(URL)
    now = timezone.now()

    def add_clusters() -> None:
        precision_trail(ClusterFactory(), ClusterFactory(), now)

    add_clusters()
    with django_assert_max_num_queries(20):
        assert client.get(URL).status_code == 200
    for _ in range(3):
        add_clusters()
    with django_assert_max_num_queries(20):
        assert client.get(URL).status_code == 200


# --- the range fits the data; ETTR over time means something for a young cluster -------------


def young_cluster(hours: int = 24, lost_in_hour: int = 12) -> tuple[Cluster, datetime]:
    """A cluster whose first event came ``hours`` and 10 minutes ago, with a snapshot each hour
    since: two workloads' wall time (2 h per hour) and 30 minutes lost in one hour."""
    lab = ClusterFactory(name="lab")
    now = timezone.now()
    first = now - timedelta(hours=hours, minutes=10)
    record_event(cluster=lab, kind=AuditKind.STATE_CHANGED, actor="test", occurred_at=first)
    for k in range(hours + 1):
        taken = now - timedelta(hours=hours - k, minutes=1)
        wall = 7200.0 * (k + 1)
        lost = 1800.0 if k >= lost_in_hour else 0.0
        snapshot(
            lab,
            minutes_ago=(now - taken).total_seconds() / 60,
            wall_seconds=wall,
            unproductive_seconds=lost,
            ettr=1 - lost / wall,
        )
    return lab, first


def local_hour(moment: datetime) -> str:
    hour = moment.astimezone(UTC).replace(minute=0, second=0, microsecond=0)
    return timezone.localtime(hour).strftime("%Y-%m-%d %H:%M:%S")


def test_the_default_range_starts_where_a_days_data_does(viewer: User) -> None:
    """
    GIVEN a cluster with one day of data
    WHEN a viewer opens Insights at its default range of 7 days
    THEN the header says there is 1 day of data, and every chart over time starts at the hour
         the data does instead of 7 days ago
    """
    _, first = young_cluster()
    body = logged_in(viewer).get(URL).content.decode()
    assert "1 day of data" in text_of(region(body, "insights-as-of"))
    assert '<option value="7d" selected>' in body
    for chart_id in ("insights-chart-ettr", "insights-chart-by-category"):
        layout = figure(body, chart_id)["layout"]
        if "range" in layout.get("xaxis", {}):
            assert layout["xaxis"]["range"][0] == local_hour(first), chart_id


def text_of(html: str) -> str:
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", "", html)).strip()


def test_a_young_clusters_ettr_is_a_line_per_hour_and_one_so_far(viewer: User) -> None:
    young_cluster()
    body = logged_in(viewer).get(URL).content.decode()
    traces = {t["name"]: t for t in figure(body, "insights-chart-ettr")["data"]}
    assert set(traces) == {"lab: each hour", "lab: so far"}
    each, so_far = traces["lab: each hour"], traces["lab: so far"]
    assert each["mode"] == so_far["mode"] == "lines+markers"
    assert so_far["line"]["dash"] == "dash"
    assert each["line"]["color"] == so_far["line"]["color"]
    # An hour for each snapshot, all productive but the hour 30 minutes were lost in.
    assert len(each["y"]) == 25
    assert sorted(each["y"])[:2] == [pytest.approx(0.75), 1.0]
    assert so_far["y"][-1] == pytest.approx(1 - 1800 / (7200 * 25))


def test_a_range_the_data_fills_says_nothing_of_its_span(viewer: User) -> None:
    young_cluster(hours=30)
    body = logged_in(viewer).get(URL, {"range": "24h"}).content.decode()
    assert "of data" not in text_of(region(body, "insights-as-of"))
    ettr = figure(body, "insights-chart-ettr")
    start = datetime.fromisoformat(ettr["layout"]["xaxis"]["range"][0])
    assert timezone.make_aware(start) >= timezone.now() - timedelta(hours=25)


def test_a_cluster_older_than_the_window_draws_its_trailing_ettr(viewer: User) -> None:
    lab = ClusterFactory(name="lab")
    record_event(
        cluster=lab,
        kind=AuditKind.STATE_CHANGED,
        actor="test",
        occurred_at=timezone.now() - timedelta(days=9),
    )
    for hours in (3, 2, 1):
        snapshot(lab, minutes_ago=hours * 60, wall_seconds=500_000.0, ettr=0.9)
    body = logged_in(viewer).get(URL).content.decode()
    (line,) = figure(body, "insights-chart-ettr")["data"]
    assert line["name"] == "lab: over the trailing window"
    assert line["line"]["dash"] == "dot"
    assert line["y"] == [0.9, 0.9, 0.9]
    assert "of data" not in text_of(region(body, "insights-as-of"))
