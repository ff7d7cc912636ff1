"""demo-h100: a cluster in action mode, where the controller acts without waiting for anyone.

Its policy lets a restart keep up to a quarter of the cluster out (one node of eight) and only
records stragglers.
"""

from __future__ import annotations

from datetime import timedelta

from recovery.choices import (
    AnomalyKind,
    AttemptExitState,
    Attribution,
    ClusterMode,
    Connection,
    FailureCategory,
    NodeHealth,
    OptInMode,
    SchedulerKind,
    Severity,
    StragglerAction,
    WorkloadState,
)
from recovery.demo.fleet.builder import Build, Builder, restart_commands
from recovery.demo.fleet.parts import (
    Evidence,
    NodeSpec,
    Pace,
    h100,
    hf_ckpt,
    hostlist,
    megatron_ckpt,
    opt_in,
)
from recovery.demo.fleet.story import Story

H100_CLUSTER = "demo-h100"
H100_CONTROLLER = "controller:slurm-advisor-2"
H100_NODES = h100(*range(1, 9))


def seed_h100(b: Builder) -> None:
    cluster = b.cluster(
        H100_CLUSTER,
        scheduler_kind=SchedulerKind.SIMULATED,
        connection=Connection.SIMULATED,
        mode=ClusterMode.ACTION,
        acknowledge_scheduler_actions=True,
        environment="prod",
        connection_settings={"recorded": {"nodes": hostlist(H100_NODES), "gpus_per_node": 8}},
    )
    b.policy(cluster, "demo-h100", blast_radius_percent=25, straggler_action=StragglerAction.RECORD)
    specs = {name: NodeSpec(state="ALLOCATED") for name in H100_NODES}
    specs["gpu-h100-005"] = NodeSpec(
        state="DRAINED",
        reason="IB mlx5_0 local catastrophic error",
        health=NodeHealth.UNHEALTHY,
        times_implicated=1,
        implicated_hours_ago=6.3,
        excluded_hours=24,
    )
    specs["gpu-h100-008"] = NodeSpec(
        state="ALLOCATED",
        health=NodeHealth.SUSPECT,
        times_implicated=1,
        implicated_hours_ago=1.3,
    )
    b.nodes(cluster, H100_NODES, specs)

    def story(job_id: str, build: Build, **fields: object) -> None:
        b.story(cluster, job_id, build, controller=H100_CONTROLLER, **fields)

    act = opt_in(OptInMode.ACT)
    story(
        "91402",
        llama31_ib,
        name="llama-3.1-70b-cpt-code",
        user="mchen",
        partition="gpu",
        workflow="llama31-70b-cpt-code",
        submit_time=b.ago(hours=30, minutes=5),
        **act,
    )
    story(
        "91410",
        gemma_host_oom,
        name="gemma-2-27b-sft",
        user="apatel",
        partition="gpu",
        submit_time=b.ago(hours=26, minutes=2),
        **act,
    )
    story(
        "91417",
        dit_watchdog,
        name="dit-xl-video-pretrain",
        user="hli",
        partition="gpu-long",
        submit_time=b.ago(hours=16, minutes=3),
        **act,
    )
    story(
        "91423",
        longctx_thermal,
        name="llama-3-8b-longctx",
        user="okoval",
        partition="gpu",
        submit_time=b.ago(hours=12, minutes=1),
        **act,
    )


def llama31_ib(s: Story) -> None:
    """91402: local catastrophic error on the IB adapter of gpu-h100-005; restarted without it
    automatically, productive again minutes later."""
    b = s.b
    pace = Pace(5.2, 1000, megatron_ckpt("/weka/ckpt/llama31-70b-cpt-code"), save_seconds=25)
    run1 = s.start(h100(2, 3, 4, 5), timedelta(minutes=1, seconds=9))
    failure = b.ago(hours=6, minutes=18, seconds=b.rng.randint(0, 40))
    progress1 = s.train(run1, pace, start=run1.started_at + timedelta(minutes=5), until=failure)
    seen = s.end(
        run1,
        failure + timedelta(seconds=19),
        AttemptExitState.FAILED,
        exit_code=1,
        noticed_after=timedelta(seconds=5),
    )
    host = "gpu-h100-005"
    line = (
        f"{host}:2231:2290 [3] transport/net_ib.cc:131 NCCL WARN NET/IB : Got async event : "
        "local catastrophic error"
    )
    [ib] = s.detect(
        run1,
        Evidence(
            signature="nccl_ib_async_catastrophic",
            category=FailureCategory.INTERCONNECT,
            attribution=Attribution.HARDWARE,
            severity=Severity.FATAL,
            line=line,
            excerpt=[
                "mlx5_core 0000:3b:00.0: mlx5_health_try_recover:327:(pid 1893): handling bad "
                "device here",
                line,
                f"{host}:2231:2290 [3] misc/ibvwrap.cc:229 NCCL WARN Call to "
                "ibv_get_async_event failed",
                f"{host}:2231:2297 [3] transport/net_ib.cc:1295 NCCL WARN NET/IB : Got "
                "completion from peer 10.42.0.13<45682> with error 5, opcode 32581, len 0, "
                "vendor err 249 (Send)",
                "[rank27]:[E ProcessGroupNCCL.cpp:1316] [PG 0 Rank 27] NCCL watchdog thread "
                "terminated with exception: NCCL error: remote process exited or there was a "
                "network error, NCCL version 2.21.5",
            ],
            at=failure,
            nodes=[host],
            ranks=[27],
            occurrences=2,
        ),
    )
    # Confirmed once the scheduler reports the job ended: decided and ready at once.
    s.settle(seen)
    restart = s.recommendation(ib)
    s.carry_out(
        restart,
        seen + timedelta(seconds=b.rng.randint(2, 6)),
        job_state="FAILED",
        commands=restart_commands(s.job, [host]),
    )
    run2 = s.restart(2, h100(1, 2, 3, 4), seen + timedelta(seconds=38), excluded=[host])
    until = b.ago(seconds=b.rng.randint(2, 12))
    progress2 = s.resume(run2, progress1, warm_up=timedelta(minutes=4, seconds=50), until=until)
    s.keep_running(progress2)


def gemma_host_oom(s: Story) -> None:
    """91410: data loader workers OOM-killed by the cgroup; restarted automatically, completed."""
    nodes = h100(6, 7)
    pace = Pace(3.4, 500, hf_ckpt("/weka/scratch/apatel/gemma-2-27b-sft"), save_seconds=30)
    run1 = s.start(nodes, timedelta(seconds=26))
    progress1 = s.train(run1, pace, start=run1.started_at + timedelta(minutes=3), to_step=2093)
    failure = progress1.at + timedelta(seconds=3)
    seen = s.end(
        run1,
        failure + timedelta(seconds=12),
        AttemptExitState.OUT_OF_MEMORY,
        noticed_after=timedelta(seconds=4),
    )
    line = (
        f"slurmstepd: error: Detected 1 oom_kill event in StepId={s.job}.0. Some of the step "
        "tasks have been OOM Killed."
    )
    [oom] = s.detect(
        run1,
        Evidence(
            signature="slurm_oom_kill",
            category=FailureCategory.HOST_OOM,
            attribution=Attribution.APPLICATION,
            severity=Severity.FATAL,
            line=line,
            excerpt=[
                "[rank12]: RuntimeError: DataLoader worker (pid 81234) is killed by signal: "
                "Killed.",
                "[rank12]: ",
                "[rank12]: The above exception was the direct cause of the following exception:",
                line,
                "srun: error: gpu-h100-007: task 12: Out Of Memory",
            ],
            at=failure,
            nodes=["gpu-h100-007"],
            ranks=[12],
        ),
    )
    s.settle(seen)
    restart = s.recommendation(oom)
    s.carry_out(
        restart,
        seen + timedelta(seconds=s.rng.randint(2, 6)),
        job_state="OUT_OF_MEMORY",
        commands=restart_commands(s.job),
    )
    run2 = s.restart(2, nodes, seen + timedelta(seconds=41))
    progress2 = s.resume(run2, progress1, warm_up=timedelta(minutes=2, seconds=45), to_step=6000)
    s.complete(progress2, ended_after=timedelta(seconds=48), noticed_after=timedelta(seconds=9))


def dit_watchdog(s: Story) -> None:
    """91417: NCCL cannot create a shared memory segment and the job is requeued held; no
    controller claims the restart, the watchdog releases the hold after the decision timeout
    so that Slurm runs the job again, and the ready restart expires."""
    b = s.b
    nodes = h100(6, 7)
    pace = Pace(7.5, 500, megatron_ckpt("/weka/ckpt/dit-xl-video"), save_seconds=35)
    run1 = s.start(nodes, timedelta(minutes=3, seconds=15))
    failure = b.ago(hours=3, minutes=12, seconds=b.rng.randint(0, 40))
    progress1 = s.train(run1, pace, start=run1.started_at + timedelta(minutes=4), until=failure)
    seen = s.end(
        run1,
        failure + timedelta(seconds=27),
        AttemptExitState.REQUEUED,
        exit_code=1,
        noticed_after=timedelta(seconds=8),
        to=WorkloadState.HELD,
        pending_reason="JobHeldAdmin",
    )
    host = "gpu-h100-006"
    line = (
        "torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/"
        "NCCLUtils.hpp:317, unhandled system error (run with NCCL_DEBUG=INFO for details), "
        "NCCL version 2.21.5"
    )
    [error] = s.detect(
        run1,
        Evidence(
            signature="nccl_system_error_shm",
            category=FailureCategory.NCCL_ERROR,
            attribution=Attribution.SYSTEM_SOFTWARE,
            line=line,
            excerpt=[
                f"{host}:97:183 [4] include/shm.h:48 NCCL WARN Error while creating shared "
                "memory segment /dev/shm/nccl-7Qk1Xa (size 9637888)",
                f"{host}:97:183 [4] NCCL INFO transport/shm.cc:101 -> 2",
                f"{host}:97:183 [4] NCCL INFO init.cc:1235 -> 2",
                f"[rank4]: {line}",
                "[rank4]: ncclSystemError: System call (e.g. socket, malloc) or external "
                "library call failed or device error. ",
                "[rank4]: Last error:",
                "[rank4]: Error while creating shared memory segment /dev/shm/nccl-7Qk1Xa "
                "(size 9637888)",
            ],
            at=failure,
            nodes=[host],
            ranks=[4],
            occurrences=3,
        ),
    )
    s.settle(seen)
    released_at = seen + timedelta(seconds=300 + b.rng.randint(5, 25))
    s.release_hold(released_at)
    s.state(released_at + timedelta(seconds=4), 1, WorkloadState.REQUEUED, "PENDING")
    run2 = s.restart(2, nodes, released_at + timedelta(seconds=66))
    until = b.ago(seconds=b.rng.randint(2, 12))
    progress2 = s.resume(run2, progress1, warm_up=timedelta(minutes=3, seconds=30), until=until)
    restart = s.recommendation(error)
    assert restart.expires_at is not None
    s.expire(restart.expires_at + timedelta(seconds=b.rng.randint(10, 50)))
    s.keep_running(progress2)


def longctx_thermal(s: Story) -> None:
    """91423: one GPU in thermal slowdown; recorded only (the straggler policy is record)."""
    b = s.b
    nodes = h100(8)
    run = s.start(nodes, timedelta(minutes=2, seconds=2))
    progress = s.train(
        run,
        Pace(2.6, 2000, hf_ckpt("/weka/scratch/okoval/llama3-8b-longctx"), save_seconds=15),
        start=run.started_at + timedelta(minutes=2),
        until=b.ago(seconds=b.rng.randint(2, 12)),
    )
    line = "            HW Thermal Slowdown           : Active"
    s.detect(
        run,
        Evidence(
            kind=AnomalyKind.STRAGGLER,
            signature="straggler_rank_throughput",
            category=FailureCategory.GPU_HARDWARE,
            attribution=Attribution.HARDWARE,
            severity=Severity.WARNING,
            line=line.strip(),
            excerpt=[
                "GPU 00000000:9B:00.0",
                "    Clocks Event Reasons",
                "        Idle                                  : Not Active",
                "        Applications Clocks Setting           : Not Active",
                "        SW Power Cap                          : Not Active",
                "        HW Slowdown                           : Active",
                line,
                "            HW Power Brake Slowdown           : Not Active",
                "        SW Thermal Slowdown                   : Active",
                "    Temperature",
                "        GPU Current Temp                      : 89 C",
            ],
            at=b.ago(hours=1, minutes=18),
            nodes=nodes,
            ranks=[3],
            source="metrics",
            detail={"metric": "step_time_seconds", "ratio": 0.76},
        ),
    )
    s.keep_running(progress)
