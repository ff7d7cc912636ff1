"""Scheduler states and GPU metrics turned into findings of the same shape as log findings.

Slurm says *that* a job or node failed, rarely *why*; DCGM says what a GPU reported. Each
becomes a ``Finding`` with ``source="scheduler"`` or ``source="metrics"``, so the attribution
and policy steps treat every signal family alike.

``XID_MEANINGS`` is the one table of NVIDIA Xid codes in the project; log signatures import it.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

from recovery.detection.findings import CRASH, STRAGGLER, Finding
from recovery.detection.hang import format_duration
from recovery.detection.linear_regex import compile_linear

# ---------------------------------------------------------------------------------------------
# Xid codes


@dataclass(frozen=True)
class XidMeaning:
    """What an Xid code shows (category), which layer it usually blames, and how bad it is."""

    category: str
    attribution: str
    description: str
    severity: str = "error"


# From NVIDIA's Xid documentation (the "Xid errors" catalogue and the GPU memory error
# management guide). Only codes seen on training clusters and whose meaning is settled are
# listed; an unknown code is reported as gpu_hardware with attribution "unknown".
XID_MEANINGS: dict[int, XidMeaning] = {
    13: XidMeaning(
        "cuda_error_app",
        "application",
        "graphics engine exception: usually the application's fault (e.g. out-of-range access)",
    ),
    31: XidMeaning(
        "cuda_error_app",
        "application",
        "GPU memory page fault (MMU fault): usually an illegal memory access by the application",
    ),
    32: XidMeaning(
        "gpu_hardware",
        "unknown",
        "invalid or corrupted push buffer stream: driver, system memory or PCIe bus corruption",
    ),
    38: XidMeaning("gpu_hardware", "system_software", "driver firmware error"),
    43: XidMeaning(
        "cuda_error_app",
        "application",
        "GPU stopped processing (reset channel verification error): the application's context "
        "faulted",
    ),
    45: XidMeaning(
        "cuda_error_app",
        "unknown",
        "preemptive cleanup of a GPU context after earlier errors or a killed process: a "
        "symptom, the cause is the error before it",
        severity="warning",
    ),
    48: XidMeaning(
        "gpu_hardware",
        "hardware",
        "double-bit ECC error (DBE): uncorrectable GPU memory error",
        severity="fatal",
    ),
    61: XidMeaning(
        "gpu_hardware", "hardware", "internal micro-controller breakpoint/warning (PMU)"
    ),
    62: XidMeaning(
        "gpu_hardware", "hardware", "internal micro-controller halt (PMU)", severity="fatal"
    ),
    63: XidMeaning(
        "gpu_hardware",
        "hardware",
        "ECC page retirement or row-remapping recording event: reset the GPU for it to take effect",
        severity="warning",
    ),
    64: XidMeaning(
        "gpu_hardware", "hardware", "ECC page retirement or row-remapping recording failure"
    ),
    74: XidMeaning("interconnect", "hardware", "NVLink error"),
    79: XidMeaning(
        "gpu_hardware",
        "hardware",
        "GPU has fallen off the bus: it no longer answers on PCIe",
        severity="fatal",
    ),
    92: XidMeaning(
        "gpu_hardware", "hardware", "high single-bit ECC error rate", severity="warning"
    ),
    94: XidMeaning(
        "gpu_hardware",
        "hardware",
        "contained ECC error: the affected application was stopped, the GPU needs a reset",
    ),
    95: XidMeaning(
        "gpu_hardware",
        "hardware",
        "uncontained ECC error: every application on the GPU is affected, the GPU must be reset",
        severity="fatal",
    ),
    # GSP firmware faults need a GPU reset whatever their root cause, so the node is kept out
    # of the next attempt; the same code on many nodes at once points at the driver/firmware.
    119: XidMeaning(
        "gpu_hardware",
        "hardware",
        "GSP RPC timeout: the GPU System Processor stopped answering, the GPU needs a reset",
        severity="fatal",
    ),
    120: XidMeaning(
        "gpu_hardware",
        "hardware",
        "GSP error: the GPU System Processor firmware failed, the GPU needs a reset",
        severity="fatal",
    ),
    154: XidMeaning(
        "gpu_hardware",
        "hardware",
        "GPU recovery action changed: the driver asks for a GPU reset or a node reboot",
    ),
}

UNKNOWN_XID = XidMeaning("gpu_hardware", "unknown", "Xid not in the table")


def xid_meaning(code: int) -> XidMeaning:
    """The table entry for ``code``, or a neutral GPU-hardware meaning for unlisted codes."""
    return XID_MEANINGS.get(code, UNKNOWN_XID)


# ---------------------------------------------------------------------------------------------
# Slurm job states

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

    implicated: list[str] = []
    if name in ("NODE_FAIL", "BOOT_FAIL"):
        category, attribution = "scheduler_event", "hardware"
        signature = "slurm-node-fail" if name == "NODE_FAIL" else "slurm-boot-fail"
        implicated = sorted(set(nodes))
    elif name == "OUT_OF_MEMORY":
        category, attribution, signature = "host_oom", "application", "slurm-out-of-memory"
    elif name in ("TIMEOUT", "DEADLINE"):
        category, attribution = "scheduler_event", "application"
        signature = f"slurm-{name.lower()}"
    elif name == "PREEMPTED":
        category, attribution, signature = "scheduler_event", "system_software", "slurm-preempted"
    elif name == "FAILED":
        category, attribution = ("segfault" if signal == 11 else ""), "unknown"
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
        severity="fatal",
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
    (compile_linear(r"(?i)nvlink|nvswitch|fabric ?manager"), "interconnect", "hardware"),
    (
        compile_linear(
            r"(?i)gpu|\becc\b|\bdbe\b|\bsbe\b|row.?remap|nvml|nvidia|dcgm|fallen off|\bgres\b"
        ),
        "gpu_hardware",
        "hardware",
    ),
    (
        compile_linear(
            r"(?i)\bib\b|infiniband|\bmlx|\bhca\b|\blink\b|rdma|roce|\bnic\b|ethernet|network|"
            r"ibstat|\bport\b"
        ),
        "interconnect",
        "hardware",
    ),
    (
        compile_linear(
            r"(?i)lustre|gpfs|\bnfs\b|beegfs|weka|mount|file ?system|\bdisk|storage|i/o"
        ),
        "storage_io",
        "system_software",
    ),
    (
        compile_linear(r"(?i)\bmce\b|machine check|\bdimm|memory error|edac|realmemory"),
        "scheduler_event",
        "hardware",
    ),
    (
        compile_linear(r"(?i)thermal|temperature|overheat|\bpsu\b|power supply|\bfan\b"),
        "scheduler_event",
        "hardware",
    ),
    # slurmd could not kill the job's processes: they hang in uninterruptible I/O or in the
    # GPU driver, a system software state of the node.
    (compile_linear(r"(?i)kill task failed"), "scheduler_event", "system_software"),
    (compile_linear(r"(?i)epilog|prolog"), "scheduler_event", "system_software"),
    # The node stopped answering the controller: a crash, a lost network or a stuck slurmd —
    # the reason alone cannot tell which.
    (compile_linear(r"(?i)not responding"), "scheduler_event", "unknown"),
    # A health check failed without naming a component recognised above.
    (compile_linear(r"(?i)\bnhc\b|health ?check"), "scheduler_event", "unknown"),
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
    return "scheduler_event", "unknown", None


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
    attribution = "hardware" if problem in ("down", "fail") else reason_attribution
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
        severity="error" if problem in ("down", "fail") else "warning",
        signature=f"slurm-node-{problem}",
        evidence=evidence,
        source="scheduler",
        nodes=[node],
        at=at,
        detail=detail,
    )


# ---------------------------------------------------------------------------------------------
# GPU metrics (DCGM exporter names)

XID_METRIC = "DCGM_FI_DEV_XID_ERRORS"
GPU_UTIL_METRIC = "DCGM_FI_DEV_GPU_UTIL"
ECC_DBE_METRIC = "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"
ROW_REMAP_FAILURE_METRIC = "DCGM_FI_DEV_ROW_REMAP_FAILURE"


@dataclass(frozen=True)
class MetricSample:
    """One sample of one metric for one GPU."""

    at: datetime
    node: str
    gpu: str
    name: str
    value: float


GpuKey = tuple[str, str]


def _series(samples: Sequence[MetricSample], name: str) -> dict[GpuKey, list[MetricSample]]:
    series: dict[GpuKey, list[MetricSample]] = {}
    for sample in samples:
        if sample.name == name and math.isfinite(sample.value):
            series.setdefault((sample.node, sample.gpu), []).append(sample)
    for values in series.values():
        values.sort(key=lambda sample: sample.at)
    return dict(sorted(series.items()))


def latest_values(samples: Sequence[MetricSample], name: str) -> dict[GpuKey, float]:
    """The last value of metric ``name`` per (node, gpu): the ``previous_*`` of the next call."""
    return {key: values[-1].value for key, values in _series(samples, name).items()}


def findings_from_gpu_metrics(
    samples: Sequence[MetricSample],
    *,
    previous_xid: Mapping[GpuKey, float] | None = None,
    previous_ecc_dbe: Mapping[GpuKey, float] | None = None,
    idle_threshold: float = 1.0,
    busy_threshold: float = 20.0,
    min_idle_samples: int = 3,
) -> list[Finding]:
    """Findings from DCGM exporter samples, one per (node, GPU, cause) with a count.

    * ``DCGM_FI_DEV_XID_ERRORS`` holds the last Xid code seen on a GPU. A change to a non-zero
      code (from ``previous_xid`` or the sample before) is an event, and so is a non-zero first
      value when nothing earlier is known. The same code twice in a row cannot be told apart
      from one event: the gauge does not change.
    * ``DCGM_FI_DEV_ECC_DBE_VOL_TOTAL`` is a counter: an increase over the sample before (or
      over ``previous_ecc_dbe``) is an uncorrectable ECC error; a decrease is a driver reload.
    * ``DCGM_FI_DEV_ROW_REMAP_FAILURE`` non-zero: the GPU ran out of spare memory rows.
    * ``DCGM_FI_DEV_GPU_UTIL``: a GPU at or below ``idle_threshold`` % for at least
      ``min_idle_samples`` consecutive samples while the median of the job's other GPUs over
      that time is at least ``busy_threshold`` % is stuck while its peers work (or spin in a
      collective waiting for it). When all GPUs are idle the job is not computing at all; that
      is for the hang detector, not this one.
    """
    findings: list[Finding] = []
    findings += _xid_findings(_series(samples, XID_METRIC), previous_xid or {})
    findings += _ecc_findings(_series(samples, ECC_DBE_METRIC), previous_ecc_dbe or {})
    findings += _row_remap_findings(_series(samples, ROW_REMAP_FAILURE_METRIC))
    findings += _stuck_idle_findings(
        _series(samples, GPU_UTIL_METRIC),
        idle_threshold=idle_threshold,
        busy_threshold=busy_threshold,
        min_idle_samples=min_idle_samples,
    )
    return findings


def _xid_findings(
    series: dict[GpuKey, list[MetricSample]], previous: Mapping[GpuKey, float]
) -> list[Finding]:
    findings = []
    for (node, gpu), values in series.items():
        last = previous.get((node, gpu))
        last_code = int(last) if last is not None and math.isfinite(last) else None
        events: dict[int, list[MetricSample]] = {}
        for sample in values:
            code = int(sample.value)
            if code != 0 and code != last_code:
                events.setdefault(code, []).append(sample)
            last_code = code
        for code, seen in sorted(events.items()):
            meaning = xid_meaning(code)
            evidence = f"Xid {code} on {node} GPU {gpu}: {meaning.description}"
            if len(seen) > 1:
                evidence += f" ({len(seen)} times)"
            findings.append(
                Finding(
                    kind=CRASH,
                    category=meaning.category,
                    attribution=meaning.attribution,
                    severity=meaning.severity,
                    signature=f"xid-{code}",
                    evidence=evidence,
                    source="metrics",
                    count=len(seen),
                    nodes=[node],
                    at=seen[0].at,
                    detail={
                        "metric": XID_METRIC,
                        "gpu": gpu,
                        "xid": code,
                        "description": meaning.description,
                        "known_xid": code in XID_MEANINGS,
                        "first_at": seen[0].at.isoformat(),
                        "last_at": seen[-1].at.isoformat(),
                    },
                )
            )
    return findings


def _ecc_findings(
    series: dict[GpuKey, list[MetricSample]], previous: Mapping[GpuKey, float]
) -> list[Finding]:
    findings = []
    for (node, gpu), values in series.items():
        last = previous.get((node, gpu))
        increases: list[tuple[MetricSample, float]] = []
        for sample in values:
            if last is not None and sample.value > last:
                increases.append((sample, sample.value - last))
            last = sample.value
        if not increases:
            continue
        errors = sum(amount for _, amount in increases)
        findings.append(
            Finding(
                kind=CRASH,
                category="gpu_hardware",
                attribution="hardware",
                severity="error",
                signature="ecc-dbe-increase",
                evidence=(
                    f"{node} GPU {gpu}: {errors:g} new double-bit (uncorrectable) ECC error(s)"
                ),
                source="metrics",
                count=len(increases),
                nodes=[node],
                at=increases[0][0].at,
                detail={
                    "metric": ECC_DBE_METRIC,
                    "gpu": gpu,
                    "new_errors": errors,
                    "total": values[-1].value,
                    "first_at": increases[0][0].at.isoformat(),
                    "last_at": increases[-1][0].at.isoformat(),
                },
            )
        )
    return findings


def _row_remap_findings(series: dict[GpuKey, list[MetricSample]]) -> list[Finding]:
    findings = []
    for (node, gpu), values in series.items():
        failing = [sample for sample in values if sample.value != 0]
        if not failing:
            continue
        findings.append(
            Finding(
                kind=CRASH,
                category="gpu_hardware",
                attribution="hardware",
                severity="error",
                signature="row-remap-failure",
                evidence=(
                    f"{node} GPU {gpu}: row remapping failed (no spare memory rows left); "
                    "the GPU needs service"
                ),
                source="metrics",
                count=len(failing),
                nodes=[node],
                at=failing[0].at,
                detail={
                    "metric": ROW_REMAP_FAILURE_METRIC,
                    "gpu": gpu,
                    "first_at": failing[0].at.isoformat(),
                    "last_at": failing[-1].at.isoformat(),
                },
            )
        )
    return findings


def _idle_runs(values: list[MetricSample], idle_threshold: float) -> list[list[MetricSample]]:
    runs: list[list[MetricSample]] = []
    current: list[MetricSample] = []
    for sample in values:
        if sample.value <= idle_threshold:
            current.append(sample)
        else:
            if current:
                runs.append(current)
            current = []
    if current:
        runs.append(current)
    return runs


def _stuck_idle_findings(
    series: dict[GpuKey, list[MetricSample]],
    *,
    idle_threshold: float,
    busy_threshold: float,
    min_idle_samples: int,
) -> list[Finding]:
    findings = []
    for key, values in series.items():
        node, gpu = key
        stuck: list[tuple[list[MetricSample], float]] = []
        for run in _idle_runs(values, idle_threshold):
            if len(run) < min_idle_samples:
                continue
            start, end = run[0].at, run[-1].at
            peers = [
                sample.value
                for other, other_values in series.items()
                if other != key
                for sample in other_values
                if start <= sample.at <= end
            ]
            if not peers:
                continue
            peer_median = statistics.median(peers)
            if peer_median >= busy_threshold:
                stuck.append((run, peer_median))
        if not stuck:
            continue
        longest, peer_median = max(stuck, key=lambda item: len(item[0]))
        idle_samples = sum(len(run) for run, _ in stuck)
        duration = (longest[-1].at - longest[0].at).total_seconds()
        findings.append(
            Finding(
                kind=STRAGGLER,
                category="",
                attribution="unknown",
                severity="error",
                signature="gpu-stuck-idle",
                evidence=(
                    f"{node} GPU {gpu} stuck at {max(s.value for s in longest):g}% utilisation "
                    f"for {len(longest)} consecutive samples ({format_duration(duration)}) "
                    f"while the job's other GPUs ran at a median {peer_median:.0f}%"
                ),
                source="metrics",
                count=idle_samples,
                nodes=[node],
                at=stuck[0][0][0].at,
                detail={
                    "metric": GPU_UTIL_METRIC,
                    "gpu": gpu,
                    "idle_samples": idle_samples,
                    "longest_run_samples": len(longest),
                    "longest_run_seconds": duration,
                    "peer_median": peer_median,
                    "first_at": stuck[0][0][0].at.isoformat(),
                    "last_at": stuck[-1][0][-1].at.isoformat(),
                },
            )
        )
    return findings
