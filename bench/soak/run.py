"""One soak: private services, the production process layout, healthy jobs, the verdict.

The layout is ``make chaos``'s (``bench.chaos``): uvicorn, two Celery workers, beat, two Advisor
Controllers over the Advisor API and the simulated cluster's clock, each in its own process on
loopback, against a MariaDB and a Redis of the run's own. One simulated cluster in acknowledged
action mode (drains too run without an approval): its jobs are healthy and do the benign things
``recovery.simulator.benign`` lists, on a schedule drawn from the seed, while real faults strike
at a low rate, so that false actions and recall are measured in the same run.

The run lasts until the jobs have trained the target of simulated job-hours (or the wall-time
cap), reading the simulator's journal every few seconds so that none of it is lost; then every
process stops and the journal is judged (``bench.soak.accounting``) and explained from the
database (``bench.soak.evidence``).

**Timing.** Training runs ``speedup`` times faster than real time, but the loop's windows are
real seconds: crash confirmation (10 s), the hang timeout. So benign pauses are real seconds
(10 to 90), and the policy's hang timeout (5 min) is longer than the longest of them, as a real
site's 30-minute hang timeout is longer than its evaluations of a few minutes (ratio 300 / 90 =
3.3). Benign events come at rates per real hour of each running job.
"""

from __future__ import annotations

import dataclasses
import json
import time
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.chaos.layout import LayoutRun, finished_run_database
from bench.soak import accounting, corpus
from recovery.simulator.benign import SOAK_RATES

ROOT = Path(__file__).resolve().parents[2]
WORK = ROOT / "var" / "soak"
CLUSTER = "soak"
HANG_TIMEOUT_MINUTES = 5
PAUSE_SECONDS = (10.0, 90.0)
# After a fault, how long the loop may take to act on it: crash confirmation (10 s), the wait
# for a cause (decision_grace_seconds, 30 s), a poll or two and a controller's claim.
ACTION_WINDOW_S = 90.0
# A hang is recorded once its silence passed the hang timeout and the next check ran (30 s).
HANG_ACTION_WINDOW_S = HANG_TIMEOUT_MINUTES * 60 + 30 + ACTION_WINDOW_S
# Faults the simulator injects in the soak: all its kinds at their published shares but
# preemption, one of the benign events here (Slurm requeues a preempted job itself; nothing is
# wrong with it).
FAULT_WEIGHTS = (("preemption", 0.0),)


@dataclass(frozen=True)
class SoakOptions:
    seed: int = 1
    job_hours: float = 10_000.0
    jobs: int = 80
    nodes: int = 320
    speedup: float = 300.0
    # Simulated hours: at 300x, 0.01 a job-hour is a real fault every 15 real seconds over 80
    # jobs; with the few bad nodes' some 170 in a default run.
    faults_per_job_hour: float = 0.01
    # Benign events per running job and real hour, by kind.
    benign_rates: tuple[tuple[str, float], ...] = SOAK_RATES
    max_wall_s: float = 2700.0
    poll_s: int = 3
    workers: int = 2
    controllers: int = 2
    lease_s: int = 10
    tick_s: float = 1.0
    journal_read_s: float = 5.0
    label: str = "full"


class SoakRun(LayoutRun):
    campaign = "soak"
    lease_sweep_s = 5

    def __init__(self, options: SoakOptions) -> None:
        super().__init__(options, WORK)
        self.options = options
        self.book = accounting.JournalBook()
        self.corpus_path = self.work / "benign-corpus.json"
        self.corpus: dict[str, Any] = {}

    # ------------------------------------------------------------------ setup

    def sim_config(self) -> Any:
        from recovery.simulator.cluster import SimConfig

        options = self.options
        return SimConfig(
            name=CLUSTER,
            nodes=options.nodes,
            jobs=options.jobs,
            seed=options.seed,
            speedup=options.speedup,
            log_dir=str(self.work / "var" / "sim"),
            faults_per_job_hour=options.faults_per_job_hour,
            fault_weights=FAULT_WEIGHTS,
            # Few persistently bad nodes: each fails its job every twenty simulated hours, about
            # every four real minutes at 300x; after a node-level fault one in five stays bad.
            bad_node_fraction=0.01,
            bad_node_faults_per_hour=0.05,
            defect_persistence=0.2,
            # Jobs of a few to twenty real minutes, checkpointing every 10-40 real seconds.
            total_steps=(60_000, 400_000),
            checkpoint_every=(2_000, 8_000),
            repair_after_seconds=120.0,
            min_job_age_seconds=600.0,
            benign_events=options.benign_rates,
            benign_pause_seconds=PAUSE_SECONDS,
            benign_corpus=str(self.corpus_path),
        )

    def prepare_cluster(self) -> tuple[Any, list[Path]]:
        from django.utils import timezone

        from recovery.choices import ClusterMode
        from recovery.demo.live import ensure_simulated_cluster
        from recovery.models import ControllerToken, Policy
        from recovery.simulator.store import simulation_store

        self.corpus = corpus.write(self.corpus_path)
        config = self.sim_config()
        cluster = ensure_simulated_cluster(config, ClusterMode.ACTION)
        store = simulation_store(config, redis_url="", state_dir=str(self.state_dir))
        store.reset()
        store.publish_config()
        store.advance(datetime.now(UTC))
        cluster.connection_settings = {
            **(cluster.connection_settings or {}),
            "node_kernel_log": store.reading().kernel_log_template(),
        }
        cluster.drain_automatically = True
        cluster.save()
        Policy.objects.update_or_create(
            name=f"{CLUSTER} soak",
            defaults={
                "cluster": cluster,
                "hang_timeout_minutes": HANG_TIMEOUT_MINUTES,
                # The simulated cluster fails far more often per real minute than a real one
                # (speedup x): the guard would withhold restarts of real faults.
                "blast_radius_percent": 50,
                "blast_radius_window_minutes": 10,
                "decision_timeout_seconds": 60,
            },
        )
        tokens = []
        for number in range(1, self.options.controllers + 1):
            _, key = ControllerToken.issue(
                cluster, f"{CLUSTER}-controller-{number}-{timezone.now():%H%M%S%f}"
            )
            path = self.work / "tokens" / f"{CLUSTER}-{number}.token"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(key)
            tokens.append(path)
        return store, tokens

    def add_roles(self, tokens: list[Path]) -> None:
        self.add_platform_roles()
        self.add_clock("clock", CLUSTER, "--tick", str(self.options.tick_s))
        for number, token_file in enumerate(tokens, start=1):
            self.add_controller(f"controller-{number}", CLUSTER, token_file)

    # ------------------------------------------------------------------ the run

    def read_journal(self, store: Any) -> None:
        try:
            cluster = store.reading()
        except Exception as exc:  # a half-written state is not possible; a busy lock is
            print(f"  journal not read this time: {exc}", flush=True)
            return
        self.book.add(dict(cluster.journal()), dict(cluster.benign_journal()))

    def run(self) -> dict[str, Any]:
        options = self.options
        started_wall = time.time()
        self.start_services()
        try:
            store, tokens = self.prepare_cluster()
            self.add_roles(tokens)
            self.supervisor.start_all()
            self.wait_for_web()
            run_start = time.time()
            print(
                f"soak: {options.jobs} jobs on {options.nodes} nodes at {options.speedup:g}x, "
                f"until {options.job_hours:,.0f} simulated job-hours (seed {options.seed})",
                flush=True,
            )
            job_hours = 0.0
            last_print = time.monotonic()
            while True:
                deadline = time.monotonic() + options.journal_read_s
                while time.monotonic() < deadline:
                    self.supervisor.tick()
                    time.sleep(0.2)
                self.read_journal(store)
                now = time.time()
                job_hours = accounting.simulated_job_hours(
                    self.book.attempts.values(), speedup=options.speedup, until=now
                )
                if time.monotonic() - last_print >= 60:
                    last_print = time.monotonic()
                    print(
                        f"  {now - run_start:6.0f} s: {job_hours:9,.0f} job-hours, "
                        f"{len(self.book.benign):5d} benign events, "
                        f"{len(self.book.failures):4d} faults",
                        flush=True,
                    )
                if job_hours >= options.job_hours or now - started_wall >= options.max_wall_s:
                    break
            run_end = time.time()
            for role in list(self.supervisor.roles):
                self.supervisor.stop_role(role)
            self.read_journal(store)
            return self.report(started_wall, run_start, run_end)
        finally:
            self.supervisor.stop_all()
            self.redis.stop()
            self.db.stop()

    # ------------------------------------------------------------------ the verdict

    def report(self, started_wall: float, run_start: float, run_end: float) -> dict[str, Any]:
        from django.db import connections

        connections.close_all()
        (self.work / "journal.json").write_text(json.dumps(self.book.dump()))
        exits = [
            {"role": e.role, "code": e.code, "log_tail": e.log_tail[-1500:]}
            for e in self.supervisor.exits
            if not e.expected
        ][:30]
        return verdict(
            self.book,
            self.options,
            run_start=run_start,
            run_end=run_end,
            wall_s=time.time() - started_wall,
            corpus=self.corpus,
            exits=exits,
            work_dir=self.work,
        )


def verdict(
    book: accounting.JournalBook,
    options: SoakOptions,
    *,
    run_start: float,
    run_end: float,
    wall_s: float,
    corpus: dict[str, Any],
    exits: list[dict[str, Any]],
    work_dir: Path,
) -> dict[str, Any]:
    """The report: the journal judged (``bench.soak.accounting``) and each false action
    explained from the run's database (``bench.soak.evidence``, Django set up on it)."""
    from bench.soak import evidence

    commands = book.sorted("commands")
    failures = book.sorted("failures")
    attempts = book.sorted("attempts")
    benign = book.sorted("benign")
    job_hours = accounting.simulated_job_hours(attempts, speedup=options.speedup, until=run_end)
    found = accounting.false_actions(commands, failures, benign)
    recorded = evidence.Recorded(CLUSTER)
    explained = [recorded.explain(action) for action in found]
    faults = accounting.judge_faults(
        failures,
        attempts,
        commands,
        evidence.anomalies_seen(CLUSTER),
        recorded_actions=evidence.recorded_actions(CLUSTER),
        judged_until=run_end - ACTION_WINDOW_S,
        hang_judged_until=run_end - HANG_ACTION_WINDOW_S,
    )
    by_kind: dict[str, int] = {}
    for action in found:
        by_kind[action["kind"]] = by_kind.get(action["kind"], 0) + 1
    benign_total = sum(book.benign_counts.values())
    hang_timeout_s = HANG_TIMEOUT_MINUTES * 60
    return {
        "seed": options.seed,
        "options": asdict(options),
        "passed": not found and not faults["missed"] and book.complete,
        "wall_s": round(wall_s, 1),
        "run_s": round(run_end - run_start, 1),
        "speedup": options.speedup,
        "simulated_job_hours": round(job_hours, 1),
        "jobs": len({attempt["job_id"] for attempt in attempts}),
        "attempts": len(attempts),
        "policy": {
            "hang_timeout_s": hang_timeout_s,
            "longest_benign_pause_s": PAUSE_SECONDS[1],
            "hang_timeout_to_longest_pause": round(hang_timeout_s / PAUSE_SECONDS[1], 2),
            "crash_confirmation_s": 10,
            "blast_radius_percent": 50,
            "drain_automatically": True,
        },
        "benign_events": {
            "total": benign_total,
            "per_job_hour": round(benign_total / job_hours, 3) if job_hours else None,
            "by_kind": dict(sorted(book.benign_counts.items())),
        },
        "journal_complete": book.complete,
        "false_actions": {
            "count": len(found),
            "per_1000_job_hours": round(1000 * len(found) / job_hours, 3) if job_hours else None,
            "per_1000_benign_events": round(1000 * len(found) / benign_total, 3)
            if benign_total
            else None,
            "by_kind": by_kind,
            "list": explained,
        },
        "real_faults": faults,
        "faults_judged_until_s_before_end": {
            "hang": HANG_ACTION_WINDOW_S,
            "other": ACTION_WINDOW_S,
        },
        "corpus": {
            name: [
                {"id": entry["id"], "category": entry["category"], "source": entry["source"]}
                for entry in corpus.get(name, [])
            ]
            for name in ("tracebacks", "warnings")
        },
        "process_exits_not_caused_by_the_run": exits,
        "run_started_at": datetime.fromtimestamp(run_start, tz=UTC).isoformat(),
        "run_ended_at": datetime.fromtimestamp(run_end, tz=UTC).isoformat(),
        "work_dir": str(work_dir),
    }


def recheck(report_path: Path) -> dict[str, Any]:
    """The verdict again, on what a finished run left in its folder (its database, the journal it
    gathered, its corpus): after the checks changed, without running the soak again."""
    previous = json.loads(report_path.read_text())
    work = Path(previous["work_dir"])
    with finished_run_database(work, SoakRun.campaign):
        book = accounting.JournalBook.load(json.loads((work / "journal.json").read_text()))
        fields = {field.name for field in dataclasses.fields(SoakOptions)}
        options = SoakOptions(**{k: v for k, v in previous["options"].items() if k in fields})
        return verdict(
            book,
            options,
            run_start=datetime.fromisoformat(previous["run_started_at"]).timestamp(),
            run_end=datetime.fromisoformat(previous["run_ended_at"]).timestamp(),
            wall_s=previous["wall_s"],
            corpus=json.loads((work / "benign-corpus.json").read_text()),
            exits=previous["process_exits_not_caused_by_the_run"],
            work_dir=work,
        )
