"""demo-a100's stories where the hardware, or the scheduler, is to blame."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

from recovery.choices import (
    AnomalyKind,
    AttemptExitState,
    Attribution,
    FailureCategory,
    Severity,
    WorkloadState,
)
from recovery.demo.fleet.builder import restart_commands
from recovery.demo.fleet.parts import (
    GPUS_PER_NODE,
    Evidence,
    Pace,
    a100,
    log_time,
    megatron_ckpt,
    slurm_time,
)
from recovery.demo.fleet.story import Story

LLAMA70B_STEP = 9.6
LLAMA70B_EVERY = 500
LLAMA70B_PACE = Pace(
    LLAMA70B_STEP, LLAMA70B_EVERY, megatron_ckpt("/lustre/ckpt/llama-70b-pretrain-v3")
)


def llama70b_first(s: Story) -> None:
    """48188: a full 24 h allocation that ends at the time limit; the policy's restart is turned
    down, as the workflow goes on in its next job."""
    run = s.start(a100(*range(1, 9)), timedelta(minutes=2, seconds=11))
    end = run.started_at + timedelta(hours=24)
    progress = s.train(run, LLAMA70B_PACE, start=run.started_at + timedelta(minutes=6), until=end)
    noticed = timedelta(seconds=38)
    s.end(run, end + timedelta(seconds=2), AttemptExitState.TIMEOUT, noticed_after=noticed)
    line = (
        f"slurmstepd: error: *** JOB {s.job} ON gpu-a100-001 CANCELLED AT "
        f"{slurm_time(end)} DUE TO TIME LIMIT ***"
    )
    [limit] = s.detect(
        run,
        Evidence(
            signature="slurm_time_limit",
            category=FailureCategory.SCHEDULER_EVENT,
            attribution=Attribution.APPLICATION,
            severity=Severity.WARNING,
            line=line,
            excerpt=[
                f" [{log_time(end - timedelta(seconds=10))}] iteration     {progress.step}/  "
                "250000 | consumed samples:      "
                f"{progress.step * 1024} | elapsed time per iteration (ms): 9601.4 | learning "
                "rate: 2.998E-04 | global batch size:  1024 | lm loss: 2.187731E+00 | loss "
                "scale: 1.0 | grad norm: 0.212 | number of skipped iterations:   0 | number of "
                "nan iterations:   0 |",
                line,
                "srun: Job step aborted: Waiting up to 32 seconds for job step to finish.",
                "[rank0]: Received SIGTERM: 15",
            ],
            at=end,
            source="scheduler",
            detail={"state": "TIMEOUT", "reason": "TimeLimit"},
        ),
    )
    s.reject(
        s.recommendation(limit),
        end + timedelta(minutes=9, seconds=14),
        "operator",
        "The time limit is expected: the workflow continues as job 48213 from the last "
        "checkpoint. No restart.",
    )
    s.finish(
        WorkloadState.FAILED,
        1,
        progress,
        reason="TIMEOUT (time limit 1-00:00:00); continued by job 48213",
    )


def llama70b_xid(s: Story) -> None:
    """48213: Xid 79 on gpu-a100-007, 63 ranks time out in NCCL, Slurm reports a node failure;
    approved restart without gpu-a100-007, training resumes and saves new checkpoints."""
    b = s.b
    nodes1 = a100(*range(1, 9))
    run1 = s.start(nodes1, timedelta(minutes=1, seconds=4))
    # Resumes from the last checkpoint of job 48188 (24 h at 9.6 s a step, 6 min start-up).
    previous = int((24 * 3600 - 6 * 60) // LLAMA70B_STEP) // LLAMA70B_EVERY * LLAMA70B_EVERY
    failure = b.ago(hours=10, minutes=12, seconds=b.rng.randint(0, 50))
    progress1 = s.train(
        run1,
        LLAMA70B_PACE,
        start_step=previous,
        start=run1.started_at + timedelta(minutes=7),
        until=failure,
    )
    node_fail = failure + timedelta(seconds=661)
    seen = s.end(
        run1,
        node_fail + timedelta(seconds=1),
        AttemptExitState.NODE_FAIL,
        noticed_after=timedelta(seconds=19),
    )
    bad = "gpu-a100-007"
    bad_rank = 6 * GPUS_PER_NODE + 2  # GPU 2 of the seventh node
    xid_line = "NVRM: Xid (PCI:0000:3b:00): 79, pid=2231, GPU has fallen off the bus."
    uptime = 318_402.113_528
    # The node's kernel log is the node's own word: no confirmation needed.
    [xid] = s.detect(
        run1,
        Evidence(
            signature="xid_79_fallen_off_bus",
            category=FailureCategory.GPU_HARDWARE,
            attribution=Attribution.HARDWARE,
            severity=Severity.FATAL,
            line=xid_line,
            excerpt=[
                f"[{uptime:.6f}] NVRM: GPU at PCI:0000:3b:00: "
                "GPU-5f3a9c1e-8d2b-4e07-b1a6-2c9e4d7f0a31",
                f"[{uptime:.6f}] NVRM: GPU Board Serial Number: 1652322041287",
                f"[{uptime + 0.000003:.6f}] {xid_line}",
                f"[{uptime + 0.000011:.6f}] NVRM: GPU 0000:3b:00.0: GPU has fallen off the bus.",
                f"[{uptime + 0.000030:.6f}] NVRM: A GPU crash dump has been created. If "
                "possible, please run",
                "               NVRM: nvidia-bug-report.sh as root to collect this data before",
                "               NVRM: the NVIDIA kernel module is unloaded.",
            ],
            at=failure,
            nodes=[bad],
            ranks=[bad_rank],
            detail={"xid": 79},
        ),
        scope=f"kernel:{bad}",
    )
    seq = 52817
    nccl_line = (
        f"[rank12]:[E ProcessGroupNCCL.cpp:616] [Rank 12] Watchdog caught collective operation "
        f"timeout: WorkNCCL(SeqNum={seq}, OpType=ALLREDUCE, NumelIn=1048576, "
        "NumelOut=1048576, Timeout(ms)=600000) ran for 600041 milliseconds before timing out."
    )
    # The surviving ranks' timeouts only show the consequence; the Xid seen in the same
    # attempt makes them the node's hardware failing.
    s.detect(
        run1,
        Evidence(
            signature="nccl_watchdog_timeout",
            category=FailureCategory.NCCL_TIMEOUT,
            attribution=Attribution.UNKNOWN,
            severity=Severity.FATAL,
            line=nccl_line,
            excerpt=[
                f" [{log_time(failure - timedelta(seconds=4))}] iteration    {progress1.step}/"
                f"  250000 | consumed samples:     {progress1.step * 1024} | elapsed time per "
                "iteration (ms): 9598.7 | learning rate: 2.991E-04 | global batch size:  1024 |"
                " lm loss: 2.041266E+00 | loss scale: 1.0 | grad norm: 0.198 | number of "
                "skipped iterations:   0 | number of nan iterations:   0 |",
                nccl_line,
                f"[rank12]:[E ProcessGroupNCCL.cpp:1537] [PG 0 Rank 12] Timeout at NCCL work: "
                f"{seq}, last enqueued NCCL work: {seq}, last completed NCCL work: {seq - 1}.",
                "[rank12]:[E ProcessGroupNCCL.cpp:630] [Rank 12] Some NCCL operations have "
                "failed or timed out. Due to the asynchronous nature of CUDA kernels, subsequent "
                "GPU operations might run on corrupted/incomplete data.",
                "[rank12]:[E ProcessGroupNCCL.cpp:636] [Rank 12] To avoid data inconsistency, "
                "we are taking the entire process down.",
                f"[rank3]:[E ProcessGroupNCCL.cpp:616] [Rank 3] Watchdog caught collective "
                f"operation timeout: WorkNCCL(SeqNum={seq}, OpType=ALLREDUCE, NumelIn=1048576, "
                "NumelOut=1048576, Timeout(ms)=600000) ran for 600044 milliseconds before "
                "timing out.",
            ],
            at=failure + timedelta(seconds=600, milliseconds=41),
            nodes=nodes1,
            ranks=[r for r in range(len(nodes1) * GPUS_PER_NODE) if r != bad_rank],
            occurrences=63,
            role="symptom",
        ),
    )
    node_line = (
        f"slurmstepd: error: *** JOB {s.job} ON {bad} CANCELLED AT {slurm_time(node_fail)} "
        "DUE TO NODE FAILURE ***"
    )
    s.detect(
        run1,
        Evidence(
            signature="slurm_node_failure",
            category=FailureCategory.SCHEDULER_EVENT,
            attribution=Attribution.HARDWARE,
            severity=Severity.FATAL,
            line=node_line,
            excerpt=[
                f"srun: error: Node failure on {bad}",
                "srun: Job step aborted: Waiting up to 32 seconds for job step to finish.",
                node_line,
                "srun: error: gpu-a100-003: tasks 16-23: Killed",
                "srun: error: gpu-a100-001: tasks 0-7: Killed",
            ],
            at=node_fail,
            nodes=[bad],
            source="scheduler",
            detail={"state": "NODE_FAIL", "reason": "Xid 79 GPU fell off the bus"},
        ),
    )
    s.settle(seen)
    recommendation = s.recommendation(xid)
    approved_at = failure + timedelta(minutes=13, seconds=22)
    s.approve(
        recommendation,
        approved_at,
        "operator",
        "NHC drained gpu-a100-007; on-call opened a hardware ticket.",
    )
    s.carry_out(
        recommendation,
        approved_at + timedelta(seconds=b.rng.randint(2, 6)),
        job_state="NODE_FAIL",
        commands=restart_commands(s.job, [bad]),
    )
    requeued_at = approved_at + timedelta(seconds=12)
    s.state(requeued_at, 1, WorkloadState.REQUEUED, "PENDING", reason="BeginTime")
    run2 = s.restart(
        2,
        a100(1, 2, 3, 4, 5, 6, 8, 9),
        approved_at + timedelta(minutes=2, seconds=31),
        excluded=[bad],
    )
    until = b.ago(seconds=b.rng.randint(4, 20))
    progress2 = s.resume(run2, progress1, warm_up=timedelta(minutes=6, seconds=12), until=until)
    s.keep_running(progress2)


def deepseek_ib(s: Story) -> None:
    """48198: the job's trap requeues it after an NCCL error; the restart recommended on that
    error is superseded once rank 10's output shows InfiniBand retries exceeded on
    gpu-a100-014, by a restart without it that waits for an operator."""
    b = s.b
    nodes = a100(11, 14)
    pace = Pace(4.1, 1000, megatron_ckpt("/lustre/ckpt/deepseek-moe-16b"), save_seconds=30)
    run = s.start(nodes, timedelta(minutes=2, seconds=47))
    failure = b.ago(hours=1, minutes=36, seconds=b.rng.randint(0, 40))
    progress = s.train(run, pace, start=run.started_at + timedelta(minutes=4), until=failure)
    seen = s.end(
        run,
        failure + timedelta(seconds=20),
        AttemptExitState.REQUEUED,
        exit_code=1,
        noticed_after=timedelta(seconds=5),
        to=WorkloadState.REQUEUED,
        pending_reason="Priority",
    )
    host = "gpu-a100-014"
    nccl_line = (
        "torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/"
        "ProcessGroupNCCL.cpp:1970, remote process exited or there was a network error, "
        "NCCL version 2.20.5"
    )
    s.detect(
        run,
        Evidence(
            signature="nccl_remote_error",
            category=FailureCategory.NCCL_ERROR,
            attribution=Attribution.SYSTEM_SOFTWARE,
            line=nccl_line,
            excerpt=[
                "[rank3]: Traceback (most recent call last):",
                '[rank3]:   File "/workspace/Megatron-LM/pretrain_gpt.py", line 243, in <module>',
                "[rank3]:     pretrain(",
                f"[rank3]: {nccl_line}",
                "[rank3]: ncclRemoteError: A call failed possibly due to a network error or a "
                "remote process exiting prematurely.",
                "[rank3]: Last error:",
                "[rank3]: NET/IB : Got completion from peer 10.31.4.117<48598> with error 12, "
                "opcode 0, len 0, vendor err 129 (Recv)",
            ],
            at=failure + timedelta(seconds=2),
            nodes=nodes,
            ranks=[r for r in range(16) if r != 10],
            occurrences=15,
            role="symptom",
        ),
    )
    s.settle(seen)
    ib_line = (
        f"{host}:41877:42210 [2] transport/net_ib.cc:1295 NCCL WARN NET/IB : Got completion "
        "from peer 10.31.4.117<48598> with error 12, opcode 0, len 0, vendor err 129 (Recv)"
    )
    s.detect(
        run,
        Evidence(
            signature="nccl_ib_completion_error",
            category=FailureCategory.INTERCONNECT,
            attribution=Attribution.HARDWARE,
            severity=Severity.FATAL,
            line=ib_line,
            excerpt=[
                "mlx5_core 0000:c1:00.0 ibp193s0: Link down",
                "mlx5_core 0000:c1:00.0 ibp193s0: Link up",
                ib_line,
                f"{host}:41877:42210 [2] NCCL INFO transport/net.cc:1034 -> 6",
                f"{host}:41877:42210 [2] NCCL INFO proxy.cc:520 -> 6",
                f"{host}:41877:42210 [2] NCCL INFO proxy.cc:684 -> 6 [Proxy Thread]",
            ],
            at=failure,
            nodes=[host],
            ranks=[10],
            occurrences=4,
        ),
        after=timedelta(seconds=b.rng.randint(33, 45)),
    )
    s.finish(
        WorkloadState.REQUEUED,
        1,
        progress,
        reason="Requeued by the job (exit code 1); pending: Priority",
    )


def mixtral_straggler(s: Story) -> None:
    """48221: GPU 2 of gpu-a100-012 runs with hardware slowdown; the whole job slows to its pace.
    Restarting without the node waits for approval."""
    b = s.b
    path = megatron_ckpt("/lustre/ckpt/mixtral-sft-r4")
    run = s.start(a100(12, 13), timedelta(minutes=1, seconds=40))
    slow_from = b.ago(minutes=52)
    fast = s.train(
        run, Pace(2.2, 2000, path), start=run.started_at + timedelta(minutes=4), until=slow_from
    )
    slow = s.train(
        run,
        Pace(3.05, 2000, path),
        start_step=fast.step,
        start=fast.at,
        until=b.ago(seconds=b.rng.randint(2, 9)),
        checkpoint=(
            (fast.checkpoint_step, fast.checkpoint_at)
            if fast.checkpoint_step is not None and fast.checkpoint_at is not None
            else None
        ),
    )
    evidence_at = slow_from + timedelta(minutes=10)
    step_at = slow.step - 3
    line = (
        'DCGM_FI_DEV_CLOCK_THROTTLE_REASONS{gpu="2",UUID="GPU-8a1d3c55-0f2e-4b9a-9e61-'
        '7c0b2d4e9f13",Hostname="gpu-a100-012",modelName="NVIDIA A100-SXM4-80GB"} 8'
    )
    s.detect(
        run,
        Evidence(
            kind=AnomalyKind.STRAGGLER,
            signature="straggler_rank_throughput",
            category=FailureCategory.GPU_HARDWARE,
            attribution=Attribution.HARDWARE,
            severity=Severity.WARNING,
            line=line,
            excerpt=[
                f"[rank2] step {step_at} | fwd-bwd 2.93s | optimizer 0.09s | 2,118 tok/s/gpu",
                f"[rank9] step {step_at} | fwd-bwd 2.04s | optimizer 0.08s | 3,046 tok/s/gpu",
                f"[rank14] step {step_at} | fwd-bwd 2.01s | optimizer 0.08s | 3,071 tok/s/gpu",
                'DCGM_FI_DEV_SM_CLOCK{gpu="2",Hostname="gpu-a100-012"} 1005',
                'DCGM_FI_DEV_SM_CLOCK{gpu="1",Hostname="gpu-a100-012"} 1410',
                line,
            ],
            at=evidence_at,
            nodes=["gpu-a100-012"],
            ranks=[2],
            source="metrics",
            detail={
                "metric": "tokens_per_s_per_gpu",
                "ratio": 0.7,
                "member_median": 2118,
                "peer_median": 3046,
            },
        ),
    )
    # The attempt produced a checkpoint if it saved one at either pace.
    s.keep_running(replace(slow, saved=fast.saved or slow.saved))
