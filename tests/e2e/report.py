"""Print var/e2e/report.json as a table and check it against the targets.

``python tests/e2e/report.py [REPORT]`` exits 1 when a target is missed or a scenario is missing,
2 when there is no report. "node s" is when the faulty node was first named by an anomaly, for
the scenarios whose fault is on one node. Targets, for this two-core machine:

* median detection latency of crashes and node failures at most 5 s;
* a hang detected within the policy's hang threshold plus 5 s;
* median action latency (detection to the scheduler action) at most 5 s, over the scenarios
  where the loop alone decides when to act: not 7 (the action waits for an operator's
  approval) nor 8 (the controller acting is killed on purpose; another one finishes);
* no duplicate scheduler actions;
* no action on a job that kept training: scenarios 9 (caught exceptions), 15 (a handled error,
  then a quiet step of 25 s) and 16 (a 30 s checkpoint save) ran with no scheduler action;
* every scenario present and passed.

A crash read from a job's log is only a suspect until the process is seen to end: "suspect s"
is when the first anomaly was recorded, "detect s" when the loop had one it may act on (a crash
once confirmed, a hang or a straggler once recorded; for scenario 11 the hang the error stalled
into), and "action s" runs from that moment to the first scheduler action.

Rows carry the Slurm version they ran on (``slurm``); each version is checked on its own. On
24.11 the expected scenarios are those of ``WR_E2E_2411_SCENARIOS`` (default ``1 2 4 8 15``, or
``all``), and ``WR_TEST_SLURM_VERSIONS`` names the versions expected (default both).
"""

from __future__ import annotations

import json
import os
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

DEFAULT_REPORT = Path(__file__).resolve().parents[2] / "var" / "e2e" / "report.json"
SCENARIOS = (
    "1-rank-killed",
    "2-node-death",
    "3-hang",
    "4-xid-hardware",
    "5-app-exception",
    "6-straggler",
    "7-monitor-approval",
    "8-controller-killed",
    "9-caught-exception",
    "10-traceback-then-death",
    "11-error-then-hang",
    "12-observed-job",
    "13-workflow",
    "14-dependency",
    "15-handled-then-quiet",
    "16-slow-checkpoint",
)
# The scenarios whose job keeps training through what it does (caught errors, a quiet step
# after a handled one, a long checkpoint save): the loop must leave them alone.
KEPT_TRAINING = ("9-caught-exception", "15-handled-then-quiet", "16-slow-checkpoint")
# Scenarios whose fault is a crash or a node failure, for the detection-latency target: not a
# hang, a straggler, a job that kept training, one that stalled into a hang, nor a workflow's
# story of several jobs.
CRASHES = frozenset(SCENARIOS) - {
    "3-hang",
    "6-straggler",
    "11-error-then-hang",
    "13-workflow",
    "14-dependency",
    *KEPT_TRAINING,
}
# Scenarios whose action waits on purpose: for an operator's approval, for a second controller.
WAITED_ACTIONS = frozenset({"7-monitor-approval", "8-controller-killed", "12-observed-job"})
DETECTION_TARGET_S = 5.0
ACTION_TARGET_S = 5.0
HANG_MARGIN_S = 5.0

COLUMNS = (
    ("scenario", 23),
    ("passed", 6),
    ("suspect s", 9),
    ("detect s", 8),
    ("action s", 8),
    ("new ckpt s", 10),
    ("attribution", 15),
    ("actions", 7),
    ("node s", 6),
)


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "NO"
    if isinstance(value, float):
        return f"{value:.2f}"
    return str(value)


def table(rows: Sequence[dict[str, Any]]) -> list[str]:
    header = "  ".join(name.ljust(width) for name, width in COLUMNS)
    lines = [header, "-" * len(header)]
    for row in rows:
        values = (
            row.get("scenario"),
            row.get("passed"),
            row.get("suspect_latency_s"),
            row.get("detection_latency_s"),
            row.get("action_latency_s"),
            row.get("time_to_new_checkpoint_s"),
            row.get("attribution"),
            row.get("scheduler_actions"),
            row.get("node_implicated_after_s"),
        )
        lines.append(
            "  ".join(_cell(v).ljust(width) for v, (_, width) in zip(values, COLUMNS, strict=True))
        )
    return lines


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def expected_scenarios(version: str) -> tuple[str, ...]:
    if version == "22.05":
        return SCENARIOS
    chosen = os.environ.get("WR_E2E_2411_SCENARIOS", "1 2 4 8 15").replace(",", " ").split()
    if "all" in chosen:
        return SCENARIOS
    return tuple(name for name in SCENARIOS if name.split("-")[0] in chosen)


def expected_versions() -> list[str]:
    return os.environ.get("WR_TEST_SLURM_VERSIONS", "22.05 24.11").replace(",", " ").split()


def check(
    rows: Sequence[dict[str, Any]], scenarios: Sequence[str] = SCENARIOS
) -> list[tuple[str, str, bool]]:
    """(target, what was measured, met) for each target."""
    by_name = {row["scenario"]: row for row in rows}
    results = []

    detections = [
        row["detection_latency_s"]
        for name, row in by_name.items()
        if name in CRASHES and row.get("detection_latency_s") is not None
    ]
    missing_detection = [
        name
        for name in CRASHES
        if name in by_name and by_name[name].get("detection_latency_s") is None
    ]
    median = _median(detections)
    results.append(
        (
            f"median crash/node-failure detection <= {DETECTION_TARGET_S:.0f} s",
            f"{_cell(median)} s over {len(detections)}"
            + (
                f"; not detected: {', '.join(sorted(missing_detection))}"
                if missing_detection
                else ""
            ),
            median is not None and median <= DETECTION_TARGET_S and not missing_detection,
        )
    )

    hang = by_name.get("3-hang")
    if hang is not None:
        threshold = hang.get("hang_threshold_s")
        latency = hang.get("detection_latency_s")
        met = latency is not None and threshold is not None and latency <= threshold + HANG_MARGIN_S
        results.append(
            (
                f"hang detected within threshold + {HANG_MARGIN_S:.0f} s",
                f"{_cell(latency)} s (threshold {_cell(threshold)} s)",
                met,
            )
        )

    actions = [
        row["action_latency_s"]
        for row in rows
        if row.get("action_latency_s") is not None and row.get("scenario") not in WAITED_ACTIONS
    ]
    median = _median(actions)
    results.append(
        (
            f"median action latency <= {ACTION_TARGET_S:.0f} s",
            f"{_cell(median)} s over {len(actions)} (not {', '.join(sorted(WAITED_ACTIONS))})",
            median is not None and median <= ACTION_TARGET_S,
        )
    )

    duplicates = {
        row["scenario"]: row.get("duplicate_actions", 0)
        for row in rows
        if row.get("duplicate_actions")
    }
    results.append(
        (
            "zero duplicate actions",
            ", ".join(f"{k}: {v}" for k, v in duplicates.items()) or "none",
            not duplicates,
        )
    )

    for name in KEPT_TRAINING:
        if name not in by_name and name not in scenarios:
            continue
        row = by_name.get(name)
        actions_taken = None if row is None else row.get("scheduler_actions")
        results.append(
            (
                "no action on a job that kept training",
                f"scenario {name} did not run"
                if row is None
                else f"scheduler actions in {name}: {_cell(actions_taken)}",
                actions_taken == 0,
            )
        )

    missing = [name for name in scenarios if name not in by_name]
    failed = [row["scenario"] for row in rows if not row.get("passed")]
    results.append(
        (
            "every scenario passed",
            f"{len(rows) - len(failed)}/{len(scenarios)} passed"
            + (f"; failed: {', '.join(failed)}" if failed else "")
            + (f"; missing: {', '.join(missing)}" if missing else ""),
            not failed and not missing,
        )
    )
    return results


def main(argv: Sequence[str]) -> int:
    path = Path(argv[0]) if argv else DEFAULT_REPORT
    try:
        rows = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        print(f"no report at {path}: {exc}", file=sys.stderr)
        return 2
    order = {name: i for i, name in enumerate(SCENARIOS)}
    rows = sorted(rows, key=lambda row: order.get(row.get("scenario", ""), len(order)))
    by_version: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        by_version.setdefault(str(row.get("slurm", "22.05")), []).append(row)
    all_met = True
    for version in sorted({*expected_versions(), *by_version}):
        version_rows = by_version.get(version, [])
        print(f"Slurm {version}")
        print("\n".join(table(version_rows)))
        print()
        results = check(version_rows, expected_scenarios(version))
        for target, measured, met in results:
            print(f"{'ok  ' if met else 'MISS'}  {target}: {measured}")
            all_met = all_met and met
        for row in version_rows:
            if not row.get("passed") and row.get("failure"):
                last = [line for line in str(row["failure"]).splitlines() if line.strip()][-3:]
                print(f"\n{row['scenario']} ({version}) failed:\n  " + "\n  ".join(last))
        print()
    return 0 if all_met else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
