"""Slurm hostlist expressions, read and written the way Slurm does.

Slurm prints node lists compressed everywhere (``squeue``, ``scontrol show job``, the JSON
output) and takes them back in ``ExcNodeList=``: ``node[001-004,007]`` names five nodes,
``rack[1-2]-node[01-02]`` four. The reading rules follow Slurm's hostlist.c:

- Top-level groups are separated by commas, spaces or tabs; empty groups are skipped.
- Inside brackets: comma-separated numbers and ``low-high`` ranges. Each range keeps the zero
  padding of its written low end (``[08-10]`` gives 08, 09, 10; ``[8-10]`` gives 8, 9, 10).
- Several bracket groups in one name multiply out. Slurm takes the last group as the innermost
  loop and the other groups from right to left around it; for two groups that is plain reading
  order. Text may follow a bracket group only if another bracket group comes later, as in
  ``rack[1-2]-node[01-02]``: Slurm refuses ``node[1-2]-ib``.
- Order and duplicates are kept as written, as ``hostlist_create`` does.

Where Slurm is lenient by accident (``n[1-]`` means n1, ``n[ 2]`` means n02, an unclosed '['
gets a ']' appended), this module refuses instead: such a list did not come from Slurm. So does
any name that ``validation.name_problem`` would refuse, because these names go on to command
lines.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from recovery.schedulers.validation import (
    DIGITS,
    MAX_NODE_NAME_LENGTH,
    NAME_CHARACTERS,
    name_problem,
    shown,
)

# Slurm refuses a single range of more hosts than this (MAX_RANGE in hostlist.c).
MAX_RANGE_SIZE = 64 * 1024
# The largest Slurm clusters have tens of thousands of nodes. A list naming more than this is a
# mistake or an attack, and refusing it before expanding bounds both memory and time.
MAX_EXPANDED_NAMES = 64 * 1024

# What Slurm prints when a job has no nodes: "(null)" in scontrol, "None assigned" in sacct.
EMPTY_NODELISTS = frozenset({"", "(null)", "None assigned"})

# Slurm splits on "\t, "; newlines are accepted as well, for lists pasted from a terminal.
_SEPARATORS = frozenset(", \t\r\n")


class NodeListError(ValueError):
    """A node list Slurm would not produce, or one naming unsafe node names."""


def _error(text: str, problem: str) -> NodeListError:
    return NodeListError(f"invalid node list {shown(text)}: {problem}")


@dataclass(frozen=True)
class _Range:
    """One bracket item: ``007`` or ``001-004``, with the written width of its low end."""

    low: int
    high: int
    width: int

    @property
    def size(self) -> int:
        return self.high - self.low + 1

    def labels(self) -> Iterator[str]:
        for number in range(self.low, self.high + 1):
            yield str(number).zfill(self.width)


@dataclass(frozen=True)
class _Pattern:
    """One top-level group: literal text around bracket groups (one more literal than groups)."""

    literals: tuple[str, ...]
    groups: tuple[tuple[_Range, ...], ...]

    @property
    def size(self) -> int:
        size = 1
        for group in self.groups:
            size *= sum(item.size for item in group)
        return size

    def names(self) -> Iterator[str]:
        if not self.groups:
            yield self.literals[0]
            return
        labels = [[label for item in group for label in item.labels()] for group in self.groups]
        # Slurm's nesting, outermost first: groups[-2], groups[-3], ..., groups[0], groups[-1].
        last = len(labels) - 1
        loop_order = [*range(last - 1, -1, -1), last]
        chosen = [""] * len(labels)
        for combination in itertools.product(*(labels[index] for index in loop_order)):
            for index, label in zip(loop_order, combination):
                chosen[index] = label
            parts = [self.literals[0]]
            for label, literal in zip(chosen, self.literals[1:]):
                parts.append(label)
                parts.append(literal)
            yield "".join(parts)


def _split_top_level(text: str) -> list[str]:
    """Split at separators outside brackets, checking that brackets pair up and never nest."""
    groups: list[str] = []
    current: list[str] = []
    inside = False
    for position, character in enumerate(text):
        if character == "[":
            if inside:
                raise _error(text, f"'[' inside brackets at position {position}")
            inside = True
        elif character == "]":
            if not inside:
                raise _error(text, f"']' without a matching '[' at position {position}")
            inside = False
        elif character in _SEPARATORS and not inside:
            if current:
                groups.append("".join(current))
                current = []
            continue
        current.append(character)
    if inside:
        raise _error(text, "'[' without a matching ']'")
    if current:
        groups.append("".join(current))
    return groups


def _is_number(text: str) -> bool:
    return bool(text) and all(character in DIGITS for character in text)


def _parse_range(item: str, text: str) -> _Range:
    low_text, dash, high_text = item.partition("-")
    if not _is_number(low_text) or (dash and not _is_number(high_text)):
        raise _error(text, f"{item!r} in brackets is not a number or a low-high range")
    # No node name is longer than this, and it keeps int() far from its digit limit.
    if max(len(low_text), len(high_text)) > MAX_NODE_NAME_LENGTH:
        raise _error(text, f"the number in {shown(item)} is too long")
    low = int(low_text)
    high = int(high_text) if dash else low
    if high < low:
        raise _error(text, f"range {item!r} runs backwards")
    if high - low + 1 > MAX_RANGE_SIZE:
        raise _error(text, f"range {item!r} names more than {MAX_RANGE_SIZE} nodes")
    return _Range(low=low, high=high, width=len(low_text))


def _parse_group(group: str, text: str) -> _Pattern:
    literals: list[str] = []
    groups: list[tuple[_Range, ...]] = []
    literal_start = 0
    position = 0
    while position < len(group):
        character = group[position]
        if character != "[":
            if character not in NAME_CHARACTERS:
                raise _error(text, f"{character!r} is not allowed in node names")
            position += 1
            continue
        # _split_top_level guarantees a ']' follows, with no '[' in between.
        closing = group.index("]", position)
        body = group[position + 1 : closing]
        if not body:
            raise _error(text, "empty brackets")
        literals.append(group[literal_start:position])
        groups.append(tuple(_parse_range(item, text) for item in body.split(",")))
        position = literal_start = closing + 1
    literals.append(group[literal_start:])
    if groups and literals[-1]:
        raise _error(
            text,
            f"{literals[-1]!r} follows the last bracket group; Slurm allows text after a "
            "bracket group only before another one",
        )
    return _Pattern(literals=tuple(literals), groups=tuple(groups))


def expand_nodelist(text: str) -> list[str]:
    """Every node name in a Slurm hostlist expression, in Slurm's order.

    ``"node[001-004,007]"`` gives node001 to node004 and node007; ``""``, ``"(null)"`` and
    ``"None assigned"`` give ``[]``. Raises NodeListError for anything Slurm would refuse, for
    names that are not safe node names, and for lists naming more than MAX_EXPANDED_NAMES nodes.
    """
    if not isinstance(text, str):
        raise NodeListError(f"a node list must be a string, got {type(text).__name__}")
    stripped = text.strip()
    if stripped in EMPTY_NODELISTS:
        return []
    patterns = [_parse_group(group, text) for group in _split_top_level(stripped)]
    # Count before building anything: "n[0-9][0-9][0-9][0-9][0-9][0-9]" is short to write.
    total = 0
    for pattern in patterns:
        total += pattern.size
        if total > MAX_EXPANDED_NAMES:
            raise _error(text, f"names more than {MAX_EXPANDED_NAMES} nodes")
    names: list[str] = []
    for pattern in patterns:
        for name in pattern.names():
            problem = name_problem(name, max_length=MAX_NODE_NAME_LENGTH)
            if problem is not None:
                raise _error(text, f"node name {shown(name)} {problem}")
            names.append(name)
    return names


@dataclass(frozen=True)
class _Host:
    """A node name split as Slurm splits it: prefix, then the trailing digits (maybe none)."""

    name: str
    prefix: str
    digits: str

    @classmethod
    def parse(cls, name: str) -> _Host:
        problem = name_problem(name, max_length=MAX_NODE_NAME_LENGTH)
        if problem is not None:
            raise NodeListError(f"invalid node name {shown(name)}: {problem}")
        end = len(name)
        while end > 0 and name[end - 1] in DIGITS:
            end -= 1
        return cls(name=name, prefix=name[:end], digits=name[end:])

    @property
    def number(self) -> int:
        return int(self.digits)

    def sort_key(self) -> tuple[tuple[tuple[int, int, str], ...], bool, int, int]:
        # Prefixes in natural order, like Slurm's strnatcmp; a bare prefix ("node") before its
        # numbered names; numbers by value, and "1" before "01" when both exist.
        number = self.number if self.digits else 0
        return (_natural_key(self.prefix), bool(self.digits), number, len(self.digits))


def _natural_key(text: str) -> tuple[tuple[int, int, str], ...]:
    """Digit runs compare by value, other characters by code point, as strnatcmp does.

    A digit run is keyed by ord('0') so that it sorts against a non-digit character exactly as
    any digit would; its value and text then order it against other digit runs.
    """
    key: list[tuple[int, int, str]] = []
    position = 0
    while position < len(text):
        end = position
        while end < len(text) and text[end] in DIGITS:
            end += 1
        if end > position:
            run = text[position:end]
            key.append((ord("0"), int(run), run))
            position = end
        else:
            key.append((ord(text[position]), 0, ""))
            position += 1
    return tuple(key)


def _unique_sorted_hosts(names: Iterable[str]) -> list[_Host]:
    # A single string would be iterated character by character.
    if isinstance(names, (str, bytes)):
        raise NodeListError(f"expected node names, got the single value {shown(names)}")
    hosts = {_Host.parse(name) for name in names}
    return sorted(hosts, key=_Host.sort_key)


def sort_node_names(names: Iterable[str]) -> list[str]:
    """The distinct names in Slurm's order: the order expand(compress(names)) gives back."""
    return [host.name for host in _unique_sorted_hosts(names)]


@dataclass
class _Run:
    """Consecutive numbers printed at one width: one "a-b" item in brackets."""

    low: int
    high: int
    width: int

    def accepts(self, host: _Host) -> bool:
        # "[8-10]" prints 10 as "10": unpadded numbers join a narrower run. A padded one such as
        # "010" only joins runs written at its own width, or it would come back as "10".
        return host.number == self.high + 1 and str(host.number).zfill(self.width) == host.digits

    def text(self) -> str:
        low = str(self.low).zfill(self.width)
        if self.high == self.low:
            return low
        return f"{low}-{str(self.high).zfill(self.width)}"


def _compress_prefix(prefix: str, hosts: list[_Host]) -> list[str]:
    items: list[str] = []
    runs: list[_Run] = []
    for host in hosts:
        if not host.digits:
            items.append(host.name)
        elif runs and runs[-1].accepts(host):
            runs[-1].high = host.number
        else:
            runs.append(_Run(low=host.number, high=host.number, width=len(host.digits)))
    if len(runs) == 1 and runs[0].low == runs[0].high:
        items.append(prefix + runs[0].text())
    elif runs:
        items.append(f"{prefix}[{','.join(run.text() for run in runs)}]")
    return items


def compress_nodelist(names: Iterable[str]) -> str:
    """Slurm's compressed form of a set of node names.

    ``["node001", "node002", "node003", "node004", "node007"]`` gives ``"node[001-004,007]"``;
    one name stays as it is; duplicates go; names without a numeric suffix are kept whole.
    Raises NodeListError for a name that is not a safe node name.
    """
    items: list[str] = []
    for prefix, group in itertools.groupby(_unique_sorted_hosts(names), key=lambda h: h.prefix):
        items.extend(_compress_prefix(prefix, list(group)))
    return ",".join(items)
