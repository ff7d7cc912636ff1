"""What a scan reports: the progress, checkpoint and evaluation lines it kept, and the
occurrences of each signature as findings.

Kept apart from the scanner itself: the loop stores and compares these, and needs none of
the scanning to do so.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from recovery.detection.findings import CRASH, Finding, FindingSource
from recovery.detection.linear_regex import compile_linear
from recovery.detection.normalize import LineContext
from recovery.detection.signatures import Signature
from recovery.detection.tracebacks import Printed, least_handled

MAX_RANKS_KEPT = 4096
MAX_NODES_KEPT = 1024

# Per stream: [steps in a row, the last counted line's digest, the run's first step or None].
NonfiniteState = dict[str, list[int | str | None]]


@dataclass(frozen=True)
class ProgressPoint:
    line: int
    step: int
    rank: int | None
    node: str | None
    at: datetime | None
    loss: float | None
    throughput: float | None
    step_time_seconds: float | None


@dataclass(frozen=True)
class CheckpointPoint:
    line: int
    step: int | None
    path: str | None
    at: datetime | None
    completed: bool


@dataclass(frozen=True)
class EvaluationPoint:
    """A line announcing that an evaluation pass begins."""

    line: int
    at: datetime | None


@dataclass
class Occurrences:
    """Everything seen of one signature (and discriminator) in a log."""

    signature: Signature
    category: str
    attribution: str
    severity: str
    priority: int
    evidence: str
    first_line: int
    excerpt: str
    at: datetime | None
    detail: dict[str, Any]
    kind: str = CRASH
    count: int = 0
    last_line: int = 0
    ranks: set[int] = field(default_factory=set)
    nodes: set[str] = field(default_factory=set)
    # The chains of tracebacks it was printed in (indexes into the scanner's chains), if any,
    # each with the first line it was printed on in that chain.
    chains: dict[int, int] = field(default_factory=dict)

    # Nodes that printed a line which accuses another node (or nobody).
    witnesses: set[str] = field(default_factory=set)

    def add(self, line: int, context: LineContext, chain: int | None = None) -> None:
        self.count += 1
        if chain is not None:
            self.chains.setdefault(chain, line)
        self.last_line = line
        if context.rank is not None and len(self.ranks) < MAX_RANKS_KEPT:
            self.ranks.add(context.rank)
        accused, witness = _accused_node(self.signature, context)
        if accused and len(self.nodes) < MAX_NODES_KEPT:
            self.nodes.add(accused)
        if witness and len(self.witnesses) < MAX_NODES_KEPT:
            self.witnesses.add(witness)

    def to_finding(self, chains: list[Printed]) -> Finding:
        """The finding; ``chains`` says how each chain of tracebacks was printed."""
        implicates = self.signature.implicates_nodes
        printed = least_handled({chains[chain] for chain in self.chains})
        reporters = self.witnesses if implicates else self.witnesses | self.nodes
        witnesses = (
            {"reported_by_nodes": sorted(reporters)[:32]} if reporters or not implicates else {}
        )
        return Finding(
            kind=self.kind,
            category=self.category,
            attribution=self.attribution,
            severity=self.severity,
            signature=self.signature.name,
            evidence=self.evidence,
            source=FindingSource.LOG,
            count=self.count,
            first_line=self.first_line,
            nodes=sorted(self.nodes) if implicates else [],
            ranks=sorted(self.ranks) if implicates else [],
            at=self.at,
            implicates_nodes=implicates,
            chains=dict(self.chains),
            detail={
                **self.detail,
                **witnesses,
                **({"printed": str(printed)} if self.chains else {}),
                "role": self.signature.role,
                "reports_exit": self.signature.reports_exit,
                "priority": self.priority,
                "last_line": self.last_line,
                "excerpt": self.excerpt,
            },
        )


def _accused_node(signature: Signature, context: LineContext) -> tuple[str | None, str | None]:
    """(The node a line accuses, the node that printed it as a mere witness)."""
    if not signature.accused_node:
        return context.node, None
    hit = compile_linear(signature.accused_node).search(context.message)
    if hit is None:
        return None, context.node
    named = next((group for group in hit.groups() if group), None)
    if named is None:
        return context.node, None
    return named, (context.node if context.node != named else None)


@dataclass
class ScanResult:
    findings: list[Finding]
    progress: list[ProgressPoint]
    checkpoints: list[CheckpointPoint]
    lines: int
    bytes: int
    progress_lines: int
    checkpoint_lines: int
    progress_after_last_failure: int
    engine: str
    # Carry to the next read of the same output (``LogScanner(nonfinite_state=...)``).
    nonfinite_state: NonfiniteState = field(default_factory=dict)
    evaluations: list[EvaluationPoint] = field(default_factory=list)
