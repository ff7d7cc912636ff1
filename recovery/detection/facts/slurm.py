"""Slurm node states turned into findings.

Slurm says *that* a node failed, rarely *why*: a node's reason names the component when an
admin, slurmd or a health check wrote one down. How a job ended is read by its phase, the same
for every scheduler (``job_ending.py``).
"""

from __future__ import annotations

from datetime import datetime

from recovery.detection.facts.xid import xid_meaning
from recovery.detection.findings import CRASH, Finding
from recovery.detection.linear_regex import compile_linear
from recovery.detection.taxonomy import Attribution, FailureCategory, Severity

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
