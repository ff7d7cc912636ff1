"""The text a simulated training job writes: start-up chatter, progress, checkpoints, failures.

Lines look like those of a real multi-node job started with ``srun -l``: srun puts the rank in
front, the program prints a timestamp and its host (like ``tests/e2e/jobs/ddp_train.py``)::

    8: 2026-11-29T18:00:01.123Z gpu-0007: step:   120  loss:  3.2100  memory: ...  tps: 5,231

NCCL prints ``host:pid:tid [gpu] NCCL INFO ...`` after the same prefixes, a node's kernel or
health monitor lines carry only the timestamp and host, and Slurm's own lines (``srun: error:``,
``slurmstepd-host: error: ***``) come without either, as Slurm writes them. Failure text is
built from templates per fault kind, with the ranks, hosts, PCI bus ids, pids and sequence
numbers of the job at hand, so that no two failures read alike.

By topic: ``layout`` (timestamps, hosts, ranks), ``healthy`` (start-up, progress, checkpoints),
``context`` (where a failure happens, and text many failures share), the failure families
``gpu``, ``application``, ``network`` and ``system``, ``failures`` (the text of each fault
kind), and ``benign`` (what healthy jobs and their nodes print that can look like trouble).
"""

from __future__ import annotations

from recovery.simulator.logtext.benign import (
    application_xid_lines,
    checkpoint_saved_line,
    checkpoint_started_line,
    eval_finished,
    eval_started,
    handled_traceback,
    kernel_line,
    loss_scale_overflow,
    module_load_lines,
    nccl_warning,
    persistence_mode_lines,
    warning_lines,
)
from recovery.simulator.logtext.context import FailureContext
from recovery.simulator.logtext.failures import failure_lines
from recovery.simulator.logtext.healthy import (
    checkpoint_lines,
    finished_line,
    progress_line,
    startup_lines,
    thermal_lines,
    training_loss,
)
from recovery.simulator.logtext.layout import (
    GPUS_PER_NODE,
    NCCL_VERSION,
    NIC_BUSES,
    PCI_LAYOUTS,
    host_line,
    node_ip,
    node_number,
    pci_bus,
    rank_line,
    slurm_time,
    stamp,
)
from recovery.simulator.logtext.system import cancel_notice, requeue_notice

__all__ = (
    "GPUS_PER_NODE",
    "NCCL_VERSION",
    "NIC_BUSES",
    "PCI_LAYOUTS",
    "FailureContext",
    "application_xid_lines",
    "cancel_notice",
    "checkpoint_lines",
    "checkpoint_saved_line",
    "checkpoint_started_line",
    "eval_finished",
    "eval_started",
    "failure_lines",
    "finished_line",
    "handled_traceback",
    "host_line",
    "kernel_line",
    "loss_scale_overflow",
    "module_load_lines",
    "nccl_warning",
    "node_ip",
    "node_number",
    "pci_bus",
    "persistence_mode_lines",
    "progress_line",
    "rank_line",
    "requeue_notice",
    "slurm_time",
    "stamp",
    "startup_lines",
    "thermal_lines",
    "training_loss",
    "warning_lines",
)
