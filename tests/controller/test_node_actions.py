"""Drains and resumes carried out from the node's state read now.

The scheduler and the Advisor API are scripted here; tests/slurm/test_drains.py drains and
resumes real Slurm nodes through the real API.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from datetime import datetime
from typing import Any

import pytest

from recovery.controller.client import ReadyRecommendation
from recovery.controller.controller import AdvisorController
from recovery.schedulers.base import (
    DRAIN_REASON_PREFIX,
    Command,
    CommandResult,
    NodeInfo,
    SchedulerError,
    drain_reason,
)
from recovery.schedulers.compat import UTC
from tests.fakes import Scripted


class Nodes(Scripted):
    """Nodes whose drain and resume change what the next read shows."""

    def __init__(self, *nodes: NodeInfo, unreadable: int = 0, refuse: bool = False) -> None:
        super().__init__([], list(nodes))
        self.commands: list[tuple[str, ...]] = []
        self.unreadable = unreadable
        self.refuse = refuse

    def list_nodes(self) -> list[NodeInfo]:
        if self.unreadable:
            self.unreadable -= 1
            raise SchedulerError("slurm_load_node error: Unable to contact slurm controller")
        return super().list_nodes()

    def drain_node(self, name: str, reason: str) -> CommandResult:
        argv = self.planned_node_argv(Command.DRAIN_NODE, name, reason)
        self.commands.append(argv)
        if self.refuse:
            result = CommandResult(argv, 1, "", "Invalid node name specified\n")
            raise SchedulerError(result.describe(), result)
        self._change(name, flags=["DRAIN"], reason=reason)
        return CommandResult(argv, 0, "", "")

    def resume_node(self, name: str) -> CommandResult:
        argv = self.planned_node_argv(Command.RESUME_NODE, name)
        self.commands.append(argv)
        self._change(name, flags=[], reason="")
        return CommandResult(argv, 0, "", "")

    def _change(self, name: str, **fields: Any) -> None:
        self.nodes = [replace(n, **fields) if n.name == name else n for n in self.nodes]


class API:
    """Records the dispatches the controller makes before each command."""

    def __init__(self) -> None:
        self.dispatched: list[list[str]] = []

    def dispatch(self, recommendation_id: int, argv: Sequence[str], sequence: int) -> None:
        self.dispatched.append(list(argv))

    def renew(self, recommendation_id: int, lease_seconds: int) -> None:
        return None


def node_action(action: str, node: str = "node003", reason: str = "") -> ReadyRecommendation:
    return ReadyRecommendation(
        id=21,
        job_id="4242",
        partition="gpu",
        attempt=None,
        action=action,
        excluded_nodes=[],
        reason=reason or drain_reason("hardware: gpu_hardware (xid-79) on node003, from kernel"),
        node=node,
    )


def controller(scheduler: Nodes, api: API | None = None) -> AdvisorController:
    return AdvisorController(
        api or API(),  # type: ignore[arg-type]
        scheduler,
        poll_seconds=0,
        backoff_seconds=0,
        sleep=lambda _: None,
    )


IDLE = NodeInfo("node003", "IDLE")
DRAINED_BY_US = NodeInfo("node003", "IDLE", flags=["DRAIN"], reason=f"{DRAIN_REASON_PREFIX} xid 79")


def test_a_drain_is_dispatched_run_and_verified() -> None:
    scheduler, api = Nodes(IDLE), API()
    outcome = controller(scheduler, api).carry_out(node_action("drain"))
    assert (outcome.outcome, outcome.converged) == ("executed", True), outcome.detail
    assert api.dispatched == [list(scheduler.commands[0])]
    assert scheduler.commands[0][:4] == ("scontrol", "update", "NodeName=node003", "State=DRAIN")
    assert scheduler.commands[0][4].startswith(f"Reason={DRAIN_REASON_PREFIX} hardware:")
    assert outcome.state_before == {
        "known": True,
        "node": "node003",
        "state": "IDLE",
        "flags": [],
        "reason": "",
    }


def test_a_node_recovery_drained_is_not_drained_again() -> None:
    scheduler, api = Nodes(DRAINED_BY_US), API()
    outcome = controller(scheduler, api).carry_out(node_action("drain"))
    assert (outcome.outcome, outcome.converged) == ("skipped", True)
    assert scheduler.commands == [] and api.dispatched == []


def test_a_node_an_administrator_drained_is_refused_not_taken_over() -> None:
    """Before, this was "skipped, converged": the drain counted as done on someone else's
    drain. Recovery's drain is not in place, and never will be: refused, with the node as read."""
    admin = NodeInfo("node003", "MIXED", flags=["DRAIN"], reason="admin: swap PSU")
    scheduler, api = Nodes(admin), API()
    outcome = controller(scheduler, api).carry_out(node_action("drain"))
    assert (outcome.outcome, outcome.converged) == ("failed", False)
    assert outcome.detail.startswith("refused before any command: node003 is out of service")
    assert "admin: swap PSU" in outcome.detail
    assert scheduler.commands == [] and api.dispatched == []
    assert outcome.state_before["reason"] == "admin: swap PSU"


RMA_AT = datetime(2026, 12, 3, 9, 30, tzinfo=UTC)


@pytest.mark.parametrize(
    "node",
    [
        NodeInfo("node003", "DOWN", reason="RMA 4411 do not resume", reason_set_by="root"),
        NodeInfo("node003", "DOWN", flags=["NOT_RESPONDING"], reason="Not responding"),
        NodeInfo("node003", "IDLE", flags=["FAIL"], reason="bad DIMM"),
        NodeInfo("node003", "MIXED", flags=["MAINTENANCE", "RESERVED"]),
        NodeInfo("node003", "IDLE", flags=["REBOOT_REQUESTED"]),
        NodeInfo("node003", "IDLE", flags=["POWERED_DOWN"]),
        NodeInfo("node003", "IDLE", flags=["POWER_DOWN"]),
        NodeInfo("node003", "IDLE", flags=["A_FLAG_OF_A_LATER_SLURM"]),
        NodeInfo("node003", "FUTURE"),
        NodeInfo("node003", "UNKNOWN"),
    ],
    ids=lambda node: "+".join([node.state, *node.flags]),
)
def test_a_node_out_of_service_is_never_drained(node: NodeInfo) -> None:
    scheduler, api = Nodes(replace(node, reason_set_at=RMA_AT if node.reason else None)), API()
    outcome = controller(scheduler, api).carry_out(node_action("drain"))
    assert (outcome.outcome, outcome.converged) == ("failed", False)
    assert outcome.detail.startswith("refused before any command: node003 ")
    assert scheduler.commands == [] and api.dispatched == []
    # The report carries the node as read: the trail keeps its state and whose reason it is.
    assert outcome.state_before["state"] == node.state
    assert outcome.state_before["flags"] == node.flags
    assert outcome.state_before["reason"] == node.reason
    if node.reason_set_by:
        assert outcome.state_before["reason_set_by"] == "root"
        assert outcome.state_before["reason_set_at"] == RMA_AT.isoformat()


@pytest.mark.parametrize(
    "node",
    [
        NodeInfo("node003", "ALLOCATED"),
        NodeInfo("node003", "MIXED", flags=["COMPLETING"]),
        NodeInfo("node003", "IDLE", flags=["RESERVED"]),
        NodeInfo("node003", "IDLE", flags=["PLANNED"]),
        # Stopped answering, not yet DOWN: still in service, and what a drain is for.
        NodeInfo("node003", "ALLOCATED", flags=["NOT_RESPONDING"]),
        # 24.11 keeps the last reason on a resumed node: it keeps nothing out.
        NodeInfo("node003", "IDLE", reason="admin: kernel upgrade", reason_set_by="root"),
    ],
    ids=lambda node: "+".join([node.state, *node.flags]),
)
def test_a_node_in_service_is_drained(node: NodeInfo) -> None:
    scheduler = Nodes(node)
    outcome = controller(scheduler).carry_out(node_action("drain"))
    assert (outcome.outcome, outcome.converged) == ("executed", True), outcome.detail


@pytest.mark.parametrize(
    ("node", "unknown"),
    [
        (NodeInfo("node003", None, unreadable={"state": "state: null"}), "state: state: null"),
        (NodeInfo("node003", None, flags=["IDLE"]), "state: not reported by the scheduler"),
        (NodeInfo("node003", "IDLE", reason=None), "reason: not reported by the scheduler"),
    ],
)
@pytest.mark.parametrize("action", ["drain", "resume"])
def test_a_node_whose_state_is_unknown_is_not_acted_on(
    node: NodeInfo, unknown: str, action: str
) -> None:
    scheduler, api = Nodes(node), API()
    outcome = controller(scheduler, api).carry_out(node_action(action, reason="ops resumes"))
    assert (outcome.outcome, outcome.converged) == ("retry", False)
    assert f"not acting on node node003 while these are unknown: {unknown}" in outcome.detail
    assert scheduler.commands == [] and api.dispatched == []


class AdministratorAtDispatch(API):
    """An administrator changes the node between the command's dispatch and the command."""

    def __init__(self, scheduler: Nodes, **change: Any) -> None:
        super().__init__()
        self.scheduler, self.change = scheduler, change

    def dispatch(self, recommendation_id: int, argv: Sequence[str], sequence: int) -> None:
        super().dispatch(recommendation_id, argv, sequence)
        self.scheduler._change("node003", **self.change)


def test_a_node_taken_out_after_it_was_read_is_not_drained() -> None:
    scheduler = Nodes(IDLE)
    api = AdministratorAtDispatch(scheduler, state="DOWN", reason="RMA 4411", reason_set_by="root")
    outcome = controller(scheduler, api).carry_out(node_action("drain"))
    assert (outcome.outcome, outcome.converged) == ("failed", False)
    assert "refused before any command: node003 is out of service (DOWN" in outcome.detail
    assert len(api.dispatched) == 1 and scheduler.commands == []  # dispatched, never run
    assert outcome.state_before["state"] == "DOWN"  # the node as read right before
    assert outcome.state_before["reason"] == "RMA 4411"


def test_an_unreadable_node_is_retried_never_guessed() -> None:
    scheduler = Nodes(IDLE, unreadable=10)
    outcome = controller(scheduler).carry_out(node_action("drain"))
    assert outcome.outcome == "retry"
    assert "cannot read node node003" in outcome.detail
    assert scheduler.commands == []


def test_an_unknown_node_is_refused() -> None:
    scheduler = Nodes(IDLE)
    outcome = controller(scheduler).carry_out(node_action("drain", node="node009"))
    assert outcome.outcome == "failed"
    assert "does not know node009" in outcome.detail
    assert scheduler.commands == []


@pytest.mark.parametrize("node", ["node[1-3]", "node003;reboot", "", "-rf"])
def test_a_node_name_no_command_may_carry_is_refused(node: str) -> None:
    scheduler = Nodes(IDLE)
    outcome = controller(scheduler).carry_out(node_action("drain", node=node))
    assert outcome.outcome == "failed"
    assert outcome.detail.startswith("refused before any command")
    assert scheduler.commands == []


def test_a_refused_drain_fails_with_what_slurm_said() -> None:
    scheduler = Nodes(IDLE, refuse=True)
    outcome = controller(scheduler).carry_out(node_action("drain"))
    assert outcome.outcome == "failed"
    assert "Invalid node name specified" in outcome.detail
    assert outcome.commands[0]["returncode"] == 1


def test_a_resume_undoes_recoverys_own_drain() -> None:
    scheduler, api = Nodes(DRAINED_BY_US), API()
    outcome = controller(scheduler, api).carry_out(node_action("resume", reason="ops resumes"))
    assert (outcome.outcome, outcome.converged) == ("executed", True), outcome.detail
    assert scheduler.commands == [("scontrol", "update", "NodeName=node003", "State=RESUME")]
    assert api.dispatched == [list(scheduler.commands[0])]


def test_a_resume_never_undoes_an_administrators_drain() -> None:
    scheduler = Nodes(NodeInfo("node003", "IDLE", flags=["DRAIN"], reason="admin: swap PSU"))
    outcome = controller(scheduler).carry_out(node_action("resume", reason="ops resumes"))
    assert outcome.outcome == "failed"
    assert "drained by someone else (admin: swap PSU)" in outcome.detail
    assert scheduler.commands == []


@pytest.mark.parametrize(
    "node",
    [
        replace(DRAINED_BY_US, state="DOWN"),
        replace(DRAINED_BY_US, flags=["DRAIN", "NOT_RESPONDING"]),
        replace(DRAINED_BY_US, flags=["DRAIN", "MAINTENANCE"]),
        replace(DRAINED_BY_US, flags=["DRAIN", "FAIL"]),
        replace(DRAINED_BY_US, flags=["DRAIN", "REBOOT_REQUESTED"]),
    ],
    ids=lambda node: "+".join([node.state, *node.flags]),
)
def test_a_resume_leaves_recoverys_drain_once_something_else_keeps_the_node_out(
    node: NodeInfo,
) -> None:
    scheduler, api = Nodes(node), API()
    outcome = controller(scheduler, api).carry_out(node_action("resume", reason="ops resumes"))
    assert (outcome.outcome, outcome.converged) == ("failed", False)
    assert "more than recovery's drain keeps it out of service" in outcome.detail
    assert scheduler.commands == [] and api.dispatched == []


def test_a_resume_is_called_off_when_an_administrator_sets_the_node_down_meanwhile() -> None:
    scheduler = Nodes(DRAINED_BY_US)
    api = AdministratorAtDispatch(scheduler, state="DOWN", reason="RMA 4411 do not resume")
    outcome = controller(scheduler, api).carry_out(node_action("resume", reason="ops resumes"))
    assert (outcome.outcome, outcome.converged) == ("failed", False)
    assert "drained by someone else (RMA 4411 do not resume)" in outcome.detail
    assert len(api.dispatched) == 1 and scheduler.commands == []


def test_a_resume_of_a_node_in_service_is_skipped() -> None:
    scheduler = Nodes(IDLE)
    outcome = controller(scheduler).carry_out(node_action("resume", reason="ops resumes"))
    assert (outcome.outcome, outcome.converged) == ("skipped", True)
    assert scheduler.commands == []


@pytest.mark.parametrize(
    ("verdict", "expected"),
    [
        ("hardware: Xid 79", f"{DRAIN_REASON_PREFIX} hardware: Xid 79"),
        (f"{DRAIN_REASON_PREFIX} twice", f"{DRAIN_REASON_PREFIX} twice"),
        (
            'quote " and \\ and \n newline\x1b[31m',
            f"{DRAIN_REASON_PREFIX} quote and and newline [31m",
        ),
        ("x" * 500, f"{DRAIN_REASON_PREFIX} {'x' * 500}"[:200]),
    ],
)
def test_the_drain_reason_is_one_safe_bounded_line(verdict: str, expected: str) -> None:
    assert drain_reason(verdict) == expected
