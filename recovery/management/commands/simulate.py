from __future__ import annotations

import signal
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from recovery.choices import ClusterMode
from recovery.demo.live import NotSimulated, ensure_simulated_cluster
from recovery.schedulers.base import SchedulerError
from recovery.simulator.cluster import SimConfig
from recovery.simulator.store import BaseSimulationStore, simulation_store


class Command(BaseCommand):
    help = (
        "Run a simulated Slurm cluster: training jobs write logs, faults happen at published "
        "rates, and the real poller, detectors, policy and Advisor Controller act on it. "
        "Creates or updates the cluster row; runs until Ctrl-C (or --duration)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--cluster", default="sim", help="cluster name (created if missing)")
        parser.add_argument("--nodes", type=int, default=64)
        parser.add_argument("--jobs", type=int, default=24, help="concurrent training jobs")
        parser.add_argument("--speedup", type=float, default=1.0)
        parser.add_argument("--seed", type=int, default=0)
        parser.add_argument(
            "--faults-per-job-hour", type=float, default=None, help="of simulated training"
        )
        parser.add_argument(
            "--mode", choices=[ClusterMode.MONITOR, ClusterMode.ACTION], default=None,
            help="set the cluster's mode (action also acknowledges scheduler actions)",
        )  # fmt: skip
        parser.add_argument(
            "--logged-steps-per-second", type=float, default=None,
            help="the most progress lines a job prints per real second (default 1)",
        )  # fmt: skip
        parser.add_argument(
            "--resubmit-spread", type=float, default=None,
            help="seconds within which a job Slurm forgot is replaced, at a random moment "
            "(default 0: at once)",
        )  # fmt: skip
        parser.add_argument("--tick", type=float, default=1.0, help="seconds between steps")
        parser.add_argument("--duration", type=float, default=0.0, help="stop after (0: never)")
        parser.add_argument("--reset", action="store_true", help="start from a fresh cluster")

    def handle(self, *args: Any, **options: Any) -> None:
        if options["nodes"] < 1 or options["jobs"] < 0 or options["speedup"] <= 0:
            raise CommandError("--nodes must be ≥ 1, --jobs ≥ 0 and --speedup > 0")
        if options["tick"] <= 0:
            raise CommandError("--tick must be > 0")
        fields: dict[str, Any] = {
            "name": options["cluster"],
            "nodes": options["nodes"],
            "jobs": options["jobs"],
            "seed": options["seed"],
            "speedup": options["speedup"],
            "log_dir": str(Path(settings.VAR_DIR) / "sim"),
        }
        if options["faults_per_job_hour"] is not None:
            fields["faults_per_job_hour"] = options["faults_per_job_hour"]
        if options["logged_steps_per_second"] is not None:
            if options["logged_steps_per_second"] <= 0:
                raise CommandError("--logged-steps-per-second must be > 0")
            fields["max_logged_steps_per_second"] = options["logged_steps_per_second"]
        if options["resubmit_spread"] is not None:
            if options["resubmit_spread"] < 0:
                raise CommandError("--resubmit-spread must be ≥ 0")
            fields["resubmit_spread_seconds"] = options["resubmit_spread"]
        config = SimConfig(**fields)
        try:
            cluster = ensure_simulated_cluster(config, options["mode"])
        except NotSimulated as exc:
            raise CommandError(str(exc)) from None
        store = simulation_store(
            config, redis_url=settings.REDIS_URL, state_dir=settings.SIMULATOR_STATE_DIR
        )
        if options["reset"]:
            store.reset()
        store.publish_config()
        self.stdout.write(
            f"Simulating {cluster.name}: {config.nodes} nodes, {config.jobs} jobs, "
            f"speedup {config.speedup:g}, seed {config.seed}, mode {cluster.mode}; "
            f"logs in {config.log_dir}/{config.name}; state in {store.location}"
        )
        stopping = False

        def stop(signum: int, frame: object) -> None:
            nonlocal stopping
            stopping = True

        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGINT, stop)
        started = time.monotonic()
        last_report = 0.0
        while not stopping:
            tick_started = time.monotonic()
            try:
                store.advance(datetime.now(UTC))
            except SchedulerError as exc:
                self.stderr.write(f"{config.name}: {exc}")
            elapsed = time.monotonic() - started
            if elapsed - last_report >= 30:
                last_report = elapsed
                self._report(store)
            if options["duration"] and elapsed >= options["duration"]:
                break
            time.sleep(max(0.0, options["tick"] - (time.monotonic() - tick_started)))

    def _report(self, store: BaseSimulationStore) -> None:
        cluster = store.reading()
        jobs = cluster.jobs()
        states: dict[str, int] = {}
        for job in jobs:
            assert job.native_state is not None  # the simulator always knows its jobs' states
            states[job.native_state] = states.get(job.native_state, 0) + 1
        down = sum(1 for node in cluster.nodes() if node.unavailable)
        summary = ", ".join(f"{count} {state.lower()}" for state, count in sorted(states.items()))
        self.stdout.write(f"{store.config.name}: {summary or 'no jobs'}; {down} nodes out")
