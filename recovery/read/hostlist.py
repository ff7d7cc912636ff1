"""Rank and node lists written short, for pages: ``0-63`` and ``gpu-a100-[001-004,007]``.

Pure functions of their input, never raising: a page shows whatever a record holds, and the
full list stays available to the caller (the Console puts it in a ``title``).

Node names follow Slurm's hostlist form: the digits at the end of a name are its number, the
rest its prefix; names of one prefix go in one bracket group, each prefix in its own group, in
natural order. Zero padding is kept as written: ``gpu-007`` and ``gpu-008`` give
``gpu-[007-008]``, while ``n8``, ``n9``, ``n10`` give ``n[8-10]``; a padded number joins only a
run written at its own width, so expanding the text gives back the same names. Names without a
number (``login``) and names with text after their number (``node1-ib``) stay whole.
Duplicates go; the order of the input does not matter.

``recovery.schedulers.nodelist`` writes the same form for command lines and refuses
names that are unsafe there; these functions are for reading, and accept any text.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

__all__ = ("compress_hostnames", "compress_ranks", "sorted_hostnames")

_NUMBERED = re.compile(r"^(.*?)(\d+)$", re.S)


def compress_ranks(ranks: Iterable[object]) -> str:
    """Ranks as comma-separated numbers and ranges: ``[0, 1, 2, 3, 8, 10, 11, 12]`` gives
    ``"0-3,8,10-12"``. Duplicates and order do not matter; what is not an integer is left
    out (a JSON list may hold anything). An empty list gives ``""``."""
    numbers = sorted({r for r in ranks if isinstance(r, int) and not isinstance(r, bool)})
    items: list[str] = []
    start = previous = None
    for number in numbers:
        if previous is not None and number == previous + 1:
            previous = number
            continue
        if start is not None and previous is not None:
            items.append(_span(start, previous))
        start = previous = number
    if start is not None and previous is not None:
        items.append(_span(start, previous))
    return ",".join(items)


def _span(low: int, high: int) -> str:
    return str(low) if low == high else f"{low}-{high}"


@dataclass(frozen=True)
class _Name:
    prefix: str
    digits: str  # "" for a name without a number at its end

    @classmethod
    def parse(cls, name: str) -> _Name:
        match = _NUMBERED.match(name)
        if match is None:
            return cls(name, "")
        return cls(match.group(1), match.group(2))

    @property
    def number(self) -> int:
        return int(self.digits)

    @property
    def text(self) -> str:
        return self.prefix + self.digits

    def sort_key(self) -> tuple[tuple[tuple[int, int, str], ...], int, int, str]:
        # Unnumbered names of a prefix first, then by value, then by written width.
        if not self.digits:
            return (_natural_key(self.prefix), 0, -1, "")
        return (_natural_key(self.prefix), 1, self.number, self.digits)


def _natural_key(text: str) -> tuple[tuple[int, int, str], ...]:
    """Digit runs compare by value, other characters by code point (``gpu2`` before
    ``gpu10``)."""
    return tuple(
        (0, int(part), part) if part.isdigit() else (1, 0, part)
        for part in re.findall(r"\d+|\D+", text)
    )


def _names(names: Iterable[object]) -> list[_Name]:
    if isinstance(names, str | bytes):
        names = [names.decode() if isinstance(names, bytes) else names]
    unique = {str(name).strip() for name in names if name is not None}
    return sorted((_Name.parse(name) for name in unique if name), key=_Name.sort_key)


def sorted_hostnames(names: Iterable[object]) -> list[str]:
    """The distinct names in the order ``compress_hostnames`` writes them."""
    return [name.text for name in _names(names)]


@dataclass
class _Run:
    low: int
    high: int
    width: int

    def accepts(self, name: _Name) -> bool:
        # "n[8-10]" reads back as n8, n9, n10, but "n[08-10]" as n08, n09, n10: a number joins
        # a run only when the run's width writes it as it was written.
        return name.number == self.high + 1 and str(name.number).zfill(self.width) == name.digits

    def text(self) -> str:
        low = str(self.low).zfill(self.width)
        return low if self.high == self.low else f"{low}-{str(self.high).zfill(self.width)}"


def compress_hostnames(names: Iterable[object]) -> str:
    """Node names in Slurm's hostlist form: ``gpu-a100-001`` … ``gpu-a100-004`` and
    ``gpu-a100-007`` give ``"gpu-a100-[001-004,007]"``; several prefixes give several groups,
    joined by commas. An empty list gives ``""``."""
    items: list[str] = []
    prefix: str | None = None
    runs: list[_Run] = []

    def flush() -> None:
        if prefix is None or not runs:
            return
        if len(runs) == 1 and runs[0].low == runs[0].high:
            items.append(prefix + runs[0].text())
        else:
            items.append(f"{prefix}[{','.join(run.text() for run in runs)}]")

    for name in _names(names):
        if not name.digits:
            flush()
            prefix, runs = None, []
            items.append(name.text)
            continue
        if name.prefix != prefix:
            flush()
            prefix, runs = name.prefix, []
        if runs and runs[-1].accepts(name):
            runs[-1].high = name.number
        else:
            runs.append(_Run(name.number, name.number, len(name.digits)))
    flush()
    return ",".join(items)
