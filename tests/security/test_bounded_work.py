"""Bounded work per job: what one job prints cannot make a read, a decision or a report unbounded.

- A flood of distinct failure lines adds at most the caps of anomalies; the rest are folded
  into existing ones with their counts, and a re-read adds nothing.
- The attribution provider is never called while the read's transaction holds a row lock,
  and a worker killed before it called leaves a state the next poll completes.
- A decision reads the workload's history with the same queries for 5 anomalies as for 300.
- A controller's free-form report (``state_before``, ``commands``) is size- and depth-limited.
"""

from __future__ import annotations

import json
import os
import threading
import uuid
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from django.core.cache import cache
from django.db import OperationalError, connection
from django.db.models.signals import post_init
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone
from pytest_django.fixtures import DjangoAssertNumQueries
from pytest_django.fixtures import Settings as SettingsWrapper
from rest_framework.test import APIClient

from recovery.audit.limits import MAX_FREE_FORM_BYTES, MAX_FREE_FORM_DEPTH, free_form_problem
from recovery.choices import AuditKind, Confirmation, RecommendationStatus
from recovery.controller.controller import job_snapshot
from recovery.loop import attribution
from recovery.loop.anomalies import finish_awaited_attributions
from recovery.loop.logs import ingest_workload_logs
from recovery.loop.policy import decide_when_ready
from recovery.loop.push import LogBatch, ingest_log_batch
from recovery.models import (
    Anomaly,
    Attempt,
    AuditEvent,
    ControllerToken,
    LogCursor,
    Verdict,
    Workload,
)
from recovery.schedulers.transport import LocalTransport
from recovery.sources.attribution_provider import post_with_deadline
from tests.factories import AnomalyFactory, ClusterFactory, RecommendationFactory, WorkloadFactory
from tests.fakes import job

PER_READ = 10
PER_ATTEMPT = 25
FLOOD = 300
# Xids the detectors take as warnings (no failure): left out of the floods.
WARNING_XIDS = frozenset({45, 63, 92})


def xid_line(code: int, node: int = 2) -> str:
    """A kernel Xid line as the NVIDIA driver prints it; each code is a distinct finding."""
    return (
        f"Nov 29 03:14:15 node{node:03d} kernel: NVRM: Xid (PCI:0000:3b:00): {code}, "
        f"pid=2231, name=python, Ch 00000008\n"
    )


def xid_flood(poll: int = 0) -> str:
    """300 Xid lines of 300 codes, none of them a warning; each poll's codes are new."""
    codes = [code for code in range(1, 6 * FLOOD) if code not in WARNING_XIDS]
    return "".join(xid_line(code) for code in codes[poll * FLOOD : (poll + 1) * FLOOD])


@pytest.fixture
def caps(settings: SettingsWrapper) -> None:
    settings.MAX_NEW_ANOMALIES_PER_READ = PER_READ
    settings.MAX_ANOMALIES_PER_ATTEMPT = PER_ATTEMPT
    settings.ATTRIBUTION_PROVIDER_URL = ""
    cache.clear()


def reading_workload(tmp_path: Path, **fields: Any) -> Workload:
    workload = WorkloadFactory(
        stdout_path=str(tmp_path / "job.out"),
        work_dir=str(tmp_path),
        user_uid=os.getuid(),
        **fields,
    )
    Attempt.objects.create(workload=workload, number=1, nodes=["node001", "node002"])
    return workload


def append(workload: Workload, text: str) -> None:
    with Path(workload.stdout_path).open("a") as handle:
        handle.write(text)


def totals(workload: Workload) -> tuple[int, int, int]:
    """Anomalies, findings they stand for (recorded + folded), and lines they count."""
    anomalies = list(Anomaly.objects.filter(workload=workload))
    findings = len(anomalies) + sum(a.folded_findings for a in anomalies)
    return len(anomalies), findings, sum(a.occurrences for a in anomalies)


def events(kind: str) -> int:
    return AuditEvent.objects.filter(kind=kind).count()


# --- anomaly caps -------------------------------------------------------------------------


@pytest.mark.django_db
@pytest.mark.usefixtures("caps")
def test_a_flood_of_distinct_xids_adds_at_most_the_cap_and_counts_every_finding(
    tmp_path: Path,
) -> None:
    """
    GIVEN a job whose output holds 300 distinct Xid lines
    WHEN the output is read, then read again
    THEN at most the per-read cap of anomalies is stored, their counts add up to 300 findings,
    one event says findings were folded, and the second read adds nothing.
    """
    workload = reading_workload(tmp_path)
    append(workload, xid_flood())

    summary = ingest_workload_logs(workload, LocalTransport())

    stored, findings, lines = totals(workload)
    assert summary.anomalies_new == stored == PER_READ
    assert (findings, lines) == (FLOOD, FLOOD)
    assert events(AuditKind.DETECTED) == PER_READ
    assert events(AuditKind.ATTRIBUTED) == PER_READ
    folded = AuditEvent.objects.get(kind=AuditKind.ANOMALIES_FOLDED)
    assert (folded.attempt, folded.payload["cap"], folded.payload["limit"]) == (
        1,
        "per_read",
        PER_READ,
    )
    assert folded.payload["folded_findings"] == FLOOD - PER_READ
    assert Anomaly.objects.filter(folded_findings__gt=0, last_seen_at__isnull=False).exists()

    again = ingest_workload_logs(workload, LocalTransport())

    assert (again.bytes_read, again.anomalies_new) == (0, 0)
    assert totals(workload) == (PER_READ, FLOOD, FLOOD)
    assert events(AuditKind.DETECTED) == PER_READ
    assert events(AuditKind.ANOMALIES_FOLDED) == 1


@pytest.mark.django_db
@pytest.mark.usefixtures("caps")
def test_an_attempt_holds_at_most_its_cap_and_the_trail_says_so_once(tmp_path: Path) -> None:
    """
    GIVEN a job that prints 300 new distinct Xid lines between each of five polls
    WHEN each poll reads them
    THEN the attempt stops at its cap of anomalies, every finding is still counted, and one
    ANOMALIES_FOLDED event was written for the attempt.
    """
    workload = reading_workload(tmp_path)
    for poll in range(5):
        append(workload, xid_flood(poll))
        ingest_workload_logs(workload, LocalTransport())

    assert totals(workload) == (PER_ATTEMPT, 5 * FLOOD, 5 * FLOOD)
    assert events(AuditKind.DETECTED) == PER_ATTEMPT
    assert events(AuditKind.ANOMALIES_FOLDED) == 1


@pytest.mark.django_db
@pytest.mark.usefixtures("caps")
def test_a_read_rolled_back_after_its_findings_is_counted_once_when_read_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """
    GIVEN a worker that dies after recording a flood but before its read committed
    WHEN the next worker reads the same lines
    THEN the findings are counted once: the cursor commits with them or not at all.
    """
    workload = reading_workload(tmp_path)
    append(workload, xid_flood())
    original_save = LogCursor.save

    def dies(self: LogCursor, *args: Any, **kwargs: Any) -> None:
        raise RuntimeError("worker killed")

    monkeypatch.setattr(LogCursor, "save", dies)
    with pytest.raises(RuntimeError):
        ingest_workload_logs(workload, LocalTransport())
    assert totals(workload) == (0, 0, 0)
    monkeypatch.setattr(LogCursor, "save", original_save)

    ingest_workload_logs(workload, LocalTransport())

    assert totals(workload) == (PER_READ, FLOOD, FLOOD)
    assert events(AuditKind.ANOMALIES_FOLDED) == 1


@pytest.mark.django_db
@pytest.mark.usefixtures("caps")
def test_a_pushed_flood_sent_twice_is_counted_once(tmp_path: Path) -> None:
    workload = reading_workload(tmp_path)
    batch = LogBatch(lines=xid_flood().splitlines(), stream="node002:0", sequence=1)

    first = ingest_log_batch(workload, batch)
    repeat = ingest_log_batch(workload, batch)

    assert first.anomalies_new == PER_READ
    assert repeat.duplicate
    assert totals(workload) == (PER_READ, FLOOD, FLOOD)


@pytest.mark.django_db
@pytest.mark.usefixtures("caps")
def test_folded_findings_show_where_the_anomaly_is_shown(
    tmp_path: Path, viewer: Any, settings: SettingsWrapper
) -> None:
    from django.test import Client

    from tests.conftest import TEST_PASSWORD

    workload = reading_workload(tmp_path)
    append(workload, xid_flood())
    ingest_workload_logs(workload, LocalTransport())
    folded = Anomaly.objects.filter(workload=workload, folded_findings__gt=0).first()
    assert folded is not None

    client = Client()
    assert client.login(username=viewer.username, password=TEST_PASSWORD)
    page = client.get(reverse("console:workload", args=[workload.pk])).content.decode()
    assert f"with {folded.folded_findings} more findings past the anomaly cap" in page
    body = client.get(f"/api/v1/anomalies/{folded.pk}/").json()
    assert body["folded_findings"] == folded.folded_findings
    assert body["occurrences"] == folded.occurrences


# --- the provider is asked after the commit ----------------------------------------------


VERDICT = {
    "attribution": "hardware",
    "confidence": 0.97,
    "implicated_nodes": ["node002"],
    "explanation": "Xid 79 on node002",
}


class LockProbingProvider(ThreadingHTTPServer):
    """Answers a verdict; before answering, tries to lock the reading job's rows from its own
    database connection, without waiting: a lock held by the read makes that fail."""

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _ProbeHandler)
        self.workload_id = 0
        self.calls: list[dict[str, bool]] = []

    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/verdict"

    def probe(self) -> dict[str, bool]:
        locked: dict[str, bool] = {}
        statements = {
            "workload": "SELECT id FROM recovery_workload WHERE id = %s FOR UPDATE NOWAIT",
            "cursor": "SELECT id FROM recovery_logcursor WHERE workload_id = %s FOR UPDATE NOWAIT",
        }
        try:
            for name, statement in statements.items():
                with connection.cursor() as cursor:
                    cursor.execute("START TRANSACTION")
                    try:
                        cursor.execute(statement, [self.workload_id])
                        locked[name] = False
                    except OperationalError:
                        locked[name] = True
                    finally:
                        cursor.execute("ROLLBACK")
        finally:
            connection.close()
        return locked


class _ProbeHandler(BaseHTTPRequestHandler):
    server: LockProbingProvider

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", "0")))
        self.server.calls.append(self.server.probe())
        body = json.dumps(VERDICT).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def probing_provider(settings: SettingsWrapper) -> Iterator[LockProbingProvider]:
    server = LockProbingProvider()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    settings.ATTRIBUTION_PROVIDER_URL = server.url()
    settings.ATTRIBUTION_PROVIDER_TIMEOUT = 2.0
    cache.clear()
    yield server
    server.shutdown()
    server.server_close()
    cache.clear()


@pytest.fixture
def atomic_at_call(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """Whether this thread was inside a transaction at each provider call."""
    seen: list[bool] = []

    def observed(*args: Any, **kwargs: Any) -> bytes:
        seen.append(connection.in_atomic_block)
        return post_with_deadline(*args, **kwargs)

    monkeypatch.setattr("recovery.loop.attribution.post_with_deadline", observed)
    return seen


EXIT_LINE = "srun: error: node002: task 1: Exited with exit code 1"


def read_output_file(workload: Workload) -> None:
    append(workload, xid_line(79) + EXIT_LINE + "\n")
    ingest_workload_logs(workload, LocalTransport())


def read_pushed_lines(workload: Workload) -> None:
    lines = [xid_line(79).strip(), EXIT_LINE]
    ingest_log_batch(workload, LogBatch(lines=lines, stream="node002:0", sequence=1))


READ_WAYS: dict[str, Callable[[Workload], None]] = {
    "output file": read_output_file,
    "pushed lines": read_pushed_lines,
}


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("way", sorted(READ_WAYS))
def test_the_provider_is_asked_after_the_read_commits_never_under_its_locks(
    way: str, tmp_path: Path, probing_provider: LockProbingProvider, atomic_at_call: list[bool]
) -> None:
    """
    GIVEN a provider that, when called, tries to lock the reading job's rows from another
    database connection without waiting
    WHEN a read finds an Xid and a task exit (pushed lines lock the workload row, a file read
    locks its cursor)
    THEN the provider is called once, outside any transaction, finds nothing locked, and its
    verdict is recorded before the policy decides on it.
    """
    workload = reading_workload(tmp_path)
    probing_provider.workload_id = workload.pk

    READ_WAYS[way](workload)

    assert probing_provider.calls == [{"workload": False, "cursor": False}]
    assert atomic_at_call == [False]
    anomaly = Anomaly.objects.get(workload=workload)
    assert anomaly.provider_due_at is None
    assert anomaly.verdicts.filter(provider=attribution.EXTERNAL_PROVIDER).exists()
    attributed = AuditEvent.objects.get(kind=AuditKind.ATTRIBUTED)
    assert attributed.payload["provider"] == attribution.EXTERNAL_PROVIDER
    recommended = AuditEvent.objects.get(kind=AuditKind.RECOMMENDED)
    assert recommended.payload["excluded_nodes"] == ["node002"]
    assert attributed.pk < recommended.pk


@pytest.mark.django_db
def test_a_worker_killed_before_asking_leaves_a_state_the_next_poll_completes_once(
    tmp_path: Path,
    probing_provider: LockProbingProvider,
    django_capture_on_commit_callbacks: Any,
) -> None:
    """
    GIVEN a read committed with its anomaly awaiting the provider, and the worker killed before
    its after-commit call ran
    WHEN the next poll catches up, twice
    THEN the anomaly was undecided meanwhile; the provider is asked once, one ATTRIBUTED event
    and one recommendation follow.
    """
    workload = reading_workload(tmp_path)
    probing_provider.workload_id = workload.pk
    append(workload, xid_line(79) + EXIT_LINE + "\n")
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        ingest_workload_logs(workload, LocalTransport())
    assert callbacks  # the call it would have made after the commit

    anomaly = Anomaly.objects.get(workload=workload)
    assert anomaly.provider_due_at is not None
    assert anomaly.decided_at is None
    assert anomaly.verdicts.get().provider == Verdict.BUILTIN_PROVIDER
    assert events(AuditKind.ATTRIBUTED) == 0
    assert not workload.recommendations.exists()

    assert finish_awaited_attributions(workload.cluster_id) == 1
    assert finish_awaited_attributions(workload.cluster_id) == 0

    assert len(probing_provider.calls) == 1
    assert events(AuditKind.ATTRIBUTED) == 1
    assert workload.recommendations.count() == 1
    decided = Anomaly.objects.get(pk=anomaly.pk)
    assert decided.provider_due_at is None
    assert decided.decided_at is not None


@pytest.mark.django_db
def test_provider_calls_per_read_are_bounded(
    tmp_path: Path,
    settings: SettingsWrapper,
    probing_provider: LockProbingProvider,
    django_capture_on_commit_callbacks: Any,
) -> None:
    settings.MAX_PROVIDER_CALLS_PER_READ = 2
    workload = reading_workload(tmp_path)
    probing_provider.workload_id = workload.pk
    append(workload, "".join(xid_line(code) for code in (13, 31, 43, 48, 79)))

    with django_capture_on_commit_callbacks(execute=True):
        ingest_workload_logs(workload, LocalTransport())

    assert len(probing_provider.calls) == 2
    reasons = [
        event.payload.get("degraded_reason")
        for event in AuditEvent.objects.filter(kind=AuditKind.ATTRIBUTED)
    ]
    assert len(reasons) == 5
    assert reasons.count(None) == 2
    assert reasons.count("provider not asked: at most 2 provider calls follow one read") == 3


# --- decisions read the history with constant work ---------------------------------------


def workload_with_anomalies(count: int) -> tuple[Workload, Anomaly]:
    """A failed attempt with ``count`` earlier hardware anomalies, and a new confirmed one."""
    workload = WorkloadFactory()
    attempt = Attempt.objects.create(
        workload=workload, number=1, nodes=[f"gpu-{n:03d}" for n in range(8)]
    )
    Anomaly.objects.bulk_create(
        AnomalyFactory.build(
            workload=workload,
            attempt=attempt,
            implicated_nodes=[f"gpu-{n % 8:03d}"],
            confirmation=Confirmation.CONFIRMED,
            decided_at=timezone.now(),
        )
        for n in range(count)
    )
    fresh = AnomalyFactory(
        workload=workload,
        attempt=attempt,
        implicated_nodes=["gpu-007"],
        confirmation=Confirmation.CONFIRMED,
    )
    return workload, Anomaly.objects.select_related("workload__cluster", "attempt").get(pk=fresh.pk)


@pytest.mark.django_db
def test_a_decision_reads_the_history_with_constant_queries(
    django_assert_max_num_queries: DjangoAssertNumQueries,
) -> None:
    """
    GIVEN two workloads whose attempt has 5 and 300 earlier anomalies
    WHEN the policy decides on a new anomaly of each
    THEN both decisions run the same number of queries and build no anomaly objects of the
    history in Python.
    """
    built: list[int] = []

    def count_anomaly(sender: type[Anomaly], **kwargs: Any) -> None:
        built.append(1)

    queries: dict[int, int] = {}
    objects: dict[int, int] = {}
    post_init.connect(count_anomaly, sender=Anomaly)
    try:
        for count in (5, 300):
            _, fresh = workload_with_anomalies(count)
            built.clear()
            with CaptureQueriesContext(connection) as captured:
                recommendation = decide_when_ready(fresh, timezone.now())
            assert recommendation is not None
            queries[count], objects[count] = len(captured), len(built)
    finally:
        post_init.disconnect(count_anomaly, sender=Anomaly)

    assert queries[5] == queries[300]
    assert objects[5] == objects[300] == 0
    _, fresh = workload_with_anomalies(300)
    with django_assert_max_num_queries(queries[5]):
        decide_when_ready(fresh, timezone.now())


# --- free-form fields from outside --------------------------------------------------------


def nested(levels: int) -> dict[str, Any]:
    value: dict[str, Any] = {"leaf": 1}
    for _ in range(levels - 1):
        value = {"inner": value}
    return value


def claimed_recommendation() -> tuple[APIClient, Any]:
    cluster = ClusterFactory()
    recommendation = RecommendationFactory(
        workload=WorkloadFactory(cluster=cluster), status=RecommendationStatus.READY
    )
    _, key = ControllerToken.issue(cluster, "slurm-advisor-1")
    client = APIClient()
    client.credentials(
        HTTP_AUTHORIZATION=f"Bearer {key}", HTTP_X_CONTROLLER_INSTANCE=str(uuid.uuid4())
    )
    claimed = client.post(reverse("api:advisor-claim", args=[recommendation.pk]), {}, format="json")
    assert claimed.status_code == 200
    return client, recommendation


OVERSIZED_REPORTS: dict[str, dict[str, Any]] = {
    "state_before too large": {"state_before": {"nodes": ["x" * 100] * 200}},
    "state_before too deep": {"state_before": nested(MAX_FREE_FORM_DEPTH + 1)},
    # Deeper than Python's own JSON reader can go without a RecursionError.
    "state_before far too deep": {"state_before": "DEEP"},
    "commands too large": {
        "commands": [{"argv": ["scontrol", "requeue", "1"], "returncode": 0, "output": "y" * 8000}]
        * 10
    },
}


@pytest.mark.django_db
@pytest.mark.parametrize("case", sorted(OVERSIZED_REPORTS))
def test_an_oversized_or_too_deep_report_is_refused_and_nothing_is_stored(case: str) -> None:
    """
    GIVEN a controller holding a recommendation
    WHEN it reports with a free-form field larger or deeper than allowed
    THEN the API answers 400 in its error shape naming the field, and neither the
    recommendation nor the audit trail changes.
    """
    client, recommendation = claimed_recommendation()
    events_before = AuditEvent.objects.count()
    body = {"outcome": "executed", "converged": True, **OVERSIZED_REPORTS[case]}
    levels = 100_000
    text = json.dumps(body).replace('"DEEP"', '{"a":' * levels + "1" + "}" * levels)

    response = client.post(
        reverse("api:advisor-report", args=[recommendation.pk]),
        text,
        content_type="application/json",
    )

    assert response.status_code == 400
    answer = response.json()
    assert answer["error"] == answer["detail"]
    if case.endswith("far too deep"):
        # Refused while the body is read, before any field is: no field to name.
        assert answer["code"] == "parse_error"
        assert "nested too deeply" in answer["error"]
    else:
        assert answer["error"] == "The request body is not valid."
        assert answer["code"] == "invalid"
        assert list(answer["fields"]) == [case.split(" ")[0]]
    recommendation.refresh_from_db()
    assert recommendation.status == RecommendationStatus.CLAIMED
    assert recommendation.result == {}
    assert AuditEvent.objects.count() == events_before


@pytest.mark.django_db
def test_a_report_at_the_limits_is_recorded() -> None:
    client, recommendation = claimed_recommendation()
    state = nested(MAX_FREE_FORM_DEPTH)
    state["padding"] = "z" * (MAX_FREE_FORM_BYTES - len(json.dumps(state)) - 20)
    assert free_form_problem(state) is None

    response = client.post(
        reverse("api:advisor-report", args=[recommendation.pk]),
        {"outcome": "executed", "state_before": state, "converged": True},
        format="json",
    )

    assert response.status_code == 200
    event = AuditEvent.objects.get(kind=AuditKind.SCHEDULER_ACTION)
    assert event.payload["state_before"] == state


def test_the_controller_fits_a_huge_jobs_snapshot_within_the_limit() -> None:
    """A job on 20,000 nodes: its snapshot is compressed so that its report is accepted."""
    nodes = [f"gpu-{rack:03d}-{n:03d}" for rack in range(200) for n in range(100)]
    snapshot = job_snapshot(job(nodes=nodes, excluded_nodes=nodes[:3]))
    assert free_form_problem(snapshot) is None
    assert snapshot["nodes"].startswith("gpu-000-[000-099],gpu-001-[000-099],")
    assert snapshot["excluded_nodes"] == "gpu-000-[000-002]"

    scattered = job_snapshot(job(nodes=nodes, excluded_nodes=nodes[::3]))
    assert free_form_problem(scattered) is None
    assert scattered["excluded_nodes"] == "6667 nodes, too many to list"
