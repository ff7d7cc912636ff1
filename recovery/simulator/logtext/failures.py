"""The text of each fault kind, by family."""

from __future__ import annotations

from collections.abc import Callable

from recovery.simulator.faults import FaultKind
from recovery.simulator.logtext import application, gpu, network, system
from recovery.simulator.logtext.context import FailureContext

_TEMPLATES: dict[str, Callable[[FailureContext], list[str]]] = {
    "gpu_faulty": gpu.gpu_faulty,
    "gpu_memory": gpu.gpu_memory,
    "gpu_gsp": gpu.gpu_gsp,
    "gpu_thermal": system.no_text,
    "app_exception": application.app_exception,
    "cuda_error_app": application.cuda_error_app,
    "gpu_oom": application.gpu_oom,
    "nan_divergence": application.nan_divergence,
    "segfault": application.segfault,
    "host_oom": application.host_oom,
    "nccl_error": network.nccl_error,
    "ib_link": network.ib_link,
    "nic_fatal": network.nic_fatal,
    "node_death": system.node_death,
    "nccl_timeout": network.nccl_timeout,
    "hang": system.no_text,
    "storage_io": system.storage_io,
    "preemption": system.preemption,
    "time_limit": system.time_limit,
}


def failure_lines(kind: FaultKind, context: FailureContext) -> list[str]:
    """The lines a failure of ``kind`` leaves in the job's output."""
    return _TEMPLATES[kind.name](context)
