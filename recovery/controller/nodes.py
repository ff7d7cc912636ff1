"""Draining and resuming a node for recovery, from the node's state read now.

Neutral: any adapter that can drain (``Capabilities.drain``) takes the same steps. A node is
recovery's to drain only while in service, and to resume only while recovery's own drain is the
one thing keeping it out (``drain_refusal``, ``resume_refusal``).
"""

from __future__ import annotations

from recovery.controller.client import ReadyRecommendation
from recovery.controller.lease import LeaseLost
from recovery.controller.outcome import NotOwned, Outcome, Retry, node_snapshot
from recovery.controller.steps import Steps
from recovery.schedulers.base import (
    Command,
    CommandResult,
    NodeInfo,
    SchedulerError,
    describe_unknown,
    drain_reason,
    drain_refusal,
    drained_by_recovery,
    resume_refusal,
)
from recovery.schedulers.capabilities import Action
from recovery.schedulers.validation import validate_node_names


def carry_out_on_node(steps: Steps, recommendation: ReadyRecommendation) -> Outcome:
    """Drain or resume the recommendation's node, from the node's state read now.

    A node already as wanted by recovery is skipped: drained with recovery's reason (a drain
    is done once however many recommendations or approvals ask for it), or not drained (a
    resume). Otherwise recovery acts only on a node it may own (``drain_refusal``,
    ``resume_refusal``): a drain only of a node in service, a resume only of recovery's own
    drain with nothing else keeping the node out.
    Anything else is refused before any command and reported with the node as read. A node
    whose state or reason is unknown is not acted on; it is read again on the next pass.
    The node is read once more after the command's dispatch, right before the command, and
    the command is called off when that read no longer allows it.
    """
    outcome = Outcome("skipped", {"known": None})
    try:
        name = validate_node_names([recommendation.node])[0]
        reason = drain_reason(recommendation.reason)
        node = steps.read_node(name)
        outcome.state_before = node_snapshot(node)
        if node is None:
            outcome.outcome = "failed"
            outcome.detail = f"refused before any command: the scheduler does not know {name}"
            return outcome
        done = _already_done(recommendation.action, node)
        if done:
            outcome.converged = True
            outcome.detail = done
            return outcome
        _require_ownable(recommendation.action, node)
        drain = recommendation.action == Action.DRAIN

        def run() -> CommandResult:
            return (
                steps.adapter.drain_node(name, reason) if drain else steps.adapter.resume_node(name)
            )

        steps.node_command(
            outcome,
            Command.DRAIN_NODE if drain else Command.RESUME_NODE,
            name,
            run,
            reason if drain else "",
            recheck=lambda: _still_to_change(steps, recommendation.action, name, outcome),
        )
        after = steps.read_node(name)
        # Done as ``_already_done`` says: for a resume, recovery's drain lifted (Slurm may
        # list the node as not responding until its next ping).
        outcome.converged = after is not None and bool(_already_done(recommendation.action, after))
        if not outcome.converged:
            outcome.detail = f"not converged: {node_snapshot(after)}"
    except NotOwned as exc:
        outcome.outcome = "failed"
        outcome.converged = False
        outcome.detail = f"refused before any command: {exc}"
    except ValueError as exc:  # InvalidIdentifier, or a reason recovery does not write
        outcome.outcome = "failed"
        outcome.detail = f"refused before any command: {exc}"
    except (Retry, LeaseLost) as exc:
        outcome.outcome = "retry"
        outcome.converged = False
        outcome.detail = f"to be continued from the scheduler's state: {exc}"
    except SchedulerError as exc:
        if exc.result is not None:
            steps.record(outcome, exc.result)
        # Unreachable, or a command whose effect is unknown: the node's state decides next.
        outcome.outcome = "retry" if exc.result is None else "failed"
        outcome.converged = False if exc.result is None else None
        outcome.detail = str(exc)
    return outcome


def _still_to_change(steps: Steps, action: str, name: str, outcome: Outcome) -> None:
    """Read the node once more after the command's dispatch, right before the command.

    An administrator may have taken the node out (or Slurm itself) since it was read, or a
    controller paused since then may come back to a node another one already changed.
    Raises ``NotOwned`` when recovery may no longer change it (the report then shows the
    node as read now) and ``Retry`` when it is already as wanted (the next pass says so).
    """
    node = steps.read_node(name)
    outcome.state_before = node_snapshot(node)
    if node is None:
        raise NotOwned(f"the scheduler no longer knows {name}")
    if _already_done(action, node):
        raise Retry(f"{name} changed since it was read ({node.describe()}): not run")
    _require_ownable(action, node)


def _already_done(action: str, node: NodeInfo) -> str:
    """Why ``action`` has nothing left to do on ``node`` as read, or "": drained with recovery's
    reason (a drain), not drained (a resume: no drain of recovery's is left to lift, whatever
    else keeps the node out). Never said of a node whose state is unknown."""
    if node.unknown():
        return ""
    if action == Action.DRAIN and drained_by_recovery(node):
        return f"{node.name} is already drained by recovery: {node.reason}"
    if action == Action.RESUME and not node.drained:
        return f"{node.name} is not drained ({node.describe()})"
    return ""


def _require_ownable(action: str, node: NodeInfo) -> None:
    """Raise ``Retry`` while the node's state or reason is unknown (it is read again on the
    next pass), ``NotOwned`` when recovery may not ``action`` the node as read."""
    unknown = node.unknown()
    if unknown:
        raise Retry(
            f"not acting on node {node.name} while these are unknown: {describe_unknown(unknown)}"
        )
    refusal = drain_refusal(node) if action == Action.DRAIN else resume_refusal(node)
    if refusal:
        raise NotOwned(refusal)
