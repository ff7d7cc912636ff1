"""Admin-edited patterns add to, replace and switch off built-in signatures."""

from __future__ import annotations

import pytest

from recovery.detection.classify import classify_scan
from recovery.detection.scanner.log_scanner import LogScanner
from recovery.loop.patterns import active_signature_set, progress_parser_for
from recovery.models import DetectionPattern, Policy

pytestmark = pytest.mark.django_db

WEKA = "weka: io stalled on /mnt/weka for 120 s"


def classify_with_active(text: str) -> str:
    scanner = LogScanner(active_signature_set())
    scanner.feed(text.encode())
    return classify_scan(scanner.finish()).category


def add_pattern(**fields: object) -> DetectionPattern:
    values: dict[str, object] = {
        "name": "site-weka-stall",
        "pattern": r"weka: io stalled",
        "category": "storage_io",
        "attribution": "system_software",
        "severity": "fatal",
        "examples": WEKA,
    }
    values.update(fields)
    row = DetectionPattern(**values)
    row.full_clean()
    row.save()
    return row


def test_a_new_pattern_adds_a_signature() -> None:
    assert classify_with_active(WEKA + "\n") == "healthy"
    add_pattern()
    assert classify_with_active(WEKA + "\n") == "storage_io"


def test_a_pattern_with_a_builtin_name_replaces_it() -> None:
    xid = "NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=python\n"
    assert classify_with_active(xid) == "gpu_hardware"
    add_pattern(
        name="nvidia-xid",
        pattern=r"NVRM: Xid \(PCI:[^)]*\): 79,",
        category="interconnect",
        attribution="hardware",
        examples=xid.strip(),
    )
    signatures = active_signature_set()
    assert not signatures.by_name["nvidia-xid"].builtin
    assert classify_with_active(xid) == "interconnect"


def test_a_disabled_row_switches_a_builtin_off() -> None:
    line = "pcieport 0000:00:03.0: PCIe Bus Error: severity=Uncorrected (Fatal), type=Transaction\n"
    assert classify_with_active(line) == "gpu_hardware"
    add_pattern(
        name="pcie-aer-uncorrected",
        pattern=r"PCIe Bus Error: severity=Uncorrected",
        category="gpu_hardware",
        attribution="hardware",
        examples=line.strip(),
        enabled=False,
    )
    assert "pcie-aer-uncorrected" not in active_signature_set().by_name
    assert classify_with_active(line) == "healthy"


def test_the_set_is_rebuilt_only_when_rows_change() -> None:
    first = active_signature_set()
    assert active_signature_set() is first
    row = add_pattern()
    second = active_signature_set()
    assert second is not first
    row.description = "edited"
    row.save()
    assert active_signature_set() is not second


def test_a_policy_progress_pattern_is_used_first() -> None:
    policy = Policy(name="custom", progress_pattern=r"MYTRAIN s=(?P<step>\d+)")
    parser = progress_parser_for(policy)
    progress = parser.parse_progress("MYTRAIN s=420 l=1.2")
    assert progress is not None
    assert progress.step == 420
    assert progress_parser_for(None).parse_progress("MYTRAIN s=420 l=1.2") is None
