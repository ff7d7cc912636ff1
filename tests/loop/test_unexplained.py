"""A death the scheduler confirmed that nothing explains is recorded as ``unexplained``, with the
last lines the job printed, and decided exactly as an uncategorised FAILED always was.

The scheduler is scripted; the job's output is a real file read through the loop's own reader.
"""

from __future__ import annotations

import copy
from datetime import timedelta
from pathlib import Path

import pytest
from django.utils import timezone

from recovery.choices import (
    AnomalyKind,
    AuditKind,
    ClusterMode,
    Confirmation,
    EvidenceSource,
    FailureCategory,
    RecommendationAction,
)
from recovery.detection.findings import Finding
from recovery.detection.taxonomy import NO_CATEGORY
from recovery.loop.anomalies import record_anomalies
from recovery.loop.decision_facts import History
from recovery.loop.logs import TAIL_BYTES
from recovery.loop.monitors import check_progress
from recovery.loop.policy_rules import decide
from recovery.loop.poll import poll_cluster
from recovery.models import Anomaly, AuditEvent, Cluster, Policy, ProgressSample, Workload
from recovery.schedulers.transport import LocalTransport
from tests.factories import ClusterFactory
from tests.fakes import Scripted, job

pytestmark = pytest.mark.django_db

NODES = ["node001", "node002"]
LAST_WORDS = [
    "step 812 loss 2.0411",
    "step 813 loss 2.0397",
    "weka: io stalled on fd 0x7f3a for 120 s (tries=3)",
]


@pytest.fixture
def cluster() -> Cluster:
    cluster = ClusterFactory(mode=ClusterMode.ACTION, acknowledge_scheduler_actions=True)
    Policy.objects.create(name="lab", cluster=cluster, blast_radius_percent=100)
    return cluster


class Job:
    """An opted-in job whose output file the test writes, polled with a local transport."""

    def __init__(self, cluster: Cluster, tmp_path: Path) -> None:
        self.cluster = cluster
        self.output = tmp_path / "job.out"
        self.output.write_text("")
        self.paths = {"stdout_path": str(self.output), "work_dir": str(tmp_path)}
        self.poll(job(nodes=NODES, **self.paths))

    def poll(self, info: object) -> None:
        scheduler = Scripted([info])  # type: ignore[list-item]
        scheduler.transport = LocalTransport()
        poll_cluster(self.cluster, scheduler)

    def prints(self, *lines: str) -> None:
        with self.output.open("a") as out:
            out.write("".join(f"{line}\n" for line in lines))

    def fails(self, **ending: object) -> None:
        fields: dict[str, object] = {"state": "FAILED", "exit_code": 1, **ending}
        self.poll(job(nodes=NODES, end_time=timezone.now(), **self.paths, **fields))

    @property
    def workload(self) -> Workload:
        return Workload.objects.get(cluster=self.cluster)


@pytest.fixture
def running(cluster: Cluster, tmp_path: Path) -> Job:
    return Job(cluster, tmp_path)


def test_a_failure_nothing_explains_is_unexplained_with_the_jobs_last_lines(
    running: Job,
) -> None:
    """
    GIVEN a job that printed progress and a line no signature knows
    WHEN Slurm reports it FAILED with exit code 3
    THEN one confirmed crash is recorded, of category unexplained, with the scheduler's exit
         code and the last lines of the job's output; the audit trail says so
    """
    running.prints(*LAST_WORDS)
    running.fails(exit_code=3)

    anomaly = Anomaly.objects.get()
    assert anomaly.kind == AnomalyKind.CRASH
    assert anomaly.category == FailureCategory.UNEXPLAINED
    assert anomaly.confirmation == Confirmation.CONFIRMED
    assert anomaly.evidence_source == EvidenceSource.SCHEDULER
    assert anomaly.signature == "slurm-failed-exit-3"
    assert anomaly.details["exit_code"] == 3
    assert anomaly.details["last_lines"] == LAST_WORDS
    detected = AuditEvent.objects.get(kind=AuditKind.DETECTED)
    assert detected.payload["category"] == FailureCategory.UNEXPLAINED


def test_the_last_lines_are_read_bounded(running: Job) -> None:
    """Forty lines at most, each cut to 500 characters, from the end of the file only."""
    running.prints("first line of a long log")
    running.prints(*(f"line {n} " + "x" * 700 for n in range(200)))
    assert running.output.stat().st_size > TAIL_BYTES
    running.fails()

    lines = Anomaly.objects.get().details["last_lines"]
    assert len(lines) == 40
    assert lines[0].startswith("line 160 ")
    assert lines[-1].startswith("line 199 ")
    assert {len(line) for line in lines} == {500}


def test_output_that_cannot_be_read_leaves_it_unexplained_without_lines(running: Job) -> None:
    running.output.unlink()
    running.fails()
    anomaly = Anomaly.objects.get()
    assert anomaly.category == FailureCategory.UNEXPLAINED
    assert anomaly.details["last_lines"] == []


def test_a_failure_the_logs_explained_is_not_unexplained(running: Job) -> None:
    running.prints(
        "Traceback (most recent call last):",
        '  File "train.py", line 3, in <module>',
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
    )
    running.fails()
    assert not Anomaly.objects.filter(category=FailureCategory.UNEXPLAINED).exists()
    assert Anomaly.objects.get().category == FailureCategory.GPU_OOM


def test_a_segfault_or_a_node_failure_says_what_failed(cluster: Cluster, tmp_path: Path) -> None:
    segfault = Job(cluster, tmp_path)
    segfault.fails(exit_code=None, exit_signal=11)
    assert Anomaly.objects.get().category == FailureCategory.SEGFAULT

    Anomaly.objects.all().delete()
    other = tmp_path / "other"
    other.mkdir()
    lost = ClusterFactory(mode=ClusterMode.ACTION, acknowledge_scheduler_actions=True)
    node_failure = Job(lost, other)
    node_failure.fails(state="NODE_FAIL", exit_code=None)
    assert Anomaly.objects.get().category == FailureCategory.SCHEDULER_EVENT


def test_a_hang_has_no_category_and_is_not_unexplained(running: Job) -> None:
    """A hang, a straggler, a slowdown say what happened to progress, not what failed: no
    category by design. The attempt failing after a hang was decided adds nothing."""
    workload = running.workload
    attempt = workload.attempts.get()
    attempt.started_at = timezone.now() - timedelta(hours=2)
    attempt.save()
    Policy.objects.update(hang_timeout_minutes=1)
    then = timezone.now() - timedelta(minutes=30)
    ProgressSample.objects.bulk_create(
        ProgressSample(workload=workload, attempt=1, step=step, at=then + timedelta(seconds=step))
        for step in range(20)
    )
    (hang,) = check_progress(workload, timezone.now())
    assert hang.kind == AnomalyKind.HANG
    assert hang.category == NO_CATEGORY

    running.fails()
    assert not Anomaly.objects.filter(category=FailureCategory.UNEXPLAINED).exists()


@pytest.mark.parametrize(
    "policy",
    [
        Policy(name="restart"),
        Policy(name="stop", crash_action=RecommendationAction.STOP),
        Policy(name="record", crash_action=RecommendationAction.NONE),
        Policy(name="budget", max_attempts=1),
        Policy(name="no checkpoint", max_attempts_without_checkpoint=1),
        Policy(name="stop on app", stop_on_application_fault=True),
        Policy(
            name="exclude everything",
            crash_action=RecommendationAction.RESTART_EXCLUDING,
            exclude_on_attributions=["hardware", "system_software", "application", "unknown"],
            exclude_on_categories=["gpu_hardware", "interconnect", "segfault"],
        ),
    ],
    ids=lambda policy: policy.name,
)
def test_an_unexplained_failure_is_decided_as_an_uncategorised_failed_was(
    running: Job, policy: Policy
) -> None:
    """
    GIVEN an unexplained failure as the loop recorded it
    WHEN any policy decides on it, with any history
    THEN the decision (action, excluded nodes, stop reason) is the one the same failure without
         a category gets: the category names what is missing, it changes nothing done
    """
    running.prints(*LAST_WORDS)
    running.fails()
    unexplained = Anomaly.objects.select_related("workload", "attempt").get()
    uncategorised = copy.copy(unexplained)
    uncategorised.category = NO_CATEGORY
    for history in (
        History(attempts=1, attempts_without_checkpoint=0),
        History(attempts=3, attempts_without_checkpoint=3, previously_excluded=frozenset(NODES)),
        History(attempts=1, attempts_without_checkpoint=0, cluster_nodes={"node009": "suspect"}),
    ):
        was = decide(uncategorised, policy, history)
        now = decide(unexplained, policy, history)
        assert (now.action, now.excluded_nodes, now.stop_reason, now.exclusion_sources) == (
            was.action,
            was.excluded_nodes,
            was.stop_reason,
            was.exclusion_sources,
        )


def test_the_loop_restarts_an_unexplained_failure_as_it_restarts_a_bare_failed(
    running: Job,
) -> None:
    running.fails()
    recommendation = running.workload.recommendations.get()
    assert recommendation.action == RecommendationAction.RESTART
    assert recommendation.excluded_nodes == []
    assert recommendation.anomaly is not None
    assert recommendation.anomaly.category == FailureCategory.UNEXPLAINED


def test_a_kernel_finding_in_the_attempt_explains_the_death(running: Job) -> None:
    """An Xid in the node's kernel log, recorded before the end was judged, is the cause."""
    xid = Finding(
        kind="crash",
        category="gpu_hardware",
        attribution="hardware",
        severity="fatal",
        signature="xid-79",
        evidence="NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, GPU has fallen off the bus.",
        nodes=["node002"],
        detail={"role": "cause", "xid": 79},
    )
    workload = running.workload
    record_anomalies(
        workload,
        workload.attempts.get(),
        [xid],
        timezone.now(),
        scope="kernel:node002",
        source=EvidenceSource.KERNEL_LOG,
    )
    running.prints(*LAST_WORDS)
    running.fails()
    assert not Anomaly.objects.filter(category=FailureCategory.UNEXPLAINED).exists()
