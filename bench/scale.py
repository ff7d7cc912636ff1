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
import json
import os
import signal
import sys
from typing import Any

from bench.scaling.burst import print_burst, run_burst
from bench.scaling.idle import IDLE_JOBS, IDLE_NODES, print_idle, run_idle
from bench.scaling.report import print_profile, print_table, scale_out_notes, verdict
from bench.scaling.stack import Bench
from bench.scaling.steps import ROOT, WORK, Step, StepResult

DEFAULT_DATABASE_URL = "mysql://root@127.0.0.1:3306/workload_recovery_bench"
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/3"
# Jobs@nodes. The 4,000-node steps are the cluster size of the issue; the smaller clusters
# separate what grows with nodes from what grows with jobs (a job uses 2-4 nodes).
DEFAULT_STEPS = "50@200,250@1000,100@4000,1000@4000,2000@8000"
QUICK_STEPS = "50@200,250@1000"
# The scale-out step: this load again with 1, 2 and 4 worker processes of one pool process each.
DEFAULT_SCALE_OUT = "1000@4000"
SCALE_OUT_WORKERS = (1, 2, 4)
# The Console's fleet page, the API and live push are timed while this step runs.
DEFAULT_CONSOLE_AT = "1000@4000"
RESULTS = ROOT / "var" / "bench" / "scale.json"
# Polls taken apart right after these steps. Past saturation one poll reads minutes of backlog
# and takes minutes itself, so the largest loads whose polls still finish within a step are
# profiled: one with many jobs, one with many nodes.
DEFAULT_PROFILE = "250@1000,100@4000"

# Settings are read when Django starts: the bench's own database, Redis and var directory first.
os.environ.setdefault("DATABASE_URL", DEFAULT_DATABASE_URL)
os.environ.setdefault("REDIS_URL", DEFAULT_REDIS_URL)
os.environ.setdefault("WR_VAR_DIR", str(WORK))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "workload_recovery.settings")
os.environ.setdefault("LOG_LEVEL", "WARNING")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", default=None, help=f"jobs[@nodes],... (default {DEFAULT_STEPS})")
    parser.add_argument("--nodes", type=int, default=4000, help="for a step without @nodes")
    parser.add_argument("--seconds", type=float, default=None, help="measured per step (60)")
    parser.add_argument(
        "--warmup",
        type=float,
        default=None,
        help="before measuring (60: past the start-up storm of every job starting at once)",
    )
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
    parser.add_argument(
        "--scale-out", default=None,
        help=f"step run with {'/'.join(map(str, SCALE_OUT_WORKERS))} worker processes "
        f"(default {DEFAULT_SCALE_OUT}; none: skip)",
    )  # fmt: skip
    parser.add_argument(
        "--console-at", default=DEFAULT_CONSOLE_AT,
        help="the step during which the Console and the API are timed (none: skip)",
    )  # fmt: skip
    parser.add_argument("--reference-runs", type=int, default=3)
    parser.add_argument(
        "--profile", default=DEFAULT_PROFILE, help="steps whose poll is taken apart, or none"
    )
    parser.add_argument("--quick", action="store_true", help=f"{QUICK_STEPS}, 30 s each")
    parser.add_argument(
        "--burst", action=argparse.BooleanOptionalAction, default=True,
        help="the burst step: 200,000 NCCL lines and a 64-rank traceback flood at once",
    )  # fmt: skip
    parser.add_argument(
        "--idle", action=argparse.BooleanOptionalAction, default=True,
        help="the idle step: 1,000 jobs that print nothing, polls timed in this process",
    )  # fmt: skip
    args = parser.parse_args()
    if args.steps is None:
        args.steps = QUICK_STEPS if args.quick else DEFAULT_STEPS
    if args.seconds is None:
        args.seconds = 30.0 if args.quick else 60.0
    if args.warmup is None:
        args.warmup = 10.0 if args.quick else 60.0
    steps = [Step.parse(text, args.nodes) for text in args.steps.split(",") if text.strip()]
    if args.scale_out is None:
        args.scale_out = "none" if args.quick else DEFAULT_SCALE_OUT
    scale_out = None if args.scale_out == "none" else Step.parse(args.scale_out, args.nodes)

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
    burst: dict[str, Any] | None = None
    idle: dict[str, Any] | None = None
    profiles: list[tuple[Step, list[dict[str, tuple[float, int]]], str]] = []
    to_profile = {
        Step.parse(text, args.nodes)
        for text in (QUICK_STEPS.split(",")[-1:] if args.quick else args.profile.split(","))
        if text.strip() and text.strip() != "none"
    }
    try:
        bench.prepare_database()
        console_at = None if args.console_at == "none" else Step.parse(args.console_at, args.nodes)
        for index, step in enumerate(steps):
            last = index == len(steps) - 1
            results.append(
                bench.run_step(step, args.concurrency, keep_logs=last, console=step == console_at)
            )
            print_table(results[-1:], args.poll_seconds)
            if step in to_profile:
                # Before the next step empties the database and the simulation.
                print(f"\nprofiling one poll at {step.jobs} jobs / {step.nodes} nodes ...")
                profiles.append((step, *bench.profile(step)))
        largest = steps[-1]
        if args.compare_concurrency:
            results.append(bench.run_step(largest, args.compare_concurrency, keep_logs=True))
            print_table(results[-1:], args.poll_seconds)
        if scale_out is not None:
            for processes in SCALE_OUT_WORKERS:
                results.append(
                    bench.run_step(scale_out, 1, keep_logs=False, worker_processes=processes)
                )
                print_table(results[-1:], args.poll_seconds)
        print("\nreference: the detector alone on the largest step's logs ...", flush=True)
        reference = bench.reference(largest)
        if args.burst:
            print("\nburst: NCCL start-up lines and a traceback flood at once ...", flush=True)
            bench.empty_tables()
            burst = run_burst(WORK, args.reference_runs)
        if args.idle:
            print("\nidle: a cluster whose jobs print nothing, polled ...", flush=True)
            bench.clear_redis()
            bench.empty_tables()
            idle = run_idle(
                bench.sim_config(Step(IDLE_JOBS, IDLE_NODES, quiet=True)), bench.settings.REDIS_URL
            )
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
    scale_out_notes(results, scale_out)
    if burst is not None:
        print_burst(burst)
    if idle is not None:
        print_idle(idle)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    # Figures of other benches written into the same file (``make bench-ssh``) are kept.
    kept = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    RESULTS.write_text(
        json.dumps(
            {
                **{key: value for key, value in kept.items() if key == "ssh_sweep"},
                "cores": os.cpu_count(),
                "poll_seconds": args.poll_seconds,
                "speedup": args.speedup,
                "steps": [r.as_json() for r in results]
                + [extra for extra in (idle, burst) if extra is not None],
                "reference": reference,
            },
            indent=2,
        )
        + "\n"
    )
    print(f"\nwritten: {RESULTS.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
