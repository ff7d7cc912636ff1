"""Teaching a detection pattern from a line of a failure nothing explained.

When the scheduler confirms a death that no signature explains, the loop keeps the last lines
the job printed (``last_lines``). An operator picks the line that says what happened; this
module turns it into a pattern (``pattern_for_line``), shows what the pattern would change on
the labelled real cases and on the other unexplained failures (``preview``), and says why it
must not be saved (``Preview.refusals``):

* it makes a labelled healthy case a failure: a false alarm on a log known to be fine;
* it matches nothing but the line it was written for, and names no program that prints it:
  the rule every built-in signature follows (a pattern is never fitted to one case);
* its name is a built-in signature's, which it would silently replace.

Pure Python, no Django, like the rest of ``recovery.detection``: the caller reads the cases,
the other failures and the active signatures, and stores the pattern.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import re2

from recovery.detection.classify import Classification, classify_text
from recovery.detection.evaluation import Case
from recovery.detection.linear_regex import compile_linear, escape_literal
from recovery.detection.normalize import parse_line, strip_ansi
from recovery.detection.signature_set import SignatureSet
from recovery.detection.signatures import Signature
from recovery.detection.taxonomy import FailureCategory

# What an unexplained failure keeps of the job's output: enough to see how it ended, small
# enough to store with the anomaly.
LAST_LINES = 40
LINE_CHARS = 500

HEALTHY = FailureCategory.HEALTHY

# A token of a line: a hexadecimal number, a run of digits, or one other character.
_TOKENS = re.compile(r"(0[xX][0-9a-fA-F]+)|([0-9]+)|(.)", re.DOTALL)
HEX_DIGITS = "[0-9a-fA-F]+"
DIGITS = r"\d+"
_NAME_WORDS = re.compile(r"[a-z]+")
NAME_PREFIX = "taught-"
NAME_WORDS = 4


def last_lines(data: bytes, *, cut_at_start: bool) -> list[str]:
    """The last ``LAST_LINES`` non-blank lines of a read of a job's output, each cut to
    ``LINE_CHARS`` characters, as the scanner sees them: colours stripped, undecodable bytes
    replaced. ``cut_at_start``: the read began inside the file, so its first line is partial
    and is dropped."""
    text = strip_ansi(data).decode("utf-8", errors="replace")
    lines = text.splitlines()
    if cut_at_start and lines:
        lines = lines[1:]
    kept = [line.rstrip()[:LINE_CHARS] for line in lines if line.strip()]
    return kept[-LAST_LINES:]


def message_of(line: str) -> str:
    """The line without the prefixes launchers and loggers add (time, rank, host)."""
    return parse_line(line).message or line.strip()


def pattern_for_line(line: str) -> str:
    """A pattern for the message of ``line``: its words literally, every number any number.

    Leading timestamps, ranks and host names are dropped (``parse_line``); hexadecimal numbers
    (``0x7f3a``: addresses, handles) match any hexadecimal number and runs of digits (ranks,
    steps, pids, sizes) any run of digits, so the same failure on another rank, node or step
    matches too.
    """
    pieces: list[str] = []
    for hexadecimal, digits, other in _TOKENS.findall(message_of(line)):
        if hexadecimal:
            pieces.append(hexadecimal[:2] + HEX_DIGITS)
        elif digits:
            pieces.append(DIGITS)
        else:
            pieces.append(escape_literal(other))
    return "".join(pieces)


def suggested_name(line: str) -> str:
    """A signature name from the first words of the line's message: ``taught-cuda-launch-...``."""
    words = _NAME_WORDS.findall(message_of(line).lower())[:NAME_WORDS]
    return NAME_PREFIX + ("-".join(words) or "pattern")


def matches(compiled: re2._Regexp[str], line: str) -> bool:
    """Whether a signature's pattern matches ``line`` as the scanner tries it: on the message
    with its prefixes peeled off, or on the whole line."""
    return compiled.search(message_of(line)) is not None or compiled.search(line) is not None


@dataclass(frozen=True)
class Verdict:
    category: str
    attribution: str

    @classmethod
    def of(cls, classification: Classification) -> Verdict:
        return cls(classification.category, classification.attribution)

    @property
    def healthy(self) -> bool:
        return self.category == HEALTHY

    def __str__(self) -> str:
        return f"{self.category} / {self.attribution}"


@dataclass(frozen=True)
class ChangedCase:
    """A labelled case whose verdict the pattern changes, and the first line it matches there."""

    id: str
    source: str
    label: Verdict
    before: Verdict
    after: Verdict
    line: str

    @property
    def false_alarm(self) -> bool:
        """A log labelled healthy that the pattern makes a failure."""
        return self.label.healthy and not self.after.healthy

    @property
    def was_right(self) -> bool:
        return self.before == self.label

    @property
    def now_right(self) -> bool:
        return self.after == self.label


@dataclass(frozen=True)
class OtherMatch:
    """Another unexplained failure (its id) whose last lines the pattern matches."""

    key: int
    line: str


@dataclass(frozen=True)
class Refusal:
    """Why the pattern must not be saved; ``field`` is the form field it concerns ("" for the
    pattern as a whole)."""

    field: str
    message: str


@dataclass(frozen=True)
class Preview:
    """What saving the pattern would change, and what forbids saving it."""

    matched_cases: list[str]
    changed: list[ChangedCase]
    other_failures: list[OtherMatch]
    refusals: list[Refusal] = field(default_factory=list)

    @property
    def false_alarms(self) -> list[ChangedCase]:
        return [case for case in self.changed if case.false_alarm]

    @property
    def acceptable(self) -> bool:
        return not self.refusals


def preview(
    candidate: Signature,
    before: SignatureSet,
    cases: Sequence[Case],
    other_failures: Mapping[int, Sequence[str]],
) -> Preview:
    """Classify the labelled cases with and without ``candidate``; list what changes.

    ``before`` is the signature set the detectors use now; ``other_failures`` the last lines of
    the other unexplained failures, by their ids. Only the cases
    with a line the pattern matches are classified: a signature that matches no line of a log
    adds no finding to it and cannot change its verdict. The pattern must compile with RE2
    (``compile_linear``): the caller validates it first.
    """
    compiled = compile_linear(candidate.pattern)
    after = before.with_overrides([candidate])
    matched: list[str] = []
    changed: list[ChangedCase] = []
    for case in cases:
        line = _first_match(compiled, case.log.split("\n"))
        if line is None:
            continue
        matched.append(case.id)
        was = Verdict.of(classify_text(case.log, signatures=before))
        now = Verdict.of(classify_text(case.log, signatures=after))
        if was != now:
            label = Verdict(case.category, case.attribution)
            changed.append(ChangedCase(case.id, case.source, label, was, now, line))
    others = [
        OtherMatch(key, line)
        for key, lines in other_failures.items()
        if (line := _first_match(compiled, lines)) is not None
    ]
    found = Preview(matched, changed, others)
    return Preview(matched, changed, others, refusals(candidate, before, found))


def refusals(candidate: Signature, before: SignatureSet, found: Preview) -> list[Refusal]:
    """Why ``candidate`` must not be saved, given its preview; empty when it may be."""
    refused: list[Refusal] = []
    existing = before.by_name.get(candidate.name)
    if existing is not None and existing.builtin:
        refused.append(
            Refusal(
                "name",
                f"A built-in signature is named {candidate.name!r}: saving would replace it. "
                "Choose another name.",
            )
        )
    if found.false_alarms:
        shown = ", ".join(case.id for case in found.false_alarms[:10])
        refused.append(
            Refusal(
                "pattern",
                f"The pattern makes {len(found.false_alarms)} labelled healthy log(s) a failure "
                f"(false alarms: {shown}). Make it match only the failure.",
            )
        )
    if not found.matched_cases and not found.other_failures and not candidate.printed_by.strip():
        refused.append(
            Refusal(
                "pattern",
                "The pattern matches no labelled case and no other unexplained failure: it is "
                "fitted to this one line. Generalise it so it also matches another known "
                "failure, or name the program that prints the message (printed by).",
            )
        )
    return refused


def _first_match(compiled: re2._Regexp[str], lines: Iterable[str]) -> str | None:
    return next((line for line in lines if matches(compiled, line)), None)
