"""What one matched line means, beyond its signature's defaults.

A signature gives the category and attribution when nothing else decides. Some lines carry the
deciding detail themselves: the Xid code, whether a CUDA error surfaced in the application's
own traceback or asynchronously in a watchdog, which Python exception ended the run.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from recovery.detection.exceptions import meaning_of, parse_exception_line
from recovery.detection.facts.cuda_errors import cuda_error_meaning
from recovery.detection.facts.xid import XID_MEANINGS, XidMeaning, xid_meaning
from recovery.detection.linear_regex import compile_linear
from recovery.detection.signatures import CATEGORY_PRIORITY, GENERIC_EXCEPTION, Signature
from recovery.detection.taxonomy import Attribution, FailureCategory, Severity

_XID_CODE = compile_linear(r"NVRM: Xid \([^)]*\): (\d+)")
_XID_CODE_ELSEWHERE = compile_linear(r"(?i)xid(?: error)?(?: code)?[ :=]+(\d+)")
_XID_CAUSED_BY = compile_linear(r"(?i)caused by previous Xid:? ?(\d+)")
_SYNC_CUDA_EXCEPTION = compile_linear(
    r"^(?:[A-Za-z_][A-Za-z0-9_]*\.)*[A-Za-z_]*(?:Error|Exception): CUDA error"
)
_EXCEPTION_NAME = compile_linear(
    r"((?:[A-Za-z_][A-Za-z0-9_]*\.)*(?:[A-Z][A-Za-z0-9_]*)?(?:Error|Exception))(?::\s|:$|$)"
)
_DIGITS = compile_linear(r"\d+")
# Errors a program reports and then deals with are not failures.
_HANDLED = compile_linear(
    r"(?i)(?:\bretry(?:ing)?\b|will be retried|\bretries\b|attempt \d+ of \d+|"
    r"\brecovered\b|\bignor(?:ed|ing)\b|falling back|fallback to)"
)
_HANDLED_CATEGORIES = frozenset(
    {
        FailureCategory.NCCL_ERROR,
        FailureCategory.NCCL_TIMEOUT,
        FailureCategory.STORAGE_IO,
        FailureCategory.APP_EXCEPTION,
        FailureCategory.INTERCONNECT,
        FailureCategory.CUDA_ERROR_APP,
    }
)
_HEX = compile_linear(r"0x[0-9a-fA-F]+")
# NCCL's ncclInvalidUsage and ncclInvalidArgument: "a call to NCCL is incorrect, usually a
# programming error" (NCCL's ncclResult_t documentation): two ranks on one GPU, a wrong count.
_NCCL_MISUSE = compile_linear(
    r"(?:invalid usage|ncclInvalidUsage|ncclInvalidArgument|NCCL error in: \S+ invalid argument|"
    r"NCCL operation [^\n]{0,300} failed: invalid argument)"
)
# ncclRemoteError: "A call failed possibly due to a network error or a remote process exiting".
_NCCL_REMOTE = compile_linear(r"remote process exited|network error")
# ncclSystemError is a failed system call: a socket's, when the line names one.
_NCCL_SYSTEM = compile_linear(r"unhandled system error")
_NETWORK_CALL = compile_linear(r"(?i)socket|\bconnect|\baccept|NET/|bootstrap")
_CONNECTING = compile_linear(
    r"while trying to connect to|[Cc]onnection refused|[Nn]o route to host"
)
_PORT_ERROR = compile_linear(r"(\S+) Got async event : port error")
_OUT_OF_MEMORY = compile_linear(r"Cannot allocate memory|ENOMEM|errno 12\b")
_OWN_MEMORY_USE = compile_linear(r"low on resource: memory\b.*exceeds its request")
_SHARED_MEMORY = compile_linear(r"(?i)shared memory|/dev/shm|\bshm\b")


@dataclass(frozen=True)
class Refined:
    category: str
    attribution: str
    severity: str
    priority: int
    discriminator: str = ""
    detail: dict[str, Any] = field(default_factory=dict)


def refine(signature: Signature, message: str) -> Refined | None:
    """Category, attribution and severity of this occurrence; None to ignore the line."""
    base = Refined(
        category=signature.category,
        attribution=signature.attribution,
        severity=signature.severity,
        priority=signature.priority,
    )
    if not signature.builtin:
        return base  # an admin's signature means exactly what its row says
    if signature.category in _HANDLED_CATEGORIES and _HANDLED.search(message) is not None:
        # Its own finding: the same error later unhandled must not be folded into this one.
        return replace(
            base, severity=Severity.WARNING, discriminator="handled", detail={"handled": True}
        )
    if signature.name == "nvidia-xid":
        return _refine_xid(base, message)
    if signature.name == "nccl-error-raised" and _NCCL_MISUSE.search(message) is not None:
        return replace(base, attribution=Attribution.APPLICATION, detail={"nccl_misuse": True})
    if signature.name == "cuda-error-kernel":
        if _SYNC_CUDA_EXCEPTION.search(message) is not None:
            # Raised in the application's own call stack: a code bug is in view.
            return Refined(**{**base.__dict__, "attribution": Attribution.APPLICATION})
        return base
    if signature.name == GENERIC_EXCEPTION:
        return _refine_exception(base, message)
    port = _PORT_ERROR.search(message)
    if port is not None:
        # One finding per port, so that the port coming back settles that port's error only.
        return replace(base, discriminator=f"port error {port.group(1)}")
    if signature.name == "slurm-job-state":
        return _refine_slurm_state(base, message)
    if signature.name == "cuda-error-code":
        return _refine_cuda_error(base, message)
    if signature.name == "nccl-result":
        return _refine_nccl_result(base, message)
    if signature.name == "nccl-watchdog-timeout" and _CONNECTING.search(message) is not None:
        # A store or rendezvous that cannot even be reached: the connection between hosts
        # failed, no collective was waiting on a peer.
        return _as(base, FailureCategory.INTERCONNECT, Attribution.UNKNOWN, {"connecting": True})
    if signature.name == "ibv-call-failed" and _OUT_OF_MEMORY.search(message) is not None:
        # Verbs resources come from locked memory: ulimit -l or the HCA's limits, not the job.
        return replace(base, attribution=Attribution.SYSTEM_SOFTWARE, detail={"ibv_enomem": True})
    if signature.name == "pod-evicted" and _OWN_MEMORY_USE.search(message) is not None:
        # Evicted for using more memory than the pod requested: the kubelet picks those first.
        return replace(base, attribution=Attribution.APPLICATION, detail={"own_memory": True})
    if signature.category == FailureCategory.SEGFAULT and _SHARED_MEMORY.search(message):
        # SIGBUS in a DataLoader worker is /dev/shm running out: host memory, not a bad pointer.
        return _as(base, FailureCategory.HOST_OOM, Attribution.APPLICATION, {"shared_memory": True})
    return base


def _as(
    base: Refined, category: FailureCategory, attribution: Attribution, detail: dict[str, Any]
) -> Refined:
    return replace(
        base,
        category=category,
        attribution=attribution,
        priority=CATEGORY_PRIORITY.get(category, base.priority),
        detail=detail,
    )


# Slurm's job states by meaning, as ``facts/slurm.py`` reads them from the scheduler.
_SLURM_STATES: dict[str, tuple[FailureCategory, Attribution]] = {
    "TIMEOUT": (FailureCategory.SCHEDULER_EVENT, Attribution.APPLICATION),
    "DEADLINE": (FailureCategory.SCHEDULER_EVENT, Attribution.APPLICATION),
    "NODE_FAIL": (FailureCategory.SCHEDULER_EVENT, Attribution.HARDWARE),
    "BOOT_FAIL": (FailureCategory.SCHEDULER_EVENT, Attribution.HARDWARE),
    "PREEMPTED": (FailureCategory.SCHEDULER_EVENT, Attribution.SYSTEM_SOFTWARE),
    "OUT_OF_MEMORY": (FailureCategory.HOST_OOM, Attribution.APPLICATION),
    "OUT_OF_ME+": (FailureCategory.HOST_OOM, Attribution.APPLICATION),
}
_SLURM_STATE = compile_linear(
    r"(TIMEOUT|DEADLINE|NODE_FAIL|BOOT_FAIL|PREEMPTED|OUT_OF_ME(?:MORY|\+))"
)


def _refine_slurm_state(base: Refined, message: str) -> Refined:
    found = _SLURM_STATE.search(message)
    if found is None:
        return base
    category, attribution = _SLURM_STATES[found.group(1)]
    return _as(base, category, attribution, {"slurm_state": found.group(1)})


def _refine_cuda_error(base: Refined, message: str) -> Refined:
    meaning = cuda_error_meaning(message)
    if meaning is None:
        return base
    return _as(base, meaning.category, meaning.attribution, {"cuda_error": meaning.description})


def _refine_nccl_result(base: Refined, message: str) -> Refined:
    """NCCL's result by its documented meaning (ncclResult_t)."""
    if _NCCL_MISUSE.search(message) is not None:
        return replace(base, attribution=Attribution.APPLICATION, detail={"nccl_misuse": True})
    if _NCCL_REMOTE.search(message) is not None or (
        _NCCL_SYSTEM.search(message) is not None and _NETWORK_CALL.search(message) is not None
    ):
        return _as(base, FailureCategory.INTERCONNECT, Attribution.UNKNOWN, {"nccl_network": True})
    return base


def _refine_exception(base: Refined, message: str) -> Refined:
    """An exception line: the application's, unless its type or errno says what failed."""
    found = _EXCEPTION_NAME.search(message)
    name = found.group(1) if found else "Exception"
    short = _HEX.sub("0x_", _DIGITS.sub("N", message))[:160]
    refined = replace(base, discriminator=short, detail={"exception": name})
    raised = parse_exception_line(message)
    meaning = meaning_of(raised) if raised is not None else None
    if meaning is None:
        return refined
    return replace(
        refined,
        category=meaning.category,
        attribution=meaning.attribution,
        priority=CATEGORY_PRIORITY.get(meaning.category, base.priority),
        detail={"exception": name, "meaning": meaning.why},
    )


def _refine_xid(base: Refined, message: str) -> Refined:
    found = _XID_CODE.search(message) or _XID_CODE_ELSEWHERE.search(message)
    if found is None:
        return base
    code = int(found.group(1))
    meaning = xid_meaning(code)
    detail: dict[str, Any] = {
        "xid": code,
        "xid_meaning": meaning.description,
        "known_xid": code in XID_MEANINGS,
    }
    discriminator = str(code)
    cause = _XID_CAUSED_BY.search(message)
    if cause is not None and int(cause.group(1)) != code:
        # The driver names the Xid this one follows from ("Xid 45 ... caused by previous Xid
        # 149"): the earlier error is the failure, this one its cleanup.
        cause_code = int(cause.group(1))
        cause_meaning = xid_meaning(cause_code)
        detail.update(caused_by_xid=cause_code, caused_by_meaning=cause_meaning.description)
        discriminator = f"{code}<-{cause_code}"
        meaning = XidMeaning(
            cause_meaning.category,
            cause_meaning.attribution,
            cause_meaning.description,
            severity=_worse(meaning.severity, cause_meaning.severity, floor=Severity.ERROR),
        )
    return Refined(
        category=meaning.category,
        attribution=meaning.attribution,
        severity=meaning.severity,
        priority=CATEGORY_PRIORITY.get(meaning.category, base.priority),
        discriminator=discriminator,
        detail=detail,
    )


_SEVERITY_RANK: dict[str, int] = {Severity.WARNING: 0, Severity.ERROR: 1, Severity.FATAL: 2}


def _worse(*severities: Severity, floor: Severity) -> Severity:
    return max((*severities, floor), key=lambda severity: _SEVERITY_RANK.get(severity, 0))
