"""The workload page's timeline, and a workload page that stays bounded for long histories."""

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

from console.charts import colour_for_category, figure_payload
from console.timeline import CONFIRMATION_MARKERS, TIMELINE_HEIGHT_PX, workload_timeline
from console.timeline_common import ANOMALY_SYMBOLS, EXIT_STATE_COLOURS, short_nodes
from console.timeline_decisions import (
    DECISION_MARKERS,
    DECISIONS_ROW,
    SAME_MOMENT_SHARE,
    SEVERAL_NAME,
    DecisionMarker,
    group_same_moment,
)
from recovery.audit.record import record_event
from recovery.choices import (
    AnomalyKind,
    AttemptExitState,
    AuditKind,
    Confirmation,
    FailureCategory,
    RecommendationAction,
    RecommendationStatus,
    WorkloadState,
)
from recovery.models import AuditEvent, Node, ProgressSample, Workload
from recovery.read.queries import WORKLOAD_TRAIL_LIMIT
from recovery.read.timeline import DECISION_EVENT_KINDS, progress_samples
from tests.conftest import TEST_PASSWORD
from tests.factories import (
    AnomalyFactory,
    AttemptFactory,
    ClusterFactory,
    RecommendationFactory,
    WorkloadFactory,
)

pytestmark = pytest.mark.django_db

T0 = datetime(2026, 11, 29, 10, 0, tzinfo=UTC)
NOW = T0 + timedelta(seconds=600)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def logged_in(user: User) -> Client:
    client = Client()
    assert client.login(username=user.username, password=TEST_PASSWORD)
    return client


def plotted(moment: datetime) -> str:
    """A time as the figure carries it: wall-clock time in the current zone."""
    return (
        timezone.localtime(moment).replace(tzinfo=None).isoformat(sep=" ", timespec="milliseconds")
    )


def event(
    workload: Workload, seconds: float, kind: str, attempt: int | None, **payload: Any
) -> None:
    record_event(
        cluster=workload.cluster,
        workload=workload,
        attempt=attempt,
        kind=kind,
        actor="test",
        payload=payload,
        occurred_at=at(seconds),
    )


@pytest.fixture
def history() -> Workload:
    """
    Attempt 1 on gpu01-04 runs from 0 and fails at 250 (checkpoints at 100 and 200); the
    crash is detected at 252, a restart excluding gpu02 recommended at 253 and done at 255;
    attempt 2 on gpu05-08 starts at 262, resumes from step 200 at 270, checkpoints at 330 and
    is still running at 600.
    """
    workload = WorkloadFactory(
        cluster=ClusterFactory(),
        state=WorkloadState.RUNNING,
        current_attempt=2,
        submit_time=at(-60),
    )
    first = AttemptFactory(
        workload=workload,
        number=1,
        nodes=["gpu01", "gpu02", "gpu03", "gpu04"],
        started_at=at(0),
        ended_at=at(250),
        exit_state=AttemptExitState.FAILED,
        exit_code=1,
        produced_checkpoint=True,
    )
    AttemptFactory(
        workload=workload,
        number=2,
        nodes=["gpu05", "gpu06", "gpu07", "gpu08"],
        excluded_nodes=["gpu02"],
        started_at=at(262),
        exit_state=AttemptExitState.RUNNING,
    )
    anomaly = AnomalyFactory(
        workload=workload,
        attempt=first,
        kind=AnomalyKind.CRASH,
        category=FailureCategory.GPU_HARDWARE,
        signature="xid_79",
        evidence_line="NVRM: Xid 79 <GPU has fallen off the bus>",
        implicated_nodes=["gpu02"],
        evidence_at=at(250),
        detected_at=at(252),
    )
    RecommendationFactory(
        workload=workload,
        anomaly=anomaly,
        status=RecommendationStatus.EXECUTED,
        created_at=at(253),
    )
    event(workload, 0, AuditKind.STATE_CHANGED, 1, to="running")
    event(workload, 100, AuditKind.CHECKPOINT_SAVED, 1, step=100, path="/ckpt/100")
    event(workload, 200, AuditKind.CHECKPOINT_SAVED, 1, step=200, path="/ckpt/200")
    event(workload, 252, AuditKind.DETECTED, 1, evidence_at=at(250).isoformat())
    event(workload, 255, AuditKind.SCHEDULER_ACTION, 1, action="requeue", excluded=["gpu02"])
    event(workload, 262, AuditKind.RESTART_ALLOCATED, 2)
    event(workload, 270, AuditKind.PROGRESS_RESUMED, 2, step=200)
    event(workload, 330, AuditKind.CHECKPOINT_SAVED, 2, step=300, path="/ckpt/300")
    samples = [
        ProgressSample(workload=workload, attempt=1, rank=rank, step=seconds + rank, at=at(seconds))
        for seconds in range(10, 250, 10)
        for rank in (0, 1)
    ]
    samples += [
        ProgressSample(workload=workload, attempt=2, rank=0, step=seconds - 70, at=at(seconds))
        for seconds in range(280, 600, 20)
    ]
    ProgressSample.objects.bulk_create(samples)
    return workload


def traces(figure: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {trace["name"]: trace for trace in figure["data"]}


@pytest.fixture
def figure(history: Workload) -> dict[str, Any]:
    return figure_payload(workload_timeline(history, now=NOW))


# ---------- the figure ----------


def test_it_has_a_decisions_row_above_one_row_per_attempt(figure: dict[str, Any]) -> None:
    axis = figure["layout"]["yaxis"]
    assert axis["categoryarray"] == [DECISIONS_ROW, "Attempt 1", "Attempt 2"]
    assert axis["range"][0] > axis["range"][1]  # reversed: the decisions row on top
    assert figure["layout"]["xaxis"]["type"] == "date"


def test_attempts_are_bars_coloured_by_exit_state_with_their_nodes(
    figure: dict[str, Any],
) -> None:
    failed = traces(figure)["Attempt: Failed"]
    running = traces(figure)["Attempt: Running"]
    assert failed["type"] == running["type"] == "bar"
    assert failed["orientation"] == "h"
    assert failed["marker"]["color"] == EXIT_STATE_COLOURS[AttemptExitState.FAILED]
    assert running["marker"]["color"] == EXIT_STATE_COLOURS[AttemptExitState.RUNNING]
    assert failed["y"] == ["Attempt 1"]
    assert failed["text"] == ["gpu[01-04]"]
    assert failed["base"] == [plotted(at(0))]
    assert failed["x"] == [250_000]
    assert "exit code 1" in failed["hovertext"][0]
    assert "gpu[01-04]" in failed["hovertext"][0]
    assert "Excluded: gpu02" in running["hovertext"][0]


def test_a_running_attempt_ends_at_now(figure: dict[str, Any]) -> None:
    running = traces(figure)["Attempt: Running"]
    start = datetime.fromisoformat(running["base"][0])
    end = start + timedelta(milliseconds=running["x"][0])
    assert end == datetime.fromisoformat(plotted(NOW))
    assert "still running" in running["hovertext"][0]


def test_an_anomaly_sits_on_its_attempt_coloured_by_category(figure: dict[str, Any]) -> None:
    crash = traces(figure)["Anomaly: GPU hardware"]
    assert crash["mode"] == "markers"
    assert crash["x"] == [plotted(at(252))]
    assert crash["y"] == ["Attempt 1"]
    assert crash["marker"]["color"] == colour_for_category(FailureCategory.GPU_HARDWARE)
    assert crash["marker"]["symbol"] == ["x"]
    hover = crash["hovertext"][0]
    assert "Crash" in hover
    assert "Hardware" in hover
    assert "xid_79" in hover
    assert "gpu02" in hover
    assert "2.0 s later" in hover
    # The evidence is text, not markup.
    assert "&lt;GPU has fallen off the bus&gt;" in hover
    assert "<GPU" not in hover


@pytest.fixture
def crash_states() -> Workload:
    """
    One attempt from 0 to 500 with a crash in each confirmation state (all GPU hardware) and
    a hang, which needs no confirmation: suspected at 100 (still open), confirmed at 200 (the
    process exited 3.5 s after the evidence), survived at 300 (training went on) and stalled
    at 400 (no exit, no progress); the hang at 450.
    """
    workload = WorkloadFactory(state=WorkloadState.RUNNING, current_attempt=1)
    attempt = AttemptFactory(
        workload=workload,
        number=1,
        nodes=["node1", "node2"],
        started_at=at(0),
        exit_state=AttemptExitState.RUNNING,
    )

    def crash(seconds: float, state: str, after: float | None, reason: str) -> None:
        AnomalyFactory(
            workload=workload,
            attempt=attempt,
            kind=AnomalyKind.CRASH,
            category=FailureCategory.GPU_HARDWARE,
            evidence_at=at(seconds),
            detected_at=at(seconds + 1),
            confirmation=state,
            confirmation_at=at(seconds + after) if after is not None else None,
            confirmation_reason=reason,
        )

    crash(100, Confirmation.SUSPECTED, None, "")
    crash(200, Confirmation.CONFIRMED, 3.5, "srun: error: node2: task 1: Exited with exit code 1")
    crash(300, Confirmation.SURVIVED, 30, "progress to step 57 after it")
    crash(400, Confirmation.STALLED, 20, "no exit and no progress for 20 s <node2>")
    AnomalyFactory(
        workload=workload,
        attempt=attempt,
        kind=AnomalyKind.HANG,
        category=FailureCategory.NCCL_TIMEOUT,
        evidence_at=at(450),
        detected_at=at(451),
    )
    return workload


def anomaly_traces(figure: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {name: trace for name, trace in traces(figure).items() if name.startswith("Anomaly")}


def test_each_crash_state_has_its_own_marker_and_legend_entry(crash_states: Workload) -> None:
    """GIVEN crashes suspected, confirmed, survived and stalled, and a hang
    WHEN the timeline is built
    THEN each state is its own legend entry in the category's colour, told apart by symbol
    and fill (hollow while suspected, faint when survived), and the hang keeps its symbol
    """
    figure = figure_payload(workload_timeline(crash_states, now=NOW))
    named = anomaly_traces(figure)

    assert list(named) == [
        "Anomaly: GPU hardware · suspected",
        "Anomaly: GPU hardware · confirmed",
        "Anomaly: GPU hardware · survived",
        "Anomaly: GPU hardware · stalled",
        "Anomaly: NCCL timeout",
    ]
    suspected, confirmed, survived, stalled = (
        named[f"Anomaly: GPU hardware · {state}"]
        for state in ("suspected", "confirmed", "survived", "stalled")
    )
    assert suspected["x"] == [plotted(at(101))]
    assert confirmed["x"] == [plotted(at(201))]
    assert survived["x"] == [plotted(at(301))]
    assert stalled["x"] == [plotted(at(401))]
    assert {t["y"][0] for t in (suspected, confirmed, survived, stalled)} == {"Attempt 1"}
    gpu = colour_for_category(FailureCategory.GPU_HARDWARE)
    for trace in (suspected, confirmed, survived, stalled):
        assert trace["marker"]["color"] == gpu
        assert trace["legendgroup"] == "anomalies"

    symbols = [t["marker"]["symbol"][0] for t in (suspected, confirmed, survived, stalled)]
    assert len(set(symbols)) == 4
    assert confirmed["marker"]["symbol"] == ["x"]  # filled: acted on
    assert suspected["marker"]["symbol"] == ["x-open"]  # hollow: not yet acted on
    assert survived["marker"]["symbol"][0].endswith("-open")  # hollow: nothing was done
    assert not stalled["marker"]["symbol"][0].endswith("-open")  # filled: handled as a hang
    assert survived["marker"]["opacity"] < confirmed["marker"]["opacity"] == 1
    assert survived["marker"]["opacity"] < suspected["marker"]["opacity"]

    hang = named["Anomaly: NCCL timeout"]
    assert hang["marker"]["symbol"] == [ANOMALY_SYMBOLS[AnomalyKind.HANG]]
    assert hang["marker"]["symbol"][0] not in {m.symbol for m in CONFIRMATION_MARKERS.values()}


def test_the_hover_tells_the_state_why_and_how_long_confirmation_took(
    crash_states: Workload,
) -> None:
    figure = figure_payload(workload_timeline(crash_states, now=NOW))
    named = anomaly_traces(figure)
    hover = {name.rsplit(" · ", 1)[-1]: trace["hovertext"][0] for name, trace in named.items()}

    assert "State: <b>Suspected (not yet seen to end the process)</b>" in hover["suspected"]
    assert "Why:" not in hover["suspected"]

    confirmed = hover["confirmed"]
    assert "State: <b>Confirmed</b> at" in confirmed
    assert "(3.5 s after the evidence)" in confirmed
    assert "Why: srun: error: node2: task 1: Exited with exit code 1" in confirmed

    assert "State: <b>Survived (training went on)</b>" in hover["survived"]
    assert "Why: progress to step 57 after it" in hover["survived"]
    assert "after the evidence" not in hover["survived"]  # only a confirmation has a latency

    assert "State: <b>Stalled (no exit, no progress: handled as a hang)</b>" in hover["stalled"]
    # The reason is text, not markup.
    assert "&lt;node2&gt;" in hover["stalled"]
    assert "<node2>" not in hover["stalled"]

    assert "State:" not in hover["Anomaly: NCCL timeout"]


def test_the_page_shows_each_anomalys_confirmation(viewer: User, crash_states: Workload) -> None:
    """GIVEN crashes in each confirmation state and a hang
    WHEN the workload page is shown
    THEN each crash has a badge with its state and its reason, escaped; the hang has none
    """
    body = (
        logged_in(viewer).get(reverse("console:workload", args=[crash_states.pk])).content.decode()
    )
    anomalies = body[body.index('id="workload-anomalies"') : body.index('id="workload-attempts"')]
    for state in Confirmation.values:
        assert anomalies.count(f'class="badge confirmation-{state}"') == 1, state
    assert ">Survived</span>" in anomalies
    assert ">Suspected</span>" in anomalies
    assert 'title="Survived (training went on)"' in anomalies
    assert "srun: error: node2: task 1: Exited with exit code 1" in anomalies
    assert "(3.5 s after the evidence)" in anomalies
    assert "no exit and no progress for 20 s &lt;node2&gt;" in anomalies
    assert "<node2>" not in anomalies
    assert anomalies.count("anomaly__confirmation") == 4  # not for the hang


def test_decisions_at_the_same_moment_share_one_marker(figure: dict[str, Any]) -> None:
    """The recommendation at 253 s and the scheduler action at 255 s are 2 s apart on a
    10-minute axis: drawn apart they would sit on top of each other."""
    named = traces(figure)
    assert "Recommendation" not in named
    assert "Scheduler action" not in named
    several = named[SEVERAL_NAME]
    assert several["y"] == [DECISIONS_ROW]
    assert several["x"] == [plotted(at(253))]
    assert several["text"] == ["2"]
    hover = several["hovertext"][0]
    assert hover.startswith("<b>2 at once</b>")
    # Each decision's own hover, in time order.
    assert hover.index("Restart excluding nodes") < hover.index("requeue")
    assert "Executed" in hover


def test_decisions_apart_keep_their_own_markers(history: Workload) -> None:
    event(history, 400, AuditKind.SCHEDULER_ACTION, 2, action="requeue", excluded=[])
    named = traces(figure_payload(workload_timeline(history, now=NOW)))
    action = named["Scheduler action"]
    assert action["y"] == [DECISIONS_ROW]
    assert action["x"] == [plotted(at(400))]
    assert "requeue" in action["hovertext"][0]
    assert named[SEVERAL_NAME]["x"] == [plotted(at(253))]
    assert action["marker"]["symbol"] != named[SEVERAL_NAME]["marker"]["symbol"]


def test_at_a_day_scale_a_recommendation_its_approval_and_stop_are_one_marker() -> None:
    """
    GIVEN a day-long attempt; a stop recommended, approved 3 minutes later and carried out
          4 seconds after that, and an earlier approval hours before
    WHEN the timeline is drawn
    THEN the three close decisions are one marker listing each, the early one stays apart,
         and the legend sits below the chart, where plotly's mode bar cannot cover it
    """
    workload = WorkloadFactory(state=WorkloadState.STOPPED, current_attempt=1)
    AttemptFactory(
        workload=workload, number=1, started_at=at(0), ended_at=at(86_000), nodes=["gpu01"]
    )
    RecommendationFactory(
        workload=workload,
        action=RecommendationAction.STOP,
        status=RecommendationStatus.EXECUTED,
        created_at=at(80_000),
    )
    event(workload, 3_600, AuditKind.APPROVED, 1, action="restart")
    event(workload, 80_180, AuditKind.APPROVED, 1, action="stop")
    event(workload, 80_184, AuditKind.STOPPED, 1, reason="retry budget")

    figure = figure_payload(workload_timeline(workload, now=at(86_400)))

    named = traces(figure)
    several = named[SEVERAL_NAME]
    assert several["x"] == [plotted(at(80_000))]
    assert several["text"] == ["3"]
    hover = several["hovertext"][0]
    assert hover.index("Recommended: Stop") < hover.index("Approved") < hover.index("Stopped")
    assert named["Approved"]["x"] == [plotted(at(3_600))]
    legend = figure["layout"]["legend"]
    assert legend["orientation"] == "h"
    assert (legend["yref"], legend["y"], legend["yanchor"]) == ("container", 0, "bottom")


def test_markers_group_within_a_share_of_the_span_never_wider() -> None:
    moments = [at(0), at(5), at(9), at(10), at(30)]
    markers = [DecisionMarker(m, "Approved", "circle", "#000", 12, "") for m in moments]
    groups = group_same_moment(list(reversed(markers)), timedelta(seconds=9))
    assert [[m.at for m in group] for group in groups] == [
        [at(0), at(5), at(9)],  # 10 s is more than 9 s after the group's first
        [at(10)],
        [at(30)],
    ]
    assert SAME_MOMENT_SHARE == 0.01


def test_every_decision_event_read_has_a_marker() -> None:
    """The read model fetches the decision events the figure knows how to draw, no more."""
    assert list(DECISION_MARKERS) == list(DECISION_EVENT_KINDS)


def test_progress_is_drawn_below_with_checkpoints_as_diamonds(figure: dict[str, Any]) -> None:
    named = traces(figure)
    first, second = named["Progress"], named["Progress, attempt 2"]
    assert first["yaxis"] == second["yaxis"] == "y2"
    assert first["xaxis"] == "x2"
    # Attempt 1: 24 sample times (the furthest rank each), 2 checkpoints.
    assert len(first["x"]) == 24 + 2
    assert max(first["y"]) == 241  # rank 1 at 240 s
    # Attempt 2: resumed at step 200, 16 samples, a checkpoint at step 300.
    assert len(second["x"]) == 1 + 16 + 1
    assert second["y"][0] == 200
    checkpoints = named["Checkpoint saved"]
    assert checkpoints["marker"]["symbol"] == "diamond"
    assert checkpoints["y"] == [100, 200, 300]
    assert checkpoints["yaxis"] == "y2"
    assert named["Progress resumed"]["y"] == [200]


def test_the_cost_of_a_failure_is_shaded(figure: dict[str, Any]) -> None:
    named = traces(figure)
    lost = named["Work lost"]
    assert lost["fill"] == "toself"
    assert min(lost["x"]) == plotted(at(200))  # the last checkpoint before the failure
    assert max(lost["x"]) == plotted(at(250))  # the failure
    assert "50 s" in lost["text"]
    assert "steps 200 to 241: 41 steps to redo" in lost["text"]
    down = named["Until training resumed"]
    assert min(down["x"]) == plotted(at(250))
    assert max(down["x"]) == plotted(at(270))
    assert "20 s" in down["text"]
    assert "first new checkpoint): 1 min 20 s" in down["text"]
    # The same spans shade the attempts' rows.
    shapes = figure["layout"]["shapes"]
    assert {(s["x0"], s["x1"]) for s in shapes} == {
        (plotted(at(200)), plotted(at(250))),
        (plotted(at(250)), plotted(at(270))),
    }


def test_a_workload_with_nothing_yet_still_gives_a_figure() -> None:
    workload = WorkloadFactory(state=WorkloadState.PENDING)
    figure = figure_payload(workload_timeline(workload))
    assert figure["data"] == []
    assert figure["layout"]["yaxis"]["categoryarray"] == [DECISIONS_ROW]


def test_node_lists_are_compressed_or_cut_short() -> None:
    assert short_nodes(["gpu01", "gpu02", "gpu03", "gpu04"]) == "gpu[01-04]"
    scattered = [f"rack{r}-gpu{n:02d}" for r in range(8) for n in (1, 3, 5)]
    assert short_nodes(scattered) == "rack0-gpu01, rack0-gpu03, rack0-gpu05 +21 more"
    assert short_nodes([]) == ""


# ---------- bounds ----------


def test_progress_samples_are_thinned_evenly_to_the_bound() -> None:
    workload = WorkloadFactory()
    ProgressSample.objects.bulk_create(
        ProgressSample(workload=workload, attempt=1, rank=rank, step=t * 10 + rank, at=at(t))
        for t in range(1000)
        for rank in range(3)
    )
    other = WorkloadFactory()
    ProgressSample.objects.create(workload=other, attempt=1, step=10**9, at=at(5))

    points, thinned = progress_samples(workload, limit=100)

    assert thinned
    assert len(points) == 100
    assert points[0].at == at(0)
    assert [p.at for p in points] == [at(t) for t in range(0, 1000, 10)]
    assert all(p.step == (p.at - T0).total_seconds() * 10 + 2 for p in points)  # furthest rank


def test_few_progress_samples_are_all_kept() -> None:
    workload = WorkloadFactory()
    ProgressSample.objects.bulk_create(
        ProgressSample(workload=workload, attempt=1, step=t, at=at(t)) for t in range(50)
    )
    points, thinned = progress_samples(workload, limit=100)
    assert not thinned
    assert len(points) == 50


def test_the_figure_stays_small_for_a_long_history(history: Workload) -> None:
    ProgressSample.objects.bulk_create(
        ProgressSample(workload=history, attempt=2, step=t, at=at(600 + t)) for t in range(5000)
    )
    figure = figure_payload(workload_timeline(history, now=at(6000)))
    points = sum(len(trace.get("x") or []) for trace in figure["data"])
    assert points < 2500
    assert "progress thinned" in json.dumps(figure["layout"]["annotations"])


# ---------- the JSON endpoint ----------


def test_the_timeline_json_needs_a_login(history: Workload) -> None:
    url = reverse("console:workload_timeline", args=[history.pk])
    response = Client().get(url)
    assert response.status_code == 302
    assert response["Location"].startswith(reverse("login"))


def test_the_timeline_json_of_an_unknown_workload_is_404(viewer: User) -> None:
    response = logged_in(viewer).get(reverse("console:workload_timeline", args=[999_999]))
    assert response.status_code == 404


def test_the_timeline_json_is_the_figure(viewer: User, history: Workload) -> None:
    response = logged_in(viewer).get(reverse("console:workload_timeline", args=[history.pk]))
    assert response.status_code == 200
    assert response["Content-Type"] == "application/json"
    payload = response.json()
    names = {trace["name"] for trace in payload["data"]}
    assert {"Attempt: Failed", "Anomaly: GPU hardware", "Checkpoint saved"} <= names
    assert payload["layout"]["height"] == TIMELINE_HEIGHT_PX == 560


# ---------- the page ----------


def test_the_page_embeds_the_chart_outside_its_live_region(viewer: User, history: Workload) -> None:
    body = logged_in(viewer).get(reverse("console:workload", args=[history.pk])).content.decode()
    data = re.search(
        r'<div id="workload-timeline-data" data-live-refresh[^>]*>(.*?)</div>', body, re.S
    )
    assert data is not None
    assert '<script id="workload-timeline-figure" type="application/json">' in data.group(1)
    assert 'data-chart-source="workload-timeline-figure"' not in data.group(1)
    assert 'class="chart chart--timeline" data-chart-source="workload-timeline-figure"' in body
    assert "vendor/plotly/plotly.min.js" in body
    assert "console/charts.js" in body
    assert "console/workload.css" in body
    # Near the top: right after the summary, before the goodput panel.
    assert body.index('id="workload-summary"') < body.index("chart--timeline")
    assert body.index("chart--timeline") < body.index('id="workload-goodput"')
    embedded = re.search(r'type="application/json">(.*?)</script>', data.group(1), re.S)
    assert embedded
    figure = json.loads(embedded.group(1))
    assert "Attempt: Running" in {trace["name"] for trace in figure["data"]}


def test_the_page_shows_excluded_nodes(viewer: User, history: Workload) -> None:
    Node.objects.create(
        cluster=history.cluster, name="gpu06", excluded_until=timezone.now() + timedelta(hours=1)
    )
    Node.objects.create(
        cluster=history.cluster, name="gpu07", excluded_until=timezone.now() - timedelta(hours=1)
    )
    body = logged_in(viewer).get(reverse("console:workload", args=[history.pk])).content.decode()
    attempts = body[body.index('id="workload-attempts"') :]
    assert attempts.count(">excluded until <time") == 1
    assert re.search(r"gpu06 <span class=\"badge badge--excluded\"", attempts)
    assert 'node-excluded" title="gpu02">gpu02</span>' in attempts


@pytest.fixture
def long_history(history: Workload) -> Workload:
    """Many events and anomalies on one workload, and another workload's events besides."""
    kinds = [AuditKind.CHECKPOINT_SAVED, AuditKind.STATE_CHANGED, AuditKind.SCHEDULER_ACTION]
    AuditEvent.objects.bulk_create(
        AuditEvent(
            cluster=history.cluster,
            workload=history,
            attempt=2,
            kind=kinds[n % 3],
            actor="test",
            payload={"step": 300 + n},
            occurred_at=at(400 + n),
        )
        for n in range(WORKLOAD_TRAIL_LIMIT + 100)
    )
    for n in range(60):
        AnomalyFactory(workload=history, evidence_at=at(400 + n), detected_at=at(401 + n))
    other = WorkloadFactory(cluster=history.cluster)
    record_event(cluster=other.cluster, workload=other, kind=AuditKind.DETECTED, actor="x")
    return history


def test_the_audit_section_shows_the_newest_events_and_links_the_rest(
    viewer: User, long_history: Workload
) -> None:
    body = (
        logged_in(viewer).get(reverse("console:workload", args=[long_history.pk])).content.decode()
    )
    trail = body[body.index('id="audit-trail"') :]
    rows = re.findall(r'<tr id="event-(\d+)"', trail)
    assert len(rows) == WORKLOAD_TRAIL_LIMIT
    newest = AuditEvent.objects.filter(workload=long_history).order_by("-occurred_at", "-id")
    assert [int(pk) for pk in rows] == list(newest.values_list("pk", flat=True)[:200])
    assert f'href="{reverse("console:audit_event", args=[int(rows[0])])}"' in trail
    note = body[body.index('id="audit-trail-note"') :]
    assert "The newest 200 events" in note
    assert f'href="{reverse("console:audit")}?workload={long_history.pk}"' in note


def test_a_short_audit_trail_is_shown_whole(viewer: User, history: Workload) -> None:
    body = logged_in(viewer).get(reverse("console:workload", args=[history.pk])).content.decode()
    rows = re.findall(r'<tr id="event-(\d+)"', body)
    assert len(rows) == AuditEvent.objects.filter(workload=history).count()
    assert "The newest 200 events" not in body
    assert f"{reverse('console:audit')}?workload={history.pk}" in body


def test_the_page_shows_the_newest_anomalies_only(viewer: User, long_history: Workload) -> None:
    body = (
        logged_in(viewer).get(reverse("console:workload", args=[long_history.pk])).content.decode()
    )
    assert body.count('<article class="anomaly') == 50
    assert "The newest 50 anomalies" in body


def test_the_page_makes_a_bounded_number_of_queries(
    viewer: User,
    long_history: Workload,
    django_assert_max_num_queries: Any,
) -> None:
    client = logged_in(viewer)
    url = reverse("console:workload", args=[long_history.pk])
    # Besides the figure and the sections: the facts the latest action is read against, the
    # cluster's controllers, and the root cause older than the page with its verdicts.
    with django_assert_max_num_queries(29):
        response = client.get(url)
    assert response.status_code == 200
