"""Whole failed (and healthy) jobs, written the way the software involved prints them."""

from __future__ import annotations

import pytest

from recovery.detection.classify import classify_text

TORCH2_NCCL_TIMEOUT = """\
[rank3]:[E1129 10:14:02.338859795 ProcessGroupNCCL.cpp:616] [Rank 3] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=52817, OpType=ALLREDUCE, NumelIn=1048576, NumelOut=1048576, Timeout(ms)=600000) ran for 600041 milliseconds before timing out.
[rank3]:[E1129 10:14:02.339019187 ProcessGroupNCCL.cpp:1785] [PG ID 0 PG GUID 0(default_pg) Rank 3] Exception (either an error or timeout) detected by watchdog at work: 52817, last enqueued NCCL work: 52818, last completed NCCL work: 52816.
[rank3]:[E1129 10:14:02.339073002 ProcessGroupNCCL.cpp:630] [Rank 3] Some NCCL operations have failed or timed out. Due to the asynchronous nature of CUDA kernels, subsequent GPU operations might run on corrupted/incomplete data.
[rank3]:[E1129 10:14:02.339081543 ProcessGroupNCCL.cpp:636] [Rank 3] To avoid data inconsistency, we are taking the entire process down.
terminate called after throwing an instance of 'c10::DistBackendError'
  what():  [PG ID 0 PG GUID 0(default_pg) Rank 3] Process group watchdog thread terminated with exception: [Rank 3] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=52817, OpType=ALLREDUCE, NumelIn=1048576, NumelOut=1048576, Timeout(ms)=600000) ran for 600041 milliseconds before timing out.
Exception raised from checkTimeout at ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:618 (most recent call first):
frame #0: c10::Error::Error(c10::SourceLocation, std::string) + 0x96 (0x7f64e3b3af86 in /opt/conda/lib/python3.10/site-packages/torch/lib/libc10.so)
W1129 10:14:35.021000 140257 torch/distributed/elastic/multiprocessing/api.py:897] Sending process 4242 closing signal SIGTERM
E1129 10:14:36.120000 140257 torch/distributed/elastic/multiprocessing/api.py:869] failed (exitcode: -6) local_rank: 3 (pid: 4245) of binary: /opt/conda/bin/python
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
  traceback : Signal 6 (SIGABRT) received by PID 4245
srun: error: gpu-a100-012: task 3: Exited with exit code 1
"""

HEALTHY_NCCL_STARTUP = """\
gpu-a100-001:4242:4242 [0] NCCL INFO Bootstrap : Using ib0:10.1.0.1<0>
gpu-a100-001:4242:4242 [0] NCCL INFO NET/Plugin : dlerror=libnccl-net.so: cannot open shared object file: No such file or directory No plugin found (libnccl-net.so), using internal implementation
gpu-a100-001:4242:4242 [0] NCCL WARN NET/Plugin : dlerror=libnccl-net.so: cannot open shared object file: No such file or directory No plugin found (libnccl-net.so), using internal implementation
gpu-a100-001:4242:4242 [0] NCCL INFO cudaDriverVersion 12040
NCCL version 2.21.5+cuda12.4
gpu-a100-001:4242:4290 [0] NCCL INFO NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/IB ; OOB ib0:10.1.0.1<0>
gpu-a100-001:4242:4290 [0] NCCL INFO comm 0x55c1e2a0 rank 0 nranks 16 cudaDev 0 busId 1b000 - Init COMPLETE
[W1129 10:00:01.000000 4242 torch/csrc/distributed/c10d/socket.cpp:463] [c10d] The server socket has failed to bind to [::]:29500 (errno: 98 - Address already in use).
/opt/conda/lib/python3.10/site-packages/torch/utils/checkpoint.py:460: UserWarning: torch.utils.checkpoint: please pass in use_reentrant=True or use_reentrant=False explicitly.
[2026-11-29 10:01:00,000] [INFO] [logging.py:96:log_dist] [Rank 0] step=10, skipped=0, lr=[0.0003], mom=[(0.9, 0.95)]
[2026-11-29 10:01:05,000] [INFO] [logging.py:96:log_dist] [Rank 0] step=20, skipped=0, lr=[0.0003], mom=[(0.9, 0.95)]
[2026-11-29 10:01:06,000] [INFO] [torch_checkpoint_engine.py:21:save] [Torch] Saving /ckpt/global_step20/mp_rank_00_model_states.pt...
[2026-11-29 10:01:09,000] [INFO] [engine.py:3501:_save_zero_checkpoint] zero checkpoint saved /ckpt/global_step20/zero_pp_rank_0_mp_rank_00_optim_states.pt
[2026-11-29 10:01:09,100] [INFO] [torch_checkpoint_engine.py:33:commit] [Torch] Checkpoint global_step20 is ready now!
"""

SLURM_HOST_OOM = """\
 iteration      400/  250000 | lm loss: 2.9 | grad norm: 0.3 |
slurmstepd: error: Detected 1 oom_kill event in StepId=48213.0. Some of your processes may have been killed by the cgroup out-of-memory handler.
srun: error: gpu-a100-004: task 5: Out Of Memory
srun: Job step aborted: Waiting up to 32 seconds for job step to finish.
"""

TIME_LIMIT_THEN_NOISE = """\
Epoch 3:  41%|████      | 4100/10000 [3:59:10<5:44:11,  3.50s/it, loss=1.92, v_num=1]
slurmstepd: error: *** STEP 48213.0 ON gpu-a100-002 CANCELLED AT 2026-11-29T14:00:03 DUE TO TIME LIMIT ***
[rank: 1] Received SIGTERM: 15
torch.distributed.elastic.multiprocessing.api.SignalException: Process 4242 got signal: 15
RuntimeError: [/opt/conda/conda-bld/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer [10.1.0.3]:17237
"""

DEEPSPEED_DIVERGED = """\
[2026-11-29 10:00:00,000] [INFO] [loss_scaler.py:183:update_scale] [deepspeed] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: 2, reducing to 1
[2026-11-29 10:00:01,000] [INFO] [loss_scaler.py:183:update_scale] [deepspeed] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: 1, reducing to 1
Traceback (most recent call last):
  File "/opt/conda/lib/python3.10/site-packages/deepspeed/runtime/fp16/loss_scaler.py", line 175, in update_scale
    raise Exception(
Exception: Current loss scale already at minimum - cannot decrease scale anymore. Exiting run.
"""

INFINIBAND_LINK_DOWN = """\
Nov 29 10:14:01 gpu-a100-009 kernel: mlx5_core 0000:3b:00.0 ib0: Link down
gpu-a100-009:4242:4301 [2] transport/net_ib.cc:1295 NCCL WARN NET/IB : Got completion from peer 10.1.0.7<4545> with error 12, opcode 0, len 0, vendor err 129
gpu-a100-009:4242:4301 [2] NCCL INFO transport/net.cc:1087 -> 6
[rank18]: torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1970, unhandled system error (run with NCCL_DEBUG=INFO for details), NCCL version 2.21.5
"""

CHECKPOINT_DISK_FULL = """\
 iteration     2000/  250000 | lm loss: 2.1 |
saving checkpoint at iteration    2000 to /lustre/ckpt/llama
[rank0]: Traceback (most recent call last):
[rank0]:   File "/workspace/megatron/training/checkpointing.py", line 412, in save_checkpoint
[rank0]:     torch.save(state_dict, checkpoint_name)
[rank0]: RuntimeError: [enforce fail at inline_container.cc:595] . unexpected pos 2150137600 vs 2150137488
[rank0]: OSError: [Errno 28] No space left on device
"""

APP_BUG_WITH_PEER_FALLOUT = """\
[rank0]: Traceback (most recent call last):
[rank0]:   File "/workspace/train.py", line 88, in <module>
[rank0]:     batch = collate(samples)
[rank0]: KeyError: 'attention_mask'
[rank3]: torch.distributed.DistNetworkError: Failed to recv, got 0 bytes. Connection was likely closed. Did the remote server shutdown or crash?
[rank5]: torch.distributed.DistNetworkError: Failed to recv, got 0 bytes. Connection was likely closed. Did the remote server shutdown or crash?
"""

NHC_XID = """\
 iteration      900/  250000 | lm loss: 2.7 |
slurmstepd: error: *** JOB 48213 ON gpu-a100-007 CANCELLED AT 2026-11-29T03:14:15 DUE TO NODE FAILURE ***
NHC: check_nv_healthmon: GPU 3: Xid error 79 detected
"""

PREEMPTED = """\
 iteration      900/  250000 | lm loss: 2.7 |
slurmstepd: error: *** JOB 48213 ON gpu-a100-003 CANCELLED AT 2026-11-29T03:14:15 DUE TO PREEMPTION ***
"""

CASES = [
    ("torch2-nccl-timeout", TORCH2_NCCL_TIMEOUT, "nccl_timeout", "unknown"),
    ("healthy-nccl-startup", HEALTHY_NCCL_STARTUP, "healthy", "none"),
    ("slurm-host-oom", SLURM_HOST_OOM, "host_oom", "application"),
    ("time-limit", TIME_LIMIT_THEN_NOISE, "scheduler_event", "application"),
    ("deepspeed-diverged", DEEPSPEED_DIVERGED, "nan_divergence", "application"),
    ("infiniband-link-down", INFINIBAND_LINK_DOWN, "interconnect", "hardware"),
    ("checkpoint-disk-full", CHECKPOINT_DISK_FULL, "storage_io", "system_software"),
    ("app-bug-with-peer-fallout", APP_BUG_WITH_PEER_FALLOUT, "app_exception", "application"),
    ("node-failure-with-xid", NHC_XID, "gpu_hardware", "hardware"),
    ("preempted", PREEMPTED, "scheduler_event", "system_software"),
]


@pytest.mark.parametrize(
    ("log", "category", "attribution"),
    [
        pytest.param(log, category, attribution, id=name)
        for name, log, category, attribution in CASES
    ],
)
def test_a_whole_job_log(log: str, category: str, attribution: str) -> None:
    verdict = classify_text(log)
    assert (verdict.category, verdict.attribution) == (category, attribution), verdict.evidence


def test_the_timeout_names_the_rank_and_the_launcher_names_the_node() -> None:
    verdict = classify_text(TORCH2_NCCL_TIMEOUT)
    assert verdict.ranks == [3]
    srun = next(s for s in verdict.secondary if s["signature"] == "srun-task-exited")
    assert srun["nodes"] == ["gpu-a100-012"]


def test_a_healthy_log_keeps_its_checkpoints() -> None:
    from recovery.detection.scanner.log_scanner import scan_text

    result = scan_text(HEALTHY_NCCL_STARTUP)
    assert [c.completed for c in result.checkpoints][-1] is True
    assert result.findings == [] or all(f.severity == "warning" for f in result.findings)
