"""The Slurm adapter: squeue/sinfo/scontrol/scancel through a transport.

Slurm's JSON output is read where this Slurm has it, by ``slurm_json`` whatever its version.
When one JSON read fails or comes back cut short, that one call falls back to a fixed format
with an ASCII unit separator between fields, the free-text comment last; the next call tries
JSON again. The fixed format has no restart count, exclusions or requeue flag, so those are
unknown there, never defaults. Every id and node name is validated before it reaches a
command line.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import datetime

from recovery.schedulers.base import (
    Command,
    CommandResult,
    ExpeditedRequeueUnavailable,
    JobInfo,
    NodeInfo,
    SchedulerAdapter,
    SchedulerError,
    Transport,
)
from recovery.schedulers.capabilities import Capabilities
from recovery.schedulers.compat import UTC
from recovery.schedulers.dependency import chained_after
from recovery.schedulers.nodelist import NodeListError, compress_nodelist, expand_nodelist
from recovery.schedulers.optin import parse_job_comment
from recovery.schedulers.output_files import valid_uid
from recovery.schedulers.slurm_json import (
    HELD_REASONS,
    JobListing,
    JobStateError,
    SlurmDocument,
    SlurmDocumentError,
    SlurmVersion,
    expand_output_path,
    parse_document,
    read_job_state,
)
from recovery.schedulers.slurm_nodes import NODE_BASE_STATES
from recovery.schedulers.slurm_phase import slurm_phase
from recovery.schedulers.validation import validate_job_id, validate_node_names

__all__ = ["SlurmAdapter", "expand_output_path"]

logger = logging.getLogger(__name__)

SEPARATOR = "\x1f"
# squeue -o fields for the fallback; the comment (%k) may hold anything, so it comes last.
FALLBACK_FIELDS = (
    "%i", "%j", "%u", "%U", "%P", "%T", "%r", "%N", "%V", "%S", "%e", "%Z", "%p", "%E", "%k",
)  # fmt: skip
FIXED_FORMAT_UNKNOWN = {
    "restart_count": "the fixed squeue format has no restart count",
    "excluded_nodes": "the fixed squeue format has no excluded nodes",
    "requeue_allowed": "the fixed squeue format has no requeue flag",
    "account": "the fixed squeue format read here has no account",
}
# scontrol has --json from 23.02 on; 22.05 says "unrecognized option '--json'".
SCONTROL_JSON_SINCE = SlurmVersion(23, 2)
# 25.11 added expedited requeue (sbatch --requeue=expedite, allowed by
# SlurmctldParameters=enable_expedited_requeue); such a job restarts with no requeue delay.
EXPEDITED_REQUEUE_SINCE = SlurmVersion(25, 11)
EXPEDITED_REQUEUE_PARAMETER = "enable_expedited_requeue"
EXPEDITED_REQUEUE_FLAG = "EXPEDITED_REQUEUE"
# sinfo -O fields for the nodes, one node a line (-N); the reason is free text, so it comes last.
# StateComplete names every flag (``down+drain``), where %T would show DOWN+DRAIN as "drained".
NODE_FIELDS = ("NodeList", "StateComplete", "User", "Timestamp", "Reason")
# A field given a suffix and no width is printed whole, then the suffix.
NODE_FORMAT = ",".join(f"{name}:{SEPARATOR}" for name in NODE_FIELDS)
INVALID_JOB_ID = "Invalid job id specified"
_UNSUPPORTED_OPTION = ("unrecognized option", "invalid option", "unknown option")


# Slurm requeues a job in place, holds it, takes exclusions while it is pending, and drains
# and resumes nodes (``scontrol``).
SLURM_CAPABILITIES = Capabilities(requeue=True, exclude_on_restart=True, hold=True, drain=True)


class SlurmAdapter(SchedulerAdapter):
    capabilities = SLURM_CAPABILITIES

    def __init__(self, transport: Transport, *, command_timeout: float = 30.0) -> None:
        self.transport: Transport = transport
        self.command_timeout = command_timeout
        self._version: SlurmVersion | None = None  # from `scontrol version` or a JSON meta
        self._meta_cluster: str | None = None
        # Whether `scontrol --json` exists here: None until known. Only the definite answer
        # "unrecognized option" (22.05) makes it False; other failures are not remembered.
        self._scontrol_json: bool | None = None
        self._expedited: bool | None = None

    # ------------------------------------------------------------------ reading

    def list_jobs(self) -> list[JobInfo]:
        # -t all: since 24.05 squeue --json applies squeue's filters, and by default would
        # leave out the jobs that just ended (22.05 ignores the option and lists them all).
        listing = self._read_jobs(["squeue", "--json", "-t", "all"])
        if listing is None:
            return self._list_jobs_fixed_format()
        return listing.jobs

    def get_job(self, job_id: str) -> JobInfo | None:
        """The job, or None when Slurm no longer knows it. A failed read raises instead."""
        job_id = validate_job_id(job_id)
        if self._scontrol_json_allowed():
            found, job = self._get_job_scontrol_json(job_id)
            if found:
                return job
        # squeue --json ignores -j on 22.05: it always returns every job it knows.
        listing = self._read_jobs(["squeue", "--json", "-t", "all"])
        if listing is not None:
            return _find(listing, job_id)
        return next(iter(self._list_jobs_fixed_format(job_id)), None)

    def list_nodes(self) -> list[NodeInfo]:
        """Every node, read one by one: ``scontrol --json show nodes`` where scontrol has
        ``--json`` (23.02 and later), 22.05's ``sinfo --json``, or else sinfo's fixed format.

        ``sinfo --json`` of 23.02 and later is not used: it groups nodes, and gives a group of
        nodes with different reasons one of them (``nodes_from_sinfo_groups``).
        """
        if self._scontrol_json_allowed():
            result = self._run(["scontrol", "--json", "show", "nodes"], check=False)
            document = self._json_answer(result)
            if document is not None:
                try:
                    return document.nodes()
                except SlurmDocumentError as exc:
                    logger.warning("`scontrol --json show nodes` unusable: %s", exc)
        document = self._json_answer(self._run(["sinfo", "--json"], check=False))
        if document is not None and document.has_node_records:
            try:
                return document.nodes()
            except SlurmDocumentError as exc:
                logger.warning("`sinfo --json` unusable: %s", exc)
        fixed = self._run(["sinfo", "-h", "-a", "-N", "-O", NODE_FORMAT])
        nodes: dict[str, NodeInfo] = {}
        for line in fixed.stdout.splitlines():
            fields = line.split(SEPARATOR, len(NODE_FIELDS) - 1)
            if len(fields) != len(NODE_FIELDS):
                logger.warning("ignored sinfo line with %d fields: %.200s", len(fields), line)
                continue
            node = _node_from_fields(fields)
            nodes.setdefault(node.name, node)  # listed once per partition
        return list(nodes.values())

    def scheduler_version(self) -> str | None:
        version = self._slurm_version()
        return str(version) if version is not None else None

    def cluster_name(self) -> str | None:
        """ClusterName from ``scontrol show config``; None when it cannot be read."""
        config = self._config()
        if config is not None and config.get("ClusterName"):
            return config["ClusterName"]
        return self._meta_cluster

    def supports_expedited_requeue(self) -> bool:
        """Slurm 25.11 or later with ``SlurmctldParameters=enable_expedited_requeue``."""
        if self._expedited is None:
            version = self._slurm_version()
            if version is None:
                return False  # unknown now; asked again next time
            if version < EXPEDITED_REQUEUE_SINCE:
                self._expedited = False
            else:
                config = self._config()
                if config is None:
                    return False
                parameters = config.get("SlurmctldParameters", "")
                self._expedited = EXPEDITED_REQUEUE_PARAMETER in parameters.split(",")
        return self._expedited

    def _read_jobs(self, argv: list[str]) -> JobListing | None:
        """The jobs of one JSON command, or None when it failed (the caller falls back)."""
        document = self._json_answer(self._run(argv, check=False))
        if document is None:
            return None
        try:
            listing = document.jobs()
        except SlurmDocumentError as exc:
            logger.warning("`%s` unusable, using the fixed format once: %s", " ".join(argv), exc)
            return None
        for problem in listing.skipped:
            logger.warning("`%s`: ignored a job record: %s", " ".join(argv), problem)
        return listing

    def _json_answer(self, result: CommandResult) -> SlurmDocument | None:
        """What a JSON command printed, if it ran and printed a whole document without errors."""
        command = " ".join(result.argv)
        if not result.ok:
            if result.argv[:2] == ("scontrol", "--json") and _unsupported_option(result):
                self._scontrol_json = False  # Slurm before 23.02: expected, not a failure
                logger.info("%s; this Slurm has no scontrol --json", result.describe())
            else:
                logger.warning("%s; using another format once", result.describe())
            return None
        try:
            document = parse_document(result.stdout)
        except SlurmDocumentError as exc:
            logger.warning(
                "`%s` printed no usable JSON, using another format once: %s", command, exc
            )
            return None
        self._learn(document)
        if document.errors:
            logger.warning("`%s` reported errors: %s", command, "; ".join(document.errors))
            return None
        for warning in document.warnings:
            logger.info("`%s` warned: %s", command, warning)
        return document

    def _get_job_scontrol_json(self, job_id: str) -> tuple[bool, JobInfo | None]:
        """(True, job or None) when ``scontrol --json show job`` answered; (False, None) to
        read the job another way."""
        result = self._run(["scontrol", "--json", "show", "job", job_id], check=False)
        said = f"{result.stdout}\n{result.stderr}"
        if not result.ok:
            if _unsupported_option(result):
                self._scontrol_json = False
                return False, None
            if INVALID_JOB_ID in said:
                return True, None  # the job is gone
            raise SchedulerError(result.describe(), result)
        try:
            document = parse_document(result.stdout)
        except SlurmDocumentError as exc:
            logger.warning(
                "`scontrol --json show job %s` unusable, listing instead: %s", job_id, exc
            )
            return False, None
        self._scontrol_json = True
        self._learn(document)
        if document.errors:
            if any(INVALID_JOB_ID in error for error in document.errors):
                return True, None
            raise SchedulerError(
                f"`scontrol --json show job {job_id}` reported: {'; '.join(document.errors)}",
                result,
            )
        try:
            listing = document.jobs()
        except SlurmDocumentError as exc:
            logger.warning(
                "`scontrol --json show job %s` unusable, listing instead: %s", job_id, exc
            )
            return False, None
        return True, _find(listing, job_id)

    def _scontrol_json_allowed(self) -> bool:
        if self._scontrol_json is not None:
            return self._scontrol_json
        return self._version is None or self._version >= SCONTROL_JSON_SINCE

    def _learn(self, document: SlurmDocument) -> None:
        if document.version is not None:
            self._version = document.version
        if document.cluster:
            self._meta_cluster = document.cluster

    def _slurm_version(self) -> SlurmVersion | None:
        if self._version is None:
            result = self._run(["scontrol", "version"], check=False)
            if result.ok:
                self._version = SlurmVersion.parse(result.stdout)
            else:
                logger.warning("%s", result.describe())
        return self._version

    def _config(self) -> dict[str, str] | None:
        """``scontrol show config`` as a dict (``ClusterName`` → ``lab``), or None."""
        result = self._run(["scontrol", "show", "config"], check=False)
        if not result.ok:
            logger.warning("%s", result.describe())
            return None
        config = {}
        for line in result.stdout.splitlines():
            key, separator, value = line.partition("=")
            if separator and key.strip() and " " not in key.strip():
                config[key.strip()] = value.strip()
        return config

    def _list_jobs_fixed_format(self, job_id: str | None = None) -> list[JobInfo]:
        argv = ["squeue", "-h", "-t", "all", "-o", SEPARATOR.join(FALLBACK_FIELDS)]
        if job_id is not None:
            argv += ["-j", job_id]
        result = self._run(argv, check=False)
        if not result.ok:
            if job_id is not None and INVALID_JOB_ID in f"{result.stdout}\n{result.stderr}":
                return []  # the job is gone
            raise SchedulerError(result.describe(), result)
        jobs = []
        for line in result.stdout.splitlines():
            fields = line.split(SEPARATOR, len(FALLBACK_FIELDS) - 1)
            if len(fields) != len(FALLBACK_FIELDS):
                logger.warning("ignored squeue line with %d fields: %.200s", len(fields), line)
                continue
            jobs.append(_job_from_fields(fields))
        return jobs

    # ------------------------------------------------------------------ acting

    def requeue(self, job_id: str, *, hold: bool = False, expedite: bool = False) -> CommandResult:
        """``scontrol requeue`` (or ``requeuehold``); ``expedite`` asks for Slurm's expedited path
        (see ``requeue_expedited``), which cannot also hold the job."""
        if expedite:
            if hold:
                raise ValueError("an expedited requeue restarts the job at once; it cannot hold it")
            return self.requeue_expedited(job_id)
        return self._run_planned(Command.REQUEUE_HOLD if hold else Command.REQUEUE, job_id)

    def requeue_expedited(self, job_id: str) -> CommandResult:
        """Requeue a job that Slurm 25.11 restarts at once.

        25.11 has no expedite option on ``scontrol requeue``: expedited requeue is a property
        of the job (``sbatch --requeue=expedite``, listed as EXPEDITED_REQUEUE in its flags),
        allowed only with ``SlurmctldParameters=enable_expedited_requeue``. Slurm requeues such
        a job by itself on node failure, and any requeue of it gets no requeue delay. So this
        checks both and then runs the plain ``scontrol requeue``; it refuses otherwise, rather
        than do an ordinary requeue that waits out the delay.
        """
        job_id = validate_job_id(job_id)
        if not self.supports_expedited_requeue():
            raise ExpeditedRequeueUnavailable(
                f"no expedited requeue for job {job_id}: it needs Slurm 25.11 or later "
                f"with SlurmctldParameters={EXPEDITED_REQUEUE_PARAMETER} "
                f"(this is Slurm {self.scheduler_version() or 'of unknown version'})"
            )
        job = self.get_job(job_id)
        if job is None:
            raise ExpeditedRequeueUnavailable(
                f"no expedited requeue for job {job_id}: Slurm no longer knows it"
            )
        if EXPEDITED_REQUEUE_FLAG not in job.job_flags:
            raise ExpeditedRequeueUnavailable(
                f"no expedited requeue for job {job_id}: it was not submitted with "
                "--requeue=expedite, and only such jobs skip the requeue delay"
            )
        return self._run_planned(Command.REQUEUE_EXPEDITED, job_id)

    def set_excluded_nodes(self, job_id: str, nodes: Sequence[str]) -> CommandResult:
        return self._run_planned(Command.SET_EXCLUDED_NODES, job_id, nodes)

    def clear_start_delay(self, job_id: str) -> CommandResult:
        return self._run_planned(Command.CLEAR_START_DELAY, job_id)

    def release(self, job_id: str) -> CommandResult:
        return self._run_planned(Command.RELEASE, job_id)

    def hold(self, job_id: str) -> CommandResult:
        return self._run_planned(Command.HOLD, job_id)

    def cancel(self, job_id: str) -> CommandResult:
        return self._run_planned(Command.CANCEL, job_id)

    def disable_requeue(self, job_id: str) -> CommandResult:
        return self._run_planned(Command.DISABLE_REQUEUE, job_id)

    def drain_node(self, name: str, reason: str) -> CommandResult:
        return self._run(list(self.planned_node_argv(Command.DRAIN_NODE, name, reason)))

    def resume_node(self, name: str) -> CommandResult:
        return self._run(list(self.planned_node_argv(Command.RESUME_NODE, name)))

    def excluded_nodes_value(self, nodes: Sequence[str]) -> str:
        """Slurm's compressed hostlist (``gpu-[001-004]``): short on any cluster's scale."""
        return compress_nodelist(validate_node_names(nodes)) if nodes else ""

    def _run_planned(
        self, command: Command, job_id: str, nodes: Sequence[str] = ()
    ) -> CommandResult:
        """Run ``command`` as ``planned_argv`` says: what the controller recorded is what runs."""
        return self._run(list(self.planned_argv(command, job_id, nodes)))

    def _run(self, argv: list[str], *, check: bool = True) -> CommandResult:
        result = self.transport.run(argv, timeout=self.command_timeout)
        if check and not result.ok:
            raise SchedulerError(result.describe(), result)
        return result


# ---------------------------------------------------------------------- parsing


def _find(listing: JobListing, job_id: str) -> JobInfo | None:
    """The job in a complete listing; its absence means Slurm no longer knows it, unless some
    record could not be read (it may have been this job)."""
    job = next((job for job in listing.jobs if job.job_id == job_id), None)
    if job is None and listing.skipped:
        raise SchedulerError(
            f"job {job_id} is not among the jobs read, but {len(listing.skipped)} record(s) "
            f"could not be read: {listing.skipped[0]}"
        )
    return job


def _unsupported_option(result: CommandResult) -> bool:
    said = f"{result.stdout}\n{result.stderr}".lower()
    return any(marker in said for marker in _UNSUPPORTED_OPTION)


def _job_from_fields(fields: list[str]) -> JobInfo:
    (
        job_id,
        name,
        user,
        uid,
        partition,
        state_text,
        reason,
        nodes,
        submit,
        start,
        end,
        work_dir,
        priority,
        dependency,
        comment,
    ) = fields
    unreadable = dict(FIXED_FORMAT_UNKNOWN)
    state: str | None = None
    state_flags: tuple[str, ...] = ()
    try:
        state, state_flags = read_job_state(state_text)
    except JobStateError as exc:
        state_flags = exc.words
        unreadable["phase"] = f"%T: {exc}"
    info = {
        "job_id": job_id.strip(),
        "name": name,
        "user": user.strip(),
        "work_dir": work_dir,
    }
    if not info["user"]:
        unreadable["user"] = "%u: empty"
    user_uid = _fixed_format_uid(uid, unreadable)
    reason = _none(reason)
    held = _fixed_format_held(reason, priority, unreadable)
    submit_time = _slurm_time(submit)
    if submit_time is None:
        unreadable["submit_time"] = f"%V: {submit.strip()[:40]!r} is not a time"
    try:
        node_names = _fixed_format_nodes(nodes)
    except NodeListError as exc:
        node_names = []
        unreadable["nodes"] = f"%N: {exc}"
    comment = _none(comment)
    chained = chained_after(dependency)
    if chained is None:
        unreadable["chained_after"] = f"%E: {dependency.strip()[:40]!r} is not a dependency"
    return JobInfo(
        job_id=info["job_id"],
        name=name,
        user=info["user"],
        partition=partition,
        native_state=state,
        phase=slurm_phase(state),
        state_flags=state_flags,
        reason=reason,
        comment=comment,
        opt_in=parse_job_comment(comment),
        nodes=node_names,
        held=held,
        stdout_path=expand_output_path("", info),
        stderr_path=expand_output_path("", info),
        work_dir=work_dir,
        user_uid=user_uid,
        submit_time=submit_time,
        chained_after=chained,
        start_time=_slurm_time(start),
        end_time=_slurm_time(end),
        unreadable=unreadable,
    )


def _fixed_format_uid(text: str, unreadable: dict[str, str]) -> int | None:
    text = text.strip()
    if text.isascii() and text.isdigit() and valid_uid(int(text)):
        return int(text)
    unreadable["user_uid"] = f"%U: {text[:40]!r} is not a user id"
    return None


def _fixed_format_held(reason: str, priority: str, unreadable: dict[str, str]) -> bool | None:
    """Held when the reason says so or the priority (%p, normalised) is 0."""
    if reason in HELD_REASONS:
        return True
    try:
        return float(priority.strip()) == 0
    except ValueError:
        unreadable["held"] = (
            f"the reason {reason or '(none)'!r} does not say, and %p is {priority!r}"
        )
        return None


def _fixed_format_nodes(text: str) -> list[str]:
    text = text.strip()
    return expand_nodelist(text) if text and text != "(null)" else []


def _split_node_state(text: str) -> tuple[str, list[str]]:
    """``mixed+drain`` or ``down*`` → base state and flags (``*`` means not responding)."""
    text = text.strip().upper()
    flags = []
    if text.endswith("*"):
        flags.append("NOT_RESPONDING")
        text = text.rstrip("*")
    base, *rest = text.split("+")
    return base, flags + rest


def _node_from_fields(fields: list[str]) -> NodeInfo:
    """One line of ``sinfo -N -O NODE_FORMAT``; what cannot be read is unknown, not "".

    sinfo prints "none" for no reason, and "Unknown" for the user and time of no reason (24.11
    prints a user even then): both are kept only beside a reason.
    """
    name, state_text, user, timestamp, reason_text = fields
    unreadable: dict[str, str] = {}
    state: str | None = None
    base, flags = _split_node_state(state_text)
    if base in NODE_BASE_STATES and all(flags):
        state = base
    else:
        unreadable["state"] = f"StateComplete: {state_text.strip()[:60]!r} is not a node state"
    reason = reason_text.removesuffix(SEPARATOR).strip()
    if reason == "none":
        reason = ""
    set_by, set_at = "", None
    if reason:
        set_by = "" if user.strip() in {"", "Unknown", "(null)"} else user.strip()
        set_at = _slurm_time(timestamp)
        if not set_by:
            unreadable["reason_set_by"] = f"User: {user.strip()[:40]!r}"
        if set_at is None:
            unreadable["reason_set_at"] = f"Timestamp: {timestamp.strip()[:40]!r} is not a time"
    return NodeInfo(
        name=name.strip(),
        state=state,
        flags=flags,
        reason=reason,
        reason_set_by=set_by,
        reason_set_at=set_at,
        unreadable=unreadable,
    )


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
