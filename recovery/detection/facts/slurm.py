"""Slurm job and node states turned into findings.

Slurm says *that* a job or node failed, rarely *why*: a job state gives the category when the
state itself names it (node failure, out of memory, time limit, preemption), and a node's
reason names the component when an admin, slurmd or a health check wrote one down.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from recovery.detection.facts.xid import xid_meaning
from recovery.detection.findings import CRASH, Finding
from recovery.detection.linear_regex import compile_linear
from recovery.detection.taxonomy import NO_CATEGORY, Attribution, FailureCategory, Severity

# squeue's short codes, for callers that read %t instead of %T.
_JOB_STATE_CODES = {
    "BF": "BOOT_FAIL",
    "CA": "CANCELLED",
    "CD": "COMPLETED",
    "CF": "CONFIGURING",
    "CG": "COMPLETING",
    "DL": "DEADLINE",
    "F": "FAILED",
    "NF": "NODE_FAIL",
    "OOM": "OUT_OF_MEMORY",
    "PD": "PENDING",
    "PR": "PREEMPTED",
    "R": "RUNNING",
    "RD": "RESV_DEL_HOLD",
    "RF": "REQUEUE_FED",
    "RH": "REQUEUE_HOLD",
    "RQ": "REQUEUED",
    "RS": "RESIZING",
    "RV": "REVOKED",
    "S": "SUSPENDED",
    "SE": "SPECIAL_EXIT",
    "SI": "SIGNALING",
    "SO": "STAGE_OUT",
    "ST": "STOPPED",
    "TO": "TIMEOUT",
}
_JOB_STATES = frozenset(_JOB_STATE_CODES.values())

# What slurmstepd prints when it cancels a job on the controller's behalf.
_CANCEL_TIME_LIMIT = compile_linear(r"(?i)time limit")
_CANCEL_PREEMPTION = compile_linear(r"(?i)due to preemption")
_CANCEL_NODE_FAILURE = compile_linear(r"(?i)due to node\s+\S*\s*fail|node fail")

_SIGNAL_NOTES = {
    6: "SIGABRT: the process aborted itself (failed assertion, uncaught C++ exception, NCCL or "
    "c10 abort)",
    7: "SIGBUS: bad memory access, often a memory-mapped file on failed storage",
    9: "SIGKILL: possibly an out-of-memory kill (kernel or Slurm cgroup), or the end of a "
    "timeout or cancel escalation",
    11: "SIGSEGV: segmentation fault",
    15: "SIGTERM: terminated from outside (scancel, preemption, time limit)",
}


def normalise_job_state(state: str) -> str | None:
    """The Slurm job state name in ``state``, or None when it is not one.

    Accepts ``squeue``/``sacct`` spellings: "FAILED", "CANCELLED by 1234", "CANCELLED+",
    sacct's truncated "OUT_OF_ME+", lower case, and squeue's short codes ("NF", "TO").
    """
    words = state.strip().upper().split()
    if not words:
        return None
    token = words[0]
    truncated = token.endswith("+")
    token = token.rstrip("+")
    if token in _JOB_STATES:
        return token
    if token in _JOB_STATE_CODES:
        return _JOB_STATE_CODES[token]
    if truncated and token:
        candidates = [name for name in _JOB_STATES if name.startswith(token)]
        if len(candidates) == 1:
            return candidates[0]
    return None


def finding_from_scheduler_state(
    state: str,
    *,
    exit_code: int | None = None,
    signal: int | None = None,
    reason: str = "",
    nodes: Sequence[str] = (),
    at: datetime | None = None,
) -> Finding | None:
    """A finding for a Slurm job state that means the attempt ended abnormally, else None.

    * NODE_FAIL: a node of the allocation stopped responding — category ``scheduler_event``,
      attribution ``hardware``, ``nodes`` the ones given (the allocation, or the failed node
      when the caller knows it). BOOT_FAIL likewise.
    * OUT_OF_MEMORY: Slurm's cgroup killed the job for host memory — ``host_oom``,
      ``application``.
    * TIMEOUT, DEADLINE (and CANCELLED "DUE TO TIME LIMIT"): ``scheduler_event``,
      ``application`` — the job asked for too little time.
    * PREEMPTED (and CANCELLED "DUE TO PREEMPTION"): ``scheduler_event``, ``system_software``.
    * FAILED: the scheduler alone does not say which layer failed, so category ``""`` and
      attribution ``unknown``, except signal 11 (``segfault``). Signature
      ``slurm-failed-exit-N``; a SIGKILL is noted in ``detail`` as a possible OOM kill. An exit
      code above 128 without a signal is read as the shell's "killed by signal code-128".
      ``scheduler_event`` is not used: the taxonomy keeps it for Slurm's own actions (time
      limit, preemption, requeue, node failure), and a FAILED job is the application exiting
      non-zero.
    * COMPLETED, RUNNING, PENDING, REQUEUED, a user's CANCELLED and states this function does
      not know: None. Only NODE_FAIL and BOOT_FAIL put nodes in ``nodes`` (the policy may
      exclude those); for the others the allocation goes to ``detail["allocation_nodes"]``.
    """
    name = normalise_job_state(state)
    if name is None:
        return None
    raw = state.strip()
    context = f"{raw} {reason}"
    if name == "CANCELLED":
        if _CANCEL_TIME_LIMIT.search(context):
            name = "TIMEOUT"
        elif _CANCEL_PREEMPTION.search(context):
            name = "PREEMPTED"
        elif _CANCEL_NODE_FAILURE.search(context):
            name = "NODE_FAIL"
        else:
            return None

    inferred_signal = False
    if signal is None and exit_code is not None and 128 < exit_code <= 128 + 64:
        signal, inferred_signal = exit_code - 128, True

    detail: dict[str, object] = {
        "state": raw,
        "job_state": name,
        "exit_code": exit_code,
        "signal": signal,
        "reason": reason,
    }
    if inferred_signal:
        detail["signal_inferred_from_exit_code"] = True
    if signal in _SIGNAL_NOTES:
        detail["signal_note"] = _SIGNAL_NOTES[signal]

    category: str
    attribution: str
    implicated: list[str] = []
    if name in ("NODE_FAIL", "BOOT_FAIL"):
        category, attribution = FailureCategory.SCHEDULER_EVENT, Attribution.HARDWARE
        signature = "slurm-node-fail" if name == "NODE_FAIL" else "slurm-boot-fail"
        implicated = sorted(set(nodes))
    elif name == "OUT_OF_MEMORY":
        category, attribution, signature = (
            FailureCategory.HOST_OOM,
            Attribution.APPLICATION,
            "slurm-out-of-memory",
        )
    elif name in ("TIMEOUT", "DEADLINE"):
        category, attribution = FailureCategory.SCHEDULER_EVENT, Attribution.APPLICATION
        signature = f"slurm-{name.lower()}"
    elif name == "PREEMPTED":
        category, attribution, signature = (
            FailureCategory.SCHEDULER_EVENT,
            Attribution.SYSTEM_SOFTWARE,
            "slurm-preempted",
        )
    elif name == "FAILED":
        category, attribution = (
            (FailureCategory.SEGFAULT if signal == 11 else NO_CATEGORY),
            Attribution.UNKNOWN,
        )
        if exit_code:
            signature = f"slurm-failed-exit-{exit_code}"
        elif signal:
            signature = f"slurm-failed-signal-{signal}"
        else:
            signature = "slurm-failed"
        if signal == 9:
            detail["possible_oom_kill"] = True
    else:
        return None
    if nodes:
        detail["allocation_nodes"] = list(nodes)

    evidence = f"Slurm job state {raw}"
    if exit_code is not None:
        evidence += f", exit code {exit_code}"
    if signal is not None:
        evidence += f", signal {signal}"
    if reason:
        evidence += f": {reason}"
    return Finding(
        kind=CRASH,
        category=category,
        attribution=attribution,
        severity=Severity.FATAL,
        signature=signature,
        evidence=evidence,
        source="scheduler",
        nodes=implicated,
        at=at,
        detail=detail,
    )


# ---------------------------------------------------------------------------------------------
# Slurm node states

# Symbols sinfo appends to a state: * not responding, ~ powered off, # powering up, ! pending
# power down, % powering down, $ maintenance reservation, @ pending reboot, ^ reboot issued,
# - planned by the backfill scheduler.
_NODE_STATE_SUFFIXES = "*~#!%$@^-"
_NODE_PROBLEMS = {
    "fail": "fail",
    "down": "down",
    "failing": "failing",
    "failg": "failing",
    "drained": "drained",
    "draining": "draining",
    "drng": "draining",
}
# Most serious first, when a node carries several ("DOWN+DRAIN").
_NODE_PROBLEM_ORDER = ("fail", "down", "failing", "drained", "draining")
_BUSY_NODE_STATES = frozenset({"allocated", "alloc", "mixed", "mix", "completing", "comp"})

# The reason an admin, slurmd or a health check gave. Component words come before "NHC",
# because health-check reasons name the failed check ("NHC: check_hw_ib: No IB port is
# ACTIVE").
_XID_IN_REASON = compile_linear(r"(?i)xid\D{0,3}(?P<code>\d+)")
_REASON_RULES = (
    (
        compile_linear(r"(?i)nvlink|nvswitch|fabric ?manager"),
        FailureCategory.INTERCONNECT,
        Attribution.HARDWARE,
    ),
    (
        compile_linear(
            r"(?i)gpu|\becc\b|\bdbe\b|\bsbe\b|row.?remap|nvml|nvidia|dcgm|fallen off|\bgres\b"
        ),
        FailureCategory.GPU_HARDWARE,
        Attribution.HARDWARE,
    ),
    (
        compile_linear(
            r"(?i)\bib\b|infiniband|\bmlx|\bhca\b|\blink\b|rdma|roce|\bnic\b|ethernet|network|"
            r"ibstat|\bport\b"
        ),
        FailureCategory.INTERCONNECT,
        Attribution.HARDWARE,
    ),
    (
        compile_linear(
            r"(?i)lustre|gpfs|\bnfs\b|beegfs|weka|mount|file ?system|\bdisk|storage|i/o"
        ),
        FailureCategory.STORAGE_IO,
        Attribution.SYSTEM_SOFTWARE,
    ),
    (
        compile_linear(r"(?i)\bmce\b|machine check|\bdimm|memory error|edac|realmemory"),
        FailureCategory.SCHEDULER_EVENT,
        Attribution.HARDWARE,
    ),
    (
        compile_linear(r"(?i)thermal|temperature|overheat|\bpsu\b|power supply|\bfan\b"),
        FailureCategory.SCHEDULER_EVENT,
        Attribution.HARDWARE,
    ),
    # slurmd could not kill the job's processes: they hang in uninterruptible I/O or in the
    # GPU driver, a system software state of the node.
    (
        compile_linear(r"(?i)kill task failed"),
        FailureCategory.SCHEDULER_EVENT,
        Attribution.SYSTEM_SOFTWARE,
    ),
    (
        compile_linear(r"(?i)epilog|prolog"),
        FailureCategory.SCHEDULER_EVENT,
        Attribution.SYSTEM_SOFTWARE,
    ),
    # The node stopped answering the controller: a crash, a lost network or a stuck slurmd —
    # the reason alone cannot tell which.
    (compile_linear(r"(?i)not responding"), FailureCategory.SCHEDULER_EVENT, Attribution.UNKNOWN),
    # A health check failed without naming a component recognised above.
    (
        compile_linear(r"(?i)\bnhc\b|health ?check"),
        FailureCategory.SCHEDULER_EVENT,
        Attribution.UNKNOWN,
    ),
)


def _reason_verdict(reason: str) -> tuple[str, str, int | None]:
    """(category, attribution, Xid code or None) named by a node's reason."""
    match = _XID_IN_REASON.search(reason)
    if match:
        code = int(match.group("code"))
        meaning = xid_meaning(code)
        return meaning.category, meaning.attribution, code
    for pattern, category, attribution in _REASON_RULES:
        if pattern.search(reason):
            return category, attribution, None
    return FailureCategory.SCHEDULER_EVENT, Attribution.UNKNOWN, None


def node_state_finding(
    node: str, state: str, reason: str, at: datetime | None = None
) -> Finding | None:
    """A finding for a node that Slurm took out of service, else None.

    DOWN, DRAIN (drained or draining), FAIL and FAILING, in any of their spellings ("DOWN+DRAIN",
    "IDLE+DRAIN", "drained*", "down*", "drng", "failg") give a finding for ``node``; IDLE,
    ALLOCATED, MIXED and other states give None. The category comes from the reason when it
    names a component — an Xid (looked up in ``XID_MEANINGS``), GPU/ECC words (gpu_hardware),
    NVLink or IB/link/mlx words (interconnect), a filesystem (storage_io) — and is
    ``scheduler_event`` otherwise ("Kill task failed", "Not responding", a bare NHC failure,
    an admin's note). DOWN and FAIL are attributed to ``hardware``: the node itself is out.
    DRAIN and FAILING take the reason's attribution (``unknown`` when it names nothing): an
    admin or a health check took the node out, and the reason says why.
    """
    flags: list[str] = []
    not_responding = False
    for part in state.strip().lower().split("+"):
        token = part.strip()
        if token.endswith("*"):
            not_responding = True
        token = token.rstrip(_NODE_STATE_SUFFIXES)
        if token == "not_responding":
            not_responding = True
        if token:
            flags.append(token)
    problems = {_NODE_PROBLEMS[flag] for flag in flags if flag in _NODE_PROBLEMS}
    if "drain" in flags:
        # "DRAIN" is a flag on a base state: on a node still running jobs it is draining.
        problems.add("draining" if _BUSY_NODE_STATES & set(flags) else "drained")
    if not problems:
        return None
    problem = next(name for name in _NODE_PROBLEM_ORDER if name in problems)

    category, reason_attribution, xid = _reason_verdict(reason)
    attribution = Attribution.HARDWARE if problem in ("down", "fail") else reason_attribution
    evidence = f"node {node} is {state.strip()}"
    if reason:
        evidence += f": {reason}"
    detail: dict[str, object] = {
        "state": state.strip(),
        "problem": problem,
        "flags": flags,
        "not_responding": not_responding,
        "reason": reason,
    }
    if xid is not None:
        detail["xid"] = xid
        detail["xid_description"] = xid_meaning(xid).description
    return Finding(
        kind=CRASH,
        category=category,
        attribution=attribution,
        severity=Severity.ERROR if problem in ("down", "fail") else Severity.WARNING,
        signature=f"slurm-node-{problem}",
        evidence=evidence,
        source="scheduler",
        nodes=[node],
        at=at,
        detail=detail,
    )
