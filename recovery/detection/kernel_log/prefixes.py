"""The prefixes dmesg, syslog and the journal put before a kernel message, peeled off.

Kept apart from the messages' own structures: what a prefix says (the record's kernel
timestamp, a clock, a syslog tag another program wrote, an indent) decides whether a line is
a message at all, before any structure is tried.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import re2

from recovery.detection.linear_regex import compile_linear
from recovery.detection.normalize import MAX_MESSAGE_CHARS, parse_timestamp


@dataclass(frozen=True)
class Prefix:
    """What a line's prefixes say, and the message after them.

    ``record`` is the kernel's own timestamp (``[87430.975714]``): the lines of one printk
    record share it. ``clock`` is a syslog or journal time, to the second. ``foreign`` is a
    syslog line another program wrote; ``indented`` a line that starts with white space
    before any prefix (how journalctl and dmesg print a record's further lines).
    """

    message: str
    record: str | None = None
    clock: str | None = None
    at: datetime | None = None
    foreign: bool = False
    indented: bool = False

    @property
    def key(self) -> str | None:
        """What the lines of one record have in common: the kernel's time, else the clock's."""
        return self.record if self.record is not None else self.clock


# Each prefix is matched at the start of what is left of the line, in this order.
_PRIORITY = compile_linear(r"<[0-9]{1,3}>")
_FACILITY = compile_linear(r"kern *:[a-z]{1,8} *: ")  # dmesg -x
_SYSLOG_TIME = compile_linear(
    r"([A-Z][a-z]{2} [ 0-9][0-9] [0-9]{2}:[0-9]{2}:[0-9]{2}(?:\.[0-9]{1,9})?) "
)
_ISO_TIME = compile_linear(
    r"([0-9]{4}-[0-9]{2}-[0-9]{2}[T ][0-9]{2}:[0-9]{2}:[0-9]{2}(?:[.,][0-9]{1,9})?"
    r"(?:Z|[+-][0-9]{2}:?[0-9]{2})?) "
)
_CTIME = compile_linear(  # dmesg -T
    r"\[([A-Z][a-z]{2} [A-Z][a-z]{2} [ 0-9][0-9] [0-9]{2}:[0-9]{2}:[0-9]{2} [0-9]{4})\] "
)
_KERNEL_TIME = compile_linear(r"\[ *([0-9]{1,10}\.[0-9]{1,9})\] ?")
_CALLER = compile_linear(r"\[ *[TC][0-9]{1,7}\] ?")  # CONFIG_PRINTK_CALLER
# A syslog header after its time: host, then the program's tag.
_SYSLOG_SOURCE = compile_linear(
    r"[A-Za-z0-9][A-Za-z0-9._-]{0,252} ([A-Za-z0-9_./-]{1,64}?)(?:\[[0-9]{1,10}\])?: "
)
# journalctl -o short-monotonic after its time, and a bare "host kernel: " or "kernel: ".
_KERNEL_SOURCE = compile_linear(r"(?:[A-Za-z0-9][A-Za-z0-9._-]{0,252} )?kernel: ")


def peel(line: str) -> Prefix:
    """The message of ``line`` and what its dmesg, syslog or journal prefixes say."""
    text = line.rstrip("\r\n")[:MAX_MESSAGE_CHARS]
    if text[:1] in (" ", "\t"):
        return Prefix(message=text.strip(), indented=True)
    record: str | None = None
    clock: str | None = None
    at: datetime | None = None
    # Each pattern is tried only where the line's first character allows it: a line goes
    # through few of them, and they run on every line of every node's log.
    if text.startswith("<"):
        text = _drop(_PRIORITY, text)
    if text.startswith("kern "):
        text = _drop(_FACILITY, text)
    first = text[:1]
    found: re2._Match[str] | None = None
    syslog = False
    if first.isupper():
        if (found := _SYSLOG_TIME.match(text)) is not None:
            clock, syslog = found.group(1), True
    elif first.isdigit():
        if (found := _ISO_TIME.match(text)) is not None:
            clock, syslog = found.group(1), True
            at = parse_timestamp(clock)
    elif first == "[":
        if text[1:2].isalpha():
            if (found := _CTIME.match(text)) is not None:
                clock = found.group(1)
        elif (found := _KERNEL_TIME.match(text)) is not None:
            record = found.group(1)
    if found is not None:
        text = text[found.end() :]
    if syslog:
        source = _SYSLOG_SOURCE.match(text)
        if source is not None:
            text = text[source.end() :]
            if source.group(1) != "kernel":
                return Prefix(message=text, clock=clock, at=at, foreign=True)
    elif "kernel: " in text[:270]:
        text = _drop(_KERNEL_SOURCE, text)
    if text.startswith("["):
        if record is None and (found := _KERNEL_TIME.match(text)) is not None:
            record = found.group(1)
            text = text[found.end() :]
        text = _drop(_CALLER, text)
    return Prefix(message=text, record=record, clock=clock, at=at)


def _drop(pattern: re2._Regexp[str], text: str) -> str:
    found = pattern.match(text)
    return text if found is None else text[found.end() :]
