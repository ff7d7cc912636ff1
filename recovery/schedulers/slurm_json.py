"""Slurm's JSON output (``squeue --json``, ``sinfo --json``, ``scontrol --json show ...``), read
the same way for every Slurm from 22.05 to 25.11.

The shape of that output changes with each release, because each one prints through a newer
data parser:

- 22.05 (openapi/v0.0.38): flat values. ``job_state`` is one word, which is a flag such as
  ``COMPLETING`` when one is set; numbers are plain (``priority`` null when unset); ``exit_code``
  is the raw wait status; unset strings are ``""``; node ``state`` is a lower-case base state
  with a separate ``state_flags`` list. ``meta.Slurm.version`` holds integers.
- 23.02 (data_parser/v0.0.39): ``job_state`` is still one word and times are plain integers,
  but ``priority``, ``array_job_id``, ``array_task_id`` and ``exit_code`` (still the raw wait
  status) become ``{"set", "infinite", "number"}`` objects; node ``state`` is a list.
- 23.11 to 25.11 (v0.0.40 to v0.0.44): ``job_state`` is a list, base state first and then its
  flags (``["PENDING", "REQUEUED"]``); times are number objects too; ``exit_code`` is
  ``{"status", "return_code", "signal": {"id", "name"}}``; ``meta.slurm`` holds the version as
  strings and the cluster name. 25.11 adds the state flag ``EXPEDITING``.

The recovery loop acts on what is read here, so nothing is guessed: a fact that is absent,
null, unset, infinite or in a shape this module does not know is ``None`` in ``JobInfo`` and
its field is listed in ``JobInfo.unreadable`` with the reason. A default (0, [], True, "now")
would look like a fact and could make the loop requeue the wrong job.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from recovery.schedulers.base import JobInfo, NodeInfo
from recovery.schedulers.dependency import chained_after
from recovery.schedulers.optin import parse_job_comment
from recovery.schedulers.output_files import valid_uid
from recovery.schedulers.slurm_nodes import node_from_record, nodes_from_sinfo_groups
from recovery.schedulers.slurm_phase import slurm_phase
from recovery.schedulers.slurm_values import (
    _ABSENT,
    _epoch,
    _exit_code,
    _get,
    _nodes,
    _number,
    _plain_int,
    _shape,
    _string,
    _text,
    _Unreadable,
)
from recovery.schedulers.validation import shown

# Slurm's base job states (JOB_STATE_BASE) and state flags (JOB_STATE_FLAGS), as its data
# parsers name them; EXPEDITING is new in 25.11.
JOB_BASE_STATES = frozenset(
    {
        "PENDING",
        "RUNNING",
        "SUSPENDED",
        "COMPLETED",
        "CANCELLED",
        "FAILED",
        "TIMEOUT",
        "NODE_FAIL",
        "PREEMPTED",
        "BOOT_FAIL",
        "DEADLINE",
        "OUT_OF_MEMORY",
    }
)
JOB_STATE_FLAGS = frozenset(
    {
        "LAUNCH_FAILED",
        "UPDATE_DB",
        "REQUEUED",
        "REQUEUE_HOLD",
        "SPECIAL_EXIT",
        "RESIZING",
        "CONFIGURING",
        "COMPLETING",
        "STOPPED",
        "RECONFIG_FAIL",
        "POWER_UP_NODE",
        "REVOKED",
        "REQUEUE_FED",
        "RESV_DEL_HOLD",
        "SIGNALING",
        "STAGE_OUT",
        "EXPEDITING",
    }
)
# Flags that mean the job waits for someone to release it.
HELD_STATE_FLAGS = frozenset({"REQUEUE_HOLD", "SPECIAL_EXIT"})
HELD_REASONS = frozenset({"JobHeldAdmin", "JobHeldUser", "job_requeued_in_held_state"})


_VERSION = re.compile(r"(\d+)\.(\d+)(?:\.(\d+))?")


class SlurmDocumentError(ValueError):
    """The text is not a whole Slurm JSON document (not JSON, cut short, or another shape)."""


@dataclass(frozen=True, order=True)
class SlurmVersion:
    major: int
    minor: int
    micro: int = 0

    def __str__(self) -> str:
        return f"{self.major:02d}.{self.minor:02d}.{self.micro}"

    @classmethod
    def parse(cls, text: str) -> SlurmVersion | None:
        """``slurm 24.11.5``, ``slurm-wlm 22.05.8``, ``24.11.0-0rc1`` or ``25.11``."""
        match = _VERSION.search(text or "")
        if match is None:
            return None
        major, minor, micro = match.groups()
        return cls(int(major), int(minor), int(micro or 0))


@dataclass(frozen=True)
class SlurmDocument:
    """One JSON document as Slurm printed it: what its ``meta`` says, its errors and its body.

    ``errors`` are Slurm's own: a document with errors is a failed read, even when it has a
    (possibly empty) list of jobs.
    """

    body: dict[str, Any]
    version: SlurmVersion | None = None
    cluster: str | None = None
    data_parser: str | None = None
    errors: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return not self.errors

    def jobs(self) -> JobListing:
        records = self.body.get("jobs")
        if not isinstance(records, list):
            raise SlurmDocumentError(f"no list of jobs in the document: jobs is {_shape(records)}")
        return read_jobs(records)

    def nodes(self) -> list[NodeInfo]:
        """The node records of ``sinfo --json`` (22.05) or ``scontrol --json show nodes``, or the
        node groups of ``sinfo --json`` (23.02 and later; see ``nodes_from_sinfo_groups``)."""
        if self.has_node_records:
            return [node_from_record(raw) for raw in self.body["nodes"] if isinstance(raw, Mapping)]
        groups = self.body.get("sinfo")
        if isinstance(groups, list):
            return nodes_from_sinfo_groups(groups)
        raise SlurmDocumentError("no list of nodes in the document (neither nodes nor sinfo)")

    @property
    def has_node_records(self) -> bool:
        """One record per node, not ``sinfo``'s groups of nodes."""
        return isinstance(self.body.get("nodes"), list)


@dataclass(frozen=True)
class JobListing:
    jobs: list[JobInfo] = field(default_factory=list)
    # One line per record that could not become a JobInfo at all (no readable job id).
    skipped: list[str] = field(default_factory=list)


# ---------------------------------------------------------------------- the envelope


def parse_document(text: str) -> SlurmDocument:
    """Read one document; ``SlurmDocumentError`` when it is not a whole JSON object."""
    try:
        body = json.loads(text)
    except ValueError as exc:
        raise SlurmDocumentError(f"not JSON or cut short: {exc}") from None
    if not isinstance(body, dict):
        raise SlurmDocumentError(f"the document is {_shape(body)}, not an object")
    meta = body.get("meta")
    meta = meta if isinstance(meta, Mapping) else {}
    return SlurmDocument(
        body=body,
        version=read_meta_version(meta),
        cluster=read_meta_cluster(meta),
        data_parser=_meta_data_parser(meta),
        errors=_messages(body.get("errors")),
        warnings=_messages(body.get("warnings")),
    )


def read_meta_version(meta: Mapping[str, Any]) -> SlurmVersion | None:
    """``meta.slurm`` (23.11 and later, strings) or ``meta.Slurm`` (22.05, 23.02, integers)."""
    for key in ("slurm", "Slurm"):
        slurm = meta.get(key)
        if not isinstance(slurm, Mapping):
            continue
        release = slurm.get("release")
        if isinstance(release, str) and (version := SlurmVersion.parse(release)):
            return version
        parts = slurm.get("version")
        if isinstance(parts, Mapping):
            numbers = [_plain_int(parts.get(name)) for name in ("major", "minor", "micro")]
            if numbers[0] is not None and numbers[1] is not None:
                return SlurmVersion(numbers[0], numbers[1], numbers[2] or 0)
    return None


def read_meta_cluster(meta: Mapping[str, Any]) -> str | None:
    """``meta.slurm.cluster``: only 23.11 and later print it."""
    slurm = meta.get("slurm")
    if isinstance(slurm, Mapping):
        cluster = slurm.get("cluster")
        if isinstance(cluster, str) and cluster:
            return cluster
    return None


def _meta_data_parser(meta: Mapping[str, Any]) -> str | None:
    for key in ("plugin", "plugins"):
        plugin = meta.get(key)
        if isinstance(plugin, Mapping):
            for name in ("data_parser", "type"):
                value = plugin.get(name)
                if isinstance(value, str) and value:
                    return value
    return None


def _messages(value: object) -> tuple[str, ...]:
    """Slurm's ``errors``/``warnings``: objects with description, error, error_number, source."""
    if not isinstance(value, list):
        return ()
    messages = []
    for item in value:
        if isinstance(item, Mapping):
            parts = [str(item.get(key) or "").strip() for key in ("description", "error")]
            text = "; ".join(dict.fromkeys(part for part in parts if part))
            source = item.get("source")
            if isinstance(source, str) and source:
                text = f"{text} ({source})"
            messages.append(text or json.dumps(item, sort_keys=True)[:300])
        else:
            messages.append(str(item)[:300])
    return tuple(messages)


# ---------------------------------------------------------------------- job state


class JobStateError(_Unreadable):
    """The job state is unknown; what Slurm said is kept in ``words`` (as state flags)."""

    def __init__(self, reason: str, words: tuple[str, ...] = ()) -> None:
        super().__init__(reason)
        self.words = words


def read_job_state(value: object) -> tuple[str, tuple[str, ...]]:
    """Slurm's job state as the loop uses it, and the rest of what Slurm said.

    The state is the base state (RUNNING, PENDING, FAILED...), except that a job with the
    COMPLETING flag is ``COMPLETING``: that is what 22.05 and ``scontrol`` show, and what the
    loop waits on after a requeue. The tuple holds the other words in Slurm's order, so that
    nothing is lost: flags (REQUEUED, EXPEDITING...) and, under COMPLETING, the base state
    (PENDING after a requeue, FAILED for a failed job).

    22.05 and 23.02 print a single word, which is a flag when one is set; apart from
    COMPLETING, such a word hides the base state, which is then unknown.
    """
    if isinstance(value, str):
        word = value.strip().upper()
        if word in JOB_BASE_STATES or word == "COMPLETING":
            return word, ()
        if word in JOB_STATE_FLAGS:
            raise JobStateError(
                f"only the flag {word} was given; the base state is hidden", (word,)
            )
        raise JobStateError(f"unknown state word {value[:40]!r}")
    if isinstance(value, list):
        if not value or not all(isinstance(word, str) for word in value):
            raise JobStateError(f"unknown shape list {json.dumps(value)[:80]}")
        words = [word.strip().upper() for word in value]
        unknown = [w for w in words if w not in JOB_BASE_STATES and w not in JOB_STATE_FLAGS]
        if unknown:
            raise JobStateError(f"unknown state word {unknown[0][:40]!r}", tuple(words))
        bases = [w for w in words if w in JOB_BASE_STATES]
        if len(bases) != 1:
            raise JobStateError(f"{len(bases)} base states in {words}", tuple(words))
        state = "COMPLETING" if "COMPLETING" in words else bases[0]
        return state, tuple(w for w in words if w != state)
    if value is _ABSENT:
        raise JobStateError("absent")
    if value is None:
        raise JobStateError("null")
    raise JobStateError(f"unknown shape {_shape(value)}")


# ---------------------------------------------------------------------- job records


def read_jobs(records: Sequence[object]) -> JobListing:
    listing = JobListing()
    for raw in records:
        if not isinstance(raw, Mapping):
            listing.skipped.append(f"a job record is {_shape(raw)}, not an object")
            continue
        try:
            listing.jobs.append(job_from_record(raw))
        except SlurmDocumentError as exc:
            listing.skipped.append(str(exc))
    return listing


def job_id_of(raw: Mapping[str, Any]) -> str:
    """``123``, or ``123_4`` for a task of an array job; ``SlurmDocumentError`` if unreadable."""
    try:
        job_id = _number(raw.get("job_id", _ABSENT))
    except _Unreadable as exc:
        raise SlurmDocumentError(f"a job record without a readable job_id: {exc}") from None
    try:
        array_job = _number(raw.get("array_job_id", _ABSENT))
        array_task = _number(raw.get("array_task_id", _ABSENT))
    except _Unreadable:
        return str(job_id)  # not an array task (array_job_id is 0, array_task_id unset)
    if array_job > 0:
        return f"{array_job}_{array_task}"
    return str(job_id)


def job_from_record(raw: Mapping[str, Any]) -> JobInfo:
    """One job record of ``squeue --json`` or ``scontrol --json show job``, any version."""
    job_id = job_id_of(raw)
    unreadable: dict[str, str] = {}

    def read(name: str, keys: tuple[str, ...], reader: Any) -> Any:
        key, value = _get(raw, *keys)
        try:
            return reader(value)
        except _Unreadable as exc:
            unreadable[name] = f"{key}: {exc}"
        return None

    state: str | None = None
    state_flags: tuple[str, ...] = ()
    try:
        state, state_flags = read_job_state(raw.get("job_state", _ABSENT))
    except JobStateError as exc:
        state_flags = exc.words
        unreadable["phase"] = f"job_state: {exc}"
    user = read("user", ("user_name",), _string) or ""
    if not user and "user" not in unreadable:
        unreadable["user"] = "user_name: empty (the user id has no name)"
    user_uid = read("user_uid", ("user_id",), _uid)
    account = read("account", ("account",), _string)  # "" where the site keeps no accounts
    reason = _none(_text(raw, "state_reason"))
    comment = raw["comment"] if isinstance(raw.get("comment"), str) else ""
    excluded = read("excluded_nodes", ("excluded_nodes", "exc_nodes"), _nodes)
    restart_count = read("restart_count", ("restart_cnt",), _number)
    requeue_allowed = read("requeue_allowed", ("requeue",), _bool)
    exit_pair = read("exit_code", ("exit_code",), _exit_code)
    exit_code, exit_signal = exit_pair if exit_pair is not None else (None, None)
    if exit_pair is None:
        unreadable["exit_signal"] = unreadable["exit_code"]
    submit_time = read("submit_time", ("submit_time",), _epoch)
    if submit_time is None and "submit_time" not in unreadable:
        unreadable["submit_time"] = "submit_time: 0 (none)"
    nodes = read("nodes", ("nodes",), _nodes)
    held = _held(raw, reason, state_flags, unreadable)
    chained = chained_after(raw.get("dependency"))
    if chained is None:
        unreadable["chained_after"] = f"dependency: {shown(raw.get('dependency', 'absent'))}"
    info = {
        "job_id": job_id,
        "name": _text(raw, "name"),
        "user": user,
        "work_dir": _text(raw, "current_working_directory"),
    }
    return JobInfo(
        job_id=job_id,
        name=info["name"],
        user=user,
        partition=_text(raw, "partition"),
        native_state=state,
        phase=slurm_phase(state),
        state_flags=state_flags,
        job_flags=job_flags(raw) or (),
        reason=reason,
        comment=comment,
        opt_in=parse_job_comment(comment),
        nodes=nodes or [],
        excluded_nodes=excluded,
        restart_count=restart_count,
        exit_code=exit_code,
        exit_signal=exit_signal,
        requeue_allowed=requeue_allowed,
        held=held,
        stdout_path=_output_path(raw, "stdout", info),
        stderr_path=_output_path(raw, "stderr", info),
        work_dir=info["work_dir"],
        user_uid=user_uid,
        submit_time=submit_time,
        account=account.strip() if account is not None else None,
        chained_after=chained,
        eligible_time=read("eligible_time", ("eligible_time",), _epoch),
        start_time=read("start_time", ("start_time",), _epoch),
        end_time=read("end_time", ("end_time",), _epoch),
        unreadable=unreadable,
    )


def _uid(value: object) -> int:
    uid = _number(value)
    if not valid_uid(uid):
        raise _Unreadable(f"{uid} is not a user id")
    return uid


def _bool(value: object) -> bool:
    if value is _ABSENT:
        raise _Unreadable("absent")
    if not isinstance(value, bool):
        raise _Unreadable(f"unknown shape {_shape(value)}")
    return value


def _held(
    raw: Mapping[str, Any], reason: str, flags: tuple[str, ...], unreadable: dict[str, str]
) -> bool | None:
    """Held when the reason or a flag says so, or the priority is 0 (Slurm's hold)."""
    if reason in HELD_REASONS or set(flags) & HELD_STATE_FLAGS:
        return True
    try:
        return _number(raw.get("priority", _ABSENT)) == 0
    except _Unreadable as exc:
        priority_problem = f"priority: {exc}"
    hold = raw.get("hold")  # 23.02 and later print priority == 0 as hold: true as well
    if isinstance(hold, bool):
        return hold
    unreadable["held"] = f"the reason {reason or '(none)'!r} does not say, and {priority_problem}"
    return None


def _output_path(raw: Mapping[str, Any], stream: str, info: Mapping[str, str]) -> str:
    """23.02 to 24.11 print the expanded path; 22.05 and 25.05+ the pattern given to sbatch
    (25.05+ add ``stdout_expanded``)."""
    expanded = raw.get(f"{stream}_expanded")
    if isinstance(expanded, str) and expanded:
        return expanded
    pattern = raw.get(f"standard_{'output' if stream == 'stdout' else 'error'}")
    return expand_output_path(pattern if isinstance(pattern, str) else "", info)


def _none(text: str) -> str:
    text = (text or "").strip()
    return "" if text in {"(null)", "None", "N/A"} else text


def expand_output_path(pattern: str, job: Mapping[str, str]) -> str:
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


def job_flags(raw: Mapping[str, Any]) -> tuple[str, ...] | None:
    """The job's ``flags`` list (23.02 and later; 22.05 prints none), or None if unreadable.

    25.11 lists ``EXPEDITED_REQUEUE`` here for a job submitted with ``--requeue=expedite``.
    """
    flags = raw.get("flags")
    if isinstance(flags, list) and all(isinstance(flag, str) for flag in flags):
        return tuple(flag.upper() for flag in flags)
    return None
