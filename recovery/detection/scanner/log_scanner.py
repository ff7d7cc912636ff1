"""``LogScanner``: bytes fed in, complete lines located with the engine, failure lines
examined and counted as occurrences of their best signature.

The core of the scanner; what it follows across lines (tracebacks, progress, non-finite
losses) is in the mixins it is made of.
"""

from __future__ import annotations

from collections import deque
from dataclasses import replace
from typing import Any

from recovery.detection import progress as progress_module
from recovery.detection.engine import Locator, LocatorPattern
from recovery.detection.findings import CRASH, DIVERGENCE
from recovery.detection.linear_regex import compile_linear, compile_linear_bytes
from recovery.detection.normalize import LineContext, parse_line, strip_ansi
from recovery.detection.quiet_phases import EVALUATION_HINT, parse_evaluation_start
from recovery.detection.refine import Refined, refine
from recovery.detection.scanner.lines import _Block, _decode
from recovery.detection.scanner.progress_sampling import (
    DEFAULT_NONFINITE_STEPS,
    NONFINITE_STREAK,
    _ProgressSampling,
    _valid_nonfinite_state,
)
from recovery.detection.scanner.results import (
    CheckpointPoint,
    EvaluationPoint,
    NonfiniteState,
    Occurrences,
    ProgressPoint,
    ScanResult,
)
from recovery.detection.scanner.traceback_chains import _TracebackChains
from recovery.detection.signature_set import SignatureSet
from recovery.detection.signatures import (
    GENERIC_EXCEPTION,
    NONFINITE_PROGRESS_VALUE,
    Signature,
)
from recovery.detection.taxonomy import Severity
from recovery.detection.tracebacks import Printed

CHECKPOINT_ID = 1_000_000
EVALUATION_ID = 1_000_001
PORT_ACTIVE_ID = 1_000_002
# An InfiniBand port that went down and came back: NCCL prints both async events.
PORT_ACTIVE_HINT = r"Got async event : port active"
_PORT_EVENT = compile_linear(r"(\S+) Got async event : port (error|active)")
LINE_CACHE_SIZE = 4096
# Lines that may report a finished or started checkpoint save. Literal phrases, so the engine
# finds them at full speed; lines that merely mention checkpointing (torch.utils.checkpoint
# warnings) are not examined. The parser decides; a test checks this covers its examples.
CHECKPOINT_SAVE_HINT = (
    r"(?i)sav(?:e|ed|ing) (?:the |a |new |best |last |latest |final |model )?"
    r"(?:checkpoint|ckpt|model)"
    r"|(?:checkpoint|ckpt)s? (?:(?:was|is|has|have|been|successfully) )*"
    r"(?:saved|written|stored|persisted)"
    r"|(?:checkpoint|ckpt) save|is ready now|finalized successfully"
    r"|(?:wrote|written|writing|stored|persisted) (?:the |a |new |best |last |latest |final |"
    r"model |distributed |sharded )*(?:checkpoint|ckpt|model)"
)

MAX_PROGRESS_KEPT = 2000
MAX_CHECKPOINTS_KEPT = 200
IGNORED_EXCEPTION = "python-exception-ignored"
IGNORED_EXCEPTION_REACH = 12  # lines from "Exception ignored in" to the exception it names


class LogScanner(_TracebackChains, _ProgressSampling):
    """Scan a log incrementally; ``result()`` may be called at any time.

    Failure lines are all examined (identical lines only once). Progress is sampled: after each
    block, the last ``progress_samples_per_block`` progress lines are parsed, which is what
    hang and straggler detection need (the latest step, per rank) at a cost that does not grow
    with the number of progress lines. With ``progress_samples_per_stream``, each rank (or node)
    keeps at most that many of them, and the search back ends once the lines found go round
    every stream seen without adding one: the last lines of every rank, at a cost that grows
    with the ranks, not with the lines. Checkpoint lines are all examined.
    """

    def __init__(
        self,
        signatures: SignatureSet | None = None,
        *,
        parser: progress_module.ProgressParser | None = None,
        engine: str = "auto",
        max_line_bytes: int = 64 * 1024,
        max_carry_bytes: int = 1024 * 1024,
        track_progress: bool = True,
        progress_samples_per_block: int = 4,
        progress_samples_per_stream: int | None = None,
        nonfinite_steps: int = DEFAULT_NONFINITE_STEPS,
        nonfinite_state: NonfiniteState | None = None,
    ) -> None:
        self.signatures = signatures or SignatureSet.builtin()
        self.parser = parser or _default_parser()
        self.track_progress = track_progress
        extra: tuple[LocatorPattern, ...] = (LocatorPattern(PORT_ACTIVE_ID, PORT_ACTIVE_HINT),)
        if track_progress:
            extra += (
                *(
                    LocatorPattern(CHECKPOINT_ID, hint, True)
                    for hint in (CHECKPOINT_SAVE_HINT, *self.parser.checkpoint_hints[1:])
                ),
                LocatorPattern(EVALUATION_ID, EVALUATION_HINT.removeprefix("(?i)"), True),
            )
            self._progress_hint = compile_linear_bytes(
                "|".join(f"(?:{hint})" for hint in self.parser.progress_hints)
            )
        self.locator: Locator = self.signatures.locator(engine, extra)
        self.max_line_bytes = max_line_bytes
        self.max_carry_bytes = max_carry_bytes
        self.progress_samples_per_block = progress_samples_per_block
        self.progress_samples_per_stream = progress_samples_per_stream
        self._carry = b""
        self._line = 0  # newlines consumed so far
        self._bytes = 0
        self._occurrences: dict[tuple[str, str], Occurrences] = {}
        self._line_cache: dict[bytes, tuple[LineContext, Signature, Refined] | None] = {}
        self._progress: deque[ProgressPoint] = deque(maxlen=MAX_PROGRESS_KEPT)
        self._checkpoints: deque[CheckpointPoint] = deque(maxlen=MAX_CHECKPOINTS_KEPT)
        self._evaluations: deque[EvaluationPoint] = deque(maxlen=MAX_CHECKPOINTS_KEPT)
        self._last_failure_line = 0
        self._last_failure_offset: int | None = None  # in the block being scanned
        self._failure_step: int | None = None
        self._progress_after_failure = 0
        self._last_step: int | None = None
        self._ignored_exception_line = -IGNORED_EXCEPTION_REACH - 1
        self.nonfinite_steps = max(1, nonfinite_steps)
        self._nonfinite: NonfiniteState = _valid_nonfinite_state(nonfinite_state)
        self._nonfinite_seen_to: int | None = None  # in the block being scanned
        self._nonfinite_lines: dict[str, int] = {}  # the line of each stream's last count
        self._last_failure_nonfinite = False
        # How each chain of tracebacks was printed, and per stream its current chain and the
        # line of that chain's last header.
        self._chains: list[Printed] = []
        self._tracebacks: dict[str, tuple[int, int]] = {}
        # Ports seen going down and not yet back, per (node, device): the findings that said so.
        self._ports_down: dict[tuple[str, str], tuple[str, str]] = {}

    # ------------------------------------------------------------------ feeding

    def feed(self, data: bytes) -> None:
        """Scan the complete lines in ``carry + data``; keep the unfinished last line.

        The bulk of ``data`` is scanned where it lies, without copying: only the carried partial
        line and the rest of its line are joined.
        """
        if not data:
            return
        self._bytes += len(data)
        begin = 0
        if self._carry:
            newline = data.find(b"\n")
            if newline == -1:
                self._carry += data
                self._limit_carry()
                return
            head = self._carry + data[: newline + 1]
            self._carry = b""
            self._scan_block(_Block(head, 0, len(head)))
            begin = newline + 1
        cut = data.rfind(b"\n", begin) + 1
        if cut == 0:
            self._carry = data[begin:]
            self._limit_carry()
            return
        self._carry = data[cut:]
        self._limit_carry()
        if cut > begin:
            self._scan_block(_Block(data, begin, cut))

    def _limit_carry(self) -> None:
        """A line with no end in sight is examined as it is, so memory stays bounded."""
        if len(self._carry) > self.max_carry_bytes:
            block, self._carry = self._carry, b""
            self._scan_block(_Block(block, 0, len(block)), counts_line=False)

    def finish(self) -> ScanResult:
        """Scan what is left (a last line without newline) and return the result."""
        if self._carry:
            block, self._carry = self._carry + b"\n", b""
            self._scan_block(_Block(block, 0, len(block)), counts_line=False)
        return self.result()

    def result(self) -> ScanResult:
        findings = [o.to_finding(self._chains) for o in self._occurrences.values()]
        findings.sort(key=lambda f: (-f.detail["priority"], f.first_line or 0))
        return ScanResult(
            findings=findings,
            progress=list(self._progress),
            checkpoints=list(self._checkpoints),
            lines=self._line,
            bytes=self._bytes,
            progress_lines=len(self._progress),
            checkpoint_lines=len(self._checkpoints),
            progress_after_last_failure=self._progress_after_failure,
            engine=self.locator.name,
            nonfinite_state={stream: list(value) for stream, value in self._nonfinite.items()},
            evaluations=list(self._evaluations),
        )

    # ------------------------------------------------------------------ scanning

    def _scan_block(self, block: _Block, counts_line: bool = True) -> None:
        if block.data.find(b"\x1b", block.begin, block.end) != -1:
            cleaned = strip_ansi(block.data[block.begin : block.end])
            block = _Block(cleaned, 0, len(cleaned))
        view = memoryview(block.data)[block.begin : block.end]
        hits = self.locator.locate(view)  # type: ignore[arg-type]
        base_line = self._line
        newlines = block.data.count(b"\n", block.begin, block.end)
        self._line += newlines if counts_line else max(newlines - 1, 0)
        self._last_failure_offset = None
        self._nonfinite_seen_to = None
        if hits:
            self._examine_hits(block, base_line, newlines, hits)
        if self.track_progress:
            self._sample_progress(block, base_line, newlines)

    def _examine_hits(
        self, block: _Block, base_line: int, block_lines: int, hits: list[tuple[int, int]]
    ) -> None:
        data, first, last = block.data, block.begin, block.end
        segments: dict[int, tuple[int, set[int], int]] = {}
        for pattern_id, relative_end in hits:
            end = first + relative_end
            position = min(max(end - 1, first), last - 1)
            if data[position] in b"\r\n" and position > first:
                position -= 1
            start = block.line_start(position + 1)
            known = segments.get(start)
            if known is None:
                segments[start] = (position, {pattern_id}, end)
            else:
                known[1].add(pattern_id)
        starts = sorted(segments)
        # Count newlines from whichever end of the block is nearer the hits.
        if starts[0] - first > last - starts[0]:
            line = base_line + block_lines - data.count(b"\n", starts[0], last)
            cursor = starts[0]
        else:
            line = base_line
            cursor = first
        for start in starts:
            line += data.count(b"\n", cursor, start)
            cursor = start
            position, pattern_ids, match_end = segments[start]
            stop = block.segment_end(position)
            raw = data[start:stop]
            if len(raw) > self.max_line_bytes:
                relative = match_end - start
                window = self.max_line_bytes // 2
                raw = raw[max(relative - window, 0) : relative + window]
            self._examine(block, start, stop, line + 1, raw, pattern_ids)

    def _examine(
        self,
        block: _Block,
        start: int,
        stop: int,
        line_number: int,
        raw: bytes,
        pattern_ids: set[int],
    ) -> None:
        exhaustive = not self.locator.reports_every_pattern
        if self.track_progress and (exhaustive or pattern_ids & {CHECKPOINT_ID, EVALUATION_ID}):
            line = parse_line(_decode(raw))
            self._record_checkpoint(line_number, line)
            if parse_evaluation_start(line.message):
                self._evaluations.append(EvaluationPoint(line=line_number, at=line.at))
        if exhaustive or PORT_ACTIVE_ID in pattern_ids:
            self._port_came_back(parse_line(_decode(raw)))
        if not exhaustive and all(i >= CHECKPOINT_ID for i in pattern_ids):
            return
        analysed = self._analyse(raw, pattern_ids)
        if analysed is None:
            return
        context, signature, refined = analysed
        chain = None
        if refined.severity != Severity.WARNING:
            chain = self._traceback_chain(block, start, stop, line_number, context)
        if signature.name == IGNORED_EXCEPTION:
            self._ignored_exception_line = line_number
        elif (
            signature.name in (GENERIC_EXCEPTION, "python-traceback")
            and line_number - self._ignored_exception_line <= IGNORED_EXCEPTION_REACH
        ):
            # The exception Python just said it ignored (typically at interpreter shutdown).
            refined = replace(refined, severity=Severity.WARNING)
        elif signature.name == NONFINITE_PROGRESS_VALUE:
            refined = self._count_nonfinite_step(block, start, line_number, context, refined)
        key = (signature.name, refined.discriminator)
        occurrences = self._occurrences.get(key)
        if occurrences is None:
            occurrences = Occurrences(
                signature=signature,
                category=refined.category,
                attribution=refined.attribution,
                severity=refined.severity,
                priority=refined.priority,
                evidence=context.message[:1000],
                first_line=line_number,
                excerpt=block.excerpt(start, stop),
                at=context.at,
                detail=refined.detail,
                # A loss that stays NaN while training goes on: not a process that died.
                kind=DIVERGENCE if refined.discriminator == NONFINITE_STREAK else CRASH,
            )
            self._occurrences[key] = occurrences
        occurrences.add(line_number, context, chain)
        port = _PORT_EVENT.search(context.message)
        if port is not None and port.group(2) == "error" and refined.severity != Severity.WARNING:
            self._ports_down[(context.node or "", port.group(1))] = key
            occurrences.severity = refined.severity
            occurrences.detail.pop("recovered", None)
        if refined.severity != Severity.WARNING:
            self._last_failure_nonfinite = signature.name == NONFINITE_PROGRESS_VALUE
            self._last_failure_line = line_number
            self._last_failure_offset = start
            self._progress_after_failure = 0

    def _port_came_back(self, context: LineContext) -> None:
        """A port that went down and is active again was a flap the job survived: its error
        is a warning, unless another port it took down is still down."""
        port = _PORT_EVENT.search(context.message)
        if port is None or port.group(2) != "active":
            return
        key = self._ports_down.pop((context.node or "", port.group(1)), None)
        if key is None or key not in self._occurrences:
            return
        if any(other == key for other in self._ports_down.values()):
            return
        occurrences = self._occurrences[key]
        occurrences.severity = Severity.WARNING
        occurrences.detail["recovered"] = "the port was active again"

    def _analyse(
        self, raw: bytes, pattern_ids: set[int]
    ) -> tuple[LineContext, Signature, Refined] | None:
        """Context, best signature and meaning of one line; identical lines are analysed once."""
        if raw in self._line_cache:
            return self._line_cache[raw]
        text = _decode(raw)
        context = parse_line(text)
        if self.locator.reports_every_pattern:
            signature_ids = [i for i in pattern_ids if i < CHECKPOINT_ID]
        else:
            signature_ids = list(range(len(self.signatures.signatures)))
        analysed = None
        best = self._best_signature(signature_ids, context.message, text) if signature_ids else None
        if best is not None:
            refined = refine(best, context.message or text)
            if refined is not None:
                analysed = (context, best, refined)
        if len(self._line_cache) >= LINE_CACHE_SIZE:
            self._line_cache.clear()
        self._line_cache[raw] = analysed
        return analysed

    def _best_signature(
        self, signature_ids: list[int], message: str, text: str
    ) -> Signature | None:
        confirmed: list[int] = []
        for index in signature_ids:
            compiled = self.signatures.compiled[index]
            if compiled.search(message) is not None or compiled.search(text) is not None:
                confirmed.append(index)
        if not confirmed:
            return None
        specific = [i for i in confirmed if not self.signatures.is_generic(i)]
        candidates = specific or confirmed
        signatures = self.signatures.signatures
        # Ties go to the signature declared first, so the verdict never depends on set order.
        best = max(candidates, key=lambda i: (signatures[i].priority, -i))
        return signatures[best]


_default: progress_module.ProgressParser | None = None


def _default_parser() -> progress_module.ProgressParser:
    global _default
    if _default is None:
        _default = progress_module.ProgressParser()
    return _default


def scan_text(text: str | bytes, **options: Any) -> ScanResult:
    """Scan a whole log held in memory."""
    scanner = LogScanner(**options)
    scanner.feed(text.encode("utf-8", errors="replace") if isinstance(text, str) else text)
    return scanner.finish()
