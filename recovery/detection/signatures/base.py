"""What a signature is, how a built-in one is declared, and how categories rank as causes."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from recovery.detection.taxonomy import Attribution, FailureCategory, Severity

GENERIC_EXCEPTION = "python-exception"
NONFINITE_PROGRESS_VALUE = "nonfinite-progress-value"


class SignatureRole(StrEnum):
    """What a matched line says about the failure; see the package docstring."""

    CAUSE = "cause"
    SYMPTOM = "symptom"
    WRAPPER = "wrapper"


CAUSE = SignatureRole.CAUSE
SYMPTOM = SignatureRole.SYMPTOM
WRAPPER = SignatureRole.WRAPPER


@dataclass(frozen=True)
class Signature:
    name: str
    category: str
    attribution: str
    severity: str
    pattern: str
    examples: tuple[str, ...]
    counter_examples: tuple[str, ...] = ()
    role: str = CAUSE
    priority: int = 50
    caseless: bool = False
    description: str = ""
    builtin: bool = True
    tags: frozenset[str] = field(default_factory=frozenset)
    reports_exit: bool = False
    # False for lines that report what the printing process saw of a peer (a connection the
    # other side closed): the node that printed one is a witness, not a suspect.
    implicates_nodes: bool = True
    # For lines that can name a node other than the one printing them: a regex whose first
    # group that matched is the node the line accuses. An alternative with no group accuses
    # the printing node; a line it does not match accuses nobody, its printer is a witness.
    accused_node: str = ""
    # The program (and where known its source or document) that prints the message: a
    # signature matching fewer than two of the labelled real logs must name it.
    printed_by: str = ""


def define(
    name: str,
    category: FailureCategory,
    attribution: Attribution,
    pattern: str,
    examples: tuple[str, ...] | list[str],
    counter_examples: tuple[str, ...] | list[str] = (),
    *,
    severity: Severity = Severity.FATAL,
    role: SignatureRole = CAUSE,
    priority: int | None = None,
    caseless: bool = False,
    description: str = "",
    reports_exit: bool = False,
    implicates_nodes: bool = True,
    accused_node: str = "",
    printed_by: str = "",
) -> Signature:
    """A built-in signature; its priority is its category's unless given."""
    return Signature(
        name=name,
        category=category,
        attribution=attribution,
        severity=severity,
        pattern=pattern,
        examples=tuple(examples),
        counter_examples=tuple(counter_examples),
        role=role,
        priority=CATEGORY_PRIORITY[category] if priority is None else priority,
        caseless=caseless,
        description=description,
        reports_exit=reports_exit,
        implicates_nodes=implicates_nodes,
        accused_node=accused_node,
        printed_by=printed_by,
    )


# How likely each category is to be the root cause when several appear in one failed job.
# Hardware first: a GPU falling off the bus makes every other rank time out.
CATEGORY_PRIORITY: dict[str, int] = {
    FailureCategory.GPU_HARDWARE: 100,
    FailureCategory.INTERCONNECT: 90,
    FailureCategory.SCHEDULER_EVENT: 86,
    FailureCategory.HOST_OOM: 84,
    FailureCategory.STORAGE_IO: 82,
    FailureCategory.GPU_OOM: 80,
    FailureCategory.CUDA_ERROR_APP: 76,
    FailureCategory.NAN_DIVERGENCE: 72,
    FailureCategory.APP_EXCEPTION: 60,
    FailureCategory.NCCL_ERROR: 55,
    FailureCategory.SEGFAULT: 50,
    FailureCategory.NCCL_TIMEOUT: 30,
}
