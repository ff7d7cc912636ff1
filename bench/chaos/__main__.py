"""``make chaos``: a thousand faults against the production process layout, and what they broke.

    python -m bench.chaos [--seed N] [--faults N] [--duration S] [--short] [--control-plane-only]

Writes ``var/chaos/report.json`` (and ``report-<label>-seed-<N>.json``), prints a summary, and
exits 1 when any of the counts that must be zero is not: duplicate actions, actions on healthy
attempts, lost failures, unfinished recommendations, audit gaps. See ``bench/chaos/run.py``.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from bench.chaos.layout import rechecked, write_report
from bench.chaos.run import WORK, ChaosOptions, ChaosRun, recheck
from bench.chaos.schedule import SCHEDULER_FAULTS

# Enough to land at least 100 faults within three minutes, for `make test`.
SHORT = ChaosOptions(
    faults=200,
    duration_s=85.0,
    quiet_s=45.0,
    reference_s=0.0,
    jobs=8,
    nodes=32,
    faults_per_job_hour=4.0,
    label="short",
)
MUST_BE_ZERO = (
    "duplicate_actions", "acted_on_healthy_attempt", "lost", "unfinished", "audit_gaps",
)  # fmt: skip


def print_summary(report: dict[str, Any]) -> None:
    print(f"\nchaos run, seed {report['seed']} ({report['options']['label']}):")
    print(f"  faults injected          {report['faults_injected']:>6}")
    for kind, count in sorted(report["by_kind"].items()):
        print(f"    {kind:<34} {count:>6}")
    for kind, count in sorted(report["armed_by_kind"].items()):
        print(f"    ({kind}: armed {count} times, landed {report['by_kind'].get(kind, 0)})")
    for kind, count in sorted(report["missed_by_kind"].items()):
        print(f"    (found nothing to strike: {kind} {count})")
    for name in MUST_BE_ZERO:
        mark = "ok" if report[name] == 0 else "FAIL"
        print(f"  {name:<26} {report[name]:>4}  {mark}")

    print_recovery(report)
    for cluster in report["clusters"]:
        print(
            f"  {cluster['cluster']}: {cluster['failures']} failures "
            f"({cluster['failures_checked']} checked: {cluster['accounted_by']}), "
            f"{cluster['commands']} scheduler commands"
        )
    exits = report["process_exits_not_caused_by_the_schedule"]
    if exits:
        print(f"  processes that exited on their own: {', '.join(e['role'] for e in exits)}")
    print(f"  wall time {report['wall_s']} s; details in {report['work_dir']}")


def _figure(figure: dict[str, Any] | None) -> str:
    """``median p95 n`` of a summary, in fixed columns (21 characters)."""
    if not figure or not figure.get("samples"):
        return f"{'-':>7} {'-':>7} {0:>5}"
    return f"{figure['median']:>7} {figure['p95']:>7} {figure['samples']:>5}"


COLUMNS = f"{'median':>7} {'p95':>7} {'n':>5}"


def print_recovery(report: dict[str, Any]) -> None:
    """Recovery times (failure to the restart's release or requeue), without and with the
    faults side by side; where the time goes; what each kind of fault cost."""
    print(f"  recovery time, s (failure to release or requeue)  {COLUMNS}")
    rows = (
        ("without faults (action)", report.get("recovery_time_s_without_faults")),
        ("with faults (action)", report.get("recovery_time_s")),
        (
            "  from when it could be known (action)",
            report.get("recovery_time_s_from_detectable"),
        ),
        (
            "  less its scheduler's outages (action)",
            report.get("recovery_time_s_scheduler_reachable"),
        ),
        ("with faults, monitor (waits for approval)", report.get("recovery_time_s_monitor")),
    )
    for label, figure in rows:
        print(f"    {label:<46} {_figure(figure)}")
    print("    (it could be known: a hang once it lasted the hang timeout, any other at once)")
    phases = report.get("recovery_phases_s") or {}
    if phases:
        print(f"  where it goes (action), s {'without faults':>43}   {'with faults':>21}")
        print(f"    {'':<40} {COLUMNS}   {COLUMNS}")
        for key, label in (
            ("to_recommendation", "failure to recommendation"),
            ("to_claim", "recommendation to first claim"),
            ("to_restart", "first claim to restart"),
        ):
            without = (phases.get("without_faults") or {}).get(key)
            with_faults = (phases.get("with_faults") or {}).get(key)
            print(f"    {label:<40} {_figure(without)}   {_figure(with_faults)}")
    by_fault = report.get("recovery_time_s_by_fault") or {}
    if by_fault:
        print(
            "  what each fault cost (action): the recoveries it struck, and the share of all\n"
            "  recovery time it kept the scheduler, a service, beat, every worker or every\n"
            "  controller away (overlaps counted in each)"
        )
        print(f"    {'':<34} {'struck: ' + COLUMNS:>29}  {'away':>6}")
        for kind, split in sorted(by_fault.items(), key=lambda item: -item[1]["away_share"]):
            print(
                f"    {kind:<34} {_figure(split['struck']):>29}  {100 * split['away_share']:>5.0f}%"
            )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.chaos", description=__doc__)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--faults", type=int, help="faults scheduled")
    parser.add_argument("--duration", type=float, help="seconds the schedule spans")
    parser.add_argument("--quiet", type=float, help="seconds of quiet before the checks")
    parser.add_argument("--reference", type=float, help="seconds of the run without faults")
    parser.add_argument("--short", action="store_true", help="the version `make test` runs")
    parser.add_argument(
        "--control-plane-only",
        action="store_true",
        help="leave the scheduler's own faults (outages, commands timing out) out of the schedule",
    )
    parser.add_argument(
        "--recheck",
        metavar="REPORT",
        help="run the checks again on the folder a finished run left (its report.json names it)",
    )
    args = parser.parse_args(argv)
    if args.recheck:
        report = rechecked(Path(args.recheck), recheck)
        print_summary(report)
        return 0 if report["passed"] else 1
    options = SHORT if args.short else ChaosOptions()
    changes: dict[str, Any] = {"seed": args.seed}
    for name, value in (
        ("faults", args.faults),
        ("duration_s", args.duration),
        ("quiet_s", args.quiet),
        ("reference_s", args.reference),
    ):
        if value is not None:
            changes[name] = value
    if args.control_plane_only:
        changes["without"] = SCHEDULER_FAULTS
        changes["label"] = f"{options.label}-control-plane"
    options = replace(options, **changes)
    report = ChaosRun(options).run()
    write_report(WORK, report, options.label, options.seed)
    print_summary(report)
    return 0 if report["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
