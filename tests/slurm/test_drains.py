"""Drains and resumes on the real Slurm clusters, through the real Advisor API over HTTP.

A node a site fact blames on hardware is recommended for a drain; approved, the controller
drains it once; asked again, nothing more reaches Slurm. A resume undoes only recovery's own
drain. A node an administrator set DOWN or drained is left as they left it, reason and all, and
a node recovery drained that an administrator then set DOWN is not resumed. Every node is
resumed when a test ends, whatever it left.
"""

from __future__ import annotations

import os
import re
import signal
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from recovery.choices import (
    AuditKind,
    ClusterMode,
    RecommendationAction,
    RecommendationStatus,
    WorkloadState,
)
from recovery.controller.client import AdvisorClient
from recovery.controller.controller import AdvisorController
from recovery.loop import recommendations
from recovery.loop.drains import request_resume
from recovery.loop.poll import poll_cluster
from recovery.models import (
    Attempt,
    AuditEvent,
    Cluster,
    ControllerToken,
    Node,
    Policy,
    Recommendation,
    Workload,
)
from recovery.schedulers.base import DRAIN_REASON_PREFIX, CommandResult, NodeInfo
from recovery.schedulers.slurm import SlurmAdapter
from tests.factories import kernel_log_blames
from tests.slurm.conftest import SlurmCluster

pytestmark = [pytest.mark.slurm, pytest.mark.django_db(transaction=True, reset_sequences=True)]

NODE = "node003"


@pytest.fixture
def adapter(slurm_cluster: SlurmCluster) -> Iterator[SlurmAdapter]:
    adapter = slurm_cluster.adapter()
    yield adapter
    for name in slurm_cluster.nodes:
        slurm_cluster.run(["scontrol", "update", f"NodeName={name}", "State=RESUME"])
    # Slurm lists a resumed node as not responding until its next ping; the next test's poll
    # must not find it so (a node not responding is unhealthy to the loop).
    deadline = time.monotonic() + 60
    while any(node.unavailable or "NOT_RESPONDING" in node.flags for node in adapter.list_nodes()):
        assert time.monotonic() < deadline, adapter.list_nodes()
        time.sleep(0.5)
    close = getattr(adapter.transport, "close", None)
    if close is not None:
        close()


@pytest.fixture
def cluster(slurm_cluster: SlurmCluster, adapter: SlurmAdapter) -> Cluster:
    connection, settings = slurm_cluster.connection()
    cluster = Cluster.objects.create(
        name="lab",
        connection=connection,
        connection_settings=settings,
        mode=ClusterMode.ACTION,
        acknowledge_scheduler_actions=True,
    )
    # Earlier tests' jobs are still in Slurm's memory and get polled too: nothing restarts them.
    # A quarter of this four-node cluster is one node: the default 10 % would withhold every drain.
    Policy.objects.create(
        name="record only", cluster=cluster, crash_action="none", blast_radius_percent=25
    )
    poll_cluster(cluster, adapter)  # the nodes, as Slurm lists them
    return cluster


@pytest.fixture
def controller(live_server: Any, cluster: Cluster, adapter: SlurmAdapter) -> AdvisorController:
    _, key = ControllerToken.issue(cluster, "slurm-advisor-1")
    return AdvisorController(
        AdvisorClient(live_server.url, key), adapter, settle_seconds=30, poll_seconds=0.2
    )


def xid_79_in_kernel_log(cluster: Cluster) -> Recommendation:
    """A job on ``NODE`` whose node's kernel log shows Xid 79: the drain it leads to."""
    kernel_log_blames(cluster, NODE, partition="debug")
    return Recommendation.objects.get(action=RecommendationAction.DRAIN, node__name=NODE)


def slurm_node(adapter: SlurmAdapter, name: str = NODE) -> NodeInfo:
    node = adapter.get_node(name)
    assert node is not None
    return node


def poll_until_running(cluster: Cluster, job_id: str) -> Workload:
    deadline = time.monotonic() + 60
    while True:
        poll_cluster(cluster)
        workload = Workload.objects.filter(cluster=cluster, job_id=job_id).first()
        if workload is not None and workload.state == WorkloadState.RUNNING:
            return workload
        assert time.monotonic() < deadline, f"never running: {workload and workload.state}"
        time.sleep(0.3)


def node_commands() -> list[list[str]]:
    return [
        event.payload["argv"]
        for event in AuditEvent.objects.filter(kind=AuditKind.DISPATCHED).order_by("pk")
        if any(arg.startswith("NodeName=") for arg in event.payload["argv"])
    ]


def test_an_xid_in_a_kernel_log_leads_to_one_drain_once_approved(
    controller: AdvisorController,
    cluster: Cluster,
    adapter: SlurmAdapter,
    submit_job: Any,
    tmp_path: Path,
) -> None:
    """
    GIVEN an acknowledged action-mode cluster whose nodes' kernel logs are read, a job running
    WHEN Xid 79 appears in the kernel log of the job's node, and the drain it leads to is
         approved twice with the controller running after each approval
    THEN the drain waits for the approval, Slurm drains the node once with recovery's reason,
         and nothing else reaches Slurm; the poller does not take its own drain for new evidence
    """
    cluster.connection_settings = {
        **cluster.connection_settings,
        "node_kernel_log": str(tmp_path / "kern-{node}.log"),
    }
    cluster.save()
    submitted = submit_job({"STEP_SECONDS": "0.2", "TOTAL_STEPS": "1000"})
    workload = poll_until_running(cluster, str(submitted.job_id))
    (node,) = Attempt.objects.get(workload=workload, number=1).nodes
    (tmp_path / f"kern-{node}.log").write_text(
        f"Nov 29 10:00:00 {node} kernel: NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, "
        "GPU has fallen off the bus.\n"
    )
    poll_cluster(cluster)
    drain = Recommendation.objects.get(action=RecommendationAction.DRAIN, node__name=node)
    assert drain.status == RecommendationStatus.AWAITING_APPROVAL
    assert controller.run_once() == []
    assert not slurm_node(adapter, node).drained  # nothing acts on a drain nobody approved

    assert recommendations.approve(drain.pk, operator="ops").changed
    assert controller.run_once() == [(drain.pk, "executed")]
    drained = slurm_node(adapter, node)
    assert drained.drained
    assert drained.reason == drain.reason
    assert drained.reason.startswith(f"{DRAIN_REASON_PREFIX} hardware: gpu_hardware")

    assert not recommendations.approve(drain.pk, operator="ops").changed
    assert controller.run_once() == []
    drain.refresh_from_db()
    assert drain.status == RecommendationStatus.EXECUTED
    assert drain.result["converged"] is True
    assert node_commands() == [
        ["scontrol", "update", f"NodeName={node}", "State=DRAIN", f"Reason={drained.reason}"]
    ]

    poll_cluster(cluster)
    assert Node.objects.get(cluster=cluster, name=node).drained_by_recovery
    drains = Recommendation.objects.filter(action=RecommendationAction.DRAIN, node__name=node)
    assert drains.count() == 1


def test_a_second_drain_of_a_drained_node_is_skipped_and_a_resume_undoes_it(
    controller: AdvisorController, cluster: Cluster, adapter: SlurmAdapter
) -> None:
    """
    GIVEN a node recovery drained
    WHEN another drain of it is carried out, then an operator resumes it, twice
    THEN the drain is skipped without a command, and one resume returns the node to service
    """
    drain = xid_79_in_kernel_log(cluster)
    recommendations.approve(drain.pk, operator="ops")
    assert controller.run_once() == [(drain.pk, "executed")]

    again = Recommendation.objects.create(
        workload=drain.workload,
        node=drain.node,
        action=RecommendationAction.DRAIN,
        reason=drain.reason,
        status=RecommendationStatus.READY,
        # Drains are not automatic on this cluster: only an operator's approval makes one ready.
        approved_by="ops",
        idempotency_key="test:drain-again",
    )
    assert controller.run_once() == [(again.pk, "skipped")]
    assert len(node_commands()) == 1

    poll_cluster(cluster, adapter)
    node = Node.objects.get(name=NODE)
    asked = request_resume(node.pk, operator="ops", note="GPU reseated")
    assert asked.changed and asked.recommendation is not None
    assert not request_resume(node.pk, operator="ops").changed  # one resume under way
    assert controller.run_once() == [(asked.recommendation.pk, "executed")]
    assert not slurm_node(adapter).drained
    assert node_commands()[-1] == ["scontrol", "update", f"NodeName={NODE}", "State=RESUME"]
    assert len(node_commands()) == 2


def test_a_node_an_administrator_drained_is_never_resumed_by_recovery(
    controller: AdvisorController,
    cluster: Cluster,
    adapter: SlurmAdapter,
    slurm_cluster: SlurmCluster,
) -> None:
    """
    GIVEN a node an administrator drained for maintenance, after one of recovery's drains
    WHEN a resume of it reaches the controller
    THEN nothing runs: the resume fails, saying whose drain it is
    """
    drain = xid_79_in_kernel_log(cluster)
    recommendations.approve(drain.pk, operator="ops")
    controller.run_once()
    poll_cluster(cluster, adapter)
    asked = request_resume(Node.objects.get(name=NODE).pk, operator="ops")
    assert asked.recommendation is not None
    admin = slurm_cluster.run(
        ["scontrol", "update", f"NodeName={NODE}", "State=DRAIN", "Reason=admin: swap PSU"]
    )
    assert admin.returncode == 0, admin.stderr

    assert controller.run_once() == [(asked.recommendation.pk, "failed")]
    node = slurm_node(adapter)
    assert node.drained and node.reason == "admin: swap PSU"
    asked.recommendation.refresh_from_db()
    assert "drained by someone else" in asked.recommendation.disposition_reason
    assert len(node_commands()) == 1  # the drain; no resume ran


# --- nodes an administrator owns -------------------------------------------------------------

RMA = "RMA 4411 PSU swap do not resume"


@pytest.fixture
def unanswering_node(slurm_cluster: SlurmCluster, adapter: SlurmAdapter) -> Iterator[None]:
    """``NODE``'s slurmd stopped (SIGSTOP) for the test, woken again before the nodes are
    resumed: with ReturnToService=2 Slurm brings a DOWN node back into service as soon as its
    slurmd registers, and an administrator's DOWN would not last the test."""
    pid = slurm_cluster.pid_of(f"slurmd.{NODE}")
    assert pid is not None, f"no slurmd pid file for {NODE}"
    assert Path(f"/proc/{pid}/comm").read_text().strip() == "slurmd", f"{pid} is no slurmd"
    os.kill(pid, signal.SIGSTOP)
    try:
        # A message the slurmd sent just before it stopped (a registration) may still bring an
        # administrator's DOWN back into service: let slurmctld take it first.
        time.sleep(1)
        yield
    finally:
        os.kill(pid, signal.SIGCONT)


def as_administrator(slurm_cluster: SlurmCluster, *args: str) -> None:
    done = slurm_cluster.run(["scontrol", "update", f"NodeName={NODE}", *args])
    assert done.returncode == 0, done.stderr
    if "State=DOWN" in args:
        _down_until_it_holds(slurm_cluster, args)


def _down_until_it_holds(slurm_cluster: SlurmCluster, args: tuple[str, ...]) -> None:
    """A registration the stopped slurmd sent before it stopped can reach slurmctld after the
    administrator's DOWN on a busy machine, and ReturnToService=2 then brings the node back:
    set it again until DOWN has held for a second (the stopped slurmd sends nothing more)."""
    deadline = time.monotonic() + 10
    held_since: float | None = None
    while time.monotonic() < deadline:
        state, _ = scontrol_show_node(slurm_cluster)
        if not state.startswith("DOWN"):
            held_since = None
            again = slurm_cluster.run(["scontrol", "update", f"NodeName={NODE}", *args])
            assert again.returncode == 0, again.stderr
        elif held_since is None:
            held_since = time.monotonic()
        elif time.monotonic() - held_since >= 1:
            return
        time.sleep(0.2)
    raise AssertionError(f"{NODE} did not stay DOWN: {scontrol_show_node(slurm_cluster)}")


def scontrol_show_node(slurm_cluster: SlurmCluster) -> tuple[str, str]:
    """``State=`` and ``Reason=`` of ``scontrol show node``, as an administrator reads them."""
    shown = slurm_cluster.run(["scontrol", "show", "node", NODE])
    assert shown.returncode == 0, shown.stderr
    state = re.search(r"\bState=(\S+)", shown.stdout)
    reason = re.search(r"^\s*Reason=(.*?) \[[^\]]*\]\s*$", shown.stdout, re.MULTILINE)
    assert state is not None, shown.stdout
    return state.group(1), reason.group(1) if reason else ""


def approved_drain(workload: Workload) -> Recommendation:
    """A drain an operator approved while the node was in service, now ready."""
    return Recommendation.objects.create(
        workload=workload,
        node=Node.objects.get(cluster=workload.cluster, name=NODE),
        action=RecommendationAction.DRAIN,
        reason=f"{DRAIN_REASON_PREFIX} hardware: gpu_hardware (xid-79) on {NODE}, approved before",
        status=RecommendationStatus.READY,
        approved_by="ops",
        idempotency_key=f"test:approved-before:{Recommendation.objects.count()}",
    )


@pytest.mark.usefixtures("unanswering_node")
def test_a_node_an_administrator_set_down_is_left_alone_with_its_reason(
    controller: AdvisorController,
    cluster: Cluster,
    adapter: SlurmAdapter,
    slurm_cluster: SlurmCluster,
) -> None:
    """
    GIVEN a node an administrator set DOWN for an RMA
    WHEN its kernel log blames its GPU, and a drain approved before reaches the controller
    THEN no drain is recommended and none reaches Slurm: the node is DOWN with the
         administrator's reason, as scontrol shows it
    """
    as_administrator(slurm_cluster, "State=DOWN", f"Reason={RMA}")
    poll_cluster(cluster, adapter)
    node = Node.objects.get(cluster=cluster, name=NODE)
    assert node.scheduler_state.startswith("DOWN") and node.state_reason == RMA
    assert node.reason_set_by and node.reason_set_at is not None  # who and when, as Slurm said
    workload = kernel_log_blames(cluster, NODE, partition="debug")
    assert not Recommendation.objects.filter(action=RecommendationAction.DRAIN).exists()
    refused = AuditEvent.objects.get(kind=AuditKind.DRAIN_REFUSED)
    assert refused.payload["node_state"]["reason"] == RMA

    earlier = approved_drain(workload)
    assert controller.run_once() == [(earlier.pk, "failed")]
    assert node_commands() == []
    state, reason = scontrol_show_node(slurm_cluster)
    assert state.startswith("DOWN") and "DRAIN" not in state
    assert reason == RMA
    earlier.refresh_from_db()
    assert earlier.result["state_before"]["reason"] == RMA
    assert "is out of service (DOWN" in earlier.disposition_reason


def test_a_node_an_administrator_drained_is_left_alone_with_its_reason(
    controller: AdvisorController,
    cluster: Cluster,
    adapter: SlurmAdapter,
    slurm_cluster: SlurmCluster,
) -> None:
    """
    GIVEN a node an administrator drained with their own reason
    WHEN its kernel log blames its GPU, and a drain approved before reaches the controller
    THEN no drain is recommended and none reaches Slurm: the administrator's reason stays
    """
    as_administrator(slurm_cluster, "State=DRAIN", "Reason=admin: swap PSU")
    poll_cluster(cluster, adapter)
    workload = kernel_log_blames(cluster, NODE, partition="debug")
    assert not Recommendation.objects.filter(action=RecommendationAction.DRAIN).exists()

    earlier = approved_drain(workload)
    assert controller.run_once() == [(earlier.pk, "failed")]
    assert node_commands() == []
    state, reason = scontrol_show_node(slurm_cluster)
    assert "DRAIN" in state and reason == "admin: swap PSU"
    assert not request_resume(Node.objects.get(name=NODE).pk, operator="ops").changed


@pytest.mark.usefixtures("unanswering_node")
@pytest.mark.parametrize("reason", [RMA, "recovery's"])
def test_a_node_recovery_drained_then_an_administrator_set_down_is_not_resumed(
    controller: AdvisorController,
    cluster: Cluster,
    adapter: SlurmAdapter,
    slurm_cluster: SlurmCluster,
    reason: str,
) -> None:
    """
    GIVEN a node recovery drained, and a resume of it an operator asked for
    WHEN an administrator sets the node DOWN (with an RMA reason, or keeping recovery's)
    THEN the resume reaches the controller and nothing runs: the node stays DOWN and drained
    """
    drain = xid_79_in_kernel_log(cluster)
    recommendations.approve(drain.pk, operator="ops")
    assert controller.run_once() == [(drain.pk, "executed")]
    poll_cluster(cluster, adapter)
    asked = request_resume(Node.objects.get(name=NODE).pk, operator="ops")
    assert asked.recommendation is not None
    kept = drain.reason if reason == "recovery's" else reason
    as_administrator(slurm_cluster, "State=DOWN", f"Reason={kept}")

    assert controller.run_once() == [(asked.recommendation.pk, "failed")]
    assert [argv[3] for argv in node_commands()] == ["State=DRAIN"]  # no State=RESUME
    state, shown_reason = scontrol_show_node(slurm_cluster)
    assert state.startswith("DOWN") and "DRAIN" in state
    assert shown_reason == kept
    asked.recommendation.refresh_from_db()
    assert asked.recommendation.result["state_before"]["state"] == "DOWN"
    poll_cluster(cluster, adapter)
    again = request_resume(Node.objects.get(name=NODE).pk, operator="ops")
    assert not again.changed and again.recommendation is None


class WithoutJSON:
    """The cluster's transport as a Slurm answers whose JSON output fails: every ``--json``
    read is refused, so the adapter reads the nodes from sinfo's fixed format."""

    def __init__(self, transport: Any) -> None:
        self.transport = transport
        self.name = transport.name

    def run(self, argv: Sequence[str], *, timeout: float = 30.0) -> CommandResult:
        if "--json" in argv:
            return CommandResult(tuple(argv), 1, "", f"{argv[0]}: unrecognized option '--json'\n")
        result: CommandResult = self.transport.run(argv, timeout=timeout)
        return result

    def __getattr__(self, name: str) -> Any:
        return getattr(self.transport, name)


@pytest.mark.usefixtures("unanswering_node")
def test_sinfos_fixed_format_reads_an_administrators_nodes_as_the_json_does(
    adapter: SlurmAdapter, slurm_cluster: SlurmCluster
) -> None:
    """
    GIVEN a node an administrator set DOWN, and another one they drained
    WHEN the nodes are read from Slurm's JSON, and from sinfo's fixed format
    THEN both read the same state, flags and reason, and who set it; nothing is unknown
    """
    as_administrator(slurm_cluster, "State=DOWN", f"Reason={RMA}")
    drained = slurm_cluster.run(
        ["scontrol", "update", "NodeName=node002", "State=DRAIN", "Reason=admin: swap PSU"]
    )
    assert drained.returncode == 0, drained.stderr
    transport = WithoutJSON(slurm_cluster.transport())
    try:
        fixed = {node.name: node for node in SlurmAdapter(transport).list_nodes()}
    finally:
        close = getattr(transport.transport, "close", None)
        if close is not None:
            close()
    read = {node.name: node for node in adapter.list_nodes()}
    assert set(fixed) == set(read) == set(slurm_cluster.nodes)

    def seen(node: NodeInfo) -> tuple[object, ...]:
        # Whether Slurm has noticed yet that the stopped slurmd does not answer may differ.
        flags = sorted(flag for flag in node.flags if flag != "NOT_RESPONDING")
        return node.state, flags, node.reason, node.reason_set_by, node.unknown()

    for name in slurm_cluster.nodes:
        assert seen(fixed[name]) == seen(read[name]), name
    assert seen(fixed[NODE])[:3] == ("DOWN", [], RMA)
    assert seen(fixed["node002"])[:3] == ("IDLE", ["DRAIN"], "admin: swap PSU")
    assert fixed[NODE].reason_set_at is not None and fixed[NODE].reason_set_by
