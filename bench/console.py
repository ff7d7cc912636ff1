"""``make bench-console``: the Console's pages and live pushes at fleet scale, in MariaDB.

Seeds (once; kept between runs) a database of its own with 10,000 workloads on four clusters and
1,000,000 audit events, plus the attempts, nodes, anomalies, recommendations and progress samples
such a history comes with. Then serves it with the real ASGI server (uvicorn, DEBUG off, collected
static files) and measures, from a logged-in HTTP client on loopback:

- server time of the fleet page (default, filtered, sorted, deep page, search) and of workload
  pages picked at random, median and p95 over repeated requests; the reference, measured in the
  same run, is the login page (a template with no queries);
- push latency: a browser (Debian's Chromium through Playwright) keeps a workload page open while
  this process appends audit events the way the system does (``recovery.audit.record.record_event``,
  published on commit through channels-redis); the time from the append to the WebSocket message
  in the page, and to the event's row shown on the page; the reference is the same socket's
  ping/pong round trip.

Targets (issue 7): page server time median < 200 ms, push latency median < 500 ms.
"""

from __future__ import annotations

import argparse
import http.cookiejar
import json
import os
import random
import re
import statistics
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
WORK = ROOT / "var" / "bench-console"
DEFAULT_DATABASE_URL = "mysql://root@127.0.0.1:3306/workload_recovery_bench_console"
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/4"
WORKLOADS = 10_000
EVENTS = 1_000_000
CLUSTERS = ("dgx-east", "dgx-west", "h100-lab", "a100-batch")
NODES_PER_CLUSTER = 1_000
TARGET_PAGE_MEDIAN_MS = 200.0
TARGET_PUSH_MEDIAN_MS = 500.0
TARGET_PAGES = ("fleet", "workload")
PASSWORD = "bench console password"
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-quic",
]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", type=int, default=WORKLOADS)
    parser.add_argument("--events", type=int, default=EVENTS)
    parser.add_argument("--requests", type=int, default=30, help="requests per page kind")
    parser.add_argument("--pushes", type=int, default=30, help="events pushed to the browser")
    parser.add_argument("--reseed", action="store_true", help="drop and seed the database again")
    args = parser.parse_args()

    os.environ.setdefault("DATABASE_URL", DEFAULT_DATABASE_URL)
    os.environ.setdefault("REDIS_URL", DEFAULT_REDIS_URL)
    os.environ["WR_VAR_DIR"] = str(WORK)
    os.environ["WR_CHANNEL_PREFIX"] = "bench-console"
    WORK.mkdir(parents=True, exist_ok=True)
    sys.path.insert(0, str(ROOT))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "workload_recovery.settings")

    import django

    django.setup()
    seeded = ensure_seeded(args.workloads, args.events, reseed=args.reseed)
    snapshot_s = take_snapshots()
    collect_static()
    port = free_port()
    server = start_server(port)
    try:
        wait_for_http(f"http://127.0.0.1:{port}/accounts/login/", server)
        base = f"http://127.0.0.1:{port}"
        pages = measure_pages(base, args.requests, seeded)
        pushes = measure_pushes(base, args.pushes, seeded)
    finally:
        server.terminate()
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()
    print(f"goodput snapshot of every cluster (the beat task's work): {snapshot_s:.1f} s")
    return report(pages, pushes)


# ---------- seeding ----------


def ensure_seeded(workloads: int, events: int, *, reseed: bool) -> dict[str, Any]:
    """The bench data, seeded once: a run with the same sizes reuses it."""
    from django.core.management import call_command
    from django.db import connection

    from recovery.models import AuditEvent, Workload

    database = connection.settings_dict["NAME"]
    if reseed:
        drop_database(database)
    ensure_database(database)
    call_command("migrate", verbosity=0, interactive=False)
    have_workloads = Workload.objects.count()
    have_events = AuditEvent.objects.count()
    if have_workloads != workloads or have_events < events:
        if have_workloads or have_events:
            connection.close()
            drop_database(database)
            ensure_database(database)
            call_command("migrate", verbosity=0, interactive=False)
        started = time.monotonic()
        seed(workloads, events)
        print(f"seeded {workloads:,} workloads and {events:,} audit events in "
              f"{time.monotonic() - started:.0f} s")  # fmt: skip
    else:
        print(f"reusing the seeded database: {have_workloads:,} workloads, "
              f"{have_events:,} audit events")  # fmt: skip
    return sample_ids()


def _server_connection() -> Any:
    import MySQLdb
    from django.db import connection

    params = connection.settings_dict
    return MySQLdb.connect(
        host=params["HOST"] or "127.0.0.1",
        port=int(params["PORT"] or 3306),
        user=params["USER"],
        passwd=params["PASSWORD"],
    )


def ensure_database(name: str) -> None:
    server = _server_connection()
    server.cursor().execute(f"CREATE DATABASE IF NOT EXISTS `{name}` CHARACTER SET utf8mb4")
    server.close()


def drop_database(name: str) -> None:
    server = _server_connection()
    server.cursor().execute(f"DROP DATABASE IF EXISTS `{name}`")
    server.close()


def seed(workload_count: int, event_count: int) -> None:
    from django.contrib.auth.models import Group, User
    from django.db import connection, transaction

    from recovery.choices import (
        AnomalyKind,
        AttemptExitState,
        Attribution,
        AuditKind,
        FailureCategory,
        RecommendationAction,
        RecommendationStatus,
        WorkloadState,
    )
    from recovery.models import (
        Anomaly,
        Attempt,
        AuditEvent,
        Cluster,
        Node,
        ProgressSample,
        Recommendation,
        Workload,
    )
    from recovery.roles import OPERATOR

    rng = random.Random(7)
    now = datetime.now(UTC)
    clusters = [Cluster.objects.create(name=name) for name in CLUSTERS]
    node_names = [f"gpu{i:04d}" for i in range(NODES_PER_CLUSTER)]
    Node.objects.bulk_create(
        [Node(cluster=c, name=n, scheduler_state="IDLE") for c in clusters for n in node_names],
        batch_size=5000,
    )
    operator = User.objects.create_user("bench", password=PASSWORD)
    operator.groups.add(Group.objects.get(name=OPERATOR))

    states = [WorkloadState.RUNNING] * 15 + [WorkloadState.COMPLETED] * 55
    states += [WorkloadState.FAILED] * 12 + [WorkloadState.PENDING] * 8
    states += [WorkloadState.STOPPED] * 5 + [WorkloadState.CANCELLED] * 5
    categories = [c for c in FailureCategory.values if c != FailureCategory.HEALTHY]
    users = [f"user{i:02d}" for i in range(40)]
    workloads = []
    for i in range(workload_count):
        submitted = now - timedelta(minutes=rng.uniform(10, 60 * 24 * 60))
        progress_at = submitted + timedelta(minutes=rng.uniform(5, 600))
        workloads.append(
            Workload(
                cluster=clusters[i % len(clusters)],
                job_id=str(100_000 + i),
                submit_time=submitted,
                name=f"{rng.choice(['llama', 'mixtral', 'gpt', 'vit', 'dit'])}-{i}",
                user=rng.choice(users),
                partition=rng.choice(["batch", "prio", "long"]),
                opted_in=True,
                state=rng.choice(states),
                current_attempt=rng.choice([1, 1, 1, 2, 2, 3]),
                last_progress_step=rng.randint(100, 200_000),
                last_progress_at=progress_at,
                last_checkpoint_step=rng.randint(0, 100) * 1000,
                last_checkpoint_at=progress_at - timedelta(minutes=rng.uniform(0, 30)),
            )
        )
    with transaction.atomic():
        Workload.objects.bulk_create(workloads, batch_size=2000)
    workloads = list(Workload.objects.order_by("id"))

    attempts, anomalies, samples = [], [], []
    for w in workloads:
        start = w.submit_time + timedelta(minutes=2)
        for number in range(1, w.current_attempt + 1):
            first = rng.randrange(0, NODES_PER_CLUSTER - 16)
            nodes = node_names[first : first + rng.choice([2, 4, 8, 16])]
            ended = start + timedelta(minutes=rng.uniform(20, 900))
            last = number == w.current_attempt
            running = last and w.state == WorkloadState.RUNNING
            attempts.append(
                Attempt(
                    workload=w,
                    number=number,
                    nodes=nodes,
                    started_at=start,
                    ended_at=None if running else ended,
                    exit_state=AttemptExitState.RUNNING
                    if running
                    else AttemptExitState.COMPLETED
                    if last and w.state == WorkloadState.COMPLETED
                    else AttemptExitState.FAILED,
                )
            )
            start = ended + timedelta(minutes=1)
    with transaction.atomic():
        Attempt.objects.bulk_create(attempts, batch_size=5000)
    attempt_rows = list(Attempt.objects.values_list("id", "workload_id", "number", "nodes"))
    by_workload: dict[int, list[tuple[int, int, list[str]]]] = {}
    for attempt_id, workload_id, number, nodes in attempt_rows:
        by_workload.setdefault(workload_id, []).append((attempt_id, number, nodes))

    for w in workloads:
        for attempt_id, number, nodes in by_workload.get(w.pk, []):
            if number == w.current_attempt and w.state != WorkloadState.FAILED:
                continue
            category = rng.choice(categories)
            at = w.submit_time + timedelta(minutes=30 * number)
            anomalies.append(
                Anomaly(
                    workload=w,
                    attempt_id=attempt_id,
                    kind=AnomalyKind.CRASH,
                    category=category,
                    attribution=rng.choice(Attribution.values[:4]),
                    signature=f"{category}.bench",
                    evidence_line=f"[rank{rng.randrange(64)}] error in {category} on {nodes[0]}",
                    evidence_excerpt="\n".join(f"line {k} of the log" for k in range(20)),
                    implicated_nodes=nodes[:1],
                    fingerprint=f"bench-{attempt_id}",
                    evidence_at=at,
                    detected_at=at + timedelta(seconds=rng.uniform(0.5, 8)),
                )
            )
        if w.state == WorkloadState.RUNNING:
            assert w.last_progress_at is not None  # every bench workload is made with one
            base = w.last_progress_at - timedelta(hours=1)
            samples += [
                ProgressSample(
                    workload=w,
                    attempt=w.current_attempt,
                    rank=0,
                    node="gpu0001",
                    step=k * 50,
                    throughput=1000.0,
                    step_time_seconds=0.5,
                    at=base + timedelta(seconds=30 * k),
                )
                for k in range(40)
            ]
    with transaction.atomic():
        Anomaly.objects.bulk_create(anomalies, batch_size=5000)
        ProgressSample.objects.bulk_create(samples, batch_size=5000)
    anomaly_rows = list(Anomaly.objects.values_list("id", "workload_id", "attempt_id"))
    recommendations = []
    for index, (anomaly_id, workload_id, attempt_id) in enumerate(anomaly_rows):
        waiting = index % 10 == 0
        recommendations.append(
            Recommendation(
                workload_id=workload_id,
                attempt_id=attempt_id,
                anomaly_id=anomaly_id,
                action=RecommendationAction.RESTART_EXCLUDING,
                excluded_nodes=["gpu0001"],
                reason="Hardware fault on gpu0001: restart from the last checkpoint without it.",
                status=RecommendationStatus.AWAITING_APPROVAL
                if waiting
                else RecommendationStatus.EXECUTED,
                idempotency_key=f"bench:{anomaly_id}",
            )
        )
    with transaction.atomic():
        Recommendation.objects.bulk_create(recommendations, batch_size=5000)

    # Audit events: raw multi-row INSERTs (1M ORM objects would dominate the seeding).
    failures = {workload_id for _, workload_id, _ in anomaly_rows}
    per_workload = event_count // len(workloads)
    extra = event_count - per_workload * len(workloads)
    table = AuditEvent._meta.db_table
    sql = (
        f"INSERT INTO {table} (occurred_at, cluster_id, workload_id, attempt, kind, actor, payload)"
        " VALUES (%s, %s, %s, %s, %s, %s, %s)"
    )
    rows: list[tuple[Any, ...]] = []
    with connection.cursor() as cursor:
        for index, w in enumerate(workloads):
            count = per_workload + (1 if index < extra else 0)
            at = w.submit_time
            rows.append((at, w.cluster_id, w.pk, 1, AuditKind.STATE_CHANGED, "poller",
                         json.dumps({"from": "pending", "to": "running"})))  # fmt: skip
            step = 0
            for k in range(1, count):
                at = at + timedelta(seconds=rng.uniform(30, 600))
                if w.pk in failures and k == count // 2:
                    kind, actor = AuditKind.DETECTED, "detector"
                    payload: dict[str, Any] = {"category": "gpu_hardware",
                                               "evidence_at": at.isoformat()}  # fmt: skip
                elif w.pk in failures and k == count // 2 + 1:
                    kind, actor, payload = AuditKind.SCHEDULER_ACTION, "controller-1", {
                        "command": "scontrol requeuehold", "ok": True}  # fmt: skip
                elif w.pk in failures and k == count // 2 + 2:
                    kind, actor, payload = AuditKind.PROGRESS_RESUMED, "poller", {"step": step}
                else:
                    step += 500
                    kind, actor, payload = AuditKind.CHECKPOINT_SAVED, "poller", {"step": step}
                rows.append((at, w.cluster_id, w.pk, 1, kind, actor, json.dumps(payload)))
            if len(rows) >= 20_000:
                cursor.executemany(sql, rows)
                rows.clear()
        if rows:
            cursor.executemany(sql, rows)


def sample_ids() -> dict[str, Any]:
    from recovery.models import Workload

    ids = list(Workload.objects.values_list("id", flat=True))
    rng = random.Random(11)
    running = list(
        Workload.objects.filter(state="running").order_by("id").values_list("id", flat=True)[:50]
    )
    return {"workloads": rng.sample(ids, min(200, len(ids))), "running": running}


def take_snapshots() -> float:
    """What the beat task does every few minutes: the fleet's and insights' cluster figures."""
    from django.utils import timezone

    from recovery.read.insights import take_goodput_snapshots

    started = time.monotonic()
    take_goodput_snapshots(timezone.now())
    return time.monotonic() - started


def collect_static() -> None:
    from django.core.management import call_command

    call_command("collectstatic", interactive=False, verbosity=0)


# ---------- the server ----------


def free_port() -> int:
    from workload_recovery.stack import free_port as pick

    return pick()


def start_server(port: int) -> subprocess.Popen[bytes]:
    from workload_recovery.stack import web_command

    log = (WORK / "web.log").open("wb")
    env = {**os.environ, "DEBUG": "false"}
    return subprocess.Popen(
        web_command("127.0.0.1", port),
        cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip


def wait_for_http(url: str, server: subprocess.Popen[bytes], seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise SystemExit(f"the server exited early; see {WORK / 'web.log'}")
        try:
            urllib.request.urlopen(url, timeout=2)
            return
        except OSError:
            time.sleep(0.3)
    raise SystemExit(f"{url} did not answer within {seconds} s")


class Browserless:
    """A logged-in HTTP client: cookies, CSRF, timed GETs."""

    def __init__(self, base: str) -> None:
        self.base = base
        self.jar = http.cookiejar.CookieJar()
        self.opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(self.jar))

    def login(self) -> None:
        page = self.opener.open(f"{self.base}/accounts/login/").read().decode()
        token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page)
        assert token is not None, "no CSRF token on the login page"
        body = urllib.parse.urlencode(
            {"username": "bench", "password": PASSWORD, "csrfmiddlewaretoken": token.group(1)}
        ).encode()
        request = urllib.request.Request(
            f"{self.base}/accounts/login/",
            data=body,
            headers={"Referer": f"{self.base}/accounts/login/"},
        )
        landed = self.opener.open(request)
        assert "/accounts/login/" not in landed.geturl(), "login failed"

    def timed_get(self, path: str) -> float:
        started = time.perf_counter()
        response = self.opener.open(f"{self.base}{path}")
        response.read()
        elapsed = (time.perf_counter() - started) * 1000
        if response.status != 200 or (
            "/accounts/login/" in response.geturl() and path != "/accounts/login/"
        ):
            raise SystemExit(f"GET {path} answered {response.status} at {response.geturl()}")
        return elapsed


def measure_pages(base: str, requests: int, seeded: dict[str, Any]) -> dict[str, list[float]]:
    client = Browserless(base)
    client.login()
    anonymous = Browserless(base)
    workloads = seeded["workloads"]
    kinds: dict[str, Callable[[int], str]] = {
        "reference: login page": lambda i: "/accounts/login/",
        "fleet: first page": lambda i: "/",
        "fleet: one cluster": lambda i: f"/?cluster={CLUSTERS[i % len(CLUSTERS)]}",
        "fleet: failed, sorted by progress": lambda i: "/?state=failed&sort=-progress",
        "fleet: page 100": lambda i: "/?page=100",
        "fleet: search by job id": lambda i: f"/?q={100_000 + (i * 37) % WORKLOADS}",
        "workload page": lambda i: f"/workloads/{workloads[i % len(workloads)]}/",
        # Not in the targets; measured because they read the same big tables.
        "audit trail: newest page": lambda i: "/audit/",
        "audit trail: one workload": lambda i: f"/audit/?workload={workloads[i % len(workloads)]}",
        "audit trail: one kind, 7 days": lambda i: "/audit/?kind=detected&range=7d",
        "approvals": lambda i: "/approvals/",
        "insights": lambda i: "/insights/",
        "clusters": lambda i: "/clusters/",
    }
    timings: dict[str, list[float]] = {kind: [] for kind in kinds}
    for kind, path_for in kinds.items():  # one warm-up each: first-request imports, caches
        (anonymous if kind.startswith("reference") else client).timed_get(path_for(0))
    for i in range(requests):
        for kind, path_for in kinds.items():
            who = anonymous if kind.startswith("reference") else client
            timings[kind].append(who.timed_get(path_for(i + 1)))
    return timings


# ---------- live pushes ----------

# Records every message the page's WebSocket receives, with the wall-clock time.
RECORD_SOCKET = """
(() => {
  window.__wr = { messages: [], pongs: [] };
  const Native = window.WebSocket;
  window.WebSocket = function (url, protocols) {
    const socket = protocols ? new Native(url, protocols) : new Native(url);
    window.__wr.socket = socket;
    socket.addEventListener('message', (event) => {
      const at = performance.timeOrigin + performance.now();
      try {
        const data = JSON.parse(event.data);
        if (data.type === 'pong') window.__wr.pongs.push(at);
        else window.__wr.messages.push({ at, id: data.event_id });
      } catch (err) {}
    });
    return socket;
  };
  window.WebSocket.prototype = Native.prototype;
  Object.assign(window.WebSocket, { OPEN: 1, CLOSED: 3, CONNECTING: 0, CLOSING: 2 });
})();
"""


def measure_pushes(base: str, pushes: int, seeded: dict[str, Any]) -> dict[str, list[float]]:
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"  # Playwright's sync API runs a loop here
    from django.db import transaction
    from playwright.sync_api import sync_playwright

    from recovery.audit.record import record_event
    from recovery.choices import AuditKind
    from recovery.models import Workload

    workload = Workload.objects.select_related("cluster").get(pk=seeded["running"][0])
    results: dict[str, list[float]] = {"push": [], "shown": [], "reference: ping/pong": []}
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS
        )
        page = browser.new_page()
        page.add_init_script(RECORD_SOCKET)
        page.goto(f"{base}/accounts/login/")
        page.fill("input[name=username]", "bench")
        page.fill("input[name=password]", PASSWORD)
        page.click("button[type=submit]")
        page.wait_for_url(f"{base}/")
        page.goto(f"{base}/workloads/{workload.pk}/")
        page.wait_for_selector('#live-status[data-state="live"]', timeout=20_000)
        for _ in range(pushes):
            sent = time.time() * 1000
            page.evaluate("window.__wr.socket.send(JSON.stringify({type: 'ping'}))")
            page.wait_for_function("n => window.__wr.pongs.length >= n",
                                   arg=len(results["reference: ping/pong"]) + 1)  # fmt: skip
            received = page.evaluate("window.__wr.pongs[window.__wr.pongs.length - 1]")
            results["reference: ping/pong"].append(received - sent)
        # Playwright's sync API runs an event loop in this thread, and publishing goes through
        # async_to_sync: events are appended from a thread of their own, as a worker would.
        appender = ThreadPoolExecutor(max_workers=1)

        def append(step: int) -> tuple[int, float]:
            created = time.time() * 1000
            with transaction.atomic():
                event = record_event(
                    cluster=workload.cluster,
                    workload=workload,
                    attempt=workload.current_attempt,
                    kind=AuditKind.CHECKPOINT_SAVED,
                    actor="bench",
                    payload={"step": step},
                )
            return event.pk, created

        for i in range(pushes):
            event_id, created = appender.submit(append, 1_000_000 + i).result()
            page.wait_for_function(
                "id => window.__wr.messages.some(m => m.id === id)", arg=event_id, timeout=10_000
            )
            arrived = page.evaluate(
                "id => window.__wr.messages.find(m => m.id === id).at", event_id
            )
            results["push"].append(arrived - created)
            page.wait_for_selector(
                f'a[href="/audit/{event_id}/"]', timeout=10_000, state="attached"
            )
            results["shown"].append(time.time() * 1000 - created)
            time.sleep(0.4)  # events a few hundred ms apart, not one burst
        appender.shutdown()
        browser.close()
    return results


# ---------- the report ----------


def _p95(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]


def report(pages: dict[str, list[float]], pushes: dict[str, list[float]]) -> int:
    reference = statistics.median(pages["reference: login page"])
    print()
    print(f"{'page (server time over loopback HTTP)':42} {'median':>9} {'p95':>9} {'x ref':>7}")
    failed = []
    for kind, values in pages.items():
        median = statistics.median(values)
        print(f"{kind:42} {median:7.1f}ms {_p95(values):7.1f}ms {median / reference:7.1f}")
        if kind.startswith(TARGET_PAGES) and median >= TARGET_PAGE_MEDIAN_MS:
            failed.append(f"{kind}: median {median:.0f} ms ≥ {TARGET_PAGE_MEDIAN_MS:.0f} ms")
    ping = statistics.median(pushes["reference: ping/pong"])
    print()
    print(f"{'live update (event appended → browser)':42} {'median':>9} {'p95':>9} {'x ref':>7}")
    for kind, values in pushes.items():
        median = statistics.median(values)
        print(f"{kind:42} {median:7.1f}ms {_p95(values):7.1f}ms {median / ping:7.1f}")
    push = statistics.median(pushes["push"])
    if push >= TARGET_PUSH_MEDIAN_MS:
        failed.append(f"push latency median {push:.0f} ms ≥ {TARGET_PUSH_MEDIAN_MS:.0f} ms")
    print()
    if failed:
        print("MISSED: " + "; ".join(failed))
        return 1
    print(f"within the targets: fleet and workload page medians < {TARGET_PAGE_MEDIAN_MS:.0f} ms, "
          f"push median < {TARGET_PUSH_MEDIAN_MS:.0f} ms")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
