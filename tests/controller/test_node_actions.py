"""Drains and resumes carried out from the node's state read now.

The scheduler and the Advisor API are scripted here; tests/slurm/test_drains.py drains and
resumes real Slurm nodes through the real API.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import pytest

from recovery.controller.client import ReadyRecommendation
from recovery.controller.controller import AdvisorController
from recovery.sources.schedulers.base import (
    DRAIN_REASON_PREFIX,
    Command,
    CommandResult,
    NodeInfo,
    SchedulerError,
    drain_reason,
)
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


@pytest.mark.parametrize(
    "node",
    [DRAINED_BY_US, NodeInfo("node003", "MIXED", flags=["DRAIN"], reason="admin: swap PSU")],
)
def test_a_drained_node_is_not_drained_again(node: NodeInfo) -> None:
    scheduler, api = Nodes(node), API()
    outcome = controller(scheduler, api).carry_out(node_action("drain"))
    assert (outcome.outcome, outcome.converged) == ("skipped", True)
    assert scheduler.commands == [] and api.dispatched == []


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
