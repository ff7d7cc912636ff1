"""A set of signatures ready to run: built-ins, plus what admins added or replaced."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import replace

import re2

from recovery.detection.engine import Locator, LocatorPattern, build_locator
from recovery.detection.linear_regex import compile_linear
from recovery.detection.signatures import GENERIC_EXCEPTION, SIGNATURES, Signature

_builtin: SignatureSet | None = None


class SignatureSet:
    def __init__(self, signatures: Sequence[Signature]) -> None:
        names = [s.name for s in signatures]
        duplicates = {name for name in names if names.count(name) > 1}
        if duplicates:
            raise ValueError(f"duplicate signature names: {sorted(duplicates)}")
        self.signatures: list[Signature] = list(signatures)
        self.compiled: list[re2._Regexp[str]] = [compile_linear(re2_source(s)) for s in signatures]
        self.by_name = {s.name: s for s in signatures}
        self._locators: dict[tuple[str, tuple[LocatorPattern, ...]], Locator] = {}

    @classmethod
    def builtin(cls) -> SignatureSet:
        """The built-in set, built once per process (compiling the engines is the slow part)."""
        global _builtin
        if _builtin is None:
            _builtin = cls(SIGNATURES)
        return _builtin

    def locator(self, engine: str, extra: tuple[LocatorPattern, ...] = ()) -> Locator:
        """A locator for these signatures plus ``extra`` patterns, compiled once and reused."""
        key = (engine, extra)
        if key not in self._locators:
            patterns = [
                LocatorPattern(index, s.pattern, s.caseless)
                for index, s in enumerate(self.signatures)
            ]
            self._locators[key] = build_locator([*patterns, *extra], engine)
        return self._locators[key]

    def with_overrides(
        self, custom: Iterable[Signature], disabled: Iterable[str] = ()
    ) -> SignatureSet:
        """Add ``custom`` signatures; one with a built-in's name replaces it.

        Names in ``disabled`` are removed, which is how an admin switches a built-in off.
        """
        merged = {s.name: s for s in self.signatures}
        for signature in custom:
            merged[signature.name] = replace(signature, builtin=False)
        for name in disabled:
            merged.pop(name, None)
        return SignatureSet(list(merged.values()))

    def is_generic(self, index: int) -> bool:
        return self.signatures[index].name == GENERIC_EXCEPTION


def re2_source(signature: Signature) -> str:
    return f"(?i:{signature.pattern})" if signature.caseless else signature.pattern


# ----------------------------------------------------------------- export for grep


def to_posix_ere(pattern: str, *, caseless: bool = False) -> str:
    """Translate a pattern from the RE2/Hyperscan subset used here to POSIX ERE for grep -E.

    Handles non-capturing and named groups, ``\\d``, ``\\s``, ``\\S``, ``\\w`` and case-insensitive
    groups (``(?i:...)``, or the whole pattern), which are spelt out as ``[xX]`` classes.
    """
    out: list[str] = []
    caseless_depth: list[bool] = [caseless]
    i = 0
    n = len(pattern)
    escapes = {
        "d": "[0-9]",
        "D": "[^0-9]",
        "s": "[[:space:]]",
        "S": "[^[:space:]]",
        "w": "[[:alnum:]_]",
        "W": "[^[:alnum:]_]",
    }
    while i < n:
        char = pattern[i]
        if char == "\\" and i + 1 < n:
            nxt = pattern[i + 1]
            if nxt in escapes:
                out.append(escapes[nxt])
            elif nxt == "b":
                out.append("\\b")
            else:
                out.append("\\" + nxt)
            i += 2
            continue
        if char == "[":
            end = _class_end(pattern, i)
            out.append(_translate_class(pattern[i : end + 1]))
            i = end + 1
            continue
        if char == "(":
            if pattern.startswith("(?:", i):
                caseless_depth.append(caseless_depth[-1])
                out.append("(")
                i += 3
                continue
            if pattern.startswith("(?i:", i):
                caseless_depth.append(True)
                out.append("(")
                i += 4
                continue
            if pattern.startswith("(?P<", i):
                caseless_depth.append(caseless_depth[-1])
                out.append("(")
                i = pattern.index(">", i) + 1
                continue
            caseless_depth.append(caseless_depth[-1])
            out.append("(")
            i += 1
            continue
        if char == ")":
            if len(caseless_depth) > 1:
                caseless_depth.pop()
            out.append(")")
            i += 1
            continue
        if caseless_depth[-1] and char.isascii() and char.isalpha():
            out.append(f"[{char.lower()}{char.upper()}]")
        elif char in "{}" and not _is_quantifier(pattern, i):
            out.append("\\" + char)
        else:
            out.append(char)
        i += 1
    return "".join(out)


def _is_quantifier(pattern: str, index: int) -> bool:
    if pattern[index] == "{":
        close = pattern.find("}", index)
        body = pattern[index + 1 : close] if close != -1 else ""
        return bool(body) and all(c.isdigit() or c == "," for c in body)
    open_ = pattern.rfind("{", 0, index)
    body = pattern[open_ + 1 : index] if open_ != -1 else ""
    return bool(body) and all(c.isdigit() or c == "," for c in body)


def _class_end(pattern: str, start: int) -> int:
    i = start + 1
    if i < len(pattern) and pattern[i] == "^":
        i += 1
    if i < len(pattern) and pattern[i] == "]":
        i += 1
    while i < len(pattern):
        if pattern[i] == "\\":
            i += 2
            continue
        if pattern[i] == "]":
            return i
        i += 1
    raise ValueError(f"unterminated character class in {pattern!r}")


def _translate_class(text: str) -> str:
    inner = text[1:-1]
    negate = inner.startswith("^")
    if negate:
        inner = inner[1:]
    parts: list[str] = []
    i = 0
    classes = {"d": "0-9", "s": "[:space:]", "w": "[:alnum:]_"}
    while i < len(inner):
        if inner[i] == "\\" and i + 1 < len(inner):
            nxt = inner[i + 1]
            if nxt in classes:
                parts.append(classes[nxt])
            elif nxt in "]\\^-":
                # POSIX has no escapes in brackets: place the character where it is literal.
                parts.append({"]": "", "\\": "\\", "^": "", "-": ""}[nxt])
                if nxt == "]":
                    parts.insert(0, "]")
                elif nxt == "^":
                    parts.append("^")
                elif nxt == "-":
                    parts.append("-")
            else:
                parts.append(nxt)
            i += 2
            continue
        parts.append(inner[i])
        i += 1
    body = "".join(parts)
    # A literal '-' must come last, a literal '^' must not come first.
    if body.endswith("^") or (body.startswith("^") and not negate):
        body = body.lstrip("^") + "^"
    return "[" + ("^" if negate else "") + body + "]"


def export_grep_patterns(signature_set: SignatureSet) -> list[str]:
    return [to_posix_ere(s.pattern, caseless=s.caseless) for s in signature_set.signatures]
