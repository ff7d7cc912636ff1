"""Nodes' kernel logs in the loop: hardware facts become anomalies of every workload on the node
and mark it unhealthy; a process fact concerns the job its line names, if it runs there, and no
other; what acts on nothing is recorded as ignored, with the reason."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from django.utils import timezone

from recovery.choices import AuditKind, Confirmation, Connection, NodeHealth
from recovery.loop import logs
from recovery.loop.logs import IGNORED_EVENT_INTERVAL, IngestSummary, ingest_node_kernel_logs
from recovery.models import Anomaly, AuditEvent, Cluster, Node, NodeLogCursor, Workload
from recovery.schedulers.transport import LocalTransport
from tests.factories import AttemptFactory, ClusterFactory, WorkloadFactory

pytestmark = pytest.mark.django_db

NODE = "gpu-001"
ELSEWHERE = "gpu-002"
UID = 1001


@dataclass
class Nodes:
    cluster: Cluster
    here: Workload
    beside: Workload
    elsewhere: Workload
    logs: Path

    def write(self, *lines: str, node: str = NODE) -> None:
        with (self.logs / node / "kern.log").open("a") as log:
            log.write("".join(f"{line}\n" for line in lines))

    def read(self, now: datetime | None = None) -> IngestSummary:
        return ingest_node_kernel_logs(self.cluster, LocalTransport(), now=now)


@pytest.fixture
def nodes(tmp_path: Path) -> Nodes:
    cluster = ClusterFactory(
        connection=Connection.LOCAL,
        connection_settings={"node_kernel_log": str(tmp_path / "{node}" / "kern.log")},
    )
    for name in (NODE, ELSEWHERE):
        Node.objects.create(cluster=cluster, name=name)
        (tmp_path / name).mkdir()
        (tmp_path / name / "kern.log").write_text("")

    def job(job_id: str, uid: int, node: str) -> Workload:
        workload = WorkloadFactory(cluster=cluster, job_id=job_id, user_uid=uid)
        AttemptFactory(workload=workload, number=1, nodes=[node])
        return workload

    return Nodes(
        cluster=cluster,
        here=job("501", UID, NODE),
        beside=job("502", 1002, NODE),
        elsewhere=job("503", 1003, ELSEWHERE),
        logs=tmp_path,
    )


def oom_kill(job_id: str, uid: int = UID, pid: int = 777) -> str:
    cgroup = f"/system.slice/slurmstepd.scope/job_{job_id}"
    return (
        f"[2000.000100] oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=/,"
        f"mems_allowed=0-1,oom_memcg={cgroup},task_memcg={cgroup}/step_0/user/task_0,"
        f"task=python,pid={pid},uid={uid}"
    )


def killed(pid: int = 777) -> str:
    return (
        f"[2000.000200] Memory cgroup out of memory: Killed process {pid} (python) "
        f"total-vm:9000000kB, anon-rss:8000000kB, file-rss:0kB, shmem-rss:0kB, UID:{UID} "
        "pgtables:16000kB oom_score_adj:0"
    )


def reasons() -> list[str]:
    return list(
        AuditEvent.objects.filter(kind=AuditKind.INPUT_IGNORED, workload=None)
        .order_by("pk")
        .values_list("payload__reason", flat=True)
    )


def test_a_hardware_fact_reaches_every_job_on_the_node_and_marks_it(nodes: Nodes) -> None:
    nodes.write(
        "[1000.000001] NVRM: Xid (PCI:0000:3b:00): 48, pid='<unknown>', name=<unknown>, An "
        "uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer at "
        "partition 6, subpartition 0."
    )
    summary = nodes.read()
    assert summary.anomalies_new == 2
    anomalies = Anomaly.objects.order_by("workload_id")
    assert [a.workload for a in anomalies] == [nodes.here, nodes.beside]
    assert {(a.category, a.attribution, a.severity) for a in anomalies} == {
        ("gpu_hardware", "hardware", "fatal")
    }
    assert {tuple(a.implicated_nodes) for a in anomalies} == {(NODE,)}
    assert {a.confirmation for a in anomalies} == {Confirmation.CONFIRMED}
    node = Node.objects.get(name=NODE)
    assert (node.health, node.times_implicated) == (NodeHealth.UNHEALTHY, 1)
    assert Node.objects.get(name=ELSEWHERE).health == NodeHealth.UNKNOWN


def test_an_uncorrectable_host_memory_error_is_the_nodes_hardware(nodes: Nodes) -> None:
    nodes.write(
        "[1000.1] EDAC MC0: 1 UE memory read error on CPU_SrcID#0_Ha#0_Chan#0_DIMM#0 "
        "(channel:0 slot:0 page:0x1234 offset:0x0 grain:32)"
    )
    nodes.read()
    anomaly = Anomaly.objects.get(workload=nodes.here)
    assert (anomaly.category, anomaly.attribution, anomaly.signature) == (
        "",
        "hardware",
        "edac-uncorrected",
    )
    assert Node.objects.get(name=NODE).health == NodeHealth.UNHEALTHY


@pytest.mark.parametrize(
    "line",
    [
        "[1000.2] pcieport 0000:00:03.0: PCIe Bus Error: severity=Corrected, type=Physical "
        "Layer, (Receiver ID)",
        "[1000.2] mlx5_core 0000:3b:00.0 ib0: Link down",
        "[1000.2] mce: [Hardware Error]: Machine check events logged",
    ],
)
def test_a_hardware_warning_alone_is_no_anomaly_and_no_mark(nodes: Nodes, line: str) -> None:
    nodes.write(line)
    assert nodes.read().anomalies_new == 0
    assert Node.objects.get(name=NODE).health == NodeHealth.UNKNOWN


def test_an_applications_xid_names_no_job_and_is_recorded_as_ignored(nodes: Nodes) -> None:
    nodes.write(
        "[1000.3] NVRM: Xid (PCI:0000:3b:00): 31, pid=4242, name=python, Ch 00000008, intr "
        "00000000. MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_0 faulted @ 0x7f2d_a0000000. "
        "Fault is of type FAULT_PDE ACCESS_TYPE_VIRT_READ"
    )
    summary = nodes.read()
    assert (summary.anomalies_new, summary.ignored) == (0, 1)
    assert not Anomaly.objects.exists()
    assert Node.objects.get(name=NODE).health == NodeHealth.UNKNOWN
    (event,) = AuditEvent.objects.filter(kind=AuditKind.INPUT_IGNORED)
    assert event.payload["reason"] == "process_fact_names_no_job"
    assert event.payload["path"].endswith(f"{NODE}/kern.log")
    assert event.payload["detail"].startswith(f"{NODE}: 1 line(s) (nvidia-xid)")
    assert event.cluster == nodes.cluster and event.workload is None


def test_an_xid_of_unknown_cause_acts_on_nothing(nodes: Nodes) -> None:
    nodes.write("[1000.4] NVRM: Xid (PCI:0000:3b:00): 38, pid=1, name=python, Ch 00000010")
    summary = nodes.read()
    assert (summary.anomalies_new, summary.ignored) == (0, 1)
    assert reasons() == ["device_fact_not_hardware"]
    assert Node.objects.get(name=NODE).health == NodeHealth.UNKNOWN


def test_an_oom_kill_in_a_jobs_cgroup_is_that_jobs_alone(nodes: Nodes) -> None:
    nodes.write(
        "[1999.9] python invoked oom-killer: gfp_mask=0xcc0(GFP_KERNEL), order=0, oom_score_adj=0",
        oom_kill(nodes.here.job_id),
        killed(),
    )
    summary = nodes.read()
    assert (summary.anomalies_new, summary.ignored) == (1, 0)
    anomaly = Anomaly.objects.get()
    assert anomaly.workload == nodes.here
    assert (anomaly.category, anomaly.attribution, anomaly.implicated_nodes) == (
        "host_oom",
        "application",
        [],
    )
    assert anomaly.confirmation == Confirmation.SUSPECTED
    assert anomaly.details["reported_by_nodes"] == [NODE]
    assert Node.objects.get(name=NODE).health == NodeHealth.UNKNOWN

    nodes.write(oom_kill(nodes.here.job_id).replace("[2000.000100]", "[2001.0]"))
    assert nodes.read().anomalies_new == 0
    assert Anomaly.objects.get().occurrences == 2


@pytest.mark.parametrize(
    ("job", "uid"),
    [
        ("here", 2001),  # the process was not the job's user's
        ("elsewhere", 1003),  # the job runs on another node
        ("unknown", UID),  # no job recovery follows
    ],
)
def test_an_oom_kill_naming_a_job_not_here_acts_on_nothing(
    nodes: Nodes, job: str, uid: int
) -> None:
    job_id = {"here": nodes.here.job_id, "elsewhere": nodes.elsewhere.job_id}.get(job, "999")
    nodes.write(oom_kill(job_id, uid=uid))
    summary = nodes.read()
    assert (summary.anomalies_new, summary.ignored) == (0, 1)
    assert not Anomaly.objects.exists()
    assert reasons() == ["process_fact_job_not_on_node"]


def test_ignored_lines_are_counted_each_time_and_recorded_once_an_hour(nodes: Nodes) -> None:
    segfault = (
        "[{t}] python[4242]: segfault at 0 ip 00007f3a2c0a1000 sp 00007ffd3c2b1e40 error 4 in "
        "libx.so[7f3a2c000000+1000]"
    )
    now = timezone.now()
    nodes.write(segfault.format(t="3000.1"), segfault.format(t="3000.2"))
    assert nodes.read(now=now).ignored == 2
    nodes.write(segfault.format(t="3000.3"))
    assert nodes.read(now=now + timedelta(minutes=5)).ignored == 1
    assert reasons() == ["process_fact_names_no_job"]
    nodes.write(segfault.format(t="3000.4"))
    assert nodes.read(now=now + IGNORED_EVENT_INTERVAL + timedelta(minutes=1)).ignored == 1
    assert reasons() == ["process_fact_names_no_job"] * 2
    assert not Anomaly.objects.exists()


def test_a_kernel_read_and_what_it_records_commit_together(
    nodes: Nodes, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker that fails while recording reads the same lines again next time."""
    nodes.write("[4000.0] NVRM: Xid (PCI:0000:3b:00): 79, pid=1, GPU has fallen off the bus.")

    def broken(*args: object, **kwargs: object) -> int:
        raise RuntimeError("worker killed")

    with monkeypatch.context() as patch:
        patch.setattr(logs, "record_findings", broken)
        with pytest.raises(RuntimeError):
            nodes.read()
    assert not NodeLogCursor.objects.filter(node__name=NODE, offset__gt=0).exists()
    assert nodes.read().anomalies_new == 2
    assert NodeLogCursor.objects.get(node__name=NODE).offset > 0
