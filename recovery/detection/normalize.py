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

import re2

from recovery.detection.linear_regex import compile_linear

MAX_MESSAGE_CHARS = 4000

# Byte-level patterns run by Python's re on whole chunks; they are simple enough (no nested
# quantifiers) to stay linear.
ANSI_ESCAPE = re.compile(rb"\x1b(?:\[[0-9;?]*[ -/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)|[@-Z\\-_])")

# The prefixes, tried in this order at the start of what is left of the line. They are the
# project's own patterns, run by Python's re (RE2's wrapper costs microseconds a search, and
# every progress line of every job goes through here): each is anchored, with no quantified
# group and no two adjacent quantifiers over overlapping characters, so no input makes one
# backtrack more than once over the line. ``\s`` is written out as RE2 reads it.
_S = r"[\t\n\f\r ]"
_PREFIXES = [
    # srun --label: " 2: "
    ("rank", rf"{_S}{{0,6}}(\d{{1,6}}): "),
    # torchrun/PyTorch: "[rank3]:" or "[rank: 0] "
    ("rank", r"\[rank:? ?(\d{1,6})\]:? ?"),
    # Open MPI --tag-output: "[1,12]<stdout>:"
    ("rank", r"\[\d+,(\d{1,6})\]<std(?:out|err)>: ?"),
    # Ray: "(RayWorkerWrapper pid=92234, ip=172.19.24.110) "
    ("node", r"\([A-Za-z0-9_]+ pid=\d+(?:, ip=([0-9a-fA-F.:]+))?\) "),
    # ISO timestamps with an optional separator after them.
    (
        "time",
        r"\[?(\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}:\d{2}(?:[.,]\d{1,9})?(?:Z|[+-]\d{2}:?\d{2})?)"
        rf"\]?(?:{_S}*[:|-]{_S}*|{_S}+)",
    ),
    # syslog: "Aug 26 15:27:32 ailcm-ai1 kernel: "
    (
        "node",
        r"[A-Z][a-z]{2} [ \d]\d \d{2}:\d{2}:\d{2} ([A-Za-z0-9][A-Za-z0-9._-]*) "
        r"[A-Za-z0-9_./-]+(?:\[\d+\])?: ",
    ),
    # dmesg: "[87430.975714] " or "[  +0.000316] "
    ("skip", rf"\[{_S}*\+?\d+\.\d+\] "),
    # NCCL: "host:pid:tid [gpu] "
    ("node", r"([A-Za-z0-9][A-Za-z0-9._-]*):\d+:\d+ \[\d+\] "),
    # Slurm's step daemon: "slurmstepd-node001: error: ..."
    ("node", r"slurmstepd-([A-Za-z0-9][A-Za-z0-9._-]*): "),
    # pdsh/clush style "node001: ": a host name has a digit after its first character and no
    # capitals; the digit is checked after the match (``_is_host_name``), which keeps it linear.
    ("host", r"([a-z0-9][a-z0-9.-]*): "),
]


@dataclass(frozen=True)
class Peel:
    meaning: str
    group: int  # the alternative's own group in the combined pattern
    value: int | None  # its first capturing group, if it has one


def _one_of(prefixes: list[tuple[str, str]]) -> tuple[re.Pattern[str], list[Peel]]:
    """All the prefixes as one anchored alternation, and what each alternative's groups are.

    Python's re prefers the first alternative that matches, as trying the prefixes in turn
    would: one match a peel instead of one search a prefix.
    """
    parts = []
    peels = []
    group = 1
    for meaning, source in prefixes:
        groups = re.compile(source).groups
        parts.append(f"({source})")
        peels.append(Peel(meaning, group, group + 1 if groups else None))
        group += 1 + groups
    return re.compile("(?:" + "|".join(parts) + ")", re.ASCII), peels


_PREFIX, _PEELS = _one_of(_PREFIXES)


def _is_host_name(name: str) -> bool:
    return any("0" <= character <= "9" for character in name[1:])


# Each pattern searched in the message only when its text can be there: these are literal
# parts of every line it matches.
_MESSAGE_RANK = (compile_linear(r"\[(?:PG [^\]]{0,80} )?Rank (\d{1,6})\]"), ("Rank ",))
_MESSAGE_NODES = [
    (compile_linear(r"\*\*\* (?:JOB|STEP) \S+ ON (\S+) CANCELLED"), (" CANCELLED",)),
    (compile_linear(r"srun: error: ([A-Za-z0-9][A-Za-z0-9._-]*): tasks? "), ("srun: error: ",)),
    (compile_linear(r"Node failure on ([A-Za-z0-9][A-Za-z0-9._-]*)"), ("Node failure on ",)),
    (
        compile_linear(r"on (?:host|node) ([A-Za-z0-9][A-Za-z0-9._-]*\d[A-Za-z0-9._-]*)"),
        ("on host ", "on node "),
    ),
]
_MESSAGE_TASK = (compile_linear(r"srun: error: \S+: task (\d+): "), ("srun: error: ",))
# slurmstepd's notice carries its own time ("*** JOB 42 ON gpu-001 CANCELLED AT
# 2026-12-02T12:11:14 DUE TO PREEMPTION ***"), often on a line with no other: it says when the
# attempt was ended, which a late read needs to tell whose notice it is.
_MESSAGE_CANCELLED_AT = (
    compile_linear(r"\*\*\* (?:JOB|STEP) \S+ ON \S+ CANCELLED AT (\S+)"),
    (" CANCELLED AT ",),
)


def _search(
    pattern: tuple[re2._Regexp[str], tuple[str, ...]], message: str
) -> re2._Match[str] | None:
    compiled, needles = pattern
    if not any(needle in message for needle in needles):
        return None
    return compiled.search(message)


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


def _alternative(found: re.Match[str]) -> int:
    """Which alternative of ``_PREFIX`` matched: the one whose group took part."""
    for index, peel in enumerate(_PEELS):
        if found.start(peel.group) != -1:
            return index
    raise AssertionError("a match of _PREFIX without its alternative")


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
        found = _PREFIX.match(message)
        if found is None or found.end() == 0:
            break
        peel = _PEELS[_alternative(found)]
        value = found.group(peel.value) if peel.value is not None else None
        meaning = peel.meaning
        if meaning == "host":
            if value is None or not _is_host_name(value):
                break  # the last alternative: nothing else could have matched
            meaning = "node"
        if meaning == "rank" and value is not None and rank is None:
            rank = int(value)
        elif meaning == "node" and value and node is None:
            node = value
        elif meaning == "time" and value and at is None:
            at = parse_timestamp(value)
        message = message[found.end() :]
        progressed = True
    message = message.strip()
    if rank is None:
        hit = _search(_MESSAGE_RANK, message)
        if hit is not None:
            rank = int(hit.group(1))
    if rank is None:
        hit = _search(_MESSAGE_TASK, message)
        if hit is not None:
            rank = int(hit.group(1))
    if at is None:
        hit = _search(_MESSAGE_CANCELLED_AT, message)
        if hit is not None:
            at = parse_timestamp(hit.group(1))
    if node is None:
        for pattern in _MESSAGE_NODES:
            hit = _search(pattern, message)
            if hit is not None:
                node = hit.group(1)
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
