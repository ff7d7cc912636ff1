"""What goes wrong in the simulated cluster, and how often.

Each fault kind names one way a training attempt is interrupted or slowed down, the category a
log classifier should answer for the text it leaves (the design's taxonomy), that category's
default attribution (``/work/shared/corpus/README.md``), and how it acts on the job: it ends the
attempt (``crash``), kills a node (``node_death``), freezes the job (``hang``), slows one node
(``straggler``), or is a scheduler action (``scheduler``).

The shares follow Table 5 of "The Llama 3 Herd of Models" (Meta, 2024): 419 unexpected
interruptions of a 16,384-GPU pre-training run over 54 days, with its published percentages
used as relative weights (they cover 94.9 % of the interruptions; the rest is unlisted):

===============================  ======  ===========================================
report's root cause              share   simulated as
===============================  ======  ===========================================
Faulty GPU (incl. NVLink)        30.1 %  ``gpu_faulty``: Xid 79 / GPU lost / Xid 62
GPU HBM3 memory                  17.2 %  ``gpu_memory``: Xid 48 / 94 / 95, ECC
GPU SRAM memory                   4.5 %  ``gpu_memory``
GPU system processor              4.1 %  ``gpu_gsp``: Xid 119 / 120
Silent data corruption            1.4 %  ``gpu_memory`` (a later ECC report)
GPU thermal interface + sensor    1.4 %  ``gpu_thermal``: a straggler node
Software bug                     12.9 %  application kinds below, split by us
Network switch/cable              8.4 %  ``ib_link``: IB completion errors
NIC                               1.7 %  ``nic_fatal``: mlx5 health / catastrophic error
Host maintenance                  7.6 %  ``node_death``: the node stops answering
Power supply, chassis, IO board,  2.7 %  ``node_death``
CPU, system memory
NCCL watchdog timeouts            1.7 %  ``nccl_timeout`` 0.9, ``hang`` 0.8
SSD, dependency                   1.2 %  ``storage_io``
===============================  ======  ===========================================

Normalised over the listed rows, GPU faults are 61 % and hardware 82 % of the draws; the
report's 58.7 % and 78 % are of all 419 interruptions, 5 % of which it does not list. The
report does not break "software bug" down; the split here (3.3 exception, 2.0 CUDA error,
2.0 GPU OOM, 1.6 NaN, 1.5 segfault, 1.5 host OOM, 1.0 NCCL error) is ours. Preemption and
time limits are not unexpected interruptions in the report (its 47 planned interruptions were
maintenance); they are added at small shares so that ``scheduler_event`` appears at all.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

CRASH = "crash"
NODE_DEATH = "node_death"
HANG = "hang"
STRAGGLER = "straggler"
SCHEDULER = "scheduler"


@dataclass(frozen=True)
class FaultKind:
    name: str
    category: str
    attribution: str
    share: float  # percent of interruptions
    effect: str
    # A node-level fault has a node to blame; that node may keep failing ("a bad node").
    node_level: bool = False
    # An application bug: every attempt fails the same way at the same step.
    recurring: bool = False
    # The Xid codes the driver reports for it (gpu kinds), one drawn per occurrence.
    xids: tuple[int, ...] = ()


FAULT_KINDS: tuple[FaultKind, ...] = (
    FaultKind("gpu_faulty", "gpu_hardware", "hardware", 30.1, CRASH, True, xids=(79, 79, 62)),
    FaultKind(
        "gpu_memory",
        "gpu_hardware",
        "hardware",
        17.2 + 4.5 + 1.4,
        CRASH,
        True,
        xids=(48, 94, 95),
    ),
    FaultKind("gpu_gsp", "gpu_hardware", "hardware", 4.1, CRASH, True, xids=(119, 120)),
    FaultKind("gpu_thermal", "gpu_hardware", "hardware", 1.4, STRAGGLER, True),
    FaultKind("app_exception", "app_exception", "application", 3.3, CRASH, recurring=True),
    FaultKind("cuda_error_app", "cuda_error_app", "application", 2.0, CRASH, recurring=True),
    FaultKind("gpu_oom", "gpu_oom", "application", 2.0, CRASH, recurring=True),
    FaultKind("nan_divergence", "nan_divergence", "application", 1.6, CRASH, recurring=True),
    FaultKind("segfault", "segfault", "unknown", 1.5, CRASH),
    FaultKind("host_oom", "host_oom", "application", 1.5, CRASH),
    FaultKind("nccl_error", "nccl_error", "unknown", 1.0, CRASH),
    FaultKind("ib_link", "interconnect", "unknown", 8.4, CRASH, True),
    FaultKind("nic_fatal", "interconnect", "hardware", 1.7, CRASH, True),
    FaultKind("node_death", "scheduler_event", "hardware", 7.6 + 2.7, NODE_DEATH, True),
    FaultKind("nccl_timeout", "nccl_timeout", "unknown", 0.9, CRASH),
    FaultKind("hang", "nccl_timeout", "unknown", 0.8, HANG),
    FaultKind("storage_io", "storage_io", "system_software", 1.2, CRASH),
    FaultKind("preemption", "scheduler_event", "system_software", 1.0, SCHEDULER),
    FaultKind("time_limit", "scheduler_event", "application", 0.5, SCHEDULER),
)
KINDS: dict[str, FaultKind] = {kind.name: kind for kind in FAULT_KINDS}
NODE_LEVEL_KINDS = tuple(kind.name for kind in FAULT_KINDS if kind.node_level)


class FaultTable:
    """Draws fault kinds with the table's shares, or with shares given per kind."""

    def __init__(self, overrides: Mapping[str, float] | Sequence[tuple[str, float]] = ()) -> None:
        weights = {kind.name: kind.share for kind in FAULT_KINDS}
        for name, weight in dict(overrides).items():
            if name not in KINDS:
                raise ValueError(f"unknown fault kind {name!r}; known: {', '.join(KINDS)}")
            if weight < 0:
                raise ValueError(f"fault weight for {name!r} must not be negative")
            weights[name] = float(weight)
        if sum(weights.values()) <= 0:
            raise ValueError("at least one fault kind needs a positive weight")
        self.weights = weights
        self._names = list(weights)
        self._cumulative = _cumulative([weights[name] for name in self._names])
        node_names = [name for name in self._names if KINDS[name].node_level]
        self._node_names = node_names
        self._node_cumulative = _cumulative([weights[name] for name in node_names])

    def draw(self, rng: random.Random) -> FaultKind:
        return KINDS[_pick(self._names, self._cumulative, rng)]

    def draw_node_level(self, rng: random.Random) -> FaultKind | None:
        """A kind a defective node keeps causing, or None when none has a weight."""
        if not self._node_names or self._node_cumulative[-1] <= 0:
            return None
        return KINDS[_pick(self._node_names, self._node_cumulative, rng)]

    def shares_by_category(self) -> dict[str, float]:
        """Expected fraction of interruptions per category."""
        total = sum(self.weights.values())
        shares: dict[str, float] = {}
        for name, weight in self.weights.items():
            category = KINDS[name].category
            shares[category] = shares.get(category, 0.0) + weight / total
        return shares


def _cumulative(weights: list[float]) -> list[float]:
    running, out = 0.0, []
    for weight in weights:
        running += weight
        out.append(running)
    return out


def _pick(names: list[str], cumulative: list[float], rng: random.Random) -> str:
    point = rng.random() * cumulative[-1]
    for name, bound in zip(names, cumulative, strict=True):
        if point < bound:
            return name
    return names[-1]
