"""How an attempt ended, as its scheduler tells it, turned into a finding.

A scheduler says *that* a job failed, rarely *why*: the phase gives the category when it names
it (a node failure, out of memory, the time limit, preemption). Everything here reads the
scheduler-neutral ``Phase``; the scheduler's own word (``native_state``) is kept in the finding
for people to read, and names its signature (``slurm-node-fail``, ``slurm-boot-fail``...) so
that the signatures recorded before phases existed stay the same.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from recovery.detection.findings import CRASH, Finding
from recovery.detection.linear_regex import compile_linear
from recovery.detection.taxonomy import NO_CATEGORY, Attribution, FailureCategory, Severity
from recovery.schedulers.phase import Phase

# What a scheduler says when it cancels a job on its own behalf (slurmstepd's "CANCELLED AT
# ... DUE TO TIME LIMIT"): a cancel that is a time limit, a preemption or a node failure.
_CANCEL_TIME_LIMIT = compile_linear(r"(?i)time limit")
_CANCEL_PREEMPTION = compile_linear(r"(?i)due to preemption")
_CANCEL_NODE_FAILURE = compile_linear(r"(?i)due to node\s+\S*\s*fail|node fail")
# The signature's last part for a cancel read as one of these (the scheduler's own word for
# the phase is not known then).
_CANCEL_SIGNATURES = {
    Phase.TIMED_OUT: "timeout",
    Phase.PREEMPTED: "preempted",
    Phase.NODE_FAILED: "node-fail",
}

_SIGNAL_NOTES = {
    6: "SIGABRT: the process aborted itself (failed assertion, uncaught C++ exception, NCCL or "
    "c10 abort)",
    7: "SIGBUS: bad memory access, often a memory-mapped file on failed storage",
    9: "SIGKILL: possibly an out-of-memory kill (kernel or Slurm cgroup), or the end of a "
    "timeout or cancel escalation",
    11: "SIGSEGV: segmentation fault",
    15: "SIGTERM: terminated from outside (scancel, preemption, time limit)",
}


def _cancel_read_as(native_state: str, reason: str) -> Phase | None:
    context = f"{native_state} {reason}"
    if _CANCEL_TIME_LIMIT.search(context):
        return Phase.TIMED_OUT
    if _CANCEL_PREEMPTION.search(context):
        return Phase.PREEMPTED
    if _CANCEL_NODE_FAILURE.search(context):
        return Phase.NODE_FAILED
    return None


def _slug(native_state: str) -> str:
    words = native_state.strip().split()
    return (words[0] if words else "").rstrip("+").lower().replace("_", "-")


def finding_from_job_ending(
    phase: Phase,
    *,
    native_state: str,
    scheduler: str = "slurm",
    exit_code: int | None = None,
    signal: int | None = None,
    reason: str = "",
    nodes: Sequence[str] = (),
    at: datetime | None = None,
) -> Finding | None:
    """A finding for an attempt that ended in ``phase``, when that ending is abnormal; else None.

    * NODE_FAILED: a node of the allocation failed — category ``scheduler_event``, attribution
      ``hardware``, ``nodes`` the ones given (the allocation, or the failed node when the caller
      knows it).
    * OUT_OF_MEMORY: the scheduler killed the job for host memory — ``host_oom``,
      ``application``.
    * TIMED_OUT (and a cancel "DUE TO TIME LIMIT"): ``scheduler_event``, ``application`` — the
      job asked for too little time.
    * PREEMPTED (and a cancel "DUE TO PREEMPTION"): ``scheduler_event``, ``system_software``.
    * FAILED: the scheduler alone does not say which layer failed, so category ``""`` and
      attribution ``unknown``, except signal 11 (``segfault``). Signature
      ``<scheduler>-failed-exit-N``; a SIGKILL is noted in ``detail`` as a possible OOM kill.
      An exit code above 128 without a signal is read as the shell's "killed by signal
      code-128". ``scheduler_event`` is not used: the taxonomy keeps it for the scheduler's own
      actions (time limit, preemption, requeue, node failure), and a failed job is the
      application exiting non-zero.
    * Any other phase, and a user's cancel: None. Only NODE_FAILED puts nodes in ``nodes`` (the
      policy may exclude those); for the others the allocation goes to
      ``detail["allocation_nodes"]``.

    The signature is ``<scheduler>-<native state>`` (``slurm-node-fail``, ``slurm-deadline``).
    """
    name = _slug(native_state)
    if phase == Phase.CANCELLED:
        read_as = _cancel_read_as(native_state, reason)
        if read_as is None:
            return None
        phase, name = read_as, _CANCEL_SIGNATURES[read_as]

    inferred_signal = False
    if signal is None and exit_code is not None and 128 < exit_code <= 128 + 64:
        signal, inferred_signal = exit_code - 128, True

    raw = native_state.strip()
    detail: dict[str, object] = {
        "state": raw,
        "phase": str(phase),
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
    signature = f"{scheduler}-{name}"
    if phase == Phase.NODE_FAILED:
        category, attribution = FailureCategory.SCHEDULER_EVENT, Attribution.HARDWARE
        implicated = sorted(set(nodes))
    elif phase == Phase.OUT_OF_MEMORY:
        category, attribution = FailureCategory.HOST_OOM, Attribution.APPLICATION
    elif phase == Phase.TIMED_OUT:
        category, attribution = FailureCategory.SCHEDULER_EVENT, Attribution.APPLICATION
    elif phase == Phase.PREEMPTED:
        category, attribution = FailureCategory.SCHEDULER_EVENT, Attribution.SYSTEM_SOFTWARE
    elif phase == Phase.FAILED:
        category, attribution = (
            (FailureCategory.SEGFAULT if signal == 11 else NO_CATEGORY),
            Attribution.UNKNOWN,
        )
        if exit_code:
            signature = f"{scheduler}-failed-exit-{exit_code}"
        elif signal:
            signature = f"{scheduler}-failed-signal-{signal}"
        else:
            signature = f"{scheduler}-failed"
        if signal == 9:
            detail["possible_oom_kill"] = True
    else:
        return None
    if nodes:
        detail["allocation_nodes"] = list(nodes)

    evidence = f"{scheduler.capitalize()} job state {raw}"
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
