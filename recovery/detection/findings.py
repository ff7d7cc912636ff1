"""The shape every detector returns, whatever its signal: logs, scheduler states or metrics."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any

from recovery.detection.taxonomy import (
    FAILURE_CATEGORIES,
    AnomalyKind,
    Attribution,
    FailureCategory,
    Severity,
)

# Short names for the values detectors use most; the enums are in ``taxonomy``.
CRASH = AnomalyKind.CRASH
HANG = AnomalyKind.HANG
STRAGGLER = AnomalyKind.STRAGGLER
DIVERGENCE = AnomalyKind.DIVERGENCE
SLOWDOWN = AnomalyKind.SLOWDOWN
CATEGORIES = FAILURE_CATEGORIES
HEALTHY = FailureCategory.HEALTHY
ATTRIBUTIONS = tuple(Attribution)
SEVERITIES = tuple(Severity)


class FindingSource(StrEnum):
    """Which signal family a finding came from."""

    LOG = "log"
    SCHEDULER = "scheduler"
    METRICS = "metrics"
    # No training progress after an error: the loop's check of a crash that did not end.
    PROGRESS = "progress"


@dataclass
class Finding:
    """One anomaly candidate: what was seen, where, how often, and the line that shows it.

    ``kind`` is crash, hang or straggler; ``category`` and ``attribution`` use the design's
    taxonomy. ``source`` says which signal family produced it: ``log``, ``scheduler`` or
    ``metrics``. Identical evidence seen many times is one finding with ``count``.
    """

    kind: str
    category: str
    attribution: str
    severity: str
    signature: str
    evidence: str
    source: str = FindingSource.LOG
    count: int = 1
    first_line: int | None = None
    nodes: list[str] = field(default_factory=list)
    ranks: list[int] = field(default_factory=list)
    at: datetime | None = None
    detail: dict[str, Any] = field(default_factory=dict)
    # False when the line reports what its process saw of a peer: where it was printed is kept
    # in ``detail["reported_by_nodes"]``, never among the nodes it implicates.
    implicates_nodes: bool = True
    # The chains of Python tracebacks the evidence was printed in (the scanner's numbering,
    # for this scan only), each with the first line it was printed on there: an exception
    # raised while handling another is told from its cause.
    chains: dict[int, int] = field(default_factory=dict)

    def name_node(self, node: str) -> None:
        """Add the node the evidence came from (a log store's label, a kernel log's host)."""
        if not self.implicates_nodes:
            witnesses = self.detail.setdefault("reported_by_nodes", [])
            if node not in witnesses:
                witnesses.append(node)
        elif node not in self.nodes:
            self.nodes.append(node)
            self.nodes.sort()

    def name_rank(self, rank: int) -> None:
        if self.implicates_nodes and rank not in self.ranks:
            self.ranks.append(rank)
            self.ranks.sort()

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "category": self.category,
            "attribution": self.attribution,
            "severity": self.severity,
            "signature": self.signature,
            "evidence": self.evidence,
            "source": self.source,
            "count": self.count,
            "first_line": self.first_line,
            "nodes": list(self.nodes),
            "ranks": list(self.ranks),
            "at": self.at.isoformat() if self.at else None,
            "detail": dict(self.detail),
        }
