"""The bytes the scanner reads, as lines: a block of complete lines addressed by offsets,
and the stream (rank or node) a line comes from.

Kept apart so that the scanner and what it follows across lines (tracebacks, progress) read
lines the same way.
"""

from __future__ import annotations

from dataclasses import dataclass

from recovery.detection.normalize import LineContext

EXCERPT_CONTEXT_LINES = 3
MAX_EXCERPT_CHARS = 4000


def _stream(rank: int | None, node: str | None) -> str:
    return str(rank) if rank is not None else (node or "")


def _same_stream(one: LineContext, other: LineContext) -> bool:
    """Whether two lines may come from one process: the same rank, or node, where both say."""
    if one.rank is not None and other.rank is not None:
        return one.rank == other.rank
    if one.node and other.node:
        return one.node == other.node
    return True


def _decode(raw: bytes) -> str:
    return raw.decode("utf-8", errors="replace")


@dataclass(frozen=True, slots=True)
class _Block:
    """Complete lines held in ``data[begin:end]``; offsets are positions in ``data``."""

    data: bytes
    begin: int
    end: int

    def line_start(self, position: int) -> int:
        """Start of the line (or carriage-return segment) holding ``position - 1``."""
        newline = self.data.rfind(b"\n", self.begin, position)
        start = self.begin if newline == -1 else newline + 1
        carriage = self.data.rfind(b"\r", start, position)  # only within this line
        return start if carriage == -1 else carriage + 1

    def segment_end(self, position: int) -> int:
        newline = self.data.find(b"\n", position, self.end)
        end = self.end if newline == -1 else newline
        carriage = self.data.find(b"\r", position, end)
        return end if carriage == -1 else carriage

    def excerpt(self, start: int, stop: int) -> str:
        """The line at ``[start, stop)`` with a few lines of context either side."""
        data = self.data
        begin = start
        for _ in range(EXCERPT_CONTEXT_LINES):
            previous = data.rfind(b"\n", self.begin, max(begin - 1, self.begin))
            if previous == -1:
                begin = self.begin
                break
            begin = previous + 1
        end = stop
        for _ in range(EXCERPT_CONTEXT_LINES):
            following = data.find(b"\n", end + 1, self.end)
            if following == -1:
                end = self.end
                break
            end = following
        text = _decode(data[begin:end][: MAX_EXCERPT_CHARS * 4])[:MAX_EXCERPT_CHARS]
        return text.replace("\r", "\n")
