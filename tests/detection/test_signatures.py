"""Every built-in signature matches its examples and none of its counter-examples, on RE2, on
the multi-pattern engines and as exported for grep."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from recovery.detection.engine import LocatorPattern, build_locator, hyperscan_available
from recovery.detection.findings import ATTRIBUTIONS, CATEGORIES, SEVERITIES
from recovery.detection.signature_set import SignatureSet, export_grep_patterns, to_posix_ere
from recovery.detection.signatures import CATEGORY_PRIORITY, SIGNATURES, Signature

BUILTIN = SignatureSet.builtin()


def ids(signature: Signature) -> str:
    return signature.name


def test_every_category_of_the_taxonomy_has_signatures() -> None:
    covered = {s.category for s in SIGNATURES}
    assert covered == set(CATEGORIES)
    assert set(CATEGORY_PRIORITY) == set(CATEGORIES)


@pytest.mark.parametrize("signature", SIGNATURES, ids=ids)
def test_a_signature_is_well_formed(signature: Signature) -> None:
    assert signature.category in CATEGORIES
    assert signature.attribution in ATTRIBUTIONS
    assert signature.attribution != "none"
    assert signature.severity in SEVERITIES
    assert signature.examples, "every signature needs examples"
    assert signature.counter_examples, "every signature needs counter-examples"


@pytest.mark.parametrize("signature", SIGNATURES, ids=ids)
def test_a_signature_matches_its_examples_on_re2(signature: Signature) -> None:
    compiled = BUILTIN.compiled[BUILTIN.signatures.index(signature)]
    for line in signature.examples:
        assert compiled.search(line), f"{signature.name} misses: {line}"
    for line in signature.counter_examples:
        assert not compiled.search(line), f"{signature.name} matches: {line}"


@pytest.mark.parametrize("engine", ["re2", "hyperscan"])
def test_the_locators_find_every_example(engine: str) -> None:
    if engine == "hyperscan" and not hyperscan_available():
        pytest.skip("hyperscan is not installed")
    patterns = [LocatorPattern(i, s.pattern, s.caseless) for i, s in enumerate(SIGNATURES)]
    locator = build_locator(patterns, engine)
    for index, signature in enumerate(SIGNATURES):
        for line in signature.examples:
            data = f"noise\n{line}\nnoise\n".encode()
            found = {pid for pid, _ in locator.locate(data)}
            if locator.reports_every_pattern:
                assert index in found, f"{engine} misses {signature.name}: {line}"
            else:
                assert found, f"{engine} misses the line of {signature.name}: {line}"


@pytest.mark.skipif(shutil.which("grep") is None, reason="needs grep")
@pytest.mark.parametrize("signature", SIGNATURES, ids=ids)
def test_the_grep_export_matches_like_re2(signature: Signature) -> None:
    pattern = to_posix_ere(signature.pattern, caseless=signature.caseless)
    for line, expected in [(x, True) for x in signature.examples] + [
        (x, False) for x in signature.counter_examples
    ]:
        result = subprocess.run(
            ["grep", "-E", "-c", "-e", pattern], input=line + "\n", capture_output=True, text=True
        )
        assert result.returncode in (0, 1), result.stderr
        assert (result.stdout.strip() == "1") == expected, f"{pattern!r} on {line!r}"


def test_the_grep_export_has_one_pattern_per_signature() -> None:
    assert len(export_grep_patterns(BUILTIN)) == len(SIGNATURES)


def test_overrides_replace_add_and_disable() -> None:
    custom = Signature(
        name="nvidia-xid",
        category="gpu_hardware",
        attribution="hardware",
        severity="fatal",
        pattern=r"XID-REPLACED",
        examples=("XID-REPLACED",),
    )
    extra = Signature(
        name="site-fs-hang",
        category="storage_io",
        attribution="system_software",
        severity="fatal",
        pattern=r"weka: io stalled",
        examples=("weka: io stalled",),
    )
    merged = BUILTIN.with_overrides([custom, extra], disabled=["pcie-aer-corrected"])
    assert merged.by_name["nvidia-xid"].pattern == "XID-REPLACED"
    assert not merged.by_name["nvidia-xid"].builtin
    assert "site-fs-hang" in merged.by_name
    assert "pcie-aer-corrected" not in merged.by_name
    assert len(merged.signatures) == len(SIGNATURES) + 1 - 1


@pytest.mark.parametrize("signature", SIGNATURES, ids=ids)
def test_no_failure_signature_fires_on_healthy_lines(signature: Signature) -> None:
    from recovery.detection.linear_regex import healthy_lines_matched

    if signature.severity == "warning":
        return  # warnings (corrected PCIe errors) may describe healthy lines
    compiled = BUILTIN.compiled[BUILTIN.signatures.index(signature)]
    assert healthy_lines_matched(compiled) == []


def _real_log_lines() -> dict[str, list[str]]:
    import json
    from pathlib import Path

    cases: dict[str, list[str]] = {}
    for path in sorted((Path(__file__).parent / "data").rglob("*.jsonl")):
        for line in path.read_text(encoding="utf-8").splitlines():
            if line.strip():
                case = json.loads(line)
                cases[case["id"]] = case["log"].splitlines()
    return cases


REAL_LOG_LINES = _real_log_lines()


@pytest.mark.parametrize("signature", SIGNATURES, ids=ids)
def test_a_signature_is_not_fitted_to_a_single_case(signature: Signature) -> None:
    """A signature matches at least two labelled real logs, or names the program whose
    documented message it is: never a pattern fitted to the one case it was written for."""
    compiled = BUILTIN.compiled[BUILTIN.signatures.index(signature)]
    matching = [
        case
        for case, lines in REAL_LOG_LINES.items()
        if any(compiled.search(line) is not None for line in lines)
    ]
    assert len(matching) >= 2 or signature.printed_by, (
        f"{signature.name} matches {matching or 'no real case'}: add a second real case to "
        "tests/detection/data or name the program that prints it (printed_by)"
    )
    assert len(REAL_LOG_LINES) >= 150
