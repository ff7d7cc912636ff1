"""``make soak``: healthy jobs doing what healthy jobs do, against the production process layout,
and every action the loop took on a job or node that had no real fault.

    python -m bench.soak [--seed N] [--job-hours H] [--short]

Writes ``var/soak/report.json`` (and ``report-<label>-seed-<N>.json``), prints a table, and exits
1 on any false action, on a real fault the loop never acted on (other than those the simulator's
journal says need no action), or when part of the journal was lost. See ``bench/soak/run.py``.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from bench.chaos.layout import rechecked, write_report
from bench.soak.run import WORK, SoakOptions, SoakRun, recheck
from recovery.simulator.benign import KINDS, SCHEDULER, SOAK_RATES

# A few minutes and a few hundred job-hours, for `make test`: fewer jobs, benign events three
# times as often (what the scheduler and administrators do ten times as often, so that each
# happens a few times), real faults ten times as often.
SHORT_RATES = tuple(
    (name, rate * (10.0 if KINDS[name].shows_in == SCHEDULER else 3.0)) for name, rate in SOAK_RATES
)
SHORT = SoakOptions(
    job_hours=300.0,
    jobs=24,
    nodes=96,
    faults_per_job_hour=0.1,
    benign_rates=SHORT_RATES,
    max_wall_s=480.0,
    label="short",
)


def print_summary(report: dict[str, Any]) -> None:
    options = report["options"]
    print(
        f"\nsoak, seed {report['seed']} ({options['label']}): {report['jobs']} jobs, "
        f"{report['simulated_job_hours']:,.0f} simulated job-hours at {report['speedup']:g}x "
        f"in {report['run_s']:,.0f} s (wall time {report['wall_s']:,.0f} s)"
    )
    policy = report["policy"]
    print(
        f"  hang timeout {policy['hang_timeout_s']} s, longest benign pause "
        f"{policy['longest_benign_pause_s']:g} s (ratio {policy['hang_timeout_to_longest_pause']})"
    )
    benign = report["benign_events"]
    print(f"  benign events                 {benign['total']:>7,}")
    for kind, count in benign["by_kind"].items():
        print(f"    {kind:<28}{count:>7,}")
    false = report["false_actions"]
    mark = "ok" if false["count"] == 0 else "FAIL"
    print(
        f"  false actions                 {false['count']:>7}  {mark}  "
        f"({false['per_1000_job_hours']} per 1,000 job-hours)"
    )
    for kind, count in false["by_kind"].items():
        print(f"    {kind:<28}{count:>7}")
    faults = report["real_faults"]
    print("  real faults        injected  judged detected  acted")
    for kind in sorted(faults["injected"]):
        too_late = faults["not_judged_too_late"].get(kind, 0)
        print(
            f"    {kind:<16}{faults['injected'][kind]:>8}{faults['injected'][kind] - too_late:>8}"
            f"{faults['detected'].get(kind, 0):>9}{faults['acted_on'].get(kind, 0):>7}"
        )
    for reason, count in faults["not_actionable"].items():
        print(f"    needs no action: {reason}: {count}")
    mark = "ok" if not faults["missed"] else "FAIL"
    print(f"  real faults never acted on    {len(faults['missed']):>7}  {mark}")
    if not report["journal_complete"]:
        print("  the simulator dropped journal entries before they were read: FAIL")
    exits = report["process_exits_not_caused_by_the_run"]
    if exits:
        print(f"  processes that exited on their own: {', '.join(e['role'] for e in exits)}")
    print(f"  details in {report['work_dir']} and var/soak/report.json")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.soak", description=__doc__)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--job-hours", type=float, help="simulated job-hours to run for")
    parser.add_argument("--jobs", type=int, help="jobs kept submitted")
    parser.add_argument("--speedup", type=float, help="simulated seconds per real second")
    parser.add_argument("--max-wall", type=float, help="stop after this many seconds anyway")
    parser.add_argument("--short", action="store_true", help="the version `make test` runs")
    parser.add_argument(
        "--recheck",
        metavar="REPORT",
        help="judge again what a finished run left in its folder (its report.json names it)",
    )
    args = parser.parse_args(argv)
    if args.recheck:
        report = rechecked(Path(args.recheck), recheck)
        print_summary(report)
        return 0 if report["passed"] else 1
    options = SHORT if args.short else SoakOptions()
    changes: dict[str, Any] = {"seed": args.seed}
    for name, value in (
        ("job_hours", args.job_hours),
        ("jobs", args.jobs),
        ("speedup", args.speedup),
        ("max_wall_s", args.max_wall),
    ):
        if value is not None:
            changes[name] = value
    if args.jobs is not None:
        changes["nodes"] = 4 * args.jobs
    options = replace(options, **changes)
    report = SoakRun(options).run()
    write_report(WORK, report, options.label, options.seed)
    print_summary(report)
    return 0 if report["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
