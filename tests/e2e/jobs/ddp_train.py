"""A small data-parallel training program for the end-to-end fault scenarios.

One process per node, started by ``srun -l`` (see ddp_train.sh): torch.distributed with the
gloo backend on CPU, a tiny model, a fixed step time. Every rank prints one torchtitan-style
progress line per step with a timestamp, its node and its *own* compute throughput, so that a
slow rank shows a lower rate even though the gradient all-reduce keeps every rank in step::

    2026-11-29T18:00:01.123Z node002: step: 12  loss: 2.3100  memory: 0.10GiB  tps: 5,231

Rank 0 saves a checkpoint every CKPT_EVERY steps (write, then rename) and prints Megatron's
``successfully saved checkpoint from iteration N to DIR``; every rank resumes from the newest
one. Faults the harness asks for are read from CONTROL_FILE (JSON) before every step:

    {"cuda_error": {"node": "node002", "restart_count": 0},
     "app_exception": {"after_steps": 2},
     "slow": {"node": "node003", "factor": 3.0},
     "caught_exception": {"rank": 1, "at_steps": [40, 52]},
     "traceback_then_exit": {"rank": 1, "restart_count": 0},
     "error_then_hang": {"node": "node002", "restart_count": 0},
     "handled_then_quiet": {"rank": 1, "at_step": 14, "quiet_seconds": 25},
     "checkpoint_pause": {"at_step": 15, "seconds": 30}}

``cuda_error`` fires on the selected rank (``node`` or ``rank``) only on the named restart
count; ``app_exception`` fires on rank 0 of every attempt once it has run ``after_steps``
steps; ``slow`` stretches the selected rank's compute part by ``factor``.

``caught_exception`` is an error the program handles: at each of ``at_steps`` (the global
step, so a resumed attempt that runs that step again logs it again; ``restart_count``, when
given, limits it to that attempt) the selected rank logs what ``logging.exception`` prints for a
sample the data loader could not read, an ``ERROR:`` line and the full traceback ending in a
``KeyError``, then skips the sample and trains on as if nothing happened.
``traceback_then_exit`` prints the same traceback uncaught and exits with status 1, on the
selected rank, only on the named restart count. ``error_then_hang`` prints the traceback of a
storage read that failed in a prefetch thread, then blocks for ever without exiting (its main
loop waits for a batch that never comes), so every other rank waits in the all-reduce; only on
the named restart count.

``handled_then_quiet`` is a handled error followed by one long quiet step: at global step
``at_step`` the selected rank logs the same error as ``caught_exception``, then that step takes
``quiet_seconds`` longer on every rank, as an evaluation pass does (all processes alive, none
printing anything; the step's compute, and so its throughput, is unchanged), and training goes
on to the end; only on ``restart_count`` (0 unless given). ``checkpoint_pause`` is a slow
synchronous checkpoint save: at global step ``at_step`` rank 0 prints the save-start line
(saving there even if the step is not a multiple of CKPT_EVERY), takes ``seconds`` longer to
write, then prints the saved line, while every other rank waits in the next all-reduce; no
error at all; only on ``restart_count`` when given.

Environment: CKPT_DIR, CONTROL_FILE, TOTAL_STEPS (200), STEP_SECONDS (0.3), CKPT_EVERY (5),
plus what Slurm and ddp_train.sh set (SLURM_PROCID, SLURM_NTASKS, SLURMD_NODENAME,
SLURM_RESTART_COUNT, MASTER_ADDR, MASTER_PORT).
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
import warnings
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

# The CPU wheel warns when NumPy is missing; the program does not use NumPy.
warnings.filterwarnings("ignore", message="Failed to initialize NumPy")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

WIDTH = 64
BATCH = 32
SEQUENCE = 128  # "tokens" per sample, for a tokens-per-second figure like an LLM trainer's


def stamp() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def say(node: str, message: str, *, stream: Any = None) -> None:
    print(f"{stamp()} {node}: {message}", file=stream or sys.stdout, flush=True)


def newest_checkpoint(directory: Path) -> tuple[int, Path] | None:
    best: tuple[int, Path] | None = None
    for path in directory.glob("step_*.pt"):
        number = path.stem.removeprefix("step_")
        if number.isdigit() and (best is None or int(number) > best[0]):
            best = (int(number), path)
    return best


def read_faults(control: Path | None) -> dict[str, Any]:
    if control is None:
        return {}
    try:
        faults = json.loads(control.read_text() or "{}")
    except (OSError, ValueError):
        return {}  # absent, or caught half-written: no fault this step
    return faults if isinstance(faults, dict) else {}


def selects(spec: dict[str, Any], rank: int, node: str) -> bool:
    if "node" in spec:
        wanted: str = spec["node"]
        return wanted == node
    return int(spec.get("rank", 0)) == rank


def cuda_error(node: str) -> None:
    """What PyTorch prints when a kernel dies under a failing GPU (Xid 79, ECC)."""
    sys.stdout.flush()
    print(
        f"{stamp()} {node}: Traceback (most recent call last):\n"
        '  File "/workspace/train/ddp_train.py", line 214, in <module>\n'
        "    main()\n"
        '  File "/workspace/train/ddp_train.py", line 188, in main\n'
        "    loss.backward()\n"
        '  File "/usr/local/lib/python3.11/site-packages/torch/_tensor.py", line 648, in backward\n'
        "    torch.autograd.backward(\n"
        '  File "/usr/local/lib/python3.11/site-packages/torch/autograd/__init__.py", line 353, '
        "in backward\n"
        "    _engine_run_backward(\n"
        "RuntimeError: CUDA error: an illegal memory access was encountered\n"
        "CUDA kernel errors might be asynchronously reported at some other API call, so the "
        "stacktrace below might be incorrect.\n"
        "For debugging consider passing CUDA_LAUNCH_BLOCKING=1\n"
        "Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.",
        file=sys.stderr,
        flush=True,
    )
    os._exit(1)


def app_exception(node: str) -> None:
    """A bug in the data pipeline: the same error on every attempt."""
    sys.stdout.flush()
    print(
        f"{stamp()} {node}: Traceback (most recent call last):\n"
        '  File "/workspace/train/ddp_train.py", line 214, in <module>\n'
        "    main()\n"
        '  File "/workspace/train/ddp_train.py", line 176, in main\n'
        "    batch = next(batches)\n"
        '  File "/workspace/train/data.py", line 88, in __iter__\n'
        "    yield self.collate([self.samples[key] for key in keys])\n"
        '  File "/workspace/train/data.py", line 88, in <listcomp>\n'
        "    yield self.collate([self.samples[key] for key in keys])\n"
        "KeyError: 'shard-00017/sample-004211'",
        file=sys.stderr,
        flush=True,
    )
    os._exit(1)


def bad_sample(step: int) -> str:
    """The key of the sample the data loader fails on at ``step``: a different one each time."""
    return f"shard-{17 + step % 5:05d}/sample-{4211 + 37 * step:06d}"


def sample_traceback(step: int) -> str:
    """The traceback of a sample the data loader could not find."""
    return (
        "Traceback (most recent call last):\n"
        '  File "/workspace/train/data.py", line 88, in __iter__\n'
        "    yield self.collate([self.samples[key] for key in keys])\n"
        '  File "/workspace/train/data.py", line 88, in <listcomp>\n'
        "    yield self.collate([self.samples[key] for key in keys])\n"
        f"KeyError: '{bad_sample(step)}'"
    )


def caught_exception(node: str, step: int) -> None:
    """What ``logging.exception`` prints when the data loader skips a sample it cannot read;
    the program goes on training."""
    sys.stdout.flush()
    print(
        f"{stamp()} {node}: ERROR:train.data:skipping sample {bad_sample(step)} at step {step}: "
        "it could not be loaded\n" + sample_traceback(step),
        file=sys.stderr,
        flush=True,
    )


def traceback_then_exit(node: str, step: int) -> None:
    """The same error, not caught this time: the process ends with status 1."""
    sys.stdout.flush()
    print(
        f"{stamp()} {node}: Traceback (most recent call last):\n"
        '  File "/workspace/train/ddp_train.py", line 214, in <module>\n'
        "    main()\n"
        '  File "/workspace/train/ddp_train.py", line 176, in main\n'
        "    batch = next(batches)\n" + sample_traceback(step).split("\n", 1)[1],
        file=sys.stderr,
        flush=True,
    )
    os._exit(1)


def error_then_hang(node: str) -> None:
    """A prefetch thread dies on a storage read; the main loop waits for its batch for ever.

    The process neither exits nor makes progress: every other rank waits in the all-reduce.
    """
    sys.stdout.flush()
    print(
        f"{stamp()} {node}: Exception in thread shard-prefetch:\n"
        "Traceback (most recent call last):\n"
        '  File "/usr/lib/python3.11/threading.py", line 1045, in _bootstrap_inner\n'
        "    self.run()\n"
        '  File "/workspace/train/data.py", line 61, in run\n'
        "    self.queue.put(self.read_shard(path))\n"
        '  File "/workspace/train/data.py", line 73, in read_shard\n'
        '    raise RuntimeError(f"read of {path} failed after {tries} tries")\n'
        "RuntimeError: read of /lustre/datasets/web-2024/shard-00042.tar failed after 3 tries",
        file=sys.stderr,
        flush=True,
    )
    threading.Event().wait()


def at_step(spec: Any, step: int, restarts: int, *, default_restart: int | None) -> bool:
    """Whether the all-ranks fault ``spec`` fires at ``step`` in this attempt.

    ``default_restart`` is the restart count it fires on when the spec names none (``None``:
    every attempt).
    """
    if not isinstance(spec, dict) or int(spec.get("at_step", -1)) != step:
        return False
    wanted = spec.get("restart_count", default_restart)
    return wanted is None or int(wanted) == restarts


def on_attempt(spec: Any, rank: int, node: str, restarts: int) -> bool:
    """Whether the fault ``spec`` fires on this rank in this attempt."""
    return (
        isinstance(spec, dict)
        and selects(spec, rank, node)
        and int(spec.get("restart_count", 0)) == restarts
    )


def main() -> None:
    rank = int(os.environ["SLURM_PROCID"])
    world = int(os.environ["SLURM_NTASKS"])
    node = os.environ.get("SLURMD_NODENAME", f"rank{rank}")
    restarts = int(os.environ.get("SLURM_RESTART_COUNT", "0") or 0)
    total = int(os.environ.get("TOTAL_STEPS", "200"))
    step_seconds = float(os.environ.get("STEP_SECONDS", "0.3"))
    ckpt_every = int(os.environ.get("CKPT_EVERY", "5"))
    ckpt_dir = Path(os.environ["CKPT_DIR"])
    control = Path(os.environ["CONTROL_FILE"]) if os.environ.get("CONTROL_FILE") else None
    torch.set_num_threads(1)

    # A long collective timeout: a stopped rank must look like a hang, not a quick error.
    dist.init_process_group(
        "gloo", rank=rank, world_size=world, timeout=timedelta(minutes=30), init_method="env://"
    )
    torch.manual_seed(1234)
    model = torch.nn.Sequential(
        torch.nn.Linear(WIDTH, WIDTH), torch.nn.Tanh(), torch.nn.Linear(WIDTH, WIDTH)
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    start = 0
    found = newest_checkpoint(ckpt_dir)
    if found is not None:
        start, path = found
        state = torch.load(path, weights_only=True)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        if rank == 0:
            say(node, f"resuming from checkpoint at iteration {start} (restart {restarts})")
    elif rank == 0:
        say(node, f"starting from scratch (restart {restarts})")

    generator = torch.Generator().manual_seed(rank)
    target = torch.nn.Linear(WIDTH, WIDTH)
    # ``ran``: steps this attempt has completed before this one.
    for ran, step in enumerate(range(start + 1, total + 1)):
        faults = read_faults(control)
        error = faults.get("cuda_error")
        if (
            isinstance(error, dict)
            and selects(error, rank, node)
            and int(error.get("restart_count", 0)) == restarts
        ):
            cuda_error(node)
        failure = faults.get("app_exception")
        if isinstance(failure, dict) and rank == 0 and ran >= int(failure.get("after_steps", 0)):
            app_exception(node)
        if on_attempt(faults.get("traceback_then_exit"), rank, node, restarts):
            traceback_then_exit(node, step)
        if on_attempt(faults.get("error_then_hang"), rank, node, restarts):
            error_then_hang(node)
        caught = faults.get("caught_exception")
        if (
            isinstance(caught, dict)
            and selects(caught, rank, node)
            and int(caught.get("restart_count", restarts)) == restarts
            and step in {int(n) for n in caught.get("at_steps", [])}
        ):
            caught_exception(node, step)
        # Extra seconds of this step on every rank: an evaluation pass after a handled error.
        quiet_seconds = 0.0
        quiet = faults.get("handled_then_quiet")
        if at_step(quiet, step, restarts, default_restart=0):
            assert isinstance(quiet, dict)
            if selects(quiet, rank, node):
                caught_exception(node, step)
            quiet_seconds = float(quiet.get("quiet_seconds", 25))
        pause = faults.get("checkpoint_pause")
        save_pause = 0.0
        if at_step(pause, step, restarts, default_restart=None):
            assert isinstance(pause, dict)
            save_pause = float(pause.get("seconds", 30))
        slow = faults.get("slow")
        factor = float(slow.get("factor", 1.0)) if isinstance(slow, dict) else 1.0
        if not (isinstance(slow, dict) and selects(slow, rank, node)):
            factor = 1.0

        began = time.monotonic()
        inputs = torch.randn(BATCH, WIDTH, generator=generator)
        with torch.no_grad():
            wanted = target(inputs)
        loss = torch.nn.functional.mse_loss(model(inputs), wanted)
        optimizer.zero_grad()
        loss.backward()  # type: ignore[no-untyped-call]  # unannotated in torch
        # The step's compute stands for a GPU's forward and backward pass.
        time.sleep(step_seconds * factor)
        compute = time.monotonic() - began
        # Not part of the compute: a pass that prints nothing, the same on every rank.
        time.sleep(quiet_seconds)
        for parameter in model.parameters():
            assert parameter.grad is not None
            dist.all_reduce(parameter.grad)
            parameter.grad /= world
        optimizer.step()
        tps = BATCH * SEQUENCE / compute
        say(
            node,
            f"step: {step}  loss: {loss.item():.4f}  memory: 0.10GiB  tps: {tps:,.0f}",
        )
        if rank == 0 and (step % ckpt_every == 0 or save_pause):
            final = ckpt_dir / f"step_{step}.pt"
            partial = ckpt_dir / f".step_{step}.pt.tmp"
            say(node, f"saving checkpoint at iteration {step} to {ckpt_dir}")
            torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, partial)
            # A slow synchronous save: the other ranks wait for rank 0 in the next all-reduce.
            time.sleep(save_pause)
            partial.rename(final)
            say(node, f"successfully saved checkpoint from iteration {step} to {ckpt_dir}")
    dist.barrier()
    if rank == 0:
        say(node, f"training finished at iteration {total}")
    sys.stdout.flush()
    # Tearing gloo down at exit can abort ("terminate called without an active exception")
    # while its threads still run; every rank is past the barrier, so leave at once.
    os._exit(0)


if __name__ == "__main__":
    main()
