"""Recovery drains and resumes only nodes it may own; a node an administrator (or Slurm) took
out of service stays as they left it, reason and all.

The abuse: a node an administrator set DOWN with "RMA ... do not resume" got a drain; the
drain's ``Reason=workload-recovery:...`` replaced the administrator's, and one click on Resume
ran ``State=RESUME``: the RMA node was back in service. A node whose state could not be read
counted as "not drained", which opened the same path.

Here Slurm is scripted at its command line (24.11's ``scontrol --json show nodes`` and the
``scontrol update`` commands, which change what the next read shows), read by the real Slurm
adapter, polled into MariaDB, and acted on by the real controller through the real Advisor
API. tests/slurm/test_drains.py does the same against real Slurm 22.05 and 24.11.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import pytest
from rest_framework.test import APIClient

from recovery.choices import (
    AuditKind,
    ClusterMode,
    RecommendationAction,
    RecommendationStatus,
)
from recovery.controller.client import AdvisorAPIError, AdvisorClient
from recovery.controller.controller import AdvisorController
from recovery.loop import recommendations
from recovery.loop.drains import request_resume
from recovery.loop.poll import poll_cluster
from recovery.models import (
    AuditEvent,
    Cluster,
    ControllerToken,
    Node,
    Policy,
    Recommendation,
    Workload,
)
from recovery.schedulers.base import CommandResult
from recovery.schedulers.output_files import OutputAccess, OutputFile, OutputRefused
from recovery.schedulers.slurm import SlurmAdapter
from tests.factories import ClusterFactory, kernel_log_blames

pytestmark = pytest.mark.django_db

NODE = "node003"
RMA = "RMA 4411 PSU swap, do not resume"
META = {"slurm": {"version": {"major": "24", "minor": "11", "micro": "5"}, "release": "24.11.5"}}


class ScriptedSlurm:
    """Slurm 24.11 as its commands answer: node records, and the node updates they take.

    ``State=DRAIN`` adds the DRAIN flag and sets the reason, ``State=DOWN`` makes the base
    state DOWN (a drain stays), ``State=RESUME`` takes DRAIN away and brings a DOWN node back
    to IDLE, as slurmctld does.
    """

    name = "scripted-slurm"

    def __init__(self, **nodes: dict[str, Any]) -> None:
        self.nodes = {
            name: {"name": name, "reason": "", **record} for name, record in nodes.items()
        }
        self.updates: list[tuple[str, ...]] = []

    def run(self, argv: Sequence[str], *, timeout: float = 30.0) -> CommandResult:
        argv = tuple(argv)
        if argv == ("squeue", "--json", "-t", "all"):
            return self._answer(argv, {"jobs": []})
        if argv == ("scontrol", "--json", "show", "nodes"):
            return self._answer(argv, {"nodes": list(self.nodes.values())})
        if argv[:2] == ("scontrol", "update") and argv[2].startswith("NodeName="):
            self.updates.append(argv)
            fields = dict(arg.split("=", 1) for arg in argv[2:])
            self.administrator(fields["NodeName"], fields["State"], fields.get("Reason"))
            return CommandResult(argv, 0, "", "")
        raise AssertionError(f"unexpected command {argv}")

    def administrator(self, name: str, state: str, reason: str | None = None) -> None:
        """``scontrol update NodeName=name State=state Reason=reason``, as anyone runs it."""
        node = self.nodes[name]
        words = list(node["state"])
        if state == "DRAIN":
            words = [*words, "DRAIN"] if "DRAIN" not in words else words
        elif state == "DOWN":
            words = ["DOWN", *words[1:]]
        elif state == "RESUME":
            words = ["IDLE" if words[0] == "DOWN" else words[0]]
            reason = ""
        node["state"] = words
        if reason is not None:
            node["reason"] = reason
            node["reason_set_by_user"] = "root"
            node["reason_changed_at"] = {"set": True, "infinite": False, "number": 1796336552}

    def _answer(self, argv: tuple[str, ...], body: dict[str, Any]) -> CommandResult:
        document = {"meta": META, "errors": [], "warnings": [], **body}
        return CommandResult(argv, 0, json.dumps(document), "")

    def read_file(self, path: str, offset: int, limit: int) -> bytes:
        return b""

    def file_size(self, path: str) -> int | None:
        return None

    def open_output(self, path: str, access: OutputAccess) -> OutputFile | None:
        return None

    def output_sizes(self, paths: Sequence[str]) -> dict[str, int | None]:
        return dict.fromkeys(paths)

    def open_outputs(
        self,
        wanted: Mapping[str, int],
        access: OutputAccess | Mapping[str, OutputAccess],
        limit: int,
    ) -> dict[str, OutputFile | OutputRefused | None]:
        return dict.fromkeys(wanted)


class InProcessAdvisor(AdvisorClient):
    """The controller's own client, calling the real Advisor API in this process."""

    def __init__(self, key: str) -> None:
        super().__init__("http://testserver", key)
        self.client = APIClient()

    def _call(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        headers = {
            key: value
            for key, value in self.headers().items()
            if key not in {"Content-Type", "Accept"}
        }
        response = self.client.generic(
            method,
            path,
            json.dumps(body) if body is not None else "",
            content_type="application/json",
            headers=headers,
        )
        if response.status_code >= 400:
            raise AdvisorAPIError(f"{method} {path}: {response.status_code}", response.status_code)
        return response.json() if response.content else None


@pytest.fixture
def cluster() -> Cluster:
    cluster = ClusterFactory(
        name="shared", mode=ClusterMode.ACTION, acknowledge_scheduler_actions=True
    )
    Policy.objects.create(
        name="record only", cluster=cluster, crash_action="none", blast_radius_percent=50
    )
    return cluster


def slurm_with(**node003: Any) -> tuple[ScriptedSlurm, SlurmAdapter]:
    slurm = ScriptedSlurm(
        node001={"state": ["IDLE"]}, node002={"state": ["MIXED"]}, node003=node003
    )
    return slurm, SlurmAdapter(slurm)


def controller(cluster: Cluster, adapter: SlurmAdapter) -> AdvisorController:
    _, key = ControllerToken.issue(cluster, "slurm-advisor-1")
    return AdvisorController(
        InProcessAdvisor(key),
        adapter,
        settle_seconds=0,
        poll_seconds=0,
        backoff_seconds=0,
        sleep=lambda _: None,
    )


def drains() -> list[Recommendation]:
    return list(Recommendation.objects.filter(action=RecommendationAction.DRAIN).order_by("pk"))


def approved_before(workload: Workload, action: str, reason: str) -> Recommendation:
    """A node action an operator approved before the node changed: ready for the controller."""
    return Recommendation.objects.create(
        workload=workload,
        node=Node.objects.get(name=NODE),
        action=action,
        reason=reason,
        status=RecommendationStatus.READY,
        approved_by="ops",
        idempotency_key=f"test:{action}:{Recommendation.objects.count()}",
    )


def test_a_node_an_administrator_set_down_gets_no_drain_and_keeps_its_reason(
    cluster: Cluster,
) -> None:
    """
    GIVEN a node an administrator set DOWN with "RMA ... do not resume"
    WHEN a site fact blames its GPU, and a drain approved earlier reaches the controller
    THEN no drain is recommended, the controller runs nothing, and Slurm keeps the
         administrator's state and reason; the trail and the report show the node as read
    """
    slurm, adapter = slurm_with(state=["DOWN"])
    slurm.administrator(NODE, "DOWN", RMA)
    poll_cluster(cluster, adapter)
    workload = kernel_log_blames(cluster, NODE)
    assert drains() == []

    earlier = approved_before(workload, RecommendationAction.DRAIN, "workload-recovery: xid 79")
    assert controller(cluster, adapter).run_once() == [(earlier.pk, "failed")]
    assert slurm.updates == []
    assert (slurm.nodes[NODE]["state"], slurm.nodes[NODE]["reason"]) == (["DOWN"], RMA)

    [refused] = AuditEvent.objects.filter(kind=AuditKind.DRAIN_REFUSED)
    assert refused.payload["node_state"]["reason"] == RMA
    assert refused.payload["node_state"]["reason_set_by"] == "root"
    report = AuditEvent.objects.get(kind=AuditKind.ACTION_FAILED)
    assert report.payload["state_before"]["state"] == "DOWN"
    assert report.payload["state_before"]["reason"] == RMA
    assert report.payload["detail"].startswith("refused before any command: node003 is out")
    earlier.refresh_from_db()
    assert "out of service (DOWN, reason" in earlier.disposition_reason


def test_a_node_an_administrator_drained_gets_no_drain_of_recoverys(cluster: Cluster) -> None:
    """
    GIVEN a drain recommended while the node was in service
    WHEN an administrator drains the node with their own reason, then an operator approves the
         drain, and a drain approved before reaches the controller
    THEN the approval is refused, the controller runs nothing and reports the node as the
         administrator's, not as drained by recovery; no further drain is recommended
    """
    slurm, adapter = slurm_with(state=["ALLOCATED"])
    poll_cluster(cluster, adapter)
    workload = kernel_log_blames(cluster, NODE)
    [drain] = drains()
    slurm.administrator(NODE, "DRAIN", "admin: swap PSU")
    poll_cluster(cluster, adapter)

    assert not recommendations.approve(drain.pk, operator="ops").changed
    earlier = approved_before(workload, RecommendationAction.DRAIN, drain.reason)
    outcome = controller(cluster, adapter).run_once()
    assert outcome == [(earlier.pk, "failed")]  # not "skipped" as if recovery's drain held
    assert slurm.updates == []
    assert slurm.nodes[NODE]["reason"] == "admin: swap PSU"
    assert not Node.objects.get(name=NODE).drained_by_recovery
    kernel_log_blames(cluster, NODE)
    assert drains() == [drain, earlier]


def test_a_node_whose_state_cannot_be_read_gets_no_drain_and_the_controller_runs_none(
    cluster: Cluster,
) -> None:
    """
    GIVEN a node whose state Slurm prints in a shape the reader does not know (before, it
         became "" and counted as "not drained")
    WHEN a site fact blames its GPU, and a drain approved earlier reaches the controller
    THEN no drain is recommended, and the controller runs nothing: the state is unknown
    """
    slurm, adapter = slurm_with(state={"base": "IDLE", "flags": ["DRAIN"]}, reason="admin: PSU")
    poll_cluster(cluster, adapter)
    workload = kernel_log_blames(cluster, NODE)
    assert drains() == []

    earlier = approved_before(workload, RecommendationAction.DRAIN, "workload-recovery: xid 79")
    assert controller(cluster, adapter).run_once() == [(earlier.pk, "retry")]
    assert slurm.updates == []
    assert slurm.nodes[NODE]["reason"] == "admin: PSU"
    retried = AuditEvent.objects.get(kind=AuditKind.ACTION_RETRY)
    assert "not acting on node node003 while these are unknown: state" in retried.payload["detail"]
    assert Node.objects.get(name=NODE).state_unknown.startswith("state: state: unknown shape")


def test_a_node_recovery_drained_then_an_administrator_set_down_is_not_resumed(
    cluster: Cluster,
) -> None:
    """
    GIVEN a node recovery drained (its reason in Slurm)
    WHEN an administrator sets it DOWN for an RMA, keeping the reason that explains it, and an
         operator asks for a resume; and a resume asked for before reaches the controller
    THEN the resume is refused and the controller runs nothing: the node stays DOWN
    """
    slurm, adapter = slurm_with(state=["ALLOCATED"])
    poll_cluster(cluster, adapter)
    kernel_log_blames(cluster, NODE)
    [drain] = drains()
    assert recommendations.approve(drain.pk, operator="ops").changed
    advisor = controller(cluster, adapter)
    assert advisor.run_once() == [(drain.pk, "executed")]
    poll_cluster(cluster, adapter)
    earlier = request_resume(Node.objects.get(name=NODE).pk, operator="ops").recommendation
    assert earlier is not None
    slurm.administrator(NODE, "DOWN", drain.reason)
    poll_cluster(cluster, adapter)

    assert advisor.run_once() == [(earlier.pk, "failed")]
    assert [update[3] for update in slurm.updates] == ["State=DRAIN"]  # no State=RESUME
    assert slurm.nodes[NODE]["state"] == ["DOWN", "DRAIN"]
    earlier.refresh_from_db()
    assert "more than recovery's drain keeps it out of service" in earlier.disposition_reason
    asked = request_resume(Node.objects.get(name=NODE).pk, operator="ops")
    assert not asked.changed and asked.recommendation is None
    assert "more than recovery's drain keeps it out of service" in asked.message
