"""Forged kernel lines on a node two real Slurm jobs share (22.05 and 24.11).

Mallory's job and Alice's run on node003. node003's kernel log, read through the cluster's
own transport, carries what Mallory's processes can make the kernel print: a process named
like an Xid segfaulting in a library whose name holds another node's name, a process named
like the NVIDIA driver's prefix, a file name with a newline in it, the OOM killer's lines with a
forged process name and Mallory's job's cgroup. They change nothing for Alice's job or any
node; then a real Xid 79, the control, does what it always did.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from recovery.choices import ClusterMode, NodeHealth, RecommendationAction, WorkloadState
from recovery.loop.poll import poll_cluster
from recovery.models import Anomaly, Attempt, Cluster, Node, Policy, Recommendation, Workload
from tests.slurm.conftest import SlurmCluster

pytestmark = [pytest.mark.slurm, pytest.mark.django_db(transaction=True, reset_sequences=True)]

SHARED = "node003"
NAMED = "node004"


def poll_until_running(cluster: Cluster, job_ids: list[str]) -> list[Workload]:
    deadline = time.monotonic() + 60
    while True:
        poll_cluster(cluster)
        workloads = [Workload.objects.filter(cluster=cluster, job_id=j).first() for j in job_ids]
        if all(w is not None and w.state == WorkloadState.RUNNING for w in workloads):
            return [w for w in workloads if w is not None]
        assert time.monotonic() < deadline, [w and w.state for w in workloads]
        time.sleep(0.3)


def node_state(cluster: Cluster) -> dict[str, tuple[object, ...]]:
    return {
        node.name: (node.health, node.times_implicated, node.suspect_since, node.excluded_until)
        for node in Node.objects.filter(cluster=cluster)
    }


def test_forged_kernel_lines_on_a_shared_node_change_nothing_and_a_real_xid_still_acts(
    slurm_cluster: SlurmCluster, submit_job: Any, tmp_path: Path
) -> None:
    connection, settings = slurm_cluster.connection()
    log = tmp_path / f"kern-{SHARED}.log"
    log.write_text("")
    cluster = Cluster.objects.create(
        name="lab-kernel-lines",
        connection=connection,
        connection_settings={**settings, "node_kernel_log": str(tmp_path / "kern-{node}.log")},
        mode=ClusterMode.ACTION,
        acknowledge_scheduler_actions=True,
    )
    # A quarter of this four-node cluster is one node: the default would withhold every drain.
    Policy.objects.create(name="restart", cluster=cluster, blast_radius_percent=25)
    on_shared = ["-w", SHARED]
    mallory_job = submit_job({"STEP_SECONDS": "0.2", "TOTAL_STEPS": "2000"}, sbatch_args=on_shared)
    alice_job = submit_job({"STEP_SECONDS": "0.2", "TOTAL_STEPS": "2000"}, sbatch_args=on_shared)
    mallory, alice = poll_until_running(cluster, [str(mallory_job.job_id), str(alice_job.job_id)])
    for workload in (mallory, alice):
        assert Attempt.objects.get(workload=workload, number=1).nodes == [SHARED]
    before = node_state(cluster)

    header = f"Nov 29 10:00:00 {SHARED} kernel: "
    cgroup = f"/system.slice/slurmstepd.scope/job_{mallory.job_id}"
    uid = mallory.user_uid if mallory.user_uid is not None else 0
    with log.open("a") as kernel:
        kernel.write(
            f"{header}[5000.000100] Xid error 79[4242]: segfault at 0 ip 00007f3a2c0a1000 "
            f"sp 00007ffd3c2b1e40 error 4 in p on node {NAMED} x.so[7f3a2c000000+1000]\n"
            f"{header}[5000.000200] NVRM: Xid (PCI:[4243]: segfault at 0 ip 0000000000000000 "
            "sp 00007ffd3c2b1e40 error 4 in 0000:3b:00): 79, pid=1, GPU has fallen off the "
            "bus[7f3a2c000000+1000]\n"
            f"{header}[5000.000300] python[4244]: segfault at 0 ip 00007f3a2c0a1000 "
            "sp 00007ffd3c2b1e40 error 4 in x\n"
            f"{header}[5000.000300] NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=x, GPU has "
            "fallen off the bus.[7f3a2c000000+1000]\n"
            f"{header}[5001.000001] Xid error 79 invoked oom-killer: "
            "gfp_mask=0xcc0(GFP_KERNEL), order=0, oom_score_adj=0\n"
            f"{header}[5001.000400] oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),"
            f"cpuset=/,mems_allowed=0,oom_memcg={cgroup},task_memcg={cgroup}/step_batch/user/"
            f"task_0,task=Xid error 79,pid=4245,uid={uid}\n"
            f"{header}[5001.000410] Memory cgroup out of memory: Killed process 4245 "
            f"(Xid error 79) total-vm:812345kB, anon-rss:798765kB, file-rss:0kB, "
            f"shmem-rss:0kB, UID:{uid} pgtables:1600kB oom_score_adj:0\n"
        )
    poll_cluster(cluster)

    assert not Anomaly.objects.filter(workload=alice).exists()
    assert not Recommendation.objects.filter(workload=alice).exists()
    # Earlier tests' jobs, still in Slurm's memory, are polled too: only these nodes matter.
    drains = Recommendation.objects.filter(action=RecommendationAction.DRAIN)
    assert not drains.filter(node__name__in=[SHARED, NAMED]).exists()
    assert not Anomaly.objects.filter(implicated_nodes__contains=NAMED).exists()
    assert node_state(cluster) == before
    (own,) = Anomaly.objects.filter(workload=mallory)
    assert (own.category, own.attribution, own.implicated_nodes) == (
        "host_oom",
        "application",
        [],
    )

    with log.open("a") as kernel:
        kernel.write(
            f"{header}[5002.000100] NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, "
            "GPU has fallen off the bus.\n"
        )
    poll_cluster(cluster)

    # An earlier test's job still running on the node gets it too: a hardware fact is the node's.
    hardware = Anomaly.objects.filter(signature="nvidia-xid")
    assert {mallory.pk, alice.pk} <= {a.workload_id for a in hardware}
    assert {(a.category, a.attribution, tuple(a.implicated_nodes)) for a in hardware} == {
        ("gpu_hardware", "hardware", (SHARED,))
    }
    assert Node.objects.get(cluster=cluster, name=SHARED).health == NodeHealth.UNHEALTHY
    assert node_state(cluster)[NAMED] == before[NAMED]
    assert drains.filter(node__name=SHARED).count() == 1
    assert not drains.filter(node__name=NAMED).exists()
    assert Recommendation.objects.filter(
        workload=alice, action=RecommendationAction.RESTART_EXCLUDING
    ).exists()
