"""The rules of teaching a pattern from an unexplained failure's line
(``recovery.detection.teaching``): no Django, no database."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from recovery.detection.evaluation import Case, load_cases
from recovery.detection.linear_regex import compile_linear, escape_literal
from recovery.detection.signature_set import SignatureSet
from recovery.detection.signatures import CATEGORY_PRIORITY, Signature
from recovery.detection.teaching import (
    LAST_LINES,
    LINE_CHARS,
    last_lines,
    matches,
    pattern_for_line,
    preview,
    suggested_name,
)

BUILTIN = SignatureSet.builtin()
CORPUS = Path(__file__).resolve().parent / "data"
# A Weka client line no built-in signature knows, as a job printed it through srun --label.
WEKA = " 3: 2024-05-01T10:00:07Z weka: io stalled on fd 0x7f3a for 120 s (tries=3)"
# DeepSpeed's fp16 loss scaler skipping a step: healthy where it recovers (h044, c082), the
# sign of divergence where it does not (h040).
OVERFLOW = (
    "[2024-09-11 17:52:18,030] [INFO] [loss_scaler.py:183:update_scale] [deepspeed] OVERFLOW! "
    "Rank 0 Skipping step. Attempted loss scale: 4294967296, reducing to 2147483648"
)


def taught(pattern: str, category: str = "storage_io", **fields: str) -> Signature:
    """A signature as ``recovery.loop.patterns`` makes one of a stored pattern."""
    return Signature(
        name=fields.pop("name", "taught-weka-io-stalled"),
        category=category,
        attribution=fields.pop("attribution", "system_software"),
        severity="error",
        pattern=pattern,
        examples=(),
        priority=CATEGORY_PRIORITY.get(category, 50),
        builtin=False,
        printed_by=fields.pop("printed_by", ""),
    )


def case(case_id: str, log: str, category: str = "healthy", attribution: str = "none") -> Case:
    return Case(case_id, category, attribution, f"https://example.org/{case_id}", log)


# ------------------------------------------------------------------ the pattern of a line


def test_the_pattern_drops_the_prefixes_and_generalises_numbers() -> None:
    pattern = pattern_for_line(WEKA)
    assert pattern == r"weka: io stalled on fd 0x[0-9a-fA-F]+ for \d+ s \(tries=\d+\)"
    compiled = compile_linear(pattern)
    assert matches(compiled, WEKA)
    # Another rank, another time, another descriptor, another wait.
    assert matches(
        compiled, "12: 2025-01-09T03:00:00Z weka: io stalled on fd 0xBEEF for 9 s (tries=1)"
    )
    assert not matches(compiled, "weka: io resumed on fd 0x7f3a after 120 s")


def test_operators_in_the_line_are_matched_literally() -> None:
    line = "FATAL: assert (a+b)*[c] {x} $HOME ^ | ? failed"
    pattern = pattern_for_line(line)
    compiled = compile_linear(pattern)
    assert matches(compiled, line)
    assert not matches(compiled, "FATAL: assert aab*[c] {x} $HOME ^ | ? failed")


# Any character a log line can hold: no line break, no lone surrogate.
ONE_LINE = st.characters(codec="utf-8", exclude_characters="\n\r")


@given(st.text(alphabet=ONE_LINE, min_size=1, max_size=80).filter(str.strip))
def test_any_text_escaped_matches_exactly_itself(text: str) -> None:
    compiled = compile_linear(escape_literal(text))
    found = compiled.search(text)
    assert found is not None and found.group(0) == text


def test_a_suggested_name_is_a_valid_signature_name() -> None:
    assert suggested_name(WEKA) == "taught-weka-io-stalled-on"
    assert suggested_name("12345 0x1f") == "taught-x-f"
    assert suggested_name("!!!") == "taught-pattern"
    for line in (WEKA, OVERFLOW, "", "ÜBER fehler"):
        assert re.fullmatch(r"[a-z0-9][a-z0-9_.-]{0,127}", suggested_name(line))


# ------------------------------------------------------------------ the last lines


def test_the_last_lines_are_the_scanners_lines_bounded() -> None:
    data = b"partial tail of an earlier line\n" + b"".join(
        f"\x1b[31mline {n}\x1b[0m\n\n".encode() for n in range(60)
    )
    data += b"x" * 900 + b"\n" + b"\xff\xfe bad bytes\n"
    kept = last_lines(data, cut_at_start=True)
    assert len(kept) == LAST_LINES
    assert kept[0] == "line 22"
    assert kept[-2] == "x" * LINE_CHARS
    assert kept[-1] == "\ufffd\ufffd bad bytes"
    assert "partial" not in " ".join(last_lines(data, cut_at_start=True))
    assert last_lines(b"first\nsecond\n", cut_at_start=False) == ["first", "second"]


# ------------------------------------------------------------------ the preview


def test_a_pattern_that_explains_a_missed_failure_changes_its_verdict() -> None:
    missed = case(
        "weka-1",
        "step 10 loss 2.1\nweka: io stalled on fd 0x10 for 300 s (tries=5)\n",
        "storage_io",
        "system_software",
    )
    untouched = case("fine-1", "step 10 loss 2.1\nstep 11 loss 2.0\n")
    found = preview(taught(pattern_for_line(WEKA)), BUILTIN, [missed, untouched], {})
    assert found.matched_cases == ["weka-1"]
    (changed,) = found.changed
    assert (changed.id, str(changed.before), str(changed.after)) == (
        "weka-1",
        "healthy / none",
        "storage_io / system_software",
    )
    assert changed.now_right and not changed.was_right and not changed.false_alarm
    assert found.acceptable


def test_a_pattern_that_makes_a_healthy_labelled_log_a_failure_is_refused() -> None:
    healthy = case("fine-2", "step 10 loss 2.1\nweka: io stalled on fd 0x10 for 1 s (tries=1)\n")
    found = preview(taught(pattern_for_line(WEKA)), BUILTIN, [healthy], {})
    assert [c.id for c in found.false_alarms] == ["fine-2"]
    assert [r.field for r in found.refusals] == ["pattern"]
    assert "false alarms: fine-2" in found.refusals[0].message


def test_on_the_real_corpus_the_overflow_line_fixes_one_case_and_breaks_two() -> None:
    """DeepSpeed's OVERFLOW line ends h040 (it never recovered) but is routine in h044 and c082:
    taught as divergence, the preview shows all three and refuses it."""
    cases = load_cases(sorted(CORPUS.rglob("*.jsonl")))
    candidate = taught(pattern_for_line(OVERFLOW), "nan_divergence", attribution="application")
    found = preview(candidate, BUILTIN, cases, {})
    changed = {c.id: c for c in found.changed}
    assert changed["h040"].now_right
    assert {c.id for c in found.false_alarms} == {"h044", "c082"}
    assert not found.acceptable


def test_a_pattern_fitted_to_its_one_line_is_refused_unless_its_printer_is_named() -> None:
    fitted = taught(pattern_for_line(WEKA))
    cases = [case("fine-3", "step 1\n")]
    refused = preview(fitted, BUILTIN, cases, {})
    assert [r.field for r in refused.refusals] == ["pattern"]
    assert "fitted to this one line" in refused.refusals[0].message

    named = taught(pattern_for_line(WEKA), printed_by="WekaFS client (docs.weka.io)")
    assert preview(named, BUILTIN, cases, {}).acceptable


def test_another_unexplained_failure_it_matches_is_enough() -> None:
    others: dict[int, list[str]] = {
        7: ["step 3", "weka: io stalled on fd 0x99 for 61 s (tries=2)"],
        8: ["Segmentation fault (core dumped)"],
    }
    found = preview(taught(pattern_for_line(WEKA)), BUILTIN, [], others)
    assert [(m.key, m.line) for m in found.other_failures] == [
        (7, "weka: io stalled on fd 0x99 for 61 s (tries=2)")
    ]
    assert found.acceptable


def test_a_built_in_signatures_name_is_refused() -> None:
    builtin_name = BUILTIN.signatures[0].name
    candidate = taught(pattern_for_line(WEKA), name=builtin_name, printed_by="weka")
    found = preview(candidate, BUILTIN, [], {})
    assert [r.field for r in found.refusals] == ["name"]


@pytest.mark.parametrize("category", ["healthy", "unexplained"])
def test_neither_healthy_nor_unexplained_is_a_category_a_signature_may_give(
    category: str,
) -> None:
    from recovery.detection.findings import CATEGORIES

    assert category not in CATEGORIES


def test_the_rules_import_no_django() -> None:
    code = (
        "import sys, recovery.detection.teaching\n"
        "assert not [m for m in sys.modules if m.split('.')[0] == 'django'], 'django imported'\n"
    )
    root = Path(__file__).resolve().parents[2]
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(root)}
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
