"""Which chain of tracebacks a failure line belongs to, and how that chain was printed.

A part of ``LogScanner`` (a mixin of its methods), kept apart because it reads the lines
around a failure, not the failure line itself.
"""

from __future__ import annotations

from recovery.detection.normalize import LineContext, parse_line
from recovery.detection.scanner.lines import _Block, _decode, _same_stream, _stream
from recovery.detection.tracebacks import (
    NEIGHBOUR_LINES,
    TRACEBACK_REACH,
    Printed,
    continues_chain,
    is_header,
    printed_as,
)


class _TracebackChains:
    """The traceback chains ``LogScanner`` follows, per stream."""

    # Set by ``LogScanner.__init__``.
    max_line_bytes: int
    _chains: list[Printed]
    _tracebacks: dict[str, tuple[int, int]]

    def _traceback_chain(
        self, block: _Block, start: int, stop: int, line_number: int, context: LineContext
    ) -> int | None:
        """The chain of tracebacks this failure line belongs to, if it belongs to one.

        A header starts a stream's traceback; the lines after it, up to ``TRACEBACK_REACH``,
        are its frames and its exception. A header after "During handling of the above
        exception" continues the chain before it, and how it was printed decides for all of it.
        """
        stream = _stream(context.rank, context.node)
        known = self._tracebacks.get(stream)
        if known is not None and line_number - known[1] > TRACEBACK_REACH:
            known = None
        if not is_header(context.message):
            return None if known is None else known[0]
        before = self._neighbour(block, start, context, forward=False)
        printed = printed_as(before, self._neighbour(block, stop, context, forward=True))
        if known is not None and continues_chain(before):
            chain = known[0]
            self._chains[chain] = printed
        else:
            chain = len(self._chains)
            self._chains.append(printed)
        self._tracebacks[stream] = (chain, line_number)
        return chain

    def _neighbour(
        self, block: _Block, offset: int, context: LineContext, *, forward: bool
    ) -> str | None:
        """The message of the nearest line of the same stream before or after ``offset``."""
        edge = offset  # forward: the end of the line before; backward: its start
        for _ in range(NEIGHBOUR_LINES):
            if forward:
                begin = edge + 1
                if begin >= block.end:
                    return None
                end = edge = block.segment_end(begin)
            else:
                if edge <= block.begin:
                    return None
                end = edge - 1
                begin = edge = block.line_start(end)
            other = parse_line(_decode(block.data[begin:end][: self.max_line_bytes]))
            if other.message and _same_stream(context, other):
                return other.message
        return None
