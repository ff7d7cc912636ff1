"""The shape every detector returns, whatever its signal: logs, scheduler states or metrics."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

# Values mirror recovery.choices (this package must not import Django).
CRASH = "crash"
HANG = "hang"
STRAGGLER = "straggler"

CATEGORIES = (
    "nccl_timeout",
    "nccl_error",
    "interconnect",
    "gpu_hardware",
    "cuda_error_app",
    "gpu_oom",
    "host_oom",
    "app_exception",
    "storage_io",
    "scheduler_event",
    "segfault",
    "nan_divergence",
)
HEALTHY = "healthy"
ATTRIBUTIONS = ("hardware", "system_software", "application", "unknown", "none")
SEVERITIES = ("fatal", "error", "warning")


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
    source: str = "log"
    count: int = 1
    first_line: int | None = None
    nodes: list[str] = field(default_factory=list)
    ranks: list[int] = field(default_factory=list)
    at: datetime | None = None
    detail: dict[str, Any] = field(default_factory=dict)

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
