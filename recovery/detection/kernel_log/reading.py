"""Reading a whole kernel log: each line peeled, told apart from the continuation of a record
before it, and classified.

Kept apart from the structures themselves: whether a line is a message of its own depends on
the lines before it (a record carrying user text, the size of a printk record).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from recovery.detection.kernel_log.device_lines import _device_fact
from recovery.detection.kernel_log.facts import (
    DeviceFact,
    Fact,
    KernelEntry,
    KernelRead,
    ProcessFact,
    Shape,
)
from recovery.detection.kernel_log.prefixes import Prefix, peel
from recovery.detection.kernel_log.process_lines import _process_fact

# A printk record holds at most 1024 bytes of text (PRINTKRB_RECORD_MAX, kernel/printk); twice
# that bounds how far a record's continuation lines reach, whatever the log's prefixes.
MAX_RECORD_CHARS = 2048


def classify(message: str) -> Fact | Shape | None:
    """The fact ``message`` reports, the ``Shape`` of a known line that reports none, or None
    for a message no structure here recognises."""
    process = _process_fact(message)
    if process is not None:
        return process
    return _device_fact(message)


@dataclass
class _Record:
    """The record a line carrying user text began: later lines may be its continuation."""

    key: str | None
    room: int


def parse_kernel_log(data: bytes | str) -> KernelRead:
    """Every fact in a read of a kernel log (complete lines), and what was left out."""
    text = data.decode("utf-8", errors="replace") if isinstance(data, bytes) else data
    read = KernelRead()
    open_record: _Record | None = None
    for number, line in enumerate(_lines(text), start=1):
        read.lines = number
        prefix = peel(line)
        if not prefix.message:
            continue
        if prefix.foreign:
            read.foreign += 1
            _hide(read.not_from_kernel, number, prefix)
            continue
        if prefix.indented or (
            open_record is not None and open_record.room > 0 and prefix.key == open_record.key
        ):
            read.continuations += 1
            if open_record is not None:
                open_record.room -= len(prefix.message) + 1
            _hide(read.in_continuations, number, prefix)
            continue
        found = classify(prefix.message)
        # A process line carries user text. So may a message of no known structure, of any
        # length (a path, a version string a program passed): only a record's own timestamp
        # tells its next lines from the next record's.
        open_record = None
        if (
            isinstance(found, ProcessFact)
            or found is Shape.PROCESS
            or (found is None and prefix.record is not None)
        ):
            open_record = _Record(prefix.key, MAX_RECORD_CHARS - len(prefix.message))
        if isinstance(found, (DeviceFact, ProcessFact)):
            read.entries.append(KernelEntry(number, found, prefix.at))
    return read


def _lines(text: str) -> Iterator[str]:
    start = 0
    while start < len(text):
        end = text.find("\n", start)
        if end == -1:
            end = len(text)
        yield text[start:end]
        start = end + 1


def _hide(hidden: list[KernelEntry], number: int, prefix: Prefix) -> None:
    found = classify(prefix.message)
    if isinstance(found, (DeviceFact, ProcessFact)):
        hidden.append(KernelEntry(number, found, prefix.at))
