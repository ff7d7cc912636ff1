"""The Slurm adapter: squeue/sinfo/scontrol/scancel through a transport.

Slurm's JSON output is used where this Slurm has it (``squeue --json``, ``sinfo --json``);
otherwise a fixed-format fallback with an ASCII unit separator between fields, the free-text
comment last. Every id and node name is validated before it reaches a command line.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from recovery.schedulers.base import (
    CommandResult,
    JobInfo,
    NodeInfo,
    SchedulerAdapter,
    SchedulerError,
    Transport,
)
from recovery.schedulers.nodelist import NodeListError, compress_nodelist, expand_nodelist
from recovery.schedulers.optin import parse_job_comment
from recovery.schedulers.validation import validate_job_id, validate_node_names

logger = logging.getLogger(__name__)

SEPARATOR = "\x1f"
# squeue -o fields for the fallback; the comment (%k) may hold anything, so it comes last.
FALLBACK_FIELDS = ("%i", "%j", "%u", "%P", "%T", "%r", "%N", "%V", "%S", "%e", "%Z", "%p", "%k")
HELD_REASONS = frozenset({"JobHeldAdmin", "JobHeldUser", "job_requeued_in_held_state"})


class SlurmAdapter(SchedulerAdapter):
    def __init__(self, transport: Transport, *, command_timeout: float = 30.0) -> None:
        self.transport = transport
        self.command_timeout = command_timeout
        self._json: bool | None = None  # learnt on first use

    # ------------------------------------------------------------------ reading

    def list_jobs(self) -> list[JobInfo]:
        if self._json is not False:
            result = self._run(["squeue", "--json"], check=False)
            document = _json_document(result)
            if document is not None:
                self._json = True
                return [job for raw in document.get("jobs", []) if (job := _job_from_json(raw))]
            self._json = False
            logger.info("squeue has no usable --json here; using the fixed format")
        return self._list_jobs_fixed_format()

    def get_job(self, job_id: str) -> JobInfo | None:
        job_id = validate_job_id(job_id)
        if self._json is False:
            return next(iter(self._list_jobs_fixed_format(job_id)), None)
        # squeue --json ignores -j: it always returns every job it knows.
        return next((job for job in self.list_jobs() if job.job_id == job_id), None)

    def list_nodes(self) -> list[NodeInfo]:
        result = self._run(["sinfo", "--json"], check=False)
        document = _json_document(result)
        if document is not None:
            return [_node_from_json(raw) for raw in document.get("nodes", [])]
        fixed = self._run(["sinfo", "-h", "-N", "-o", f"%N{SEPARATOR}%T{SEPARATOR}%E"])
        nodes = {}
        for line in fixed.stdout.splitlines():
            name, state, reason = ([*line.split(SEPARATOR), "", "", ""])[:3]
            base, flags = _split_node_state(state)
            nodes[name] = NodeInfo(name=name, state=base, flags=flags, reason=_none(reason))
        return list(nodes.values())

    def _list_jobs_fixed_format(self, job_id: str | None = None) -> list[JobInfo]:
        argv = ["squeue", "-h", "-t", "all", "-o", SEPARATOR.join(FALLBACK_FIELDS)]
        if job_id is not None:
            argv += ["-j", job_id]
        result = self._run(argv, check=job_id is None)
        if not result.ok:
            return []  # "Invalid job id specified": the job is gone
        jobs = []
        for line in result.stdout.splitlines():
            fields = line.split(SEPARATOR, len(FALLBACK_FIELDS) - 1)
            if len(fields) != len(FALLBACK_FIELDS):
                logger.warning("ignored squeue line with %d fields: %.200s", len(fields), line)
                continue
            jobs.append(_job_from_fields(fields))
        return jobs

    # ------------------------------------------------------------------ acting

    def requeue(self, job_id: str, *, hold: bool = False) -> CommandResult:
        verb = "requeuehold" if hold else "requeue"
        return self._run(["scontrol", verb, validate_job_id(job_id)])

    def set_excluded_nodes(self, job_id: str, nodes: Sequence[str]) -> CommandResult:
        names = compress_nodelist(validate_node_names(nodes)) if nodes else ""
        return self._run(
            ["scontrol", "update", f"JobId={validate_job_id(job_id)}", f"ExcNodeList={names}"]
        )

    def clear_start_delay(self, job_id: str) -> CommandResult:
        return self._run(
            ["scontrol", "update", f"JobId={validate_job_id(job_id)}", "StartTime=now"]
        )

    def release(self, job_id: str) -> CommandResult:
        return self._run(["scontrol", "release", validate_job_id(job_id)])

    def hold(self, job_id: str) -> CommandResult:
        return self._run(["scontrol", "hold", validate_job_id(job_id)])

    def cancel(self, job_id: str) -> CommandResult:
        return self._run(["scancel", validate_job_id(job_id)])

    def disable_requeue(self, job_id: str) -> CommandResult:
        return self._run(["scontrol", "update", f"JobId={validate_job_id(job_id)}", "Requeue=0"])

    def _run(self, argv: list[str], *, check: bool = True) -> CommandResult:
        result = self.transport.run(argv, timeout=self.command_timeout)
        if check and not result.ok:
            raise SchedulerError(result.describe(), result)
        return result


# ---------------------------------------------------------------------- parsing


def _json_document(result: CommandResult) -> dict[str, Any] | None:
    if not result.ok:
        return None
    try:
        document = json.loads(result.stdout)
    except ValueError:
        return None
    return document if isinstance(document, dict) else None


def _job_from_json(raw: dict[str, Any]) -> JobInfo | None:
    try:
        job_id = str(raw["job_id"])
        array_task = raw.get("array_task_id")
        if isinstance(array_task, int) and raw.get("array_job_id"):
            job_id = f"{raw['array_job_id']}_{array_task}"
        status = raw.get("exit_code")
        exit_code, exit_signal = _decode_wait_status(status if isinstance(status, int) else None)
        reason = _none(str(raw.get("state_reason", "")))
        comment = raw.get("comment") or ""
        info = {
            "job_id": job_id,
            "name": str(raw.get("name", "")),
            "user": str(raw.get("user_name", "")),
            "partition": str(raw.get("partition", "")),
            "state": str(raw.get("job_state", "")).upper(),
            "reason": reason,
            "work_dir": str(raw.get("current_working_directory", "")),
        }
        return JobInfo(
            **info,
            comment=comment,
            opt_in=parse_job_comment(comment),
            nodes=_nodes(raw.get("nodes")),
            excluded_nodes=_nodes(raw.get("excluded_nodes")),
            restart_count=int(raw.get("restart_cnt") or 0),
            exit_code=exit_code,
            exit_signal=exit_signal,
            requeue_allowed=bool(raw.get("requeue", True)),
            held=reason in HELD_REASONS or raw.get("priority") == 0,
            stdout_path=expand_output_path(raw.get("standard_output") or "", info),
            stderr_path=expand_output_path(raw.get("standard_error") or "", info),
            submit_time=_epoch(raw.get("submit_time")),
            eligible_time=_epoch(raw.get("eligible_time")),
            start_time=_epoch(raw.get("start_time")),
            end_time=_epoch(raw.get("end_time")),
        )
    except (KeyError, TypeError, ValueError) as exc:
        logger.warning("ignored a job squeue reported in an unexpected shape: %s", exc)
        return None


def _job_from_fields(fields: list[str]) -> JobInfo:
    (
        job_id,
        name,
        user,
        partition,
        state,
        reason,
        nodes,
        submit,
        start,
        end,
        work_dir,
        priority,
        comment,
    ) = fields
    info = {
        "job_id": job_id.strip(),
        "name": name,
        "user": user,
        "partition": partition,
        "state": state.strip().upper(),
        "reason": _none(reason),
        "work_dir": work_dir,
    }
    comment = _none(comment)
    return JobInfo(
        **info,
        comment=comment,
        opt_in=parse_job_comment(comment),
        nodes=_nodes(nodes),
        held=info["reason"] in HELD_REASONS or priority.strip() in {"0", "0.00000000"},
        stdout_path=expand_output_path("", info),
        stderr_path=expand_output_path("", info),
        submit_time=_slurm_time(submit),
        start_time=_slurm_time(start),
        end_time=_slurm_time(end),
    )


def _node_from_json(raw: dict[str, Any]) -> NodeInfo:
    flags = raw.get("state_flags") or []
    return NodeInfo(
        name=str(raw.get("name", "")),
        state=str(raw.get("state", "")).upper(),
        flags=[str(flag).upper() for flag in flags],
        reason=str(raw.get("reason") or ""),
    )


def _split_node_state(text: str) -> tuple[str, list[str]]:
    """``mixed+drain`` or ``down*`` → base state and flags (``*`` means not responding)."""
    text = text.strip().upper()
    flags = []
    if text.endswith("*"):
        flags.append("NOT_RESPONDING")
        text = text.rstrip("*")
    base, *rest = text.split("+")
    return base, flags + rest


def _nodes(value: object) -> list[str]:
    if not isinstance(value, str) or not value.strip():
        return []
    try:
        return expand_nodelist(value)
    except NodeListError as exc:
        logger.warning("ignored a node list Slurm reported: %s", exc)
        return []


def _decode_wait_status(status: int | None) -> tuple[int | None, int | None]:
    """Slurm 22.05 reports the raw wait status: 768 is exit 3, 15 is SIGTERM."""
    if status is None:
        return None, None
    signal = status & 0x7F
    if signal:
        return None, signal
    return (status >> 8) & 0xFF, None


def _epoch(value: object) -> datetime | None:
    if isinstance(value, int | float) and value > 0:
        return datetime.fromtimestamp(value, tz=UTC)
    return None


def _slurm_time(text: str) -> datetime | None:
    text = text.strip()
    if not text or text in {"N/A", "Unknown", "None"}:
        return None
    try:
        return datetime.fromisoformat(text).replace(tzinfo=UTC)
    except ValueError:
        return None


def _none(text: str) -> str:
    text = (text or "").strip()
    return "" if text in {"(null)", "None", "N/A"} else text


def expand_output_path(pattern: str, job: dict[str, str]) -> str:
    """Expand sbatch's filename pattern for a job's stdout/stderr (``%j``, ``%x``, ``%u``...).

    An empty pattern is Slurm's default, ``slurm-<jobid>.out`` in the working directory.
    Codes that depend on a node or step (``%N``, ``%n``, ``%t``, ``%s``) are left as they are.
    """
    job_id = job["job_id"]
    master, _, task = job_id.partition("_")
    if not pattern:
        pattern = f"{job.get('work_dir', '').rstrip('/')}/slurm-%j.out"
    values = {
        "j": job_id,
        "x": job.get("name", ""),
        "u": job.get("user", ""),
        "A": master,
        "a": task,
    }
    out = []
    i = 0
    while i < len(pattern):
        char = pattern[i]
        if char == "%" and i + 1 < len(pattern):
            code = pattern[i + 1]
            if code == "%":
                out.append("%")
            elif code in values:
                out.append(values[code])
            else:
                out.append(pattern[i : i + 2])
            i += 2
            continue
        out.append(char)
        i += 1
    path = "".join(out)
    if not path.startswith("/") and job.get("work_dir"):
        path = f"{job['work_dir'].rstrip('/')}/{path}"
    return path
