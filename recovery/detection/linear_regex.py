"""Compile user-supplied patterns with RE2, a linear-time engine.

RE2 has no backreferences or lookaround, so no pattern, however it is written, can make a
match take more than linear time in the length of the line. Patterns that need those
features are refused with the engine's reason rather than run on a backtracking engine.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from dataclasses import dataclass

import re2

MAX_PATTERN_LENGTH = 4000

_OPTIONS = re2.Options()
_OPTIONS.log_errors = False


class PatternError(ValueError):
    """A pattern that cannot be used, with a message meant for the person who wrote it."""


@functools.lru_cache(maxsize=4096)
def compile_linear(pattern: str) -> re2._Regexp[str]:
    """Compile ``pattern`` with RE2 or raise ``PatternError`` explaining why it cannot be.

    Kept: a scanner is made for every read, and compiling is most of what making one costs.
    """
    if not pattern or not pattern.strip():
        raise PatternError("The pattern is empty.")
    if len(pattern) > MAX_PATTERN_LENGTH:
        raise PatternError(
            f"The pattern is {len(pattern)} characters long; the limit is {MAX_PATTERN_LENGTH}."
        )
    try:
        compiled = re2.compile(pattern, _OPTIONS)  # the engine's own checks and messages
        return _AsciiFast(compiled.pattern, _OPTIONS)
    except re2.error as exc:
        reason = exc.args[0] if exc.args else "invalid pattern"
        if isinstance(reason, bytes):
            reason = reason.decode("utf-8", "replace")
        raise PatternError(
            f"The pattern does not compile with the linear-time engine (RE2): {reason}. "
            "Backreferences and lookaround are not supported."
        ) from None


_NO_MATCH = (-1, -1)
# The engine's anchors, which the wrapper keeps to itself (and its stubs leave out).
_ANCHOR = re2._Anchor  # type: ignore[attr-defined]


class _AsciiFast(re2._Regexp):  # type: ignore[type-arg]  # generic in the stubs only
    """RE2 with a shortcut for ASCII text, the common case in logs.

    The wrapper's ``search`` and ``match`` map byte offsets to character offsets through a
    generator on every call, several microseconds each, and every line of every job's output
    goes through many of them. In ASCII text the two offsets are the same: the engine's spans
    are used as they are. The engine, and so the linear time, is the same.
    """

    __slots__ = ()

    def search(self, text, pos=None, endpos=None):  # type: ignore[no-untyped-def]
        if pos is None and endpos is None and isinstance(text, str) and text.isascii():
            return self._fast(_ANCHOR.UNANCHORED, text)
        return super().search(text, pos, endpos)

    def match(self, text, pos=None, endpos=None):  # type: ignore[no-untyped-def]
        if pos is None and endpos is None and isinstance(text, str) and text.isascii():
            return self._fast(_ANCHOR.ANCHOR_START, text)
        return super().match(text, pos, endpos)

    def _fast(self, anchor: object, text: str) -> re2._Match[str] | None:
        engine = self._regexp  # type: ignore[attr-defined]  # the wrapper's own slot
        spans = engine.Match(anchor, text.encode("ascii"), 0, len(text))
        if spans[0] == _NO_MATCH:
            return None
        return re2._Match(self, text, 0, len(text), spans)


@dataclass(frozen=True)
class ExampleMismatch:
    line: str
    expected_match: bool


def check_examples(
    compiled: re2._Regexp[str], examples: Iterable[str], counter_examples: Iterable[str]
) -> list[ExampleMismatch]:
    """Return every example the pattern misses and every counter-example it matches."""
    mismatches = [
        ExampleMismatch(line, expected_match=True)
        for line in examples
        if compiled.search(line) is None
    ]
    mismatches += [
        ExampleMismatch(line, expected_match=False)
        for line in counter_examples
        if compiled.search(line) is not None
    ]
    return mismatches


def healthy_lines_matched(compiled: re2._Regexp[str]) -> list[str]:
    """The ordinary healthy lines a failure pattern would fire on (it must fire on none)."""
    from recovery.detection.healthy_lines import HEALTHY_LINES

    return [line for line in HEALTHY_LINES if compiled.search(line) is not None]


def example_lines(text: str) -> list[str]:
    """Split an admin text area into example lines, ignoring blank ones."""
    return [line.rstrip("\r") for line in text.split("\n") if line.strip()]


# The characters RE2 (and Hyperscan) read as operators outside a class.
_OPERATORS = frozenset("\\.+*?()|[]{}^$")


def escape_literal(text: str) -> str:
    """``text`` as an RE2 pattern that matches exactly it."""
    return "".join(f"\\{char}" if char in _OPERATORS else char for char in text)


def compile_linear_bytes(pattern: str) -> re2._Regexp[bytes]:
    """Compile ``pattern`` with RE2 for searching bytes (chunks of log files)."""
    compile_linear(pattern)  # the same checks and messages as for text
    return _compile_bytes(pattern)


@functools.lru_cache(maxsize=4096)
def _compile_bytes(pattern: str) -> re2._Regexp[bytes]:
    return re2.compile(pattern.encode(), _OPTIONS)
