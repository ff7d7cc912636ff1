"""The real text the soak's healthy jobs print: handled tracebacks and warnings, with their sources.

Taken from the labelled real logs in ``tests/detection/data/*.jsonl`` (JSON lines with
``id``, ``category``, ``source``, ``log``):

* **warnings**: from the cases labelled ``healthy``, the lines that say "warn" or "overflow"
  (and the indented source line Python's ``warnings`` prints under one). Lines that read as
  training progress or a checkpoint are left out: another framework's step counter in a job's
  output would be a different job's progress, not a warning.
* **tracebacks**: the healthy cases hold none (they are warnings, NCCL chatter, loss-scale
  skips and progress), so the tracebacks come from real failures whose error a training program
  can catch and go on: storage errors (a checkpoint or metrics write), out of memory on a batch,
  a data loader worker, a bad sample (``HANDLED_CATEGORIES``). Each is cut the way
  ``logging.exception`` in a handler prints it: a traceback starts at the frame that caught the
  exception, so the module-level and launcher frames above the first function are dropped; a
  traceback left without a frame, or without its exception line (cut off in the issue), or whose
  frames are only a launcher's, is not used.

Every entry keeps the case's ``id`` and ``source`` address; the soak's report lists them.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from recovery.detection.normalize import parse_line
from recovery.detection.progress.parser import (
    parse_checkpoint,
    parse_checkpoint_started,
    parse_progress,
)

DATA = Path(__file__).resolve().parents[2] / "tests" / "detection" / "data"
HANDLED_CATEGORIES = ("storage_io", "gpu_oom", "host_oom", "app_exception")
HEADER = "Traceback (most recent call last):"
_FRAME = re.compile(r'^\s*File "(?P<path>[^"]+)", line \d+, in (?P<function>\S+)\s*$')
_EXCEPTION = re.compile(
    r"^(?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*(?:Error|Exception|Exit|Interrupt|Fault|Failure)(?::.*)?$"
)
_MARKERS = re.compile(r"^\s*[\^~]+\s*$")
_WARNING = re.compile(r"warn|overflow", re.IGNORECASE)
# Frames that are the launcher's or the interpreter's, never the training code's handler.
_LAUNCHER_PATHS = ("torch/distributed/run.py", "torch/distributed/elastic", "bin/torchrun")
# A warning line longer than this is a progress bar or a dump, not a message.
MAX_WARNING_CHARS = 400


def cases(data_dir: Path = DATA) -> Iterable[dict[str, Any]]:
    for path in sorted(data_dir.glob("*.jsonl")):
        for line in path.read_text(encoding="utf-8").splitlines():
            if line.strip():
                yield json.loads(line)


def handled_traceback(log: str) -> tuple[list[str], int] | None:
    """The first complete traceback in ``log`` as a handler prints it, and how many outer
    frames were dropped; None when there is none usable."""
    lines = log.splitlines()
    for index, line in enumerate(lines):
        if HEADER not in line:
            continue
        found = _traceback_after(lines[index + 1 :])
        if found is not None:
            return found
    return None


def _traceback_after(lines: list[str]) -> tuple[list[str], int] | None:
    first = next((line for line in lines if 'File "' in line), None)
    if first is None:
        return None
    prefix = first[: first.index('File "')].rstrip(" ")
    frames: list[tuple[str, list[str]]] = []
    for raw in lines:
        if prefix and not raw.startswith(prefix):
            return None  # the block ended without its exception line
        text = raw[len(prefix) :].strip()
        if not text:
            return None
        if _FRAME.match(text):
            frames.append((text, []))
        elif frames and not frames[-1][1] and not _EXCEPTION.match(text):
            frames[-1][1].append(text)  # the frame's source line
        elif frames and _MARKERS.match(text):
            frames[-1][1].append(text)
        elif frames and _EXCEPTION.match(text):
            return _as_handled(frames, text)
        else:
            return None
    return None


def _as_handled(
    frames: list[tuple[str, list[str]]], exception: str
) -> tuple[list[str], int] | None:
    functions = []
    for frame, _ in frames:
        found = _FRAME.match(frame)
        assert found is not None
        functions.append((found.group("path"), found.group("function")))
    if any(path.endswith(_LAUNCHER_PATHS) or "elastic" in path for path, _ in functions):
        return None
    start = next(
        (i for i, (path, function) in enumerate(functions) if function != "<module>"), None
    )
    if start is None:
        return None
    out = []
    for frame, code in frames[start:]:
        out.append(f"  {frame}")
        out += [f"    {line}" for line in code]
    out.append(exception)
    return out, start


def _is_progress(message: str) -> bool:
    return any(
        parse(message) is not None
        for parse in (parse_progress, parse_checkpoint, parse_checkpoint_started)
    )


def warning_lines(log: str) -> list[str]:
    """The warning lines of a healthy log, with the source line Python prints under one."""
    kept: list[str] = []
    lines = log.splitlines()
    for index, line in enumerate(lines):
        text = line.rstrip()
        if not _WARNING.search(text) or len(text) > MAX_WARNING_CHARS:
            continue
        if _is_progress(parse_line(text).message):
            continue
        kept.append(text)
        following = lines[index + 1] if index + 1 < len(lines) else ""
        if following.startswith("  ") and not _WARNING.search(following):
            kept.append(following.rstrip())
    return kept


def build(data_dir: Path = DATA) -> dict[str, Any]:
    """The corpus: ``{"tracebacks": [...], "warnings": [...]}``, each entry with ``id``,
    ``source``, ``category`` and ``lines`` (tracebacks also ``frames_dropped``)."""
    tracebacks, warnings = [], []
    for case in cases(data_dir):
        category = case.get("category", "")
        if category == "healthy":
            lines = warning_lines(case["log"])
            if lines:
                warnings.append(
                    {
                        "id": case["id"],
                        "source": case["source"],
                        "category": category,
                        "lines": lines,
                    }
                )
        elif category in HANDLED_CATEGORIES:
            found = handled_traceback(case["log"])
            if found is not None:
                lines, dropped = found
                tracebacks.append(
                    {
                        "id": case["id"],
                        "source": case["source"],
                        "category": category,
                        "lines": lines,
                        "frames_dropped": dropped,
                    }
                )
    return {"tracebacks": tracebacks, "warnings": warnings}


def write(path: Path, data_dir: Path = DATA) -> dict[str, Any]:
    corpus = build(data_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(corpus, indent=1), encoding="utf-8")
    return corpus
