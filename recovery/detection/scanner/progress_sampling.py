"""Progress, checkpoint and non-finite loss lines: sampled, parsed and counted per stream.

A part of ``LogScanner`` (a mixin of its methods), kept apart because progress is searched
back from the end of each block, not located line by line like failures.
"""

from __future__ import annotations

import hashlib
import math
from collections import deque
from dataclasses import replace

import re2

from recovery.detection import progress as progress_module
from recovery.detection.linear_regex import compile_linear
from recovery.detection.normalize import LineContext, parse_line
from recovery.detection.refine import Refined
from recovery.detection.scanner.lines import _Block, _decode, _stream
from recovery.detection.scanner.results import CheckpointPoint, NonfiniteState, ProgressPoint
from recovery.detection.taxonomy import Severity

PROGRESS_WINDOW_BYTES = 8 * 1024
# Lines of streams that already have their samples read past before the search back ends,
# beyond two rounds of the streams seen.
EXTRA_LINES_PAST_STREAMS = 16
# A loss or gradient norm that is not a number for this many logged steps in a row (per rank) is
# a failure; one is a loss scaler skipping an overflowing fp16 step. Policies may set another
# count. With the loss scale at 1 there is no scaler to skip the step: one is a failure.
DEFAULT_NONFINITE_STEPS = 2
NONFINITE_STREAK = "consecutive"
MAX_NONFINITE_STREAMS = 4096
_NO_LOSS_SCALING = compile_linear(
    r"(?i)loss[ _]scale['\"]?\s{0,3}[:=]?\s{0,3}1(?:\.0*)?(?:[^.\d]|$)"
)


class _ProgressSampling:
    """The progress, checkpoints and non-finite steps ``LogScanner`` keeps, per stream."""

    # Set by ``LogScanner.__init__``.
    parser: progress_module.ProgressParser
    max_line_bytes: int
    progress_samples_per_block: int
    progress_samples_per_stream: int | None
    nonfinite_steps: int
    _progress_hint: re2._Regexp[bytes]
    _progress: deque[ProgressPoint]
    _checkpoints: deque[CheckpointPoint]
    _last_failure_line: int
    _last_failure_offset: int | None
    _failure_step: int | None
    _progress_after_failure: int
    _last_step: int | None
    _nonfinite: NonfiniteState
    _nonfinite_seen_to: int | None
    _nonfinite_lines: dict[str, int]
    _last_failure_nonfinite: bool

    # ------------------------------------------------------------------ non-finite values

    def _count_nonfinite_step(
        self, block: _Block, start: int, line_number: int, context: LineContext, refined: Refined
    ) -> Refined:
        """Count a logged step whose loss or gradient norm is not a number; the
        ``nonfinite_steps``-th in a row of one rank is a failure (its own finding), the ones
        before it warnings. A progress line with a finite loss between two ends the run.
        """
        message = context.message
        self._end_runs_before(block, start)
        stream = _stream(context.rank, context.node)
        digest = hashlib.blake2b(message.encode(), digest_size=8).hexdigest()
        counted, last, first_step = self._nonfinite.get(stream, [0, "", None])
        steps = int(counted or 0)
        if digest != last:  # the same line from several processes is one step
            steps += 1
        if steps == 1:
            parsed = self.parser.parse_progress(message)
            first_step = parsed.step if parsed is not None else None
        if stream in self._nonfinite or len(self._nonfinite) < MAX_NONFINITE_STREAMS:
            self._nonfinite[stream] = [steps, digest, first_step]
            self._nonfinite_lines[stream] = line_number
        unscaled = _NO_LOSS_SCALING.search(message) is not None
        if steps < self.nonfinite_steps and not unscaled:
            return refined
        return replace(
            refined,
            severity=Severity.ERROR,
            discriminator=NONFINITE_STREAK,
            detail={
                **refined.detail,
                "nonfinite_steps": 1 if unscaled and steps < self.nonfinite_steps else steps,
                **({"since_step": first_step} if isinstance(first_step, int) else {}),
            },
        )

    def _end_runs_before(self, block: _Block, offset: int) -> None:
        """End the runs of the ranks that printed a finite loss since the last counted line."""
        begin = self._nonfinite_seen_to if self._nonfinite_seen_to is not None else block.begin
        self._nonfinite_seen_to = block.segment_end(offset)
        if not self._nonfinite or begin >= offset:
            return
        for line_start in self._progress_line_starts(block, begin, offset):
            parsed = self._parse_progress_at(block, line_start)
            if parsed is None or parsed[0].loss is None or not math.isfinite(parsed[0].loss):
                continue
            self._nonfinite.pop(_stream(parsed[1].rank, parsed[1].node), None)
            if not self._nonfinite:
                return

    # ------------------------------------------------------------------ progress

    def _sample_progress(self, block: _Block, base_line: int, block_lines: int) -> None:
        """Parse the last few progress lines of the block, and the one before a failure."""
        if self._last_failure_offset is not None:
            before = self._last_progress_before(block, self._last_failure_offset)
            self._failure_step = before.step if before is not None else self._last_step
        samples = self._last_progress_lines(block, self.progress_samples_per_block)
        for start, parsed, context in reversed(samples):
            # Samples sit near the end of the block: count the newlines after them, not before.
            after = block.data.count(b"\n", start, block.end)
            line_number = base_line + block_lines - after + 1
            self._progress.append(
                ProgressPoint(
                    line=line_number,
                    step=parsed.step,
                    rank=context.rank,
                    node=context.node,
                    at=context.at,
                    loss=parsed.loss,
                    throughput=parsed.throughput,
                    step_time_seconds=parsed.step_time_seconds,
                )
            )
            # After a loss that stayed non-finite, only a finite loss shows training recovered.
            finite = (
                math.isfinite(parsed.loss)
                if parsed.loss is not None
                else not self._last_failure_nonfinite
            )
            stream = _stream(context.rank, context.node)
            if (
                finite
                and parsed.loss is not None
                and stream in self._nonfinite
                and line_number > self._nonfinite_lines.get(stream, 0)
            ):
                del self._nonfinite[stream]
            if (
                finite
                and line_number > self._last_failure_line
                and (self._failure_step is None or parsed.step > self._failure_step)
            ):
                self._progress_after_failure += 1
            previous = self._last_step
            self._last_step = parsed.step if previous is None else max(previous, parsed.step)

    def _last_progress_lines(
        self, block: _Block, wanted: int
    ) -> list[tuple[int, progress_module.Progress, LineContext]]:
        """Up to ``wanted`` parsed progress lines, last first, searching back from the end."""
        found: list[tuple[int, progress_module.Progress, LineContext]] = []
        per_stream: dict[str, int] = {}
        most = self.progress_samples_per_stream
        skipped_in_a_row = 0
        end = block.end
        window = PROGRESS_WINDOW_BYTES
        while end > block.begin and len(found) < wanted:
            begin = block.line_start(max(end - window, block.begin))
            for start in self._progress_line_starts(block, begin, end):
                parsed = self._parse_progress_at(block, start)
                if parsed is None:
                    continue
                if most is not None:
                    stream = _stream(parsed[1].rank, parsed[1].node)
                    if per_stream.get(stream, 0) >= most:
                        skipped_in_a_row += 1
                        # Twice round every stream seen with nothing new: a rank that prints
                        # at all has been passed, unless it prints far less often than the rest.
                        if skipped_in_a_row > 2 * len(per_stream) + EXTRA_LINES_PAST_STREAMS:
                            return found
                        continue
                    skipped_in_a_row = 0
                    per_stream[stream] = per_stream.get(stream, 0) + 1
                found.append((start, *parsed))
                if len(found) >= wanted:
                    break
            end = begin
            window *= 4
        return found

    def _last_progress_before(self, block: _Block, offset: int) -> progress_module.Progress | None:
        begin = block.line_start(max(offset - PROGRESS_WINDOW_BYTES, block.begin))
        for start in self._progress_line_starts(block, begin, offset):
            parsed = self._parse_progress_at(block, start)
            if parsed is not None:
                return parsed[0]
        return None

    def _progress_line_starts(self, block: _Block, begin: int, end: int) -> list[int]:
        """Starts of the lines in ``[begin, end)`` the progress hint matches, last first."""
        matches = self._progress_hint.finditer(block.data, begin, end)
        return sorted({block.line_start(match.start()) for match in matches}, reverse=True)

    def _parse_progress_at(
        self, block: _Block, start: int
    ) -> tuple[progress_module.Progress, LineContext] | None:
        raw = block.data[start : block.segment_end(start)][: self.max_line_bytes]
        context = parse_line(_decode(raw))
        parsed = self.parser.parse_progress(context.message)
        return None if parsed is None else (parsed, context)

    def _record_checkpoint(self, line_number: int, context: LineContext) -> None:
        saved = self.parser.parse_checkpoint(context.message)
        started = None if saved else self.parser.parse_checkpoint_started(context.message)
        found = saved or started
        if found is None:
            return
        self._checkpoints.append(
            CheckpointPoint(
                line=line_number,
                step=found.step,
                path=found.path,
                at=context.at,
                completed=saved is not None,
            )
        )


def _valid_nonfinite_state(state: object) -> NonfiniteState:
    """A carried state as stored, or empty if it is not one (it is read back from JSON)."""
    if not isinstance(state, dict):
        return {}
    valid: NonfiniteState = {}
    for stream, value in list(state.items())[:MAX_NONFINITE_STREAMS]:
        if (
            isinstance(stream, str)
            and isinstance(value, list)
            and len(value) in (2, 3)
            and isinstance(value[0], int)
            and isinstance(value[1], str)
        ):
            first_step = value[2] if len(value) == 3 and isinstance(value[2], int) else None
            valid[stream] = [value[0], value[1], first_step]
    return valid
