"""demo-a100's stories where the application or the system software is to blame, and the
healthy ones."""

from __future__ import annotations

from datetime import datetime, timedelta

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
    Evidence,
    Pace,
    a100,
    deepspeed_ckpt,
    hf_ckpt,
    log_time,
    megatron_ckpt,
)
from recovery.demo.fleet.story import Story


def whisper(s: Story) -> None:
    """48191: healthy run to the end."""
    pace = Pace(0.85, 5000, hf_ckpt("/lustre/scratch/apatel/whisper-distill"), save_seconds=25)
    run = s.start(a100(9, 10), timedelta(seconds=38))
    progress = s.train(run, pace, start=run.started_at + timedelta(minutes=3), to_step=30000)
    s.complete(progress, ended_after=timedelta(seconds=55), noticed_after=timedelta(seconds=15))


def _megatron_iteration(at: datetime, step: int, loss: str, grad_norm: str) -> str:
    return (
        f" [{log_time(at)}] iteration     {step}/   20000 | consumed samples:      "
        f"{step * 1024} | elapsed time per iteration (ms): 4102.6 | learning rate: 2.872E-05 | "
        f"global batch size:  1024 | lm loss: {loss} | loss scale: 1.0 | grad norm: "
        f"{grad_norm} | number of skipped iterations:   0 | number of nan iterations:   0 |"
    )


def llama13b_nan(s: Story) -> None:
    """48201: the loss diverges to NaN at the same iteration twice; the approved restart runs,
    the stop after the second attempt finds the job already ended."""
    nodes = a100(9, 10)
    pace = Pace(4.1, 500, megatron_ckpt("/lustre/ckpt/llama-13b-math-cpt"), save_seconds=20)
    run1 = s.start(nodes, timedelta(seconds=52))
    nan_step = 3187

    def nan(at: datetime) -> Evidence:
        line = (
            f"RuntimeError: Rank 5, node gpu-a100-009, device 5, iteration {nan_step + 1}: "
            "Unexpected result nan (message='found NaN in local grad norm in backward pass "
            "before data-parallel communication collective')"
        )
        return Evidence(
            signature="megatron_nan_grad_norm",
            category=FailureCategory.NAN_DIVERGENCE,
            attribution=Attribution.APPLICATION,
            severity=Severity.FATAL,
            line=line,
            excerpt=[
                _megatron_iteration(
                    at - timedelta(seconds=12), nan_step - 2, "1.861240E+00", "2.913"
                ),
                _megatron_iteration(
                    at - timedelta(seconds=8), nan_step - 1, "2.377104E+00", "48.227"
                ),
                _megatron_iteration(
                    at - timedelta(seconds=4), nan_step, "7.904512E+00", "2917.443"
                ),
                "[rank5]: Traceback (most recent call last):",
                '[rank5]:   File "/workspace/Megatron-LM/megatron/core/distributed/'
                'param_and_grad_buffer.py", line 207, in check_for_nan_in_grad',
                "[rank5]:     assert not norm_is_nan, (",
                f"[rank5]: {line}",
            ],
            at=at,
            ranks=list(range(16)),
            occurrences=16,
        )

    progress1 = s.train(run1, pace, start=run1.started_at + timedelta(minutes=3), to_step=nan_step)
    failure1 = progress1.at + timedelta(seconds=4)
    seen1 = s.end(
        run1,
        failure1 + timedelta(seconds=31),
        AttemptExitState.FAILED,
        exit_code=1,
        noticed_after=timedelta(seconds=8),
    )
    [nan1] = s.detect(run1, nan(failure1))
    s.settle(seen1)
    restart = s.recommendation(nan1)
    approved = failure1 + timedelta(minutes=6, seconds=40)
    s.approve(
        restart, approved, "operator", "One retry; if it diverges again we stop and lower the LR."
    )
    s.carry_out(
        restart,
        approved + timedelta(seconds=s.rng.randint(2, 6)),
        job_state="FAILED",
        commands=restart_commands(s.job),
    )
    run2 = s.restart(2, nodes, approved + timedelta(minutes=1, seconds=5))
    progress2 = s.resume(
        run2, progress1, warm_up=timedelta(minutes=2, seconds=40), to_step=nan_step
    )
    failure2 = progress2.at + timedelta(seconds=4)
    seen2 = s.end(
        run2,
        failure2 + timedelta(seconds=29),
        AttemptExitState.FAILED,
        exit_code=1,
        noticed_after=timedelta(seconds=8),
    )
    [nan2] = s.detect(run2, nan(failure2))
    s.settle(seen2)
    stop = s.recommendation(nan2)
    approved = failure2 + timedelta(minutes=9, seconds=12)
    s.approve(stop, approved, "admin", "Stopping; jnovak will relaunch with lr 1.5e-5.")
    s.carry_out(
        stop,
        approved + timedelta(seconds=s.rng.randint(2, 6)),
        job_state="FAILED",
        outcome="skipped",
        detail=f"job {s.job} is already FAILED; nothing to cancel",
    )
    # No checkpoint since the resumed one: progress2 still names it.
    s.finish(WorkloadState.STOPPED, 2, progress2, reason=f"Stopped by recovery: {stop.reason}")


def neox_storage(s: Story) -> None:
    """48205: a checkpoint write hits a stale Lustre file handle; one restart, then done."""
    nodes = a100(12, 13)
    path = deepspeed_ckpt("/lustre/scratch/ckpt/gpt-neox-20b")
    run1 = s.start(nodes, timedelta(minutes=1, seconds=18))
    progress1 = s.train(
        run1,
        Pace(3.0, 1000, path, save_seconds=45),
        start=run1.started_at + timedelta(minutes=5),
        to_step=5999,
    )
    failure = progress1.at + timedelta(seconds=9)
    seen = s.end(
        run1,
        failure + timedelta(seconds=22),
        AttemptExitState.FAILED,
        exit_code=1,
        noticed_after=timedelta(seconds=9),
    )
    target = f"{path(6000)}/mp_rank_00_model_states.pt"
    line = "OSError: [Errno 116] Stale file handle"
    stamp = f"{failure:%Y-%m-%d %H:%M:%S},118"
    [io] = s.detect(
        run1,
        Evidence(
            signature="errno_stale_file_handle",
            category=FailureCategory.STORAGE_IO,
            attribution=Attribution.SYSTEM_SOFTWARE,
            line=line,
            excerpt=[
                f"[{stamp}] [INFO] [logging.py:96:log_dist] [Rank 0] Saving model checkpoint: "
                f"{target}",
                f"[{stamp}] [INFO] [torch_checkpoint_engine.py:21:save] [Torch] Saving {target}...",
                "Traceback (most recent call last):",
                '  File "/opt/conda/lib/python3.10/site-packages/torch/serialization.py", line '
                "628, in save",
                "    with _open_zipfile_writer(f) as opened_zipfile:",
                line,
                "LustreError: 11-0: scratch-OST0007-osc-ffff9a1c3b6e5000: operation ost_write to "
                "node 10.10.2.17@o2ib failed: rc = -107",
            ],
            at=failure,
            ranks=[0],
        ),
    )
    s.settle(seen)
    restart = s.recommendation(io)
    approved = failure + timedelta(minutes=4, seconds=3)
    note = "Storage team confirms OST0007 failed over and is back."
    s.approve(restart, approved, "operator", note)
    s.carry_out(
        restart,
        approved + timedelta(seconds=s.rng.randint(2, 6)),
        job_state="FAILED",
        commands=restart_commands(s.job),
    )
    run2 = s.restart(2, nodes, approved + timedelta(minutes=1, seconds=2))
    progress2 = s.resume(run2, progress1, warm_up=timedelta(minutes=4, seconds=30), to_step=13000)
    s.complete(progress2, ended_after=timedelta(seconds=70), noticed_after=timedelta(seconds=12))


def mistral_oom(s: Story) -> None:
    """48209: CUDA out of memory at 32k context on the first steps; the operator rejects a
    restart that would fail the same way."""
    run = s.start(a100(15, 16), timedelta(seconds=44))
    progress = s.train(
        run,
        Pace(6.3, 500, hf_ckpt("/lustre/scratch/emartin/mistral-sft-32k")),
        start=run.started_at + timedelta(minutes=3, seconds=20),
        to_step=37,
    )
    failure = progress.at + timedelta(seconds=5)
    seen = s.end(
        run,
        failure + timedelta(seconds=38),
        AttemptExitState.FAILED,
        exit_code=1,
        noticed_after=timedelta(seconds=11),
    )
    line = (
        "[rank3]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. "
        "GPU 3 has a total capacity of 79.14 GiB of which 1.23 GiB is free. Including "
        "non-PyTorch memory, this process has 77.90 GiB memory in use. Of the allocated memory "
        "74.61 GiB is allocated by PyTorch, and 1.72 GiB is reserved by PyTorch but unallocated."
        " If reserved but unallocated memory is large try setting "
        "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See "
        "documentation for Memory Management  "
        "(https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)"
    )
    [oom] = s.detect(
        run,
        Evidence(
            signature="torch_cuda_oom",
            category=FailureCategory.GPU_OOM,
            attribution=Attribution.APPLICATION,
            line=line,
            excerpt=[
                "[rank3]: Traceback (most recent call last):",
                '[rank3]:   File "/workspace/sft/train_sft.py", line 212, in <module>',
                "[rank3]:     trainer.train()",
                '[rank3]:   File "/opt/conda/lib/python3.11/site-packages/transformers/'
                'trainer.py", line 2164, in train',
                "[rank3]:     return inner_training_loop(",
                '[rank3]:   File "/opt/conda/lib/python3.11/site-packages/torch/utils/'
                'checkpoint.py", line 1124, in unpack_hook',
                line,
            ],
            at=failure,
            ranks=[3, 7, 11, 12, 15],
            occurrences=5,
        ),
    )
    s.settle(seen)
    s.reject(
        s.recommendation(oom),
        failure + timedelta(minutes=11, seconds=27),
        "operator",
        "Deterministic OOM at 32k context; emartin is lowering the micro-batch. No restart.",
    )
    s.finish(WorkloadState.FAILED, 1, progress, reason="FAILED (exit code 1)")


def sdxl_healthy(s: Story) -> None:
    """48216: a healthy fine-tune, still running."""
    run = s.start(a100(16), timedelta(minutes=1, seconds=3))
    progress = s.train(
        run,
        Pace(1.45, 10000, hf_ckpt("/lustre/scratch/tnguyen/sdxl-product"), save_seconds=18),
        start=run.started_at + timedelta(minutes=2),
        until=s.b.ago(seconds=s.rng.randint(3, 15)),
    )
    s.keep_running(progress)


def qwen_illegal_access(s: Story) -> None:
    """48224: an illegal memory access at the same step in two attempts (the job requeues
    itself); the restart advice for the first is turned down, the stop after the second awaits
    approval."""
    nodes = a100(10, 15)
    bad_step = 1230

    def illegal_access(at: datetime, attribution: str) -> Evidence:
        line = "[rank13]: RuntimeError: CUDA error: an illegal memory access was encountered"
        return Evidence(
            signature="cuda_illegal_memory_access",
            category=FailureCategory.CUDA_ERROR_APP,
            attribution=attribution,
            severity=Severity.FATAL,
            line=line,
            excerpt=[
                '[rank13]:   File "/opt/conda/lib/python3.11/site-packages/flash_attn/'
                'flash_attn_interface.py", line 96, in _flash_attn_varlen_forward',
                "[rank13]:     out, softmax_lse, S_dmask, rng_state = flash_attn_cuda.varlen_fwd(",
                "[rank13]:                                              ^^^^^^^^^^^^^^^^^^^^^^^^^",
                line,
                "[rank13]: CUDA kernel errors might be asynchronously reported at some other API "
                "call, so the stacktrace below might be incorrect.",
                "[rank13]: For debugging consider passing CUDA_LAUNCH_BLOCKING=1",
                "[rank13]: Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.",
            ],
            at=at,
            ranks=[13],
        )

    pace = Pace(11.0, 250, deepspeed_ckpt("/lustre/scratch/ychoi/qwen2-72b-sft"), save_seconds=60)
    run1 = s.start(nodes, timedelta(seconds=57))
    progress1 = s.train(run1, pace, start=run1.started_at + timedelta(minutes=8), to_step=bad_step)
    failure1 = progress1.at + timedelta(seconds=7)
    end1 = failure1 + timedelta(seconds=45)
    seen1 = s.end(
        run1,
        end1,
        AttemptExitState.REQUEUED,
        exit_code=1,
        noticed_after=timedelta(seconds=6),
        to=WorkloadState.REQUEUED,
        pending_reason="BeginTime",
    )
    # Once, a CUDA error does not tell a bug from a failing GPU.
    [first] = s.detect(run1, illegal_access(failure1, Attribution.UNKNOWN))
    s.settle(seen1)
    start2 = end1 + timedelta(minutes=2, seconds=14)
    run2 = s.restart(2, nodes, start2)
    s.reject(
        s.recommendation(first),
        start2 + timedelta(minutes=3, seconds=5),
        "operator",
        "The job requeued itself and runs again; nothing to restart.",
    )
    progress2 = s.resume(
        run2, progress1, warm_up=timedelta(minutes=7, seconds=30), to_step=bad_step
    )
    failure2 = progress2.at + timedelta(seconds=7)
    seen2 = s.end(
        run2,
        failure2 + timedelta(seconds=44),
        AttemptExitState.REQUEUED,
        exit_code=1,
        noticed_after=timedelta(seconds=6),
        to=WorkloadState.REQUEUED,
        pending_reason="Priority",
    )
    s.detect(run2, illegal_access(failure2, Attribution.APPLICATION))
    segv_line = (
        "ERROR:torch.distributed.elastic.multiprocessing.api:failed (exitcode: -11) "
        "local_rank: 5 (pid: 48812) of binary: /opt/conda/bin/python3.11"
    )
    s.detect(
        run2,
        Evidence(
            signature="torchrun_child_sigsegv",
            category=FailureCategory.SEGFAULT,
            attribution=Attribution.UNKNOWN,
            line=segv_line,
            excerpt=[
                "Fatal Python error: Segmentation fault",
                "",
                "Thread 0x00007f3c2effd640 (most recent call first):",
                '  File "/opt/conda/lib/python3.11/threading.py", line 331 in wait',
                segv_line,
                "  exitcode  : -11 (pid: 48812)",
                "  traceback : Signal 11 (SIGSEGV) received by PID 48812",
            ],
            at=failure2 + timedelta(seconds=31),
            nodes=["gpu-a100-015"],
            ranks=[13],
            role="wrapper",
        ),
    )
    s.settle(seen2)
    s.finish(
        WorkloadState.REQUEUED,
        2,
        progress2,
        reason="Requeued by the job (exit code 1); pending: Priority",
    )


def vit_hang(s: Story) -> None:
    """48230: no progress for over 30 minutes; data loader workers blocked on NFS."""
    b = s.b
    nodes = a100(15)
    steps_per_epoch = 5004

    def path(step: int) -> str:
        return f"/nfs/filer-02/okoval/vit-h-14/checkpoint-{step // 5004 - 1}.pth.tar"

    run = s.start(nodes, timedelta(minutes=1, seconds=2))
    silent_since = b.ago(minutes=47, seconds=b.rng.randint(0, 30))
    progress = s.train(
        run,
        Pace(0.72, steps_per_epoch, path, save_seconds=15),
        start=run.started_at + timedelta(minutes=3),
        until=silent_since,
    )
    epoch, batch = divmod(progress.step, steps_per_epoch)

    def timm_line(batch_index: int, loss: str, avg: str) -> str:
        percent = 100 * batch_index // steps_per_epoch
        return (
            f"Train: {epoch} [{batch_index:>4d}/{steps_per_epoch} ({percent:>3d}%)]  Loss: {loss} "
            f"({avg})  Time: 0.714s, 5737.12/s  (0.718s, 5705.37/s)  LR: 1.200e-03  "
            "Data: 0.011 (0.013)"
        )

    line = timm_line(batch, "4.217", "4.301")
    s.detect(
        run,
        Evidence(
            kind=AnomalyKind.HANG,
            signature="no_progress",
            category=FailureCategory.STORAGE_IO,
            attribution=Attribution.SYSTEM_SOFTWARE,
            line=line,
            excerpt=[
                timm_line(max(batch - 100, 0), "4.233", "4.303"),
                timm_line(max(batch - 50, 0), "4.198", "4.302"),
                line,
                "nfs: server filer-02 not responding, still trying",
                "INFO: task pt_data_worker:81234 blocked for more than 122 seconds.",
                '"echo 0 > /proc/sys/kernel/hung_task_timeout_secs" disables this message.',
            ],
            at=silent_since + timedelta(minutes=30),
            nodes=nodes,
            ranks=list(range(8)),
            source="progress",
            detail={
                "last_step": progress.step,
                "silent_seconds": 1800.0,
                "allowed_seconds": 1800.0,
                "median_step_seconds": 0.72,
            },
        ),
    )
    s.keep_running(progress)


def bert_keyerror(s: Story) -> None:
    """48233: a dataset column is missing; the operator turns the restart down."""
    run = s.start(a100(10), timedelta(seconds=31))
    failure = run.started_at + timedelta(minutes=2, seconds=48)
    seen = s.end(
        run,
        failure + timedelta(seconds=6),
        AttemptExitState.FAILED,
        exit_code=1,
        noticed_after=timedelta(seconds=9),
    )
    line = "KeyError: 'text'"
    [error] = s.detect(
        run,
        Evidence(
            signature="python_traceback_exception",
            category=FailureCategory.APP_EXCEPTION,
            attribution=Attribution.APPLICATION,
            severity=Severity.FATAL,
            line=line,
            excerpt=[
                "Traceback (most recent call last):",
                '  File "/home/rkim/bert-mlm/run_mlm.py", line 641, in <module>',
                "    main()",
                '  File "/home/rkim/bert-mlm/run_mlm.py", line 532, in main',
                "    tokenized_datasets = raw_datasets.map(",
                '  File "/home/rkim/bert-mlm/run_mlm.py", line 517, in tokenize_function',
                "    return tokenizer(examples[text_column_name], return_special_tokens_mask=True)",
                line,
            ],
            at=failure,
            ranks=list(range(8)),
            occurrences=8,
        ),
    )
    s.settle(seen)
    s.reject(
        s.recommendation(error),
        failure + timedelta(minutes=3, seconds=10),
        "operator",
        "KeyError before the first step: a configuration error a restart cannot fix.",
    )
    s.finish(WorkloadState.FAILED, 1, reason="FAILED (exit code 1)")


def gemma_loss_spike(s: Story) -> None:
    """48238: the loss jumps from about 2.1 to 6 and stays there while the job trains on; the
    cluster's policy stops diverged runs, and the stop waits for an operator."""
    b = s.b
    pace = Pace(1.6, 1000, hf_ckpt("/lustre/scratch/hlee/gemma-7b-cpt"), save_seconds=30)
    run = s.start(a100(11), timedelta(seconds=44))
    start = run.started_at + timedelta(minutes=2)
    progress = s.train(run, pace, start=start, until=b.ago(seconds=b.rng.randint(2, 9)))
    diverged_at = b.ago(minutes=34)
    since = int((diverged_at - start).total_seconds() // pace.step_seconds)
    found_at = diverged_at + timedelta(minutes=10)

    def logged(step: int, loss: float) -> str:
        return (
            f"{{'loss': {loss:.4f}, 'grad_norm': {1.1 + loss / 4:.4f}, "
            f"'learning_rate': 2.4e-05, 'epoch': {step / 40000:.2f}}}"
        )

    line = f"loss 5.98 or more since step {since} (10 min), 2.9x its median of 2.071 before"
    s.detect(
        run,
        Evidence(
            kind=AnomalyKind.DIVERGENCE,
            signature="loss-spike",
            category=FailureCategory.NAN_DIVERGENCE,
            attribution=Attribution.APPLICATION,
            severity=Severity.ERROR,
            line=line,
            excerpt=[
                logged(since - 300, 2.0712),
                logged(since - 150, 2.0688),
                logged(since, 6.2141),
                logged(since + 150, 6.0473),
                logged(since + 300, 5.9826),
                line,
            ],
            at=found_at,
            source="progress",
            detail={"since_step": since, "baseline_loss": 2.071, "lowest_loss": 5.98},
        ),
    )
    s.keep_running(progress)


def not_opted_in(s: Story) -> None:
    """48236: pending for resources, listed as not opted in because of a malformed comment."""
    s.finish(WorkloadState.PENDING, 0, reason="Resources")
