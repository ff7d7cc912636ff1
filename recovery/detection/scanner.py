"""Streaming log scanner: bytes in, findings and progress out, in bounded memory.

Feed it chunks read from any byte offset; it keeps the partial last line for the next chunk,
locates candidate lines for the whole chunk in one pass of a multi-pattern engine, and only
decodes and parses those. Lines longer than ``max_line_bytes`` are examined around the match;
a line with no newline for longer than ``max_carry_bytes`` is cut, so memory stays flat however
the input is shaped. Undecodable bytes are replaced, never fatal.
"""

from __future__ import annotations

import hashlib
import math
from collections import deque
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from recovery.detection import progress as progress_module
from recovery.detection.engine import Locator, LocatorPattern
from recovery.detection.findings import CRASH, DIVERGENCE, Finding, FindingSource
from recovery.detection.linear_regex import compile_linear, compile_linear_bytes
from recovery.detection.normalize import LineContext, parse_line, strip_ansi
from recovery.detection.quiet_phases import EVALUATION_HINT, parse_evaluation_start
from recovery.detection.refine import Refined, refine
from recovery.detection.signature_set import SignatureSet
from recovery.detection.signatures import (
    CATEGORY_PRIORITY,
    GENERIC_EXCEPTION,
    NONFINITE_PROGRESS_VALUE,
    Signature,
)
from recovery.detection.taxonomy import Severity
from recovery.detection.tracebacks import (
    NEIGHBOUR_LINES,
    TRACEBACK_REACH,
    Printed,
    continues_chain,
    is_header,
    least_handled,
    printed_as,
)

CHECKPOINT_ID = 1_000_000
EVALUATION_ID = 1_000_001
PORT_ACTIVE_ID = 1_000_002
# An InfiniBand port that went down and came back: NCCL prints both async events.
PORT_ACTIVE_HINT = r"Got async event : port active"
_PORT_EVENT = compile_linear(r"(\S+) Got async event : port (error|active)")
LINE_CACHE_SIZE = 4096
PROGRESS_WINDOW_BYTES = 8 * 1024
# Lines of streams that already have their samples read past before the search back ends,
# beyond two rounds of the streams seen.
EXTRA_LINES_PAST_STREAMS = 16
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

MAX_RANKS_KEPT = 4096
MAX_NODES_KEPT = 1024
MAX_PROGRESS_KEPT = 2000
MAX_CHECKPOINTS_KEPT = 200
EXCERPT_CONTEXT_LINES = 3
IGNORED_EXCEPTION = "python-exception-ignored"
IGNORED_EXCEPTION_REACH = 12  # lines from "Exception ignored in" to the exception it names
MAX_EXCERPT_CHARS = 4000
# A loss or gradient norm that is not a number for this many logged steps in a row (per rank) is
# a failure; one is a loss scaler skipping an overflowing fp16 step. Policies may set another
# count. With the loss scale at 1 there is no scaler to skip the step: one is a failure.
DEFAULT_NONFINITE_STEPS = 2
NONFINITE_STREAK = "consecutive"
MAX_NONFINITE_STREAMS = 4096
_NO_LOSS_SCALING = compile_linear(
    r"(?i)loss[ _]scale['\"]?\s{0,3}[:=]?\s{0,3}1(?:\.0*)?(?:[^.\d]|$)"
)

# Per stream: [steps in a row, the last counted line's digest, the run's first step or None].
NonfiniteState = dict[str, list[int | str | None]]


@dataclass(frozen=True)
class ProgressPoint:
    line: int
    step: int
    rank: int | None
    node: str | None
    at: datetime | None
    loss: float | None
    throughput: float | None
    step_time_seconds: float | None


@dataclass(frozen=True)
class CheckpointPoint:
    line: int
    step: int | None
    path: str | None
    at: datetime | None
    completed: bool


@dataclass(frozen=True)
class EvaluationPoint:
    """A line announcing that an evaluation pass begins."""

    line: int
    at: datetime | None


@dataclass
class Occurrences:
    """Everything seen of one signature (and discriminator) in a log."""

    signature: Signature
    category: str
    attribution: str
    severity: str
    priority: int
    evidence: str
    first_line: int
    excerpt: str
    at: datetime | None
    detail: dict[str, Any]
    kind: str = CRASH
    count: int = 0
    last_line: int = 0
    ranks: set[int] = field(default_factory=set)
    nodes: set[str] = field(default_factory=set)
    # The chains of tracebacks it was printed in (indexes into the scanner's chains), if any,
    # each with the first line it was printed on in that chain.
    chains: dict[int, int] = field(default_factory=dict)

    # Nodes that printed a line which accuses another node (or nobody).
    witnesses: set[str] = field(default_factory=set)

    def add(self, line: int, context: LineContext, chain: int | None = None) -> None:
        self.count += 1
        if chain is not None:
            self.chains.setdefault(chain, line)
        self.last_line = line
        if context.rank is not None and len(self.ranks) < MAX_RANKS_KEPT:
            self.ranks.add(context.rank)
        accused, witness = _accused_node(self.signature, context)
        if accused and len(self.nodes) < MAX_NODES_KEPT:
            self.nodes.add(accused)
        if witness and len(self.witnesses) < MAX_NODES_KEPT:
            self.witnesses.add(witness)

    def to_finding(self, chains: list[Printed]) -> Finding:
        """The finding; ``chains`` says how each chain of tracebacks was printed."""
        implicates = self.signature.implicates_nodes
        printed = least_handled({chains[chain] for chain in self.chains})
        reporters = self.witnesses if implicates else self.witnesses | self.nodes
        witnesses = (
            {"reported_by_nodes": sorted(reporters)[:32]} if reporters or not implicates else {}
        )
        return Finding(
            kind=self.kind,
            category=self.category,
            attribution=self.attribution,
            severity=self.severity,
            signature=self.signature.name,
            evidence=self.evidence,
            source=FindingSource.LOG,
            count=self.count,
            first_line=self.first_line,
            nodes=sorted(self.nodes) if implicates else [],
            ranks=sorted(self.ranks) if implicates else [],
            at=self.at,
            implicates_nodes=implicates,
            chains=dict(self.chains),
            detail={
                **self.detail,
                **witnesses,
                **({"printed": str(printed)} if self.chains else {}),
                "role": self.signature.role,
                "reports_exit": self.signature.reports_exit,
                "priority": self.priority,
                "last_line": self.last_line,
                "excerpt": self.excerpt,
            },
        )


def _accused_node(signature: Signature, context: LineContext) -> tuple[str | None, str | None]:
    """(The node a line accuses, the node that printed it as a mere witness)."""
    if not signature.accused_node:
        return context.node, None
    hit = compile_linear(signature.accused_node).search(context.message)
    if hit is None:
        return None, context.node
    named = next((group for group in hit.groups() if group), None)
    if named is None:
        return context.node, None
    return named, (context.node if context.node != named else None)


@dataclass
class ScanResult:
    findings: list[Finding]
    progress: list[ProgressPoint]
    checkpoints: list[CheckpointPoint]
    lines: int
    bytes: int
    progress_lines: int
    checkpoint_lines: int
    progress_after_last_failure: int
    engine: str
    # Carry to the next read of the same output (``LogScanner(nonfinite_state=...)``).
    nonfinite_state: NonfiniteState = field(default_factory=dict)
    evaluations: list[EvaluationPoint] = field(default_factory=list)


class LogScanner:
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

    # ------------------------------------------------------------------ tracebacks

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


_default: progress_module.ProgressParser | None = None


def _default_parser() -> progress_module.ProgressParser:
    global _default
    if _default is None:
        _default = progress_module.ProgressParser()
    return _default


def _stream(rank: int | None, node: str | None) -> str:
    return str(rank) if rank is not None else (node or "")


def _same_stream(one: LineContext, other: LineContext) -> bool:
    """Whether two lines may come from one process: the same rank, or node, where both say."""
    if one.rank is not None and other.rank is not None:
        return one.rank == other.rank
    if one.node and other.node:
        return one.node == other.node
    return True


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


def scan_text(text: str | bytes, **options: Any) -> ScanResult:
    """Scan a whole log held in memory."""
    scanner = LogScanner(**options)
    scanner.feed(text.encode("utf-8", errors="replace") if isinstance(text, str) else text)
    return scanner.finish()


__all__ = ["CATEGORY_PRIORITY", "LogScanner", "ScanResult", "scan_text"]
