"""Multi-pattern locators: find, in a whole chunk of log bytes, the lines any pattern may match.

Two linear-time engines stand behind one interface. Hyperscan compiles every pattern into one
automaton and scans a chunk in a single pass; RE2 runs one alternation of all patterns. The
locator only says *where* to look: each candidate line is then confirmed and its fields
extracted with the pattern's own RE2 object, so both engines give the same findings.
``make bench-detect`` measures both on the same file.
"""

from __future__ import annotations

import hashlib
import logging
import os
import platform
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import re2

from recovery.detection.linear_regex import PatternError, compile_linear

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class LocatorPattern:
    id: int
    pattern: str
    caseless: bool = False


class Locator(Protocol):
    name: str
    # False when a hit only says "some pattern matches this line": the caller then tries
    # every pattern on it (RE2's alternation reports the leftmost alternative only).
    reports_every_pattern: bool

    def locate(self, data: bytes) -> list[tuple[int, int]]:
        """Return ``(pattern id, end offset)`` pairs, unordered, possibly repeated."""
        ...


def _re2_source(pattern: LocatorPattern) -> str:
    return f"(?i:{pattern.pattern})" if pattern.caseless else pattern.pattern


class RE2Locator:
    name = "re2"
    reports_every_pattern = False

    def __init__(self, patterns: Sequence[LocatorPattern]) -> None:
        self._ids = [p.id for p in patterns]
        if not patterns:
            self._combined = None
            return
        # One alternation, one capture group per pattern: the group that took part names it.
        source = "|".join(f"({_re2_source(p)})" for p in patterns)
        options = re2.Options()
        options.log_errors = False
        options.max_mem = 256 << 20
        self._combined = re2.compile(f"(?m){source}".encode(), options)

    def locate(self, data: bytes) -> list[tuple[int, int]]:
        if self._combined is None:
            return []
        found = []
        ids = self._ids
        for match in self._combined.finditer(data):
            index = match.lastindex
            if index is not None:
                found.append((ids[index - 1], match.end()))
        return found


class HyperscanLocator:
    name = "hyperscan"

    def __init__(self, patterns: Sequence[LocatorPattern]) -> None:
        import hyperscan

        self._hs = hyperscan
        accepted, rejected = list(patterns), []
        try:
            self._database = self._compile(accepted) if accepted else None
        except hyperscan.error:
            # Find the patterns Hyperscan cannot take, one by one, only when there are some.
            accepted = []
            for pattern in patterns:
                try:
                    self._compile([pattern])
                except hyperscan.error as exc:
                    logger.info("pattern %s left to RE2: %s", pattern.id, exc)
                    rejected.append(pattern)
                else:
                    accepted.append(pattern)
            self._database = self._compile(accepted) if accepted else None
        # Patterns Hyperscan cannot compile still run, on RE2.
        self._fallback = RE2Locator(rejected) if rejected else None
        self.reports_every_pattern = self._fallback is None

    def _compile(self, patterns: Sequence[LocatorPattern]) -> object:
        hs = self._hs
        expressions = [p.pattern.encode() for p in patterns]
        ids = [p.id for p in patterns]
        flags = [
            hs.HS_FLAG_MULTILINE
            | hs.HS_FLAG_ALLOWEMPTY
            | (hs.HS_FLAG_CASELESS if p.caseless else 0)
            for p in patterns
        ]
        cached = _cache_path(expressions, ids, flags)
        if cached is not None and cached.exists():
            try:
                loaded = hs.loadb(cached.read_bytes(), mode=hs.HS_MODE_BLOCK)
                loaded.scratch = hs.Scratch(loaded)
                return loaded
            except (OSError, hs.error):
                pass  # a stale or foreign file: compile afresh
        database = hs.Database(mode=hs.HS_MODE_BLOCK)
        database.compile(expressions=expressions, ids=ids, elements=len(patterns), flags=flags)
        if cached is not None:
            try:
                cached.parent.mkdir(parents=True, exist_ok=True)
                temporary = cached.with_suffix(f".{os.getpid()}.tmp")
                temporary.write_bytes(hs.dumpb(database))
                temporary.replace(cached)
            except OSError:
                pass  # caching is an optimisation; a read-only home must not break scanning
        return database

    def locate(self, data: bytes) -> list[tuple[int, int]]:
        found: list[tuple[int, int]] = []
        if self._database is not None and data:
            append = found.append

            def on_match(
                pattern_id: int, start: int, end: int, flags: int, context: object
            ) -> None:
                append((pattern_id, end))

            self._database.scan(data, match_event_handler=on_match)  # type: ignore[attr-defined]
        if self._fallback is not None:
            found.extend(self._fallback.locate(data))
        return found


def _cache_path(expressions: list[bytes], ids: list[int], flags: list[int]) -> Path | None:
    """Where a compiled database for exactly these patterns is kept between runs."""
    import hyperscan

    root = os.environ.get("WR_CACHE_DIR") or os.environ.get("XDG_CACHE_HOME")
    base = Path(root) if root else Path.home() / ".cache"
    # hyperscan's stub file (__init__.pyi) leaves out the module's __version__.
    version: str = hyperscan.__version__  # type: ignore[attr-defined]
    digest = hashlib.sha256(
        repr((version, platform.machine(), expressions, ids, flags)).encode()
    ).hexdigest()[:32]
    return base / "workload-recovery" / f"hyperscan-{digest}.db"


def hyperscan_available() -> bool:
    try:
        import hyperscan  # noqa: F401
    except ImportError:
        return False
    return True


def build_locator(patterns: Sequence[LocatorPattern], engine: str = "auto") -> Locator:
    """Build the fastest available locator, or the one named by ``engine``."""
    for pattern in patterns:
        compile_linear(_re2_source(pattern))  # every pattern must be linear-time on RE2
    if engine == "re2" or (engine == "auto" and not hyperscan_available()):
        return RE2Locator(patterns)
    if engine in {"auto", "hyperscan"}:
        return HyperscanLocator(patterns)
    raise PatternError(f"unknown engine {engine!r} (use auto, hyperscan or re2)")
