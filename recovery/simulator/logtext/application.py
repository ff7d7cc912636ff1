"""What the training program's own failures write: exceptions, CUDA misuse, running out of
GPU or host memory, diverging loss, a segfault.
"""

from __future__ import annotations

from recovery.simulator.logtext.context import (
    TORCH_DIR,
    TRAINING_MODULE,
    FailureContext,
    rank_block,
    srun_exit,
    step_cancelled,
    traceback_lines,
    train_frames,
)
from recovery.simulator.logtext.gpu import xid_line
from recovery.simulator.logtext.layout import GPUS_PER_NODE, random_pid, rank_line


def app_exception(context: FailureContext) -> list[str]:
    rng = context.rng
    shard = rng.randrange(4096)
    variants = [
        (
            [
                (
                    "/workspace/megatron/megatron/core/datasets/gpt_dataset.py",
                    241,
                    "__getitem__",
                    "text, _ = self._query_document_sample_shuffle_indices(idx)",
                ),
                (
                    "/workspace/megatron/megatron/core/datasets/indexed_dataset.py",
                    612,
                    "get",
                    "sequence_pointer, sequence_length, sequence_mode = self.index[idx]",
                ),
            ],
            f"IndexError: index {rng.randint(10**6, 10**8)} is out of bounds for axis 0 with "
            f"size {rng.randint(10**5, 10**6)}",
        ),
        (
            [
                (
                    "/workspace/train/data.py",
                    88,
                    "__iter__",
                    "yield self.collate([self.samples[key] for key in keys])",
                )
            ],
            f"KeyError: 'shard-{shard:05d}/sample-{rng.randrange(10**6):06d}'",
        ),
        (
            [
                (
                    "/workspace/megatron/megatron/core/transformer/attention.py",
                    287,
                    "forward",
                    "query, key = apply_rotary_pos_emb(query, key, rotary_pos_emb)",
                )
            ],
            f"ValueError: Expected input batch_size ({rng.choice((8, 16, 32))}) to match target "
            f"batch_size ({rng.choice((12, 24, 48))}).",
        ),
        (
            [
                (
                    "/workspace/train/tokenizer.py",
                    51,
                    "encode",
                    'assert len(ids) <= self.max_length, f"sequence too long: {len(ids)}"',
                )
            ],
            f"AssertionError: sequence too long: {rng.randint(8193, 40000)}",
        ),
    ]
    frames, exception = variants[rng.randrange(len(variants))]
    rank = context.rank_of(rng.randrange(GPUS_PER_NODE))
    body = [*traceback_lines(train_frames(rng) + frames), exception]
    lines = rank_block(context, rank, context.host, body, context.at)
    lines += srun_exit(context, rank, context.host)
    lines.append(step_cancelled(context))
    return lines


def cuda_error_app(context: FailureContext) -> list[str]:
    rng = context.rng
    gpu = context.gpu()
    rank = context.rank_of(gpu)
    frames = [
        *train_frames(rng),
        (
            "/workspace/megatron/megatron/core/tensor_parallel/layers.py",
            247,
            "forward",
            "output_parallel = F.embedding(masked_input, self.weight)",
        ),
    ]
    if rng.random() < 0.5:
        kernel = rng.choice(
            ("Indexing.cu:1308: indexSelectLargeIndex", "IndexKernel.cu:92: operator()")
        )
        block = [
            f"../aten/src/ATen/native/cuda/{kernel}: block: [{rng.randrange(512)},0,0], thread: "
            f"[{rng.randrange(128)},0,0] Assertion `srcIndex < srcSelectDimSize` failed.",
            *traceback_lines(frames),
            "RuntimeError: CUDA error: device-side assert triggered",
        ]
        lines: list[str] = []
    else:
        block = [
            *traceback_lines(frames),
            "RuntimeError: CUDA error: an illegal memory access was encountered",
        ]
        lines = [xid_line(context, gpu, 31)] if rng.random() < 0.5 else []
    block += [
        "CUDA kernel errors might be asynchronously reported at some other API call, so the "
        "stacktrace below might be incorrect.",
        "For debugging consider passing CUDA_LAUNCH_BLOCKING=1",
        "Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.",
    ]
    lines += rank_block(context, rank, context.host, block, context.at + 0.1)
    lines += srun_exit(context, rank, context.host)
    lines.append(step_cancelled(context))
    return lines


def gpu_oom(context: FailureContext) -> list[str]:
    rng = context.rng
    gpu = context.gpu()
    rank = context.rank_of(gpu)
    wanted = rng.choice((1.25, 2.5, 3.91, 7.82, 15.64))
    free = rng.uniform(0.2, 1.2)
    body = [
        *traceback_lines(
            [
                *train_frames(rng),
                (
                    f"{TORCH_DIR}/nn/modules/module.py",
                    1747,
                    "_call_impl",
                    "return forward_call(*args, **kwargs)",
                ),
            ]
        ),
        f"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate {wanted:.2f} GiB. "
        f"GPU {gpu} has a total capacity of 79.10 GiB of which {free:.2f} GiB is free. "
        f"Including non-PyTorch memory, this process has {79.1 - free:.2f} GiB memory in use. "
        f"Of the allocated memory {rng.uniform(60, 70):.2f} GiB is allocated by PyTorch, and "
        f"{rng.uniform(1, 6):.2f} GiB is reserved by PyTorch but unallocated. If reserved but "
        "unallocated memory is large try setting "
        "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.",
    ]
    lines = rank_block(context, rank, context.host, body, context.at)
    lines += srun_exit(context, rank, context.host)
    lines.append(step_cancelled(context))
    return lines


def nan_divergence(context: FailureContext) -> list[str]:
    rng = context.rng
    head = context.hosts[0]
    lines = [
        rank_line(
            index * GPUS_PER_NODE,
            context.at,
            host,
            f"step: {context.step + 1:5d}  loss:     nan  memory: {rng.uniform(60, 70):5.2f}GiB"
            f"({rng.uniform(76, 88):.2f}%)  tps: {rng.randint(4800, 5400):,}  "
            "tflops: 0.00  mfu: 0.00%",
        )
        for index, host in enumerate(context.hosts)
    ]
    ending = rng.choice(
        (
            f"RuntimeError: Loss is NaN at iteration {context.step + 1}, stopping training",
            "FloatingPointError: Minimum loss scale reached (0.0001). Your loss is probably "
            "exploding. Try lowering the learning rate, using gradient clipping or increasing "
            "the batch size.",
            "RuntimeError: Rerun state machine: found NaN in local grad norm in backward pass "
            "before data-parallel communication collective",
        )
    )
    body = [*traceback_lines(train_frames(rng)), ending]
    lines += rank_block(context, 0, head, body, context.at + 0.1)
    lines += srun_exit(context, 0, head)
    lines.append(step_cancelled(context))
    return lines


def segfault(context: FailureContext) -> list[str]:
    rng = context.rng
    gpu = context.gpu()
    rank = context.rank_of(gpu)
    thread = rng.getrandbits(44)
    body = [
        "Fatal Python error: Segmentation fault",
        "",
        f"Thread 0x{thread:012x} (most recent call first):",
        f'  File "{TORCH_DIR}/utils/data/_utils/worker.py", line 309 in _worker_loop',
        f'  File "{TRAINING_MODULE}", line {rng.choice((1346, 1352))} in train',
    ]
    lines = rank_block(context, rank, context.host, body, context.at)
    lines += srun_exit(context, rank, context.host, "Segmentation fault")
    lines.append(step_cancelled(context))
    return lines


def host_oom(context: FailureContext) -> list[str]:
    rng = context.rng
    rank = context.rank_of(rng.randrange(GPUS_PER_NODE))
    lines = []
    if rng.random() < 0.5:
        lines += rank_block(
            context,
            rank,
            context.host,
            [
                *traceback_lines(train_frames(rng)),
                f"RuntimeError: DataLoader worker (pid {random_pid(rng)}) "
                "is killed by signal: Killed.",
            ],
            context.at,
        )
    lines += [
        f"slurmstepd-{context.host}: error: Detected {rng.randint(1, 4)} oom_kill event in StepId="
        f"{context.job_id}.0. Some of your processes may have been killed by the cgroup "
        "out-of-memory handler.",
        f"srun: error: {context.host}: task {rank}: Out Of Memory",
        "srun: Job step aborted: Waiting up to 32 seconds for job step to finish.",
    ]
    return lines
