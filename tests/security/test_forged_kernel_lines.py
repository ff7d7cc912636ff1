"""What a tenant's process makes the kernel print never acts beyond that tenant's own job.

The kernel prints text a tenant chooses: the process name (``prctl(PR_SET_NAME)``, 15
characters) in segfault and OOM-killer lines and in the NVIDIA driver's ``name=`` field, the
file name of the library a process faulted in, the cgroup path of an OOM kill. Mallory runs a
job on ``gpu-a100-001`` beside Alice's; Bob's job runs on ``gpu-a100-009``. Each test writes
into ``gpu-a100-001``'s kernel log what Mallory's processes can make the kernel print, and reads
it with the loop's own step: Alice's and Bob's jobs, both nodes' health, suspicion and
exclusion, and every drain stay as they were.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from recovery.choices import (
    AuditKind,
    ClusterMode,
    Confirmation,
    Connection,
    EvidenceTrust,
    NodeHealth,
    RecommendationAction,
)
from recovery.loop.logs import ingest_node_kernel_logs
from recovery.models import Anomaly, AuditEvent, Cluster, Node, Policy, Recommendation, Workload
from recovery.schedulers.transport import LocalTransport
from tests.factories import AttemptFactory, ClusterFactory, WorkloadFactory

pytestmark = pytest.mark.django_db

SHARED = "gpu-a100-001"
OTHER = "gpu-a100-009"
MALLORY_UID = 2001
# What every line here starts with: rsyslog's header and the kernel's own timestamp.
HEADER = f"Nov 29 10:14:01 {SHARED} kernel: "
XID_79 = (
    f"{HEADER}[87490.000100] NVRM: Xid (PCI:0000:3b:00): 79, pid=2231, name=python, "
    "GPU has fallen off the bus."
)


@dataclass
class Shared:
    cluster: Cluster
    mallory: Workload
    alice: Workload
    bob: Workload
    logs: Path

    def kernel(self, *lines: str, node: str = SHARED) -> None:
        with (self.logs / node / "kern.log").open("a") as log:
            log.write("".join(f"{line}\n" for line in lines))

    def read(self) -> None:
        ingest_node_kernel_logs(self.cluster, LocalTransport())


@pytest.fixture
def shared(tmp_path: Path) -> Shared:
    cluster = ClusterFactory(
        connection=Connection.LOCAL,
        connection_settings={"node_kernel_log": str(tmp_path / "{node}" / "kern.log")},
        mode=ClusterMode.ACTION,
        acknowledge_scheduler_actions=True,
        drain_automatically=True,
    )
    Policy.objects.create(name="everything", cluster=cluster, blast_radius_percent=100)
    for name in (SHARED, OTHER):
        Node.objects.create(cluster=cluster, name=name, scheduler_state="MIXED")
        (tmp_path / name).mkdir()
        (tmp_path / name / "kern.log").write_text("")

    def job(job_id: str, user: str, uid: int, node: str) -> Workload:
        workload = WorkloadFactory(cluster=cluster, job_id=job_id, user=user, user_uid=uid)
        AttemptFactory(workload=workload, number=1, nodes=[node])
        return workload

    state = Shared(
        cluster=cluster,
        mallory=job("7001", "mallory", MALLORY_UID, SHARED),
        alice=job("7100", "alice", 1001, SHARED),
        bob=job("7200", "bob", 1002, OTHER),
        logs=tmp_path,
    )
    state.read()  # the logs as they were when the jobs started
    return state


def untouched(shared: Shared, *, except_mallory: bool = False) -> None:
    """Nothing changed for anyone: no anomaly (Mallory's own, where allowed, names no node),
    no recommendation, no drain, both nodes as they were."""
    others = Anomaly.objects.exclude(workload=shared.mallory) if except_mallory else Anomaly.objects
    assert list(others.values_list("signature", "implicated_nodes")) == []
    assert not Anomaly.objects.exclude(implicated_nodes=[]).exists()
    assert not Recommendation.objects.filter(workload__in=[shared.alice, shared.bob]).exists()
    assert not Recommendation.objects.filter(action=RecommendationAction.DRAIN).exists()
    for node in Node.objects.filter(cluster=shared.cluster):
        assert node.health == NodeHealth.UNKNOWN, node.name
        assert node.times_implicated == 0, node.name
        assert node.suspect_since is None, node.name
        assert node.excluded_until is None, node.name


def ignored(reason: str) -> list[str]:
    return [
        event.payload["detail"]
        for event in AuditEvent.objects.filter(
            kind=AuditKind.INPUT_IGNORED, workload=None, payload__reason=reason
        )
    ]


def test_a_process_named_like_an_xid_segfaulting_in_a_library_naming_a_node_is_no_xid(
    shared: Shared,
) -> None:
    """The issue's case: ``Xid error 79`` segfaults in ``p on node gpu-a100-009 x.so``. It
    was a fatal nvidia-xid anomaly naming both nodes, for every job on the shared one."""
    shared.kernel(
        f"{HEADER}[87474.123456] Xid error 79[4242]: segfault at 0 ip 00007f3a2c0a1000 "
        f"sp 00007ffd3c2b1e40 error 4 in p on node {OTHER} x.so[7f3a2c000000+1000]"
    )
    shared.read()
    untouched(shared)
    assert len(ignored("process_fact_names_no_job")) == 1


def test_a_process_named_like_the_drivers_xid_prefix_is_no_xid(shared: Shared) -> None:
    """A process named ``NVRM: Xid (PCI:`` (15 characters) faulting in a library named
    ``0000:3b:00): 79, pid=1, GPU has fallen off the bus``: the driver's structure starts
    with a hexadecimal address, where this line has the kernel's ``[pid]``."""
    shared.kernel(
        f"{HEADER}[87474.123456] NVRM: Xid (PCI:[1234]: segfault at 0 ip 0000000000000000 "
        "sp 00007ffd3c2b1e40 error 4 in 0000:3b:00): 79, pid=1, GPU has fallen off the "
        "bus[7f3a2c000000+1000]"
    )
    shared.read()
    untouched(shared)


def test_a_node_name_in_a_library_file_name_names_no_node(shared: Shared) -> None:
    """``on node gpu-a100-009`` in a file name: it named that node in the anomalies of every
    job on the shared node."""
    shared.kernel(
        f"{HEADER}[87474.123456] python[4242]: segfault at 0 ip 00007f3a2c0a1000 "
        f"sp 00007ffd3c2b1e40 error 6 in libx on node {OTHER} y.so[7f3a2c000000+1000]"
    )
    shared.read()
    untouched(shared)
    assert not Anomaly.objects.filter(implicated_nodes__contains=OTHER).exists()


def test_an_oom_killer_line_with_a_forged_process_name_is_about_that_process(
    shared: Shared,
) -> None:
    """The OOM killer's own lines, with a process named ``Xid error 79`` (no sysctl needed):
    they were an Xid 79 on the node, and a host OOM of every job on it."""
    shared.kernel(
        f"{HEADER}[87475.000001] Xid error 79 invoked oom-killer: "
        "gfp_mask=0x100cca(GFP_HIGHUSER_MOVABLE), order=0, oom_score_adj=0",
        f"{HEADER}[87475.000900] Out of memory: Killed process 4242 (Xid error 79) "
        "total-vm:81234567kB, anon-rss:79876543kB, file-rss:0kB, shmem-rss:0kB, UID:2001 "
        "pgtables:160000kB oom_score_adj:0",
    )
    shared.read()
    untouched(shared)
    assert len(ignored("process_fact_names_no_job")) == 1


def test_a_file_name_with_a_newline_cannot_print_a_line_of_its_own(shared: Shared) -> None:
    """A library whose name holds a newline: read through syslog(2) (rsyslog's imklog), the
    kernel prints the rest of the name as a line of its own, with the record's timestamp.
    That line is the segfault's, whatever it says."""
    same = "[87476.000321] "
    shared.kernel(
        f"{HEADER}{same}python[4242]: segfault at 0 ip 00007f3a2c0a1000 sp 00007ffd3c2b1e40 "
        "error 4 in x",
        f"{HEADER}{same}NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=x, GPU has fallen off the "
        "bus.[7f3a2c000000+1000]",
    )
    shared.read()
    untouched(shared)
    assert len(ignored("continuation_of_user_text")) == 1


def test_an_applications_xid_never_reaches_another_job_on_the_node(shared: Shared) -> None:
    """Xid 13 is the application's fault (an out-of-range access): it became an anomaly of
    every job on the node, Alice's included."""
    shared.kernel(
        f"{HEADER}[87477.5] NVRM: Xid (PCI:0000:3b:00): 13, pid=4242, name=python, Graphics "
        "SM Warp Exception on (GPC 1, TPC 0, SM 1): Out Of Range Address"
    )
    shared.read()
    untouched(shared)


def test_a_syslog_line_another_program_wrote_is_not_the_kernels(shared: Shared) -> None:
    """A program of Mallory's logging with facility kern under its own name."""
    shared.kernel(
        f"Nov 29 10:14:01 {SHARED} python[4242]: NVRM: Xid (PCI:0000:3b:00): 79, pid=1, "
        "name=python, GPU has fallen off the bus."
    )
    shared.read()
    untouched(shared)
    assert len(ignored("not_from_the_kernel")) == 1


def test_a_process_fact_on_a_shared_node_touches_only_its_own_job(shared: Shared) -> None:
    """
    GIVEN Mallory's and Alice's jobs on one node
    WHEN the OOM killer kills a process in Mallory's job's cgroup (its process named like an
         Xid), and Mallory's processes segfault
    THEN Mallory's job alone has the OOM as a suspected anomaly naming no node; Alice's job,
         the node's health, drains and exclusions are untouched
    AND a real Xid 79 afterwards still does what it does: both jobs, the node unhealthy
    """
    job_cgroup = f"/system.slice/slurmstepd.scope/job_{shared.mallory.job_id}"
    shared.kernel(
        f"{HEADER}[87480.000001] Xid error 79 invoked oom-killer: "
        "gfp_mask=0xcc0(GFP_KERNEL), order=0, oom_score_adj=0",
        f"{HEADER}[87480.000400] oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),"
        f"cpuset=/,mems_allowed=0-1,oom_memcg={job_cgroup},"
        f"task_memcg={job_cgroup}/step_0/user/task_0,task=Xid error 79,pid=4242,"
        f"uid={MALLORY_UID}",
        f"{HEADER}[87480.000410] Memory cgroup out of memory: Killed process 4242 "
        f"(Xid error 79) total-vm:8123456kB, anon-rss:7987654kB, file-rss:0kB, "
        f"shmem-rss:0kB, UID:{MALLORY_UID} pgtables:16000kB oom_score_adj:0",
        f"{HEADER}[87481.200000] python[4243]: segfault at 0 ip 00007f3a2c0a1000 "
        f"sp 00007ffd3c2b1e40 error 4 in p on node {OTHER} x.so[7f3a2c000000+1000]",
    )
    shared.read()

    untouched(shared, except_mallory=True)
    (own,) = Anomaly.objects.filter(workload=shared.mallory)
    assert (own.category, own.attribution, own.signature) == (
        "host_oom",
        "application",
        "kernel-oom-killer",
    )
    assert own.implicated_nodes == []
    assert own.confirmation == Confirmation.SUSPECTED
    assert own.details["reported_by_nodes"] == [SHARED]
    assert len(ignored("process_fact_names_no_job")) == 1  # the segfault

    shared.kernel(XID_79)
    shared.read()
    hardware = Anomaly.objects.filter(signature="nvidia-xid")
    assert {a.workload_id for a in hardware} == {shared.mallory.pk, shared.alice.pk}
    assert {tuple(a.implicated_nodes) for a in hardware} == {(SHARED,)}
    assert {a.evidence_trust for a in hardware} == {EvidenceTrust.SITE}
    assert Node.objects.get(name=SHARED).health == NodeHealth.UNHEALTHY
    assert Node.objects.get(name=OTHER).health == NodeHealth.UNKNOWN
    assert not Anomaly.objects.filter(workload=shared.bob).exists()


def test_a_job_cgroup_a_process_made_below_its_own_names_no_other_job(shared: Shared) -> None:
    """A cgroup Mallory's job created under its own, named after Alice's job: the first
    ``job_<id>`` of the path is Slurm's, and it is Mallory's."""
    own = f"/system.slice/slurmstepd.scope/job_{shared.mallory.job_id}/step_0/user"
    forged = f"{own}/job_{shared.alice.job_id}/task_0"
    shared.kernel(
        f"{HEADER}[87482.000400] oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),"
        f"cpuset=/,mems_allowed=0-1,oom_memcg={forged},task_memcg={forged},task=python,"
        f"pid=4250,uid={MALLORY_UID}"
    )
    shared.read()
    assert not Anomaly.objects.filter(workload=shared.alice).exists()
    assert list(Anomaly.objects.values_list("workload__job_id", "implicated_nodes")) == [
        (shared.mallory.job_id, [])
    ]
    untouched(shared, except_mallory=True)
