"""Root cause, not the loudest line: one verdict for a whole log.

A failed 64-rank job prints 63 collective timeouts and one real cause. Findings are ranked by
how likely their category is to be the cause (hardware over the symptoms it produces, see
``CATEGORY_PRIORITY``), then by which came first. Wrappers (a launcher saying a child died)
rank below any exception they could be wrapping, so they only decide when they are all there is.
Warnings (corrected PCIe errors, thermal slowdown) never make a log failed on their own, and
failures followed by continued training progress were recovered: the log is healthy.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from recovery.detection.findings import HEALTHY, Finding
from recovery.detection.scanner.log_scanner import scan_text
from recovery.detection.scanner.results import ScanResult
from recovery.detection.signatures import GENERIC_EXCEPTION, WRAPPER
from recovery.detection.taxonomy import Attribution, Severity

# Where a generic exception that wraps a telling one ranks: with the launchers' wrappers.
WRAPPER_PRIORITY = 9
_UNTELLING = frozenset({GENERIC_EXCEPTION, "python-traceback"})

# Training that advanced this many progress lines past the last failure line recovered from it.
RECOVERED_AFTER_PROGRESS_LINES = 3


@dataclass
class Classification:
    category: str
    attribution: str
    kind: str | None
    evidence: str
    signature: str = ""
    nodes: list[str] = field(default_factory=list)
    ranks: list[int] = field(default_factory=list)
    count: int = 0
    first_line: int | None = None
    excerpt: str = ""
    secondary: list[dict[str, Any]] = field(default_factory=list)
    recovered: bool = False

    @property
    def healthy(self) -> bool:
        return self.category == HEALTHY

    def to_dict(self) -> dict[str, Any]:
        return {
            "category": self.category,
            "attribution": self.attribution,
            "kind": self.kind,
            "evidence": self.evidence,
            "signature": self.signature,
            "nodes": self.nodes,
            "ranks": self.ranks,
            "count": self.count,
            "first_line": self.first_line,
            "secondary": self.secondary,
            "recovered": self.recovered,
        }


def classify_scan(result: ScanResult) -> Classification:
    failures = [f for f in result.findings if f.severity != Severity.WARNING]
    if not failures:
        return _healthy(result.findings, recovered=False)
    if result.progress_after_last_failure >= RECOVERED_AFTER_PROGRESS_LINES:
        return _healthy(result.findings, recovered=True)
    wrappers = _wrappers_of_their_cause(failures)
    primary = max(
        failures,
        key=lambda f: (
            WRAPPER_PRIORITY if id(f) in wrappers else f.detail["priority"],
            -(f.first_line or 0),
        ),
    )
    others = [f for f in result.findings if f is not primary]
    return Classification(
        category=primary.category,
        attribution=primary.attribution,
        kind=primary.kind,
        evidence=primary.evidence,
        signature=primary.signature,
        nodes=list(primary.nodes),
        ranks=list(primary.ranks),
        count=primary.count,
        first_line=primary.first_line,
        excerpt=str(primary.detail.get("excerpt", "")),
        secondary=[_summary(f) for f in others],
    )


def _wrappers_of_their_cause(failures: list[Finding]) -> set[int]:
    """The exceptions of no known meaning raised from, or while handling, a telling one.

    Python prints a chain of tracebacks oldest first ("The above exception was the direct
    cause of the following exception", "During handling of the above exception"): a generic
    ``RuntimeError("step 300 failed")`` that ends a chain which began with an NCCL error or a
    full disk only wraps it. Returns the ``id`` of each such finding.
    """
    causes: dict[int, int] = {}  # chain -> the first line of a telling finding in it
    for finding in failures:
        if finding.signature in _UNTELLING or finding.detail.get("role") == WRAPPER:
            continue
        for chain, line in finding.chains.items():
            causes[chain] = min(causes.get(chain, line), line)
    return {
        id(finding)
        for finding in failures
        if finding.signature == GENERIC_EXCEPTION
        and "meaning" not in finding.detail
        and any(chain in causes and causes[chain] < line for chain, line in finding.chains.items())
    }


def classify_text(text: str | bytes, **options: Any) -> Classification:
    return classify_scan(scan_text(text, **options))


def _healthy(findings: list[Finding], *, recovered: bool) -> Classification:
    return Classification(
        category=HEALTHY,
        attribution=Attribution.NONE,
        kind=None,
        evidence="",
        secondary=[_summary(f) for f in findings],
        recovered=recovered,
    )


def _summary(finding: Finding) -> dict[str, Any]:
    return {
        "category": finding.category,
        "attribution": finding.attribution,
        "severity": finding.severity,
        "signature": finding.signature,
        "evidence": finding.evidence[:300],
        "count": finding.count,
        "first_line": finding.first_line,
        "nodes": finding.nodes[:32],
        "ranks": finding.ranks[:64],
    }
