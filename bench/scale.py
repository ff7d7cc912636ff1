"""``make bench-scale``: the whole stack against a simulated cluster, step by step of load.

For each load step (jobs on a cluster of nodes) everything starts fresh: the bench database's
recovery tables are emptied, the simulated cluster is reset, and three kinds of process run it as
in production: ``manage.py simulate`` (the cluster's clock and its jobs' log files), a Celery
worker (``celery -A tasks worker``) on the Redis broker, and this process in beat's role,
sending the real ``tasks.polling.poll_cluster`` every ``WR_POLL_SECONDS`` with beat's expiry.
Task start and run times come from Celery's own task events (``-E``), as a monitor such as
Flower reads them; nothing in the system is instrumented.

Per step it prints detection latency (``Anomaly.detected_at - evidence_at`` of crashes whose
evidence is a log line), log lines ingested per second next to the lines the jobs wrote, poll
run time, queue lag, the simulator's clock lag, MariaDB queries per second and the CPU of every
process. The reference, measured in the same run on the same logs: the detector alone, one
process, scanning those bytes. Then the verdict (largest step within a median of 5 s and a p95 of
15 s), what saturates first, and where one poll's time goes at the largest load (timers around
its phases and a cProfile of one call, in this process).
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import cProfile
import functools
import io
import json
import math
import os
import pstats
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
WORK = ROOT / "var" / "bench-scale"
DEFAULT_DATABASE_URL = "mysql://root@127.0.0.1:3306/workload_recovery_bench"
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/3"
# Jobs@nodes. The 4,000-node steps are the cluster size of the issue; the smaller clusters
# separate what grows with nodes from what grows with jobs (a job uses 2-4 nodes).
DEFAULT_STEPS = "50@200,100@400,250@1000,100@4000,1000@4000"
QUICK_STEPS = "50@200,250@1000"
# Polls taken apart right after these steps. Past saturation one poll reads minutes of backlog
# and takes minutes itself, so the largest loads whose polls still finish within a step are
# profiled: one with many jobs, one with many nodes.
DEFAULT_PROFILE = "250@1000,100@4000"
TARGET_MEDIAN_S = 5.0
TARGET_P95_S = 15.0
MIN_SAMPLES = 5
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")

# Settings are read when Django starts: the bench's own database, Redis and var directory first.
os.environ.setdefault("DATABASE_URL", DEFAULT_DATABASE_URL)
os.environ.setdefault("REDIS_URL", DEFAULT_REDIS_URL)
os.environ.setdefault("WR_VAR_DIR", str(WORK))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "workload_recovery.settings")
os.environ.setdefault("LOG_LEVEL", "WARNING")


@dataclass(frozen=True)
class Step:
    jobs: int
    nodes: int

    @property
    def name(self) -> str:
        return f"scale-{self.jobs}j-{self.nodes}n"

    @classmethod
    def parse(cls, text: str, nodes: int) -> Step:
        jobs, _, node_text = text.strip().partition("@")
        return cls(int(jobs), int(node_text) if node_text else nodes)


@dataclass
class PollTask:
    sent: float
    started: float | None = None
    finished: float | None = None
    runtime: float | None = None
    result: dict[str, int] = field(default_factory=dict)
    expired: bool = False
    failed: bool = False


@dataclass
class StepResult:
    step: Step
    concurrency: int
    window_s: float = 0.0
    jobs_running: float = 0.0
    written_lines_s: float = 0.0
    ingested_lines_s: float = 0.0
    ingested_mb_s: float = 0.0
    backlog_lines: int = 0
    poll_runtimes: list[float] = field(default_factory=list)
    polls_sent: int = 0
    polls_done: int = 0
    polls_skipped: int = 0
    polls_expired: int = 0
    polls_failed: int = 0
    queue_lags: list[float] = field(default_factory=list)
    queue_lengths: list[int] = field(default_factory=list)
    sim_lags: list[float] = field(default_factory=list)
    state_kb: float = 0.0
    # Detected crashes' latencies; a crash still unread after the drain counts as infinite.
    latencies: list[float] = field(default_factory=list)
    missed: int = 0
    # How much earlier Anomaly.detected_at is than the moment the detection was recorded.
    stamp_early: list[float] = field(default_factory=list)
    unread_lines: int = 0
    anomalies: dict[str, int] = field(default_factory=dict)
    undetected_note: str = ""
    db_queries_s: float = 0.0
    cpu: dict[str, float] = field(default_factory=dict)
    machine_busy: float = 0.0

    @property
    def passed(self) -> bool:
        if len(self.latencies) < MIN_SAMPLES:
            return False
        return (
            statistics.median(self.latencies) < TARGET_MEDIAN_S
            and percentile(self.latencies, 95) < TARGET_P95_S
        )


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile: with a few dozen samples, a value that was actually seen."""
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    rank = max(1, -(-len(ordered) * q // 100))
    return ordered[int(rank) - 1]


def seconds(value: float) -> str:
    return "never" if math.isinf(value) else f"{value:.1f}"


def median(values: list[float] | list[int]) -> float:
    return float(statistics.median(values)) if values else float("nan")


# ---------------------------------------------------------------------------- processes


@dataclass
class Child:
    name: str
    popen: subprocess.Popen[bytes]
    log: Path


def start_child(name: str, argv: list[str], log: Path, env: dict[str, str]) -> Child:
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as out:
        # Its own process group: a stop reaches celery's pool processes too, and Ctrl-C is
        # handled here once rather than by every child.
        popen = subprocess.Popen(
            argv, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    return Child(name, popen, log)


def stop_child(child: Child, grace_s: float = 20.0) -> None:
    if child.popen.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(child.popen.pid, signal.SIGTERM)
    try:
        child.popen.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(child.popen.pid, signal.SIGKILL)
        child.popen.wait()


class Children:
    """Every process this run started, so that any exit (Ctrl-C included) stops them."""

    def __init__(self) -> None:
        self.running: list[Child] = []

    def start(self, name: str, argv: list[str], log: Path, env: dict[str, str]) -> Child:
        child = start_child(name, argv, log, env)
        self.running.append(child)
        return child

    def stop(self, child: Child) -> None:
        stop_child(child)
        if child in self.running:
            self.running.remove(child)

    def stop_all(self) -> None:
        for child in reversed(self.running):
            stop_child(child)
        self.running.clear()

    def check(self) -> None:
        for child in self.running:
            if child.popen.poll() is not None:
                tail = child.log.read_text(errors="replace")[-2000:]
                raise SystemExit(f"{child.name} exited with {child.popen.returncode}:\n{tail}")


# ---------------------------------------------------------------------------- CPU from /proc


def _proc_stat(pid: int) -> tuple[int, int] | None:
    """(process group, CPU ticks used) of a process, or None once it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    rest = text.rsplit(")", 1)[1].split()
    return int(rest[2]), int(rest[11]) + int(rest[12])


def _pids() -> list[int]:
    return [int(entry.name) for entry in Path("/proc").iterdir() if entry.name.isdigit()]


def _pids_named(*names: str) -> list[int]:
    found = []
    for pid in _pids():
        with contextlib.suppress(OSError):
            if Path(f"/proc/{pid}/comm").read_text().strip() in names:
                found.append(pid)
    return found


def cpu_ticks(groups: dict[str, int], services: dict[str, list[int]]) -> dict[str, int]:
    """CPU ticks so far per role: a child's whole process group, or a service's processes."""
    totals = dict.fromkeys([*groups, *services], 0)
    by_group = {pgid: role for role, pgid in groups.items()}
    for pid in _pids():
        stat = _proc_stat(pid)
        if stat is not None and stat[0] in by_group:
            totals[by_group[stat[0]]] += stat[1]
    for role, pids in services.items():
        for pid in pids:
            stat = _proc_stat(pid)
            if stat is not None:
                totals[role] += stat[1]
    return totals


def machine_ticks() -> tuple[int, int]:
    """(busy, total) CPU ticks of the whole machine: other tenants show up here."""
    values = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = values[3] + values[4]
    return sum(values) - idle, sum(values)


# ---------------------------------------------------------------------------- Celery events


class TaskEvents:
    """Start and finish of the poll tasks, from the worker's task events."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.tasks: dict[str, PollTask] = {}
        self.lock = threading.Lock()
        self.receiver: Any = None
        self.ready = threading.Event()
        self.thread = threading.Thread(target=self._run, name="celery-events", daemon=True)

    def start(self) -> None:
        self.thread.start()
        self.ready.wait(10)

    def stop(self) -> None:
        if self.receiver is not None:
            self.receiver.should_stop = True
        self.thread.join(5)

    def sent(self, task_id: str, at: float) -> None:
        with self.lock:
            self.tasks[task_id] = PollTask(sent=at)

    def _run(self) -> None:
        with self.app.connection_for_read() as connection:
            self.receiver = self.app.events.Receiver(connection, handlers={"*": self._on_event})
            # The worker starts after this and is pinged before any poll is sent, so the
            # receiver's queue is declared before the first task event.
            self.ready.set()
            self.receiver.capture(limit=None, timeout=None, wakeup=False)

    def _on_event(self, event: dict[str, Any]) -> None:
        kind = event.get("type", "")
        if not kind.startswith("task-"):
            return
        with self.lock:
            task = self.tasks.get(event.get("uuid", ""))
            if task is None:
                return
            if kind == "task-started":
                task.started = float(event["timestamp"])
            elif kind == "task-succeeded":
                task.finished = float(event["timestamp"])
                task.runtime = float(event.get("runtime") or 0.0)
                with contextlib.suppress(ValueError, SyntaxError):
                    parsed = ast.literal_eval(event.get("result") or "{}")
                    if isinstance(parsed, dict):
                        task.result = parsed
            elif kind == "task-failed":
                task.finished, task.failed = float(event["timestamp"]), True
            elif kind == "task-revoked":
                task.expired = bool(event.get("expired"))
                task.finished = float(event["timestamp"])

    def snapshot(self) -> list[PollTask]:
        with self.lock:
            return [PollTask(**vars(task)) for task in self.tasks.values()]


# ---------------------------------------------------------------------------- the bench


class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        import django

        django.setup()
        from django.conf import settings

        from tasks.celery import app

        self.args = args
        self.settings = settings
        self.app = app
        self.children = Children()
        self.env = {**os.environ, "WR_POLL_SECONDS": str(args.poll_seconds)}
        self.python = sys.executable
        self.celery = str(Path(sys.executable).parent / "celery")
        import redis

        self.redis = redis.Redis.from_url(settings.REDIS_URL)
        self.queue = settings.CELERY_TASK_DEFAULT_QUEUE
        self.services = {
            "mariadb": _pids_named("mariadbd", "mysqld"),
            "redis": _pids_named("redis-server"),
        }

    # ------------------------------------------------------------------ setup

    def prepare_database(self) -> None:
        db = self.settings.DATABASES["default"]
        if "mysql" in db["ENGINE"]:
            if "bench" not in str(db["NAME"]):
                # Each step empties the recovery tables: never on a database of real use.
                raise SystemExit(f"refusing to empty {db['NAME']!r}: its name must contain 'bench'")
            import MySQLdb

            server = MySQLdb.connect(
                host=db["HOST"] or "127.0.0.1",
                port=int(db["PORT"] or 3306),
                user=db["USER"],
                password=db["PASSWORD"] or "",
            )
            server.cursor().execute(
                f"CREATE DATABASE IF NOT EXISTS `{db['NAME']}` CHARACTER SET utf8mb4"
            )
            server.close()
        subprocess.run(
            [self.python, "manage.py", "migrate", "--noinput", "-v", "0"],
            cwd=ROOT,
            env=self.env,
            check=True,
        )

    def empty_tables(self) -> None:
        from django.apps import apps
        from django.db import connection

        tables = [
            model._meta.db_table
            for model in apps.get_app_config("recovery").get_models(include_auto_created=True)
        ]
        with connection.cursor() as cursor:
            if connection.vendor == "mysql":
                # TRUNCATE, not DELETE: the audit table's triggers refuse deletes, by design.
                cursor.execute("SET FOREIGN_KEY_CHECKS = 0")
                for table in tables:
                    cursor.execute(f"TRUNCATE TABLE `{table}`")
                cursor.execute("SET FOREIGN_KEY_CHECKS = 1")
            else:
                for table in tables:
                    cursor.execute(f'DELETE FROM "{table}"')

    def clear_redis(self) -> None:
        """The broker queue, results, locks and simulations of this bench's Redis database."""
        keys = [self.queue, "unacked", "unacked_index"]
        for pattern in ("celery-task-meta-*", "wr:sim:*", "wr:poll:*"):
            keys += list(self.redis.scan_iter(pattern, count=1000))
        if keys:
            self.redis.delete(*keys)

    def sim_config(self, step: Step) -> Any:
        from recovery.simulator.cluster import SimConfig

        # The same fields the simulate command sets, so its cluster row and ours agree.
        return SimConfig(
            name=step.name,
            nodes=step.nodes,
            jobs=step.jobs,
            seed=self.args.seed,
            speedup=self.args.speedup,
            log_dir=str(Path(self.settings.VAR_DIR) / "sim"),
            faults_per_job_hour=self.args.faults_per_job_hour,
        )

    # ------------------------------------------------------------------ one step

    def run_step(self, step: Step, concurrency: int, *, keep_logs: bool) -> StepResult:
        from recovery.choices import ClusterMode
        from recovery.demo.live import ensure_simulated_cluster
        from tasks.polling import poll_cluster

        args = self.args
        print(
            f"\n== {step.jobs} jobs on {step.nodes} nodes, worker concurrency {concurrency}: "
            f"{args.warmup:g} s warm-up + {args.seconds:g} s measured",
            flush=True,
        )
        self.clear_redis()
        self.empty_tables()
        config = self.sim_config(step)
        log_dir = Path(config.log_dir) / config.name
        shutil.rmtree(log_dir, ignore_errors=True)
        cluster = ensure_simulated_cluster(config, ClusterMode.MONITOR)
        logs = WORK / "logs" / step.name
        shutil.rmtree(logs, ignore_errors=True)

        events = TaskEvents(self.app)
        events.start()
        simulate = self.children.start(
            "simulate",
            [self.python, "manage.py", "simulate", "--cluster", config.name,
             "--nodes", str(step.nodes), "--jobs", str(step.jobs),
             "--speedup", f"{args.speedup:g}", "--seed", str(args.seed),
             "--faults-per-job-hour", f"{args.faults_per_job_hour:g}",
             "--mode", ClusterMode.MONITOR, "--tick", "1", "--reset"],
            logs / "simulate.log",
            self.env,
        )  # fmt: skip
        worker = self.children.start(
            "worker",
            [self.celery, "-A", "tasks", "worker", "-E", "--loglevel", "WARNING",
             "--concurrency", str(concurrency), "-n", f"{step.name}@%h"],
            logs / "worker.log",
            self.env,
        )  # fmt: skip
        self._wait_for_worker()
        result = StepResult(step, concurrency)
        state_key = f"wr:sim:{config.name}:state"
        groups = {"simulate": simulate.popen.pid, "worker": worker.popen.pid}
        services = {**self.services, "bench driver": [os.getpid()]}

        started = time.monotonic()
        window_start = started + args.warmup
        window_end = window_start + args.seconds
        next_poll = started
        mark: dict[str, Any] = {}
        sim_stopped_at: float | None = None
        running_samples: list[int] = []
        while True:
            now = time.monotonic()
            self.children.check()
            if now >= next_poll and sim_stopped_at is None:
                sent_at = time.time()
                task = poll_cluster.apply_async((cluster.pk,), expires=args.poll_seconds * 0.9)
                events.sent(task.id, sent_at)
                next_poll += args.poll_seconds
            if "start" not in mark and now >= window_start:
                mark["start"] = self._mark(config, groups, services, cluster.pk)
            in_window = "start" in mark and sim_stopped_at is None
            if in_window:
                result.queue_lengths.append(int(self.redis.llen(self.queue)))
                lag, running = self._sim_clock(state_key, config.name)
                if lag is not None:
                    result.sim_lags.append(lag)
                running_samples.append(running)
            if sim_stopped_at is None and now >= window_end:
                mark["end"] = self._mark(config, groups, services, cluster.pk)
                result.state_kb = (self.redis.strlen(state_key) or 0) / 1024
                self.children.stop(simulate)
                sim_stopped_at = time.time()
            if sim_stopped_at is not None:
                # Drain: the last failures are detected by a poll that starts after the clock
                # stopped; polls keep coming until one such poll has finished.
                tasks = events.snapshot()
                caught_up = any(
                    t.started
                    and t.started > sim_stopped_at
                    and t.finished
                    and not t.result.get("skipped")
                    for t in tasks
                )
                if caught_up or time.time() - sim_stopped_at > args.drain_seconds:
                    break
                if now >= next_poll:
                    task = poll_cluster.apply_async((cluster.pk,), expires=args.poll_seconds * 0.9)
                    events.sent(task.id, time.time())
                    next_poll += args.poll_seconds
            time.sleep(max(0.0, min(1.0, next_poll - time.monotonic())))
        drained = time.time() - (sim_stopped_at or time.time())
        self.children.stop(worker)
        events.stop()
        self._finish(result, config, cluster.pk, mark, events.snapshot(), running_samples)
        result.undetected_note = (
            f"drained in {drained:.0f} s"
            if drained <= args.drain_seconds
            else f"drain timed out: {result.unread_lines:,} lines never read, "
            f"{result.missed} crashes in them counted as never detected"
        )
        if not keep_logs:
            shutil.rmtree(log_dir, ignore_errors=True)
        return result

    def _wait_for_worker(self) -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            self.children.check()
            if self.app.control.ping(timeout=1.0):
                return
        raise SystemExit("the Celery worker did not answer a ping within 60 s")

    def _sim_clock(self, state_key: str, name: str) -> tuple[float | None, int]:
        """How far the simulation's clock is behind the wall clock, and its running jobs.

        Only the head of the saved state is read ("now" comes first), so that sampling every
        second costs nothing next to what it measures; running jobs are counted on a full read
        every tenth sample.
        """
        head = self.redis.getrange(state_key, 0, 80).decode(errors="replace")
        lag = None
        marker = '"now":'
        if marker in head:
            value = head.split(marker, 1)[1].split(",", 1)[0]
            with contextlib.suppress(ValueError):
                lag = time.time() - float(value)
        self._clock_reads = getattr(self, "_clock_reads", 0) + 1
        if self._clock_reads % 10:
            return lag, -1
        raw = self.redis.get(state_key)
        if not raw:
            return lag, -1
        jobs = json.loads(raw)["jobs"]
        return lag, sum(1 for job in jobs if job["state"] == "RUNNING")

    def _mark(
        self, config: Any, groups: dict[str, int], services: dict[str, list[int]], cluster_id: int
    ) -> dict[str, Any]:
        from django.db import connection

        from recovery.models import LogCursor

        log_dir = Path(config.log_dir) / config.name
        sizes = {}
        if log_dir.exists():
            sizes = {str(path): path.stat().st_size for path in log_dir.glob("*.out")}
        offsets: dict[str, int] = {}
        for path, offset in LogCursor.objects.filter(workload__cluster_id=cluster_id).values_list(
            "path", "offset"
        ):
            offsets[path] = max(offset, offsets.get(path, 0))
        questions = 0
        if connection.vendor == "mysql":
            with connection.cursor() as cursor:
                cursor.execute("SHOW GLOBAL STATUS LIKE 'Questions'")
                questions = int(cursor.fetchone()[1])
        return {
            "time": time.time(),
            "sizes": sizes,
            "offsets": offsets,
            "cpu": cpu_ticks(groups, services),
            "machine": machine_ticks(),
            "questions": questions,
        }

    def _finish(
        self,
        result: StepResult,
        config: Any,
        cluster_id: int,
        mark: dict[str, Any],
        tasks: list[PollTask],
        running_samples: list[int],
    ) -> None:
        from recovery.choices import AuditKind
        from recovery.models import Anomaly, AuditEvent

        start, end = mark["start"], mark["end"]
        window = end["time"] - start["time"]
        result.window_s = window
        known = [n for n in running_samples if n >= 0]
        result.jobs_running = median(known) if known else float("nan")
        written = ingested = ingested_bytes = backlog = 0
        for path, size in end["sizes"].items():
            begin = start["sizes"].get(path, 0)
            done_from = start["offsets"].get(path, 0)
            done_to = end["offsets"].get(path, 0)
            with Path(path).open("rb") as handle:
                data = handle.read(size)
            written += data.count(b"\n", begin, size)
            ingested += data.count(b"\n", done_from, done_to)
            ingested_bytes += max(0, done_to - done_from)
            backlog += data.count(b"\n", done_to, size)
        result.written_lines_s = written / window
        result.ingested_lines_s = ingested / window
        result.ingested_mb_s = ingested_bytes / window / 1e6
        result.backlog_lines = backlog
        result.db_queries_s = (end["questions"] - start["questions"]) / window
        for role, ticks in end["cpu"].items():
            result.cpu[role] = (ticks - start["cpu"].get(role, 0)) / CLOCK_TICKS / window * 100
        busy = end["machine"][0] - start["machine"][0]
        total = end["machine"][1] - start["machine"][1]
        result.machine_busy = busy / total * 100 * (os.cpu_count() or 1) if total else 0.0

        in_window = [t for t in tasks if start["time"] <= t.sent <= end["time"]]
        result.polls_sent = len(in_window)
        for task in in_window:
            if task.expired:
                result.polls_expired += 1
            elif task.failed:
                result.polls_failed += 1
            elif task.result.get("skipped"):
                result.polls_skipped += 1
            elif task.runtime is not None:
                result.polls_done += 1
                result.poll_runtimes.append(task.runtime)
            if task.started is not None:
                result.queue_lags.append(max(0.0, task.started - task.sent))

        w0 = datetime.fromtimestamp(start["time"], tz=UTC)
        w1 = datetime.fromtimestamp(end["time"], tz=UTC)
        # Anomaly.detected_at is the poll's start time, not when the poll got to the log: a
        # slow poll would look fast. The "detected" audit event is written when the anomaly is.
        recorded = {
            payload.get("anomaly"): occurred_at
            for payload, occurred_at in AuditEvent.objects.filter(
                cluster_id=cluster_id, kind=AuditKind.DETECTED
            ).values_list("payload", "occurred_at")
        }
        anomalies = Anomaly.objects.filter(
            workload__cluster_id=cluster_id, evidence_at__gte=w0, evidence_at__lte=w1
        ).values_list("pk", "kind", "details", "evidence_at", "detected_at")
        for pk, kind, details, evidence_at, detected_at in anomalies:
            source = (details or {}).get("source", "")
            label = f"{kind}/{source}" if source else kind
            result.anomalies[label] = result.anomalies.get(label, 0) + 1
            if kind == "crash" and source == "log":
                at = recorded.get(pk, detected_at)
                result.latencies.append((at - evidence_at).total_seconds())
                result.stamp_early.append((at - detected_at).total_seconds())
        self._count_missed(result, cluster_id, end["sizes"], w0, w1)

    def _count_missed(
        self,
        result: StepResult,
        cluster_id: int,
        sizes: dict[str, int],
        w0: datetime,
        w1: datetime,
    ) -> None:
        """Crashes of the window in output no poll read before the drain ended.

        Leaving them out would report the latency of the lucky ones only: each counts as never
        detected. A job fails at most once per attempt, so a file counts once.
        """
        from recovery.loop.logs import scan
        from recovery.models import LogCursor

        offsets: dict[str, int] = {}
        for path, offset in LogCursor.objects.filter(workload__cluster_id=cluster_id).values_list(
            "path", "offset"
        ):
            offsets[path] = max(offset, offsets.get(path, 0))
        for path in sizes:
            with Path(path).open("rb") as handle:
                handle.seek(offsets.get(path, 0))
                unread = handle.read()
            if not unread:
                continue
            result.unread_lines += unread.count(b"\n")
            crashes = [
                finding
                for finding in scan(unread).findings
                if finding.kind == "crash"
                and finding.severity != "warning"
                and finding.source == "log"
                and finding.at is not None
                and w0 <= finding.at <= w1
            ]
            if crashes:
                result.missed += 1
                result.latencies.append(math.inf)

    # ------------------------------------------------------------------ reference

    def reference(self, step: Step) -> dict[str, float]:
        """The detector alone on the step's logs: one scanner over all of it, and per file."""
        from recovery.detection.scanner import LogScanner
        from recovery.detection.signature_set import SignatureSet
        from recovery.loop.logs import PROGRESS_SAMPLES, scan

        log_dir = Path(self.sim_config(step).log_dir) / step.name
        blobs = [path.read_bytes() for path in sorted(log_dir.glob("*.out"))]
        data = b"".join(blobs)
        lines = data.count(b"\n")
        signatures = SignatureSet.builtin()
        whole: list[float] = []
        per_file: list[float] = []
        for _ in range(self.args.reference_runs):
            began = time.perf_counter()
            scanner = LogScanner(signatures, progress_samples_per_block=PROGRESS_SAMPLES)
            scanner.feed(data)
            scanner.finish()
            whole.append(time.perf_counter() - began)
            began = time.perf_counter()
            for blob in blobs:
                scan(blob)
            per_file.append(time.perf_counter() - began)
        return {
            "files": len(blobs),
            "mb": len(data) / 1e6,
            "lines": lines,
            "whole_lines_s": lines / statistics.median(whole),
            "whole_mb_s": len(data) / 1e6 / statistics.median(whole),
            "per_file_lines_s": lines / statistics.median(per_file),
            "per_file_ms": statistics.median(per_file) / max(1, len(blobs)) * 1000,
        }

    # ------------------------------------------------------------------ one poll, taken apart

    def profile(self, step: Step, polls: int = 1) -> tuple[list[dict[str, tuple[float, int]]], str]:
        """Phase times and query counts of polls at ``step``, then a cProfile of one more.

        The cluster's clock is advanced here before each poll, as the simulate command would,
        so each poll reads what was written while the one before it ran. The first one reads
        the output of the clock's jump over the pause since the step ended, which the simulator
        caps per job, as much as a poll of a saturated run reads.
        """
        from django.db import connection

        import recovery.loop.poll as polling
        from recovery.models import Cluster
        from recovery.simulator.adapter import SimulatedAdapter
        from recovery.simulator.store import SimulationStore

        config = self.sim_config(step)
        store = SimulationStore.from_url(self.settings.REDIS_URL, config)
        cluster = Cluster.objects.get(name=config.name)
        phases: dict[str, tuple[float, int]] = {}
        queries = [0]

        def count_queries(execute: Callable[..., Any], *args: Any) -> Any:
            queries[0] += 1
            return execute(*args)

        def timed(label: str, function: Callable[..., Any]) -> Callable[..., Any]:
            @functools.wraps(function)
            def wrapper(*args: Any, **kwargs: Any) -> Any:
                began, before = time.perf_counter(), queries[0]
                try:
                    return function(*args, **kwargs)
                finally:
                    spent, count = phases.get(label, (0.0, 0))
                    phases[label] = (
                        spent + time.perf_counter() - began,
                        count + queries[0] - before,
                    )

            return wrapper

        patched: list[tuple[Any, str, Any]] = []
        targets = [
            (SimulatedAdapter, "list_nodes", "list_nodes (simulated store)"),
            (SimulatedAdapter, "list_jobs", "list_jobs (simulated store)"),
            (polling, "_sync_nodes", "sync nodes"),
            (polling, "_sync_job", "sync jobs"),
            (polling, "ingest_node_kernel_logs", "node kernel logs"),
            (polling, "ingest_workload_logs", "ingest job logs"),
            (polling, "_run_monitors", "monitors (endings, nodes, hang/straggler)"),
            (polling, "decide_pending", "decide_pending"),
        ]
        for owner, name, label in targets:
            original = getattr(owner, name)
            patched.append((owner, name, original))
            setattr(owner, name, timed(label, original))
        runs: list[dict[str, tuple[float, int]]] = []
        profiler = cProfile.Profile()
        try:
            with connection.execute_wrapper(count_queries):
                for index in range(polls + 1):
                    time.sleep(self.args.poll_seconds)
                    store.advance()
                    phases.clear()
                    queries[0] = 0
                    began = time.perf_counter()
                    if index == polls:
                        profiler.enable()
                    summary = polling.poll_cluster(cluster)
                    if index == polls:
                        profiler.disable()
                    phases["total"] = (time.perf_counter() - began, queries[0])
                    phases["summary"] = (float(summary.log_bytes), summary.jobs_seen)
                    runs.append(dict(phases))
        finally:
            for owner, name, original in patched:
                setattr(owner, name, original)
        out = io.StringIO()
        stats = pstats.Stats(profiler, stream=out)
        stats.sort_stats("tottime").print_stats(14)
        return runs, out.getvalue()


# ---------------------------------------------------------------------------- printing


def cpu_text(cpu: dict[str, float]) -> str:
    return " ".join(f"{role.split()[0]} {value:.0f}%" for role, value in cpu.items())


def print_table(results: list[StepResult], poll_seconds: int) -> None:
    print()
    header = (
        f"{'jobs':>5} {'nodes':>5} {'run':>4} {'written':>8} {'ingested':>8} {'backlog':>8} "
        f"{'poll s':>11} {'polls':>13} {'lag s':>10} {'LLEN':>7} {'sim lag':>8} "
        f"{'latency s':>11} {'n':>4} {'db q/s':>7}"
    )
    print(header)
    print(
        f"{'':>5} {'':>5} {'jobs':>4} {'lines/s':>8} {'lines/s':>8} {'lines':>8} "
        f"{'med/p95':>11} {'ok/skip/exp':>13} {'med/max':>10} {'med/max':>7} {'med s':>8} "
        f"{'med/p95':>11} {'':>4} {'':>7}"
    )
    for r in results:
        runtimes = r.poll_runtimes
        lags = r.queue_lags
        poll = f"{median(runtimes):.1f}/{percentile(runtimes, 95):.1f}" if runtimes else "-"
        lag = f"{median(lags):.1f}/{max(lags):.1f}" if lags else "-"
        llen = f"{median(r.queue_lengths):.0f}/{max(r.queue_lengths)}" if r.queue_lengths else "-"
        lat = (
            f"{seconds(median(r.latencies))}/{seconds(percentile(r.latencies, 95))}"
            if r.latencies
            else "-"
        )
        print(
            f"{r.step.jobs:>5} {r.step.nodes:>5} {r.jobs_running:>4.0f} {r.written_lines_s:>8,.0f} "
            f"{r.ingested_lines_s:>8,.0f} {r.backlog_lines:>8,} {poll:>11} "
            f"{f'{r.polls_done}/{r.polls_skipped}/{r.polls_expired}':>13} {lag:>10} {llen:>7} "
            f"{median(r.sim_lags):>8.1f} {lat:>11} {len(r.latencies):>4} {r.db_queries_s:>7,.0f}"
        )
    print(
        f"(poll every {poll_seconds} s; 'polls' ok/skipped by the cluster's poll lock/expired "
        "in the queue; latency: crashes whose evidence is a log line, evidence → 'detected' audit event)"
    )
    print()
    print(f"{'jobs':>5} {'nodes':>5}  CPU % of one core over the window, and other figures")
    for r in results:
        anomalies = ", ".join(f"{count} {label}" for label, count in sorted(r.anomalies.items()))
        print(
            f"{r.step.jobs:>5} {r.step.nodes:>5}  {cpu_text(r.cpu)}; machine {r.machine_busy:.0f}% "
            f"of {100 * (os.cpu_count() or 1)}%"
        )
        print(
            f"{'':>13}ingest {r.ingested_mb_s:.2f} MB/s; sim state {r.state_kb:,.0f} KB; "
            f"anomalies: {anomalies or 'none'}; {r.undetected_note}"
        )
        if r.stamp_early:
            print(
                f"{'':>13}Anomaly.detected_at is {median(r.stamp_early):.1f} s (median; max "
                f"{max(r.stamp_early):.1f} s) earlier than the detection was recorded"
            )


def print_profile(step: Step, runs: list[dict[str, tuple[float, int]]], top: str) -> None:
    print()
    print(f"One poll taken apart: {step.jobs} jobs on {step.nodes} nodes, in this process")
    labels = [label for label in runs[0] if label not in {"total", "summary"}]
    timed = runs[:-1] or runs
    total = median([run["total"][0] for run in timed])
    print(f"{'phase':<44}{'median s':>9}{'share':>7}{'queries':>9}{'ms/query':>9}")
    for label in sorted(labels, key=lambda name: -median([run[name][0] for run in timed])):
        spent = median([run[label][0] for run in timed])
        queries = median([run[label][1] for run in timed])
        per_query = f"{spent / queries * 1000:.2f}" if queries else ""
        print(f"{label:<44}{spent:>9.2f}{spent / total:>7.0%}{queries:>9,.0f}{per_query:>9}")
    queries = median([run["total"][1] for run in timed])
    log_bytes = median([run["summary"][0] for run in timed])
    print(
        f"{'whole poll':<44}{total:>9.2f}{1:>7.0%}{queries:>9,.0f}   "
        f"({log_bytes / 1e3:,.0f} KB of new output, {step.nodes:,} nodes, "
        f"{median([run['summary'][1] for run in timed]):.0f} jobs)"
    )
    print("\ncProfile of one more poll (top by own time):")
    lines = [line for line in top.splitlines() if line.strip()]
    start = next((i for i, line in enumerate(lines) if "ncalls" in line), 0)
    for line in lines[start:]:
        print("  " + line.strip()[:150])


def verdict(
    results: list[StepResult],
    reference: dict[str, float] | None,
    profiles: list[tuple[Step, list[dict[str, tuple[float, int]]], str]],
    poll_seconds: int,
) -> None:
    print()
    passing = [r for r in results if r.passed]
    if passing:
        best = max(passing, key=lambda r: (r.ingested_lines_s, r.step.jobs))
        print(
            f"Sustained: {best.step.jobs} jobs on {best.step.nodes} nodes, "
            f"{best.ingested_lines_s:,.0f} log lines/s ingested, detection latency median "
            f"{seconds(median(best.latencies))} s / p95 "
            f"{seconds(percentile(best.latencies, 95))} s "
            f"(targets < {TARGET_MEDIAN_S:g} s / < {TARGET_P95_S:g} s, "
            f"{len(best.latencies)} crashes)."
        )
    else:
        print(
            f"No step kept the detection latency within median < {TARGET_MEDIAN_S:g} s and "
            f"p95 < {TARGET_P95_S:g} s."
        )
    for r in results:
        state = "within" if r.passed else "MISSES"
        why = []
        if r.poll_runtimes and median(r.poll_runtimes) >= poll_seconds:
            why.append(
                f"a poll takes {median(r.poll_runtimes):.1f} s, "
                f"{median(r.poll_runtimes) / poll_seconds:.1f}x the {poll_seconds} s interval"
            )
        if r.polls_sent and (r.polls_skipped + r.polls_expired) / r.polls_sent > 0.3:
            why.append(
                f"{r.polls_skipped + r.polls_expired} of {r.polls_sent} polls skipped or expired"
            )
        if r.written_lines_s and r.ingested_lines_s < 0.9 * r.written_lines_s:
            why.append(
                f"ingests {r.ingested_lines_s / r.written_lines_s:.0%} of the lines written "
                f"({r.backlog_lines:,} lines behind at the end)"
            )
        if r.sim_lags and median(r.sim_lags) > 2.5:
            why.append(f"the simulator's clock lags {median(r.sim_lags):.1f} s")
        if r.queue_lags and median(r.queue_lags) > poll_seconds:
            why.append(f"polls wait {median(r.queue_lags):.1f} s in the queue")
        if r.cpu.get("mariadb", 0) > 80:
            why.append(f"MariaDB uses {r.cpu['mariadb']:.0f}% of a core")
        if r.missed:
            why.append(f"{r.missed} crashes never read before the drain ended")
        if len(r.latencies) < MIN_SAMPLES:
            why.append(f"only {len(r.latencies)} crashes measured")
        print(
            f"  {r.step.jobs:>5} jobs / {r.step.nodes:>5} nodes: {state} targets"
            + (f" - {'; '.join(why)}" if why else "")
        )
    if reference is not None and results:
        print()
        print(
            f"Reference, the detector alone on one core, on the largest step's logs "
            f"({reference['files']:.0f} files, {reference['mb']:.1f} MB, {reference['lines']:,.0f} "
            f"lines): {reference['whole_lines_s']:,.0f} lines/s ({reference['whole_mb_s']:.1f} "
            f"MB/s) as one stream; {reference['per_file_lines_s']:,.0f} lines/s scanning file by "
            f"file as ingestion does ({reference['per_file_ms']:.1f} ms per file)."
        )
        for r in results:
            print(
                f"  {r.step.jobs:>5} jobs / {r.step.nodes:>5} nodes: the system ingests "
                f"{r.ingested_lines_s:,.0f} lines/s = {r.ingested_lines_s / reference['whole_lines_s']:.3f}x "
                f"the detector alone"
            )
    for profile_step, profile_runs, _ in profiles:
        timed = profile_runs[:-1] or profile_runs
        total = median([run["total"][0] for run in timed])
        nodes = median([run.get("sync nodes", (0.0, 0))[0] for run in timed])
        jobs_part = total - nodes
        jobs = profile_step.jobs
        per_node = nodes / profile_step.nodes
        per_job = jobs_part / max(1, jobs)
        print()
        print(
            f"Where a poll's time goes at {jobs} jobs / {profile_step.nodes} nodes: "
            f"{nodes:.2f} s syncing nodes ({per_node * 1000:.2f} ms a node, every poll, changed "
            f"or not) and {jobs_part:.2f} s for the jobs ({per_job * 1000:.1f} ms a job: sync, "
            f"log ingestion, monitors; it grows with the stored progress samples). One "
            f"cluster's poll runs serially (its Redis poll lock), so this whole time is added "
            f"to a detection once the poll is longer than the {poll_seconds} s interval."
        )


def scale_out_notes(results: list[StepResult], poll_seconds: int) -> None:
    print()
    print(
        "Scaling out: poll_cluster holds a per-cluster Redis lock, so one cluster's poll never "
        "runs on two workers at once - more workers or a higher concurrency raise the number of "
        "clusters polled in parallel (one core each on this machine), not the size of the "
        "cluster one poll covers; extra polls of the same cluster come back 'skipped'. A "
        "cluster larger than one poll can cover needs its poll split: node sync as one task, "
        "and log ingestion + monitors partitioned by workload onto their own queue (routing "
        "key per cluster or per workload hash), which the workers then run in parallel."
    )


# ---------------------------------------------------------------------------- main


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", default=None, help=f"jobs[@nodes],... (default {DEFAULT_STEPS})")
    parser.add_argument("--nodes", type=int, default=4000, help="for a step without @nodes")
    parser.add_argument("--seconds", type=float, default=None, help="measured per step (60)")
    parser.add_argument("--warmup", type=float, default=None, help="before measuring (15)")
    parser.add_argument("--drain-seconds", type=float, default=30.0)
    parser.add_argument("--poll-seconds", type=int, default=2, help="WR_POLL_SECONDS")
    parser.add_argument("--speedup", type=float, default=30.0)
    parser.add_argument("--faults-per-job-hour", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--concurrency", type=int, default=2, help="worker pool processes")
    parser.add_argument(
        "--compare-concurrency", type=int, default=0,
        help="run the largest step again with this many pool processes (0: no)",
    )  # fmt: skip
    parser.add_argument("--reference-runs", type=int, default=3)
    parser.add_argument(
        "--profile", default=DEFAULT_PROFILE, help="steps whose poll is taken apart, or none"
    )
    parser.add_argument("--quick", action="store_true", help=f"{QUICK_STEPS}, 30 s each")
    args = parser.parse_args()
    if args.steps is None:
        args.steps = QUICK_STEPS if args.quick else DEFAULT_STEPS
    if args.seconds is None:
        args.seconds = 30.0 if args.quick else 60.0
    if args.warmup is None:
        args.warmup = 10.0 if args.quick else 15.0
    steps = [Step.parse(text, args.nodes) for text in args.steps.split(",") if text.strip()]

    bench = Bench(args)
    db = bench.settings.DATABASES["default"]
    print(
        f"bench-scale: database {db['ENGINE'].rsplit('.', 1)[-1]} {db['NAME']}, "
        f"Redis {os.environ['REDIS_URL']}, {os.cpu_count()} cores; poll every "
        f"{args.poll_seconds} s, speedup {args.speedup:g}, {args.faults_per_job_hour:g} faults "
        f"per job-hour of training",
        flush=True,
    )

    def interrupted(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupted)
    results: list[StepResult] = []
    reference = None
    profiles: list[tuple[Step, list[dict[str, tuple[float, int]]], str]] = []
    to_profile = {
        Step.parse(text, args.nodes)
        for text in (QUICK_STEPS.split(",")[-1:] if args.quick else args.profile.split(","))
        if text.strip() and text.strip() != "none"
    }
    try:
        bench.prepare_database()
        for index, step in enumerate(steps):
            last = index == len(steps) - 1
            results.append(bench.run_step(step, args.concurrency, keep_logs=last))
            print_table(results[-1:], args.poll_seconds)
            if step in to_profile:
                # Before the next step empties the database and the simulation.
                print(f"\nprofiling one poll at {step.jobs} jobs / {step.nodes} nodes ...")
                profiles.append((step, *bench.profile(step)))
        largest = steps[-1]
        if args.compare_concurrency:
            results.append(bench.run_step(largest, args.compare_concurrency, keep_logs=True))
            print_table(results[-1:], args.poll_seconds)
        print("\nreference: the detector alone on the largest step's logs ...", flush=True)
        reference = bench.reference(largest)
    except KeyboardInterrupt:
        print("\ninterrupted: stopping every process started", flush=True)
        return 130
    finally:
        bench.children.stop_all()

    print("\n==== bench-scale summary")
    print_table(results, args.poll_seconds)
    for step, runs, top in profiles:
        print_profile(step, runs, top)
    verdict(results, reference, profiles, args.poll_seconds)
    scale_out_notes(results, args.poll_seconds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
