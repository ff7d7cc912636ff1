"""The parser the scanner uses: per-policy patterns first, then the built-in shapes."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from recovery.detection.linear_regex import PatternError, compile_linear
from recovery.detection.progress.checkpoints import (
    SAVED,
    STARTED,
    classify_builtin_checkpoint,
    clean_path,
)
from recovery.detection.progress.fields import to_float, to_int
from recovery.detection.progress.formats import NOT_PROGRESS, recognise_progress
from recovery.detection.progress.records import CHECKPOINT_HINT, PROGRESS_HINT, Checkpoint, Progress

if TYPE_CHECKING:
    from re2 import _Regexp as CompiledPattern

_PROGRESS_OVERRIDE_GROUPS = frozenset({"step", "loss", "throughput", "total"})
_CHECKPOINT_OVERRIDE_GROUPS = frozenset({"step", "path"})


def _compile_override(
    pattern: str, allowed: frozenset[str], required: str | None
) -> CompiledPattern[str]:
    compiled = compile_linear(pattern)
    names = set(compiled.groupindex)
    if required and required not in names:
        raise PatternError(
            f"The pattern needs a named group (?P<{required}>...) that captures the step number."
        )
    unknown = sorted(names - allowed)
    if unknown:
        raise PatternError(
            f"Unknown named group(s) {', '.join(unknown)}; allowed: {', '.join(sorted(allowed))}."
        )
    return compiled


class ProgressParser:
    """Reads progress and checkpoint lines, trying per-policy patterns before the built-ins.

    A progress override must capture ``step`` and may capture ``loss``, ``throughput`` and
    ``total``; a checkpoint override may capture ``step`` and ``path``. Anything else raises
    ``PatternError`` when the parser is built, so a bad policy fails when it is saved, not
    silently on a live log.
    """

    def __init__(
        self, progress_patterns: Sequence[str] = (), checkpoint_patterns: Sequence[str] = ()
    ) -> None:
        self._progress_patterns = tuple(progress_patterns)
        self._checkpoint_patterns = tuple(checkpoint_patterns)
        self._progress_overrides = [
            _compile_override(pattern, _PROGRESS_OVERRIDE_GROUPS, "step")
            for pattern in self._progress_patterns
        ]
        self._checkpoint_overrides = [
            _compile_override(pattern, _CHECKPOINT_OVERRIDE_GROUPS, None)
            for pattern in self._checkpoint_patterns
        ]

    @property
    def progress_hints(self) -> tuple[str, ...]:
        """Pre-filter patterns covering every line ``parse_progress`` can accept."""
        return (PROGRESS_HINT, *self._progress_patterns)

    @property
    def checkpoint_hints(self) -> tuple[str, ...]:
        """Pre-filter patterns covering every line the checkpoint parsers can accept."""
        return (CHECKPOINT_HINT, *self._checkpoint_patterns)

    def parse_progress(self, message: str) -> Progress | None:
        if self._classify_checkpoint(message) is not None:
            return None
        for compiled in self._progress_overrides:
            match = compiled.search(message)
            if match is None:
                continue
            step = to_int(match.group("step"))
            if step is None:
                continue
            groups = match.groupdict()
            return Progress(
                step=step,
                total_steps=to_int(groups.get("total")),
                loss=to_float(groups.get("loss")),
                throughput=to_float(groups.get("throughput")),
                framework="custom",
            )
        if NOT_PROGRESS.search(message):
            return None
        return recognise_progress(message)

    def parse_checkpoint(self, message: str) -> Checkpoint | None:
        """A finished checkpoint save, or None."""
        outcome = self._classify_checkpoint(message)
        return outcome[1] if outcome and outcome[0] == SAVED else None

    def parse_checkpoint_started(self, message: str) -> Checkpoint | None:
        """A save that has begun and will be confirmed by a later line, or None."""
        outcome = self._classify_checkpoint(message)
        return outcome[1] if outcome and outcome[0] == STARTED else None

    def _classify_checkpoint(self, message: str) -> tuple[str, Checkpoint] | None:
        for compiled in self._checkpoint_overrides:
            match = compiled.search(message)
            if match is not None:
                groups = match.groupdict()
                return SAVED, Checkpoint(
                    step=to_int(groups.get("step")),
                    path=clean_path(groups.get("path")),
                    framework="custom",
                )
        return classify_builtin_checkpoint(message)


_DEFAULT_PARSER = ProgressParser()


def parse_progress(message: str) -> Progress | None:
    """Built-in progress parsing, for callers without per-policy patterns."""
    return _DEFAULT_PARSER.parse_progress(message)


def parse_checkpoint(message: str) -> Checkpoint | None:
    """Built-in finished-checkpoint parsing, for callers without per-policy patterns."""
    return _DEFAULT_PARSER.parse_checkpoint(message)


def parse_checkpoint_started(message: str) -> Checkpoint | None:
    """Built-in started-checkpoint parsing, for callers without per-policy patterns."""
    return _DEFAULT_PARSER.parse_checkpoint_started(message)
