"""Turning a raw log line into the message and what its prefixes say: rank, node, time.

Training logs arrive wrapped in prefixes added by launchers and loggers, often several deep:
``2019-06-02T16:13:44.884Z: [1,12]<stdout>:host:815:864 [0] NCCL WARN ...`` or
`` 2: [rank2]:[E504 23:32:59.3 ProcessGroupNCCL.cpp:1896] ...``. The prefixes are peeled off one
by one; what they name is kept, so a finding can say which ranks and nodes printed it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime

from recovery.detection.linear_regex import compile_linear

MAX_MESSAGE_CHARS = 4000

# Byte-level patterns run by Python's re on whole chunks; they are simple enough (no nested
# quantifiers) to stay linear.
ANSI_ESCAPE = re.compile(rb"\x1b(?:\[[0-9;?]*[ -/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)|[@-Z\\-_])")

_PREFIXES = [
    # srun --label: " 2: "
    ("rank", compile_linear(r"^\s{0,6}(\d{1,6}): ")),
    # torchrun/PyTorch: "[rank3]:" or "[rank: 0] "
    ("rank", compile_linear(r"^\[rank:? ?(\d{1,6})\]:? ?")),
    # Open MPI --tag-output: "[1,12]<stdout>:"
    ("rank", compile_linear(r"^\[\d+,(\d{1,6})\]<std(?:out|err)>: ?")),
    # Ray: "(RayWorkerWrapper pid=92234, ip=172.19.24.110) "
    ("node", compile_linear(r"^\([A-Za-z0-9_]+ pid=\d+(?:, ip=([0-9a-fA-F.:]+))?\) ")),
    # ISO timestamps with an optional separator after them.
    (
        "time",
        compile_linear(
            r"^\[?(\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}:\d{2}(?:[.,]\d{1,9})?(?:Z|[+-]\d{2}:?\d{2})?)"
            r"\]?(?:\s*[:|-]\s*|\s+)"
        ),
    ),
    # syslog: "Aug 26 15:27:32 ailcm-ai1 kernel: "
    (
        "node",
        compile_linear(
            r"^[A-Z][a-z]{2} [ \d]\d \d{2}:\d{2}:\d{2} ([A-Za-z0-9][A-Za-z0-9._-]*) "
            r"[A-Za-z0-9_./-]+(?:\[\d+\])?: "
        ),
    ),
    # dmesg: "[87430.975714] " or "[  +0.000316] "
    ("skip", compile_linear(r"^\[\s*\+?\d+\.\d+\] ")),
    # NCCL: "host:pid:tid [gpu] "
    ("node", compile_linear(r"^([A-Za-z0-9][A-Za-z0-9._-]*):\d+:\d+ \[\d+\] ")),
    # Slurm's step daemon: "slurmstepd-node001: error: ..."
    ("node", compile_linear(r"^slurmstepd-([A-Za-z0-9][A-Za-z0-9._-]*): ")),
    # pdsh/clush style "node001: " (a host name has a digit and no capitals)
    ("node", compile_linear(r"^([a-z0-9][a-z0-9.-]*\d[a-z0-9.-]*): ")),
]

_MESSAGE_RANK = compile_linear(r"\[(?:PG [^\]]{0,80} )?Rank (\d{1,6})\]")
_MESSAGE_NODES = [
    compile_linear(r"\*\*\* (?:JOB|STEP) \S+ ON (\S+) CANCELLED"),
    compile_linear(r"srun: error: ([A-Za-z0-9][A-Za-z0-9._-]*): tasks? "),
    compile_linear(r"Node failure on ([A-Za-z0-9][A-Za-z0-9._-]*)"),
    compile_linear(r"on (?:host|node) ([A-Za-z0-9][A-Za-z0-9._-]*\d[A-Za-z0-9._-]*)"),
]
_MESSAGE_TASK = compile_linear(r"srun: error: \S+: task (\d+): ")
# slurmstepd's notice carries its own time ("*** JOB 42 ON gpu-001 CANCELLED AT
# 2026-12-02T12:11:14 DUE TO PREEMPTION ***"), often on a line with no other: it says when the
# attempt was ended, which a late read needs to tell whose notice it is.
_MESSAGE_CANCELLED_AT = compile_linear(r"\*\*\* (?:JOB|STEP) \S+ ON \S+ CANCELLED AT (\S+)")


@dataclass(frozen=True)
class LineContext:
    message: str
    rank: int | None = None
    node: str | None = None
    at: datetime | None = None


def strip_ansi(data: bytes) -> bytes:
    if b"\x1b" not in data:
        return data
    return ANSI_ESCAPE.sub(b"", data)


def parse_line(line: str) -> LineContext:
    """Peel the known prefixes off ``line`` and return the message with its context."""
    message = line.rstrip("\r\n")
    if len(message) > MAX_MESSAGE_CHARS:
        message = message[:MAX_MESSAGE_CHARS]
    rank: int | None = None
    node: str | None = None
    at: datetime | None = None
    progressed = True
    while progressed and message:
        progressed = False
        for meaning, prefix in _PREFIXES:
            found = prefix.search(message)
            if found is None or found.end() == 0:
                continue
            value = found.group(1) if prefix.groups else None
            if meaning == "rank" and value is not None and rank is None:
                rank = int(value)
            elif meaning == "node" and value and node is None:
                node = value
            elif meaning == "time" and value and at is None:
                at = parse_timestamp(value)
            message = message[found.end() :]
            progressed = True
            break
    message = message.strip()
    if rank is None:
        found = _MESSAGE_RANK.search(message)
        if found is not None:
            rank = int(found.group(1))
    if rank is None:
        found = _MESSAGE_TASK.search(message)
        if found is not None:
            rank = int(found.group(1))
    if at is None:
        found = _MESSAGE_CANCELLED_AT.search(message)
        if found is not None:
            at = parse_timestamp(found.group(1))
    if node is None:
        for pattern in _MESSAGE_NODES:
            found = pattern.search(message)
            if found is not None:
                node = found.group(1)
                break
    return LineContext(message=message, rank=rank, node=node, at=at)


def parse_timestamp(text: str) -> datetime | None:
    """Parse an ISO-like timestamp; naive times are taken as UTC."""
    cleaned = text.replace(",", ".").replace("Z", "+00:00")
    try:
        parsed = datetime.fromisoformat(cleaned)
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)
