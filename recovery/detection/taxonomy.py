"""The failure taxonomy: what a finding is, which layer it blames, how bad it is.

These are the one definition of each kind of value. Detection uses them directly (this module
imports nothing, Django least of all); ``recovery.choices`` builds the Django choices for the
models and forms from them, so values and labels are declared once. The values are shared
with the test corpus and stored in the database: they must not change.

Members are strings (``StrEnum``): they compare equal to their values, serialise as their
values, and a value read back from the database or a JSON file is accepted wherever a member is.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Self


class LabelledEnum(StrEnum):
    """A string enumeration whose members also carry the label people see.

    Declared as Django's choices are, ``NAME = "value", "Label"``, so that the Django choices
    can be built from it with the same values and labels.
    """

    _value_: str
    label: str

    def __new__(cls, value: str, label: str) -> Self:
        member = str.__new__(cls, value)
        member._value_ = value
        member.label = label
        return member


class AnomalyKind(LabelledEnum):
    """What a finding shows: a process that died, one that stopped progressing, a slow node,
    training that goes on but learns nothing (a loss that stays NaN or jumped and stayed up),
    or a whole job that slowed down."""

    CRASH = "crash", "Crash"
    HANG = "hang", "Hang"
    STRAGGLER = "straggler", "Straggler"
    DIVERGENCE = "divergence", "Divergence"
    SLOWDOWN = "slowdown", "Slowdown"


class FailureCategory(LabelledEnum):
    """What failed. ``HEALTHY`` is the verdict on a log with no failure in it.

    ``UNEXPLAINED`` is never a detector's verdict: the loop records it for a death the scheduler
    confirmed (the attempt ended failed) that no log, kernel or metrics finding explains, so an
    operator can find it and teach a pattern for it.
    """

    NCCL_TIMEOUT = "nccl_timeout", "NCCL timeout"
    NCCL_ERROR = "nccl_error", "NCCL error"
    INTERCONNECT = "interconnect", "Interconnect"
    GPU_HARDWARE = "gpu_hardware", "GPU hardware"
    CUDA_ERROR_APP = "cuda_error_app", "CUDA error (application)"
    GPU_OOM = "gpu_oom", "GPU out of memory"
    HOST_OOM = "host_oom", "Host out of memory"
    APP_EXCEPTION = "app_exception", "Application exception"
    STORAGE_IO = "storage_io", "Storage I/O"
    SCHEDULER_EVENT = "scheduler_event", "Scheduler event"
    SEGFAULT = "segfault", "Segmentation fault"
    NAN_DIVERGENCE = "nan_divergence", "NaN / divergence"
    HEALTHY = "healthy", "Healthy"
    UNEXPLAINED = "unexplained", "Unexplained"


# A finding whose signal does not say what failed (a hang, a straggler, a job Slurm reports
# FAILED without a reason): attribution decides later. Not a category, so stored blank.
NO_CATEGORY = ""


class Attribution(LabelledEnum):
    """Which layer is to blame."""

    HARDWARE = "hardware", "Hardware"
    SYSTEM_SOFTWARE = "system_software", "System software"
    APPLICATION = "application", "Application"
    UNKNOWN = "unknown", "Unknown"
    NONE = "none", "None"


class Severity(LabelledEnum):
    """How bad one finding is on its own. Warnings never make a log failed by themselves."""

    FATAL = "fatal", "Fatal"
    ERROR = "error", "Error"
    WARNING = "warning", "Warning"


# What only the loop records, never a signature or the classifier: a confirmed death nothing
# explained.
LOOP_ONLY_CATEGORIES = frozenset({FailureCategory.UNEXPLAINED})

# The categories a failure can have, in declaration order: every category but the healthy
# verdict and those only the loop records. What a signature, and so the classifier, may answer.
FAILURE_CATEGORIES: tuple[FailureCategory, ...] = tuple(
    category
    for category in FailureCategory
    if category is not FailureCategory.HEALTHY and category not in LOOP_ONLY_CATEGORIES
)
