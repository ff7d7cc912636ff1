"""A replay's report (``recovery.loop.replay``) as ``manage.py replay_policy`` prints it.

JSON, and lines for a terminal; what became of a recorded recommendation in words (``fate``)
is shared with the pages (``recovery.loop.replay_view``). Apart from the replay because it
only formats what the replay found.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from recovery.choices import RecommendationStatus
from recovery.loop.replay import Action, ReplayedDecision, ReplayReport


def report_json(report: ReplayReport, *, every_decision: bool = False) -> dict[str, Any]:
    """The report as JSON: the totals both ways and the differences (every decision if asked)."""
    shown = report.decisions if every_decision else report.differences

    def action(value: Action | None) -> dict[str, Any] | None:
        if value is None:
            return None
        return {
            "action": value.action,
            "excluded_nodes": list(value.excluded_nodes),
            "node": value.node,
            "needs_person": value.needs_person,
            "reason": value.reason,
        }

    def decision(d: ReplayedDecision) -> dict[str, Any]:
        return {
            "at": d.at.isoformat(),
            "anomaly": d.anomaly_id,
            "job_id": d.job_id,
            "attempt": d.attempt,
            "kind": d.kind,
            "verdict": d.verdict,
            "recorded": action(d.recorded),
            "recorded_status": d.recorded_status,
            "recorded_by": d.recorded_by,
            "replayed": action(d.replayed),
            "explanation": d.explanation,
        }

    return {
        "cluster": report.cluster,
        "since": report.since.isoformat(),
        "until": report.until.isoformat(),
        "policy": report.policy,
        "decisions": len(report.decisions),
        "verdicts": dict(report.verdicts),
        "recorded": asdict(report.recorded),
        "replayed": asdict(report.replayed),
        "stops_operators_let_run": [decision(d) for d in report.stops_operators_let_run],
        "rejected_actions_taken": [decision(d) for d in report.rejected_actions_taken],
        "unexplained": len(report.unexplained),
        "shown": [decision(d) for d in shown],
    }


def fate(decision: ReplayedDecision) -> str:
    """What became of the recorded recommendation, in words: "approved by olivia, executed"."""
    status = decision.recorded_status.replace("_", " ")
    if not decision.recorded_by:
        return status
    if decision.recorded_status == RecommendationStatus.REJECTED:
        return f"rejected by {decision.recorded_by}"
    return f"approved by {decision.recorded_by}, {status}"


def report_lines(report: ReplayReport, *, every_decision: bool = False) -> list[str]:
    """The report for a terminal."""
    verdicts = ", ".join(f"{count} {verdict}" for verdict, count in report.verdicts.items())
    lines = [
        f"Replay of {report.policy} on {report.cluster}, "
        f"{report.since:%Y-%m-%d %H:%M} to {report.until:%Y-%m-%d %H:%M} UTC: "
        f"{len(report.decisions)} decisions ({verdicts or 'none'}). Nothing was changed.",
        "",
        f"{'':28}{'recorded':>10}{'replayed':>10}",
    ]
    for label, name in (
        ("restarts", "restarts"),
        ("stops", "stops"),
        ("drains", "drains"),
        ("nodes excluded", "nodes_excluded"),
        ("node-hours kept out", "node_hours_excluded"),
        ("carried out without approval", "without_approval"),
    ):
        recorded, replayed = getattr(report.recorded, name), getattr(report.replayed, name)
        lines.append(f"{label:28}{recorded:>10g}{replayed:>10g}")
    lines.append(
        f"{'jobs stopped operators let run':28}{'':>10}{len(report.stops_operators_let_run):>10}"
    )
    lines.append(
        f"{'actions operators rejected':28}{'':>10}{len(report.rejected_actions_taken):>10}"
    )
    shown = report.decisions if every_decision else report.differences
    if shown:
        lines += ["", "when        job/attempt  recorded -> replayed  [verdict] why"]
    for d in shown:
        recorded = d.recorded.words() if d.recorded else "nothing"
        replayed = d.replayed.words() if d.replayed else "nothing"
        status = f" ({fate(d)})" if d.recorded_status else ""
        why = f" {d.explanation}" if d.explanation else ""
        lines.append(
            f"{d.at:%m-%d %H:%M}  {d.job_id}/{d.attempt}  {recorded}{status} -> {replayed}"
            f"  [{d.verdict}]{why}"
        )
    if report.unexplained:
        lines += ["", f"{len(report.unexplained)} differences have no recorded explanation."]
    return lines
