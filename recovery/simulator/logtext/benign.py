"""What a healthy job and its nodes write that can look like trouble
(``recovery.simulator.benign``).

Handled tracebacks and warnings are real text: a corpus file (``SimConfig.benign_corpus``) holds
tracebacks and warning lines taken from labelled real logs, each with the address it came from
(``bench.soak.corpus`` builds it from ``tests/detection/data``). A handled traceback is printed
as ``logging.exception`` prints it: the logger's record (``ERROR:name:message``, here after the
program's own time and host, as its other lines) and then the traceback, whose lines are part
of the same record and carry only srun's rank prefix.

Kernel lines are laid out as ``journalctl -k -o short-iso-precise`` prints them.
"""

from __future__ import annotations

import functools
import json
import random
import re
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from recovery.simulator.logtext.context import FailureContext
from recovery.simulator.logtext.layout import (
    GPUS_PER_NODE,
    NIC_BUSES,
    pci_bus,
    random_pid,
    rank_line,
)

DRIVER_VERSION = "550.90.07"
TRACEBACK_HEADER = "Traceback (most recent call last):"

# What a handler says when it logs an error and goes on, by the category of the error it caught.
HANDLERS: dict[str, tuple[tuple[str, str], ...]] = {
    "storage_io": (
        ("train.checkpoint", "saving the checkpoint failed; keeping the previous one, retrying"),
        ("train.metrics", "could not write the metrics file; continuing without it"),
    ),
    "gpu_oom": (("train", "out of memory on this batch; skipping it and emptying the cache"),),
    "host_oom": (("train.data", "a data loader worker failed; restarting the data loader"),),
    "app_exception": (
        ("train.data", "skipping a sample that could not be loaded"),
        ("train.callbacks", "a callback failed; continuing without it"),
    ),
}
DEFAULT_HANDLER = (("train", "an error was handled; continuing"),)
EVAL_EXAMPLES = (2048, 4096, 8192, 16384)
# InfiniBand async events NCCL reports with WARN that leave the link working.
IB_EVENTS = ("client reregistration", "GID table change", "port active", "LID change")


@dataclass(frozen=True)
class CorpusText:
    """Real lines, where they came from, and how they were labelled."""

    id: str
    source: str
    category: str
    lines: tuple[str, ...]


@dataclass(frozen=True)
class BenignCorpus:
    tracebacks: tuple[CorpusText, ...] = ()
    warnings: tuple[CorpusText, ...] = ()
    sources: dict[str, str] = field(default_factory=dict)


@functools.lru_cache(maxsize=8)
def load_corpus(path: str) -> BenignCorpus:
    """The corpus file at ``path``: ``{"tracebacks": [...], "warnings": [...]}``, each entry
    ``{"id", "source", "category", "lines"}``."""
    data: dict[str, Any] = json.loads(Path(path).read_text(encoding="utf-8"))

    def texts(key: str) -> tuple[CorpusText, ...]:
        return tuple(
            CorpusText(
                id=str(entry["id"]),
                source=str(entry["source"]),
                category=str(entry.get("category", "")),
                lines=tuple(str(line) for line in entry["lines"]),
            )
            for entry in data.get(key, [])
            if entry.get("lines")
        )

    tracebacks, warnings = texts("tracebacks"), texts("warnings")
    sources = {text.id: text.source for text in (*tracebacks, *warnings)}
    return BenignCorpus(tracebacks=tracebacks, warnings=warnings, sources=sources)


def handled_traceback(context: FailureContext, text: CorpusText, *, rank: int) -> list[str]:
    """``logging.exception``'s record for ``text`` on ``rank`` (on ``context.host``)."""
    rng = context.rng
    logger, message = rng.choice(HANDLERS.get(text.category, DEFAULT_HANDLER))
    if rng.random() < 0.7:
        # The program's own format, as on its other lines, with logging's default after it.
        lines = [rank_line(rank, context.at, context.host, f"ERROR:{logger}:{message}")]
    else:
        # Hydra's default record format, the other one training programs commonly use.
        moment = datetime.fromtimestamp(context.at, tz=UTC)
        lines = [
            f"{rank}: [{moment:%Y-%m-%d %H:%M:%S},{moment.microsecond // 1000:03d}][{logger}]"
            f"[ERROR] - {message}"
        ]
    lines += [f"{rank}: {line}" for line in (TRACEBACK_HEADER, *text.lines)]
    return lines


def warning_lines(text: CorpusText, *, rank: int, host: str, at: float) -> list[str]:
    """Lines a library printed on its own (Python's warnings, DeepSpeed's logger).

    The message is the real one; what the printing process puts around it is this job's: the
    time a logger stamps, the host and the rank NCCL and PyTorch name.
    """
    lines = []
    for line in text.lines:
        line = _STAMP.sub(lambda found: _restamp(found, at), line, count=1)
        line = _NCCL_HOST.sub(lambda found: f"{host}:{found.group(2)}", line, count=1)
        line = _RANK.sub(f"[rank{rank}]:", line, count=1)
        lines.append(f"{rank}: {line}")
    return lines


# A logger's time at the start of a line ("[2024-09-11 17:52:18,030]", "2026-07-11 21:02:51").
_STAMP = re.compile(r"^(\[?)(\d{4}-\d{2}-\d{2})([ T])(\d{2}:\d{2}:\d{2})([,.]\d{1,6})?")
_NCCL_HOST = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*):(\d+:\d+ \[\d+\] )")
_RANK = re.compile(r"^\[rank\d+\]:")


def _restamp(found: re.Match[str], at: float) -> str:
    moment = datetime.fromtimestamp(at, tz=UTC)
    fraction = found.group(5) or ""
    if fraction:
        digits = len(fraction) - 1
        fraction = fraction[0] + f"{moment.microsecond:06d}"[:digits]
    return f"{found.group(1)}{moment:%Y-%m-%d}{found.group(3)}{moment:%H:%M:%S}{fraction}"


def nccl_warning(context: FailureContext) -> list[str]:
    """NCCL on one rank: an InfiniBand event it survives, or a connect it retries."""
    rng = context.rng
    gpu = rng.randrange(GPUS_PER_NODE)
    rank = context.rank_of(gpu)
    pid = random_pid(rng)
    prefix = f"{context.host}:{pid}:{pid + rng.randint(50, 400)} [{gpu}] NCCL"
    port = rng.randrange(4)
    device = f"mlx5_{port}:1"
    choice = rng.random()
    if choice < 0.45:
        messages = [f"WARN NET/IB : {device} Got async event : {rng.choice(IB_EVENTS)}"]
    elif choice < 0.7:
        # A link that flapped and came back before any transfer timed out.
        messages = [
            f"WARN NET/IB : {device} Got async event : port error",
            f"WARN NET/IB : {device} Got async event : port active",
        ]
    else:
        messages = [
            "INFO Call to connect returned Connection refused, retrying",
            "INFO Call to connect returned Connection refused, retrying",
        ]
    return [
        rank_line(rank, context.at + 0.4 * index, context.host, f"{prefix} {message}")
        for index, message in enumerate(messages)
    ]


def loss_scale_overflow(scale: float, *, skips: int) -> list[str]:
    """Apex's dynamic loss scaler skipping ``skips`` overflowing steps from ``scale``, printed
    by rank 0."""
    lines = []
    for _ in range(skips):
        scale /= 2
        lines.append(
            f"0: Gradient overflow.  Skipping step, loss scaler 0 reducing loss scale to {scale}"
        )
    return lines


def eval_started(context: FailureContext) -> list[str]:
    """The Hugging Face Trainer's announcement of an evaluation pass."""
    rng = context.rng
    head = context.batch_host
    return [
        rank_line(0, context.at, head, "***** Running Evaluation *****"),
        rank_line(0, context.at, head, f"  Num examples = {rng.choice(EVAL_EXAMPLES)}"),
        rank_line(0, context.at, head, f"  Batch size = {rng.choice((4, 8, 16))}"),
    ]


def eval_finished(context: FailureContext, *, seconds: float, loss: float) -> list[str]:
    rng = context.rng
    samples = rng.choice(EVAL_EXAMPLES) / max(seconds, 1.0)
    return [
        rank_line(
            0,
            context.at,
            context.batch_host,
            f"{{'eval_loss': {loss:.4f}, 'eval_runtime': {seconds:.2f}, "
            f"'eval_samples_per_second': {samples:.3f}, "
            f"'eval_steps_per_second': {samples / 8:.3f}}}",
        )
    ]


def checkpoint_started_line(*, host: str, at: float, step: int, checkpoint_dir: str) -> str:
    return rank_line(0, at, host, f"saving checkpoint at iteration {step:8d} to {checkpoint_dir}")


def checkpoint_saved_line(*, host: str, at: float, step: int, checkpoint_dir: str) -> str:
    return rank_line(
        0, at, host, f"successfully saved checkpoint from iteration {step:8d} to {checkpoint_dir}"
    )


# ----------------------------------------------------------------------------- kernel log


def kernel_line(host: str, at: float, message: str) -> str:
    """A kernel record as ``journalctl -k -o short-iso-precise`` prints it."""
    moment = datetime.fromtimestamp(at, tz=UTC)
    return f"{moment:%Y-%m-%dT%H:%M:%S}.{moment.microsecond:06d}+00:00 {host} kernel: {message}"


def persistence_mode_lines(host: str, at: float) -> list[str]:
    """What the driver prints when a prolog or health check turns persistence mode on."""
    return [
        kernel_line(
            host,
            at,
            "NVRM: Persistence mode is deprecated and will be removed in a future release. "
            "Please use nvidia-persistenced instead.",
        )
    ]


def module_load_lines(host: str, at: float, rng: random.Random) -> list[str]:
    """The driver loading after a node's maintenance reboot."""
    built = "Fri May 31 09:35:42 UTC 2024"
    lines = [
        "nvidia: loading out-of-tree module taints kernel.",
        "nvidia: module license 'NVIDIA' taints kernel.",
        f"nvidia-nvlink: Nvlink Core is being initialized, major device number "
        f"{rng.randint(230, 240)}",
    ]
    for gpu in range(GPUS_PER_NODE):
        lines.append(f"nvidia 0000:{pci_bus(host, gpu)}:00.0: enabling device (0000 -> 0002)")
    lines += [
        f"NVRM: loading NVIDIA UNIX x86_64 Kernel Module  {DRIVER_VERSION}  {built}",
        f"nvidia-modeset: Loading NVIDIA Kernel Mode Setting Driver for UNIX platforms  "
        f"{DRIVER_VERSION}  {built}",
        f"nvidia-uvm: Loaded the UVM driver, major device number {rng.randint(500, 511)}.",
        f"mlx5_core 0000:{NIC_BUSES[0]}:00.0: firmware version: 28.39.1002",
    ]
    return [kernel_line(host, at + 0.01 * index, line) for index, line in enumerate(lines)]


def application_xid_lines(host: str, at: float, rng: random.Random) -> tuple[int, list[str]]:
    """An Xid whose cause is the application's (a process's bad access or killed context)."""
    gpu = rng.randrange(GPUS_PER_NODE)
    bus = f"0000:{pci_bus(host, gpu)}:00"
    pid = random_pid(rng)
    name = rng.choice(("python", "python3", "pt_main_thread"))
    code = rng.choice((13, 31, 43))
    texts = {
        13: f"Graphics SM Warp Exception on (GPC {rng.randrange(8)}, TPC {rng.randrange(9)}, "
        f"SM {rng.randrange(2)}): Out Of Range Address",
        31: f"Ch 0000000{rng.randrange(8)}, intr 10000000. MMU Fault: ENGINE GRAPHICS "
        f"GPCCLIENT_T1_{rng.randrange(4)} faulted @ 0x7f{rng.getrandbits(8):02x}_"
        f"{rng.getrandbits(16):04x}0000. Fault is of type FAULT_PDE ACCESS_TYPE_VIRT_READ",
        43: f"Ch 000000{rng.randrange(8, 64):02x}",
    }
    lines = []
    if rng.random() < 0.3:
        # Printed once per GPU and boot, before its first Xid.
        lines += [
            f"NVRM: GPU at PCI:{bus}: GPU-{rng.getrandbits(32):08x}-{rng.getrandbits(16):04x}-"
            f"{rng.getrandbits(16):04x}-{rng.getrandbits(16):04x}-{rng.getrandbits(48):012x}",
            f"NVRM: GPU Board Serial Number: {rng.randint(1652820000000, 1652829999999)}",
        ]
    lines.append(f"NVRM: Xid (PCI:{bus}): {code}, pid={pid}, name={name}, {texts[code]}")
    return code, [kernel_line(host, at + 0.001 * index, line) for index, line in enumerate(lines)]
