"""Streaming log scanner: bytes in, findings and progress out, in bounded memory.

Feed it chunks read from any byte offset; it keeps the partial last line for the next chunk,
locates candidate lines for the whole chunk in one pass of a multi-pattern engine, and only
decodes and parses those. Lines longer than ``max_line_bytes`` are examined around the match;
a line with no newline for longer than ``max_carry_bytes`` is cut, so memory stays flat however
the input is shaped. Undecodable bytes are replaced, never fatal.

The scanner is split by what its parts do: ``log_scanner`` (``LogScanner``: feeding, locating
and examining failure lines), ``results`` (what a scan reports), ``lines`` (blocks of complete
lines and the stream each belongs to), ``traceback_chains`` and ``progress_sampling`` (what
``LogScanner`` follows across lines). The names below are the scanner's public interface.
"""

from __future__ import annotations

from recovery.detection.scanner.log_scanner import CHECKPOINT_SAVE_HINT, LogScanner, scan_text
from recovery.detection.scanner.progress_sampling import DEFAULT_NONFINITE_STEPS
from recovery.detection.scanner.results import (
    CheckpointPoint,
    EvaluationPoint,
    NonfiniteState,
    ProgressPoint,
    ScanResult,
)
from recovery.detection.signatures import CATEGORY_PRIORITY

__all__ = [
    "CATEGORY_PRIORITY",
    "CHECKPOINT_SAVE_HINT",
    "DEFAULT_NONFINITE_STEPS",
    "CheckpointPoint",
    "EvaluationPoint",
    "LogScanner",
    "NonfiniteState",
    "ProgressPoint",
    "ScanResult",
    "scan_text",
]
