"""What a demo story hands the loop's functions in place of a real cluster.

The scheduler as the watchdog finds a story's held job (``_HeldJob``), and where the story's
evidence would have been read (``demo_evidence_source``). Apart from the story (``story``),
which only passes them on: they describe the world outside the loop, not the workload's history.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from recovery.choices import AnomalyKind, EvidenceSource
from recovery.detection.findings import Finding, FindingSource
from recovery.schedulers.base import (
    CommandResult,
    JobInfo,
    NodeInfo,
    SchedulerAdapter,
    SchedulerError,
)

if TYPE_CHECKING:
    from recovery.demo.fleet.story import Story


class _HeldJob(SchedulerAdapter):
    """The scheduler as the watchdog finds it: the story's job, held, and released on request.

    The recorded history carries out no other action; asking for one is a defect of a story.
    """

    def __init__(self, story: Story) -> None:
        self.story = story

    def get_job(self, job_id: str) -> JobInfo | None:
        return self.story.job_info("PENDING", held=True)

    def release(self, job_id: str) -> CommandResult:
        return CommandResult(("scontrol", "release", job_id), 0, "", "")

    def set_excluded_nodes(self, job_id: str, nodes: Sequence[str]) -> CommandResult:
        argv = ("scontrol", "update", f"JobId={job_id}", f"ExcNodeList={','.join(nodes)}")
        return CommandResult(argv, 0, "", "")

    def _not_recorded(self, what: str) -> SchedulerError:
        return SchedulerError(f"the demo history records no {what}")

    def list_jobs(self) -> list[JobInfo]:
        raise self._not_recorded("job listing")

    def list_nodes(self) -> list[NodeInfo]:
        raise self._not_recorded("node listing")

    def requeue(self, job_id: str, *, hold: bool = False) -> CommandResult:
        raise self._not_recorded("requeue")

    def clear_start_delay(self, job_id: str) -> CommandResult:
        raise self._not_recorded("start delay change")

    def hold(self, job_id: str) -> CommandResult:
        raise self._not_recorded("hold")

    def cancel(self, job_id: str) -> CommandResult:
        raise self._not_recorded("cancel")

    def disable_requeue(self, job_id: str) -> CommandResult:
        raise self._not_recorded("requeue change")


def demo_evidence_source(findings: list[Finding], scope: str) -> EvidenceSource:
    """Where the story's evidence would have come from: a node's kernel log, the scheduler, GPU
    metrics, or else the job's output file, as the loop's readers record it."""
    if scope.startswith("kernel:"):
        return EvidenceSource.KERNEL_LOG
    if any(finding.kind == AnomalyKind.HANG for finding in findings):
        return EvidenceSource.PROGRESS
    sources = {finding.source for finding in findings}
    if FindingSource.SCHEDULER in sources:
        return EvidenceSource.SCHEDULER
    if FindingSource.METRICS in sources:
        return EvidenceSource.GPU_METRICS
    if FindingSource.PROGRESS in sources:
        return EvidenceSource.PROGRESS
    return EvidenceSource.JOB_OUTPUT
