"""Fakes shared by the loop's tests: a scripted scheduler and the jobs it reports."""

from __future__ import annotations

import dataclasses
import os
from datetime import datetime, timedelta
from typing import Any

from recovery.schedulers.base import JobInfo, NodeInfo, SchedulerAdapter
from recovery.schedulers.compat import UTC
from recovery.schedulers.optin import parse_job_comment
from recovery.schedulers.slurm import SLURM_CAPABILITIES
from recovery.schedulers.slurm_phase import slurm_phase

# Recent: a job that started hours ago and never printed a step would rightly be a hang.
SUBMITTED = datetime.now(UTC).replace(microsecond=0) - timedelta(minutes=2)
COMMENT = '{"nvidia-recovery":{"environment":"prod","mode":"act"}}'


class Scripted(SchedulerAdapter):
    """A scheduler that reports what the test says. The real Slurm path is in tests/slurm."""

    capabilities = SLURM_CAPABILITIES

    def __init__(self, jobs: list[JobInfo], nodes: list[NodeInfo] | None = None) -> None:
        self.jobs = jobs
        self.nodes = nodes or []

    def list_jobs(self) -> list[JobInfo]:
        return self.jobs

    def list_nodes(self) -> list[NodeInfo]:
        return self.nodes

    def get_job(self, job_id: str) -> JobInfo | None:
        return next((j for j in self.jobs if j.job_id == job_id), None)

    def _refuse(self, *args: object, **kwargs: object) -> object:
        raise AssertionError("polling never acts")

    requeue = set_excluded_nodes = clear_start_delay = release = hold = cancel = _refuse  # type: ignore[assignment]
    disable_requeue = _refuse  # type: ignore[assignment]


def job(**fields: object) -> JobInfo:
    values: dict[str, object] = {
        "job_id": "4242",
        "name": "llama",
        "user": "alice",
        "partition": "gpu",
        "state": "RUNNING",
        "reason": "None",
        "comment": COMMENT,
        "opt_in": parse_job_comment(COMMENT),
        "nodes": ["node001", "node002"],
        "excluded_nodes": [],
        "restart_count": 0,
        "requeue_allowed": True,
        "held": False,
        "submit_time": SUBMITTED,
        "start_time": SUBMITTED + timedelta(seconds=5),
        # The user running the tests: output files a test writes are that user's.
        "user_uid": os.getuid(),
    }
    values.update(fields)
    if "comment" in fields and "opt_in" not in fields:
        values["opt_in"] = parse_job_comment(str(fields["comment"]))
    # ``state`` is Slurm's word, as the tests write it; the adapter's phase goes with it.
    native = values.pop("state")
    values.setdefault("native_state", native)
    values.setdefault("phase", slurm_phase(None if native is None else str(native)))
    return JobInfo(**values)  # type: ignore[arg-type]


def restated(info: JobInfo, state: str | None, **changes: Any) -> JobInfo:
    """``info`` in Slurm's ``state`` (with its phase), with ``changes``."""
    return dataclasses.replace(info, native_state=state, phase=slurm_phase(state), **changes)
