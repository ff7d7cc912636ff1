"""The measured stack, one load step at a time, as in production.

``manage.py simulate`` (the cluster's clock and its jobs' log files), a Celery worker on the
Redis broker, and this process in beat's role, sending the real ``tasks.polling.poll_cluster``
every ``WR_POLL_SECONDS`` with beat's expiry; then the step's figures from the database, the
log files and the task events.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import shutil
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, cast

from bench.scaling.console_probe import ConsoleProbe
from bench.scaling.phases import profile_poll
from bench.scaling.processes import CLOCK_TICKS, Children, cpu_ticks, machine_ticks, pids_named
from bench.scaling.reference import detector_reference
from bench.scaling.steps import (
    QUIET_LOGGED_STEPS_PER_SECOND,
    RESUBMIT_SPREAD_SECONDS,
    ROOT,
    WORK,
    PollTask,
    Step,
    StepResult,
    median,
)
from bench.scaling.task_events import TaskEvents


class Bench:
    """One run: the processes it starts, the database and Redis it empties, the steps it measures."""

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
        self.workload_queue = settings.WORKLOAD_QUEUE
        self.services = {
            "mariadb": pids_named("mariadbd", "mysqld"),
            "redis": pids_named("redis-server"),
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
            server.close()  # type: ignore[no-untyped-call]  # unannotated in types-mysqlclient
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
        keys = [self.queue, self.workload_queue, "unacked", "unacked_index"]
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
            faults_per_job_hour=0.0 if step.quiet else self.args.faults_per_job_hour,
            max_logged_steps_per_second=(
                QUIET_LOGGED_STEPS_PER_SECOND
                if step.quiet
                else SimConfig.max_logged_steps_per_second
            ),
            resubmit_spread_seconds=RESUBMIT_SPREAD_SECONDS,
        )

    # ------------------------------------------------------------------ one step

    def run_step(
        self,
        step: Step,
        concurrency: int,
        *,
        keep_logs: bool,
        worker_processes: int = 1,
        console: bool = False,
    ) -> StepResult:
        from recovery.choices import ClusterMode
        from recovery.demo.live import ensure_simulated_cluster
        from tasks.polling import poll_cluster

        args = self.args
        workers_said = (
            f"{worker_processes} worker processes"
            if worker_processes > 1
            else f"worker concurrency {concurrency}"
        )
        print(
            f"\n== {step.jobs} jobs on {step.nodes} nodes, {workers_said}: "
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
             "--faults-per-job-hour", f"{config.faults_per_job_hour:g}",
             "--logged-steps-per-second", f"{config.max_logged_steps_per_second:g}",
             "--resubmit-spread", f"{config.resubmit_spread_seconds:g}",
             "--mode", ClusterMode.MONITOR, "--tick", "1", "--reset"],
            logs / "simulate.log",
            self.env,
        )  # fmt: skip
        # Separate worker processes stand for separate hosts: each has a name of its own.
        workers = [
            self.children.start(
                f"worker {index}",
                [self.celery, "-A", "tasks", "worker", "-E", "--loglevel", "WARNING",
                 "--concurrency", str(concurrency), "-n", f"{step.name}-{index}@%h"],
                logs / f"worker-{index}.log",
                self.env,
            )
            for index in range(worker_processes)
        ]  # fmt: skip
        self._wait_for_worker(worker_processes)
        probe = ConsoleProbe(self.env, logs / "web.log") if console else None
        console_error = ""
        if probe is not None:
            try:
                probe.start()
            except (SystemExit, OSError, AssertionError) as error:
                # The load step still counts; the note says why the Console was not timed.
                console_error = f"the Console could not be timed: {error}"
                probe.stop()
                probe = None
        result = StepResult(step, concurrency, worker_processes)
        if console_error:
            result.console = {"errors": [console_error]}
        state_key = f"wr:sim:{config.name}:state"
        groups = {
            "simulate": [simulate.popen.pid],
            "worker": [worker.popen.pid for worker in workers],
        }
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
                if probe is not None:
                    probe.measuring()
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
                if probe is not None:
                    result.console = probe.stop()
            if sim_stopped_at is not None:
                # Drain: the last failures are detected by a poll that starts after the clock
                # stopped; polls keep coming until one such poll has finished.
                caught_up = self._caught_up(events.snapshot(), sim_stopped_at)
                if caught_up or time.time() - sim_stopped_at > args.drain_seconds:
                    break
                if now >= next_poll:
                    task = poll_cluster.apply_async((cluster.pk,), expires=args.poll_seconds * 0.9)
                    events.sent(task.id, time.time())
                    next_poll += args.poll_seconds
            time.sleep(max(0.0, min(1.0, next_poll - time.monotonic())))
        drained = time.time() - (sim_stopped_at or time.time())
        for worker in workers:
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

    def _wait_for_worker(self, count: int) -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            self.children.check()
            if len(self.app.control.ping(timeout=1.0) or []) >= count:
                return
        raise SystemExit(f"{count} Celery worker(s) did not answer a ping within 60 s")

    @staticmethod
    def _caught_up(tasks: list[PollTask], sim_stopped_at: float) -> bool:
        """Whether a snapshot taken after the clock stopped, and all its shards, have run.

        The last failures are detected by the shard tasks of a poll that started after the
        simulation's clock stopped.
        """
        polls = sorted(
            (
                t
                for t in tasks
                if t.kind == "poll"
                and t.started
                and t.started > sim_stopped_at
                and t.finished
                and not t.result.get("skipped")
            ),
            key=lambda t: t.started or 0.0,
        )
        if not polls:
            return False
        first = polls[0]
        wanted = int(first.result.get("batches", 0))
        started = first.started or 0.0
        shards = [t for t in tasks if t.kind == "shard" and t.sent >= started]
        return len(shards) >= wanted and all(t.finished for t in shards)

    def _sim_clock(self, state_key: str, name: str) -> tuple[float | None, int]:
        """How far the simulation's clock is behind the wall clock, and its running jobs.

        Only the head of the saved state is read ("now" comes first), so that sampling every
        second costs nothing next to what it measures; running jobs are counted on a full read
        every tenth sample.
        """
        # redis-py types every answer as bytes or str; this client does not decode: bytes.
        head = cast("bytes", self.redis.getrange(state_key, 0, 80)).decode(errors="replace")
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
        self,
        config: Any,
        groups: dict[str, list[int]],
        services: dict[str, list[int]],
        cluster_id: int,
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
        result.lines_ingested = ingested
        result.ingested_mb_s = ingested_bytes / window / 1e6
        result.backlog_lines = backlog
        result.db_queries = end["questions"] - start["questions"]
        result.db_queries_s = result.db_queries / window
        for role, ticks in end["cpu"].items():
            result.cpu[role] = (ticks - start["cpu"].get(role, 0)) / CLOCK_TICKS / window * 100
        busy = end["machine"][0] - start["machine"][0]
        total = end["machine"][1] - start["machine"][1]
        result.machine_busy = busy / total * 100 * (os.cpu_count() or 1) if total else 0.0

        in_window = [t for t in tasks if start["time"] <= t.sent <= end["time"]]
        for shard in (t for t in in_window if t.kind == "shard"):
            if shard.expired:
                result.shards_expired += 1
            elif shard.result.get("skipped"):
                result.shards_skipped += 1
            elif shard.runtime is not None:
                result.shard_runtimes.append(shard.runtime)
                result.workloads_processed += int(shard.result.get("workloads", 0))
                result.workloads_left_quiet += int(shard.result.get("left_quiet", 0))
        judges = [t for t in in_window if t.kind == "judge"]
        result.judges = (
            sum(1 for t in judges if t.runtime is not None and not t.result.get("skipped")),
            sum(1 for t in judges if t.result.get("skipped")),
            sum(1 for t in judges if t.expired),
        )
        # A shard task that expired in the queue is revoked before the worker announces it
        # received it: its event names no task the receiver knows. What the snapshots queued,
        # less the shard tasks seen, is what expired unseen.
        seen = len([t for t in in_window if t.kind == "shard"])
        in_window = [t for t in in_window if t.kind == "poll"]
        result.shards_queued = sum(
            int(t.result.get("batches", 0)) for t in in_window if t.runtime is not None
        )
        result.shards_expired += max(0, result.shards_queued - seen)
        result.job_polls = sum(
            int(t.result.get("jobs_seen", 0)) for t in in_window if t.runtime is not None
        )
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
        return detector_reference(
            Path(self.sim_config(step).log_dir) / step.name, self.args.reference_runs
        )

    # ------------------------------------------------------------------ one poll, taken apart

    def profile(self, step: Step, polls: int = 1) -> tuple[list[dict[str, tuple[float, int]]], str]:
        """Phase times and query counts of polls at ``step``, then a cProfile of one more."""
        return profile_poll(
            self.sim_config(step), self.settings.REDIS_URL, self.args.poll_seconds, polls
        )
