"""A standby controller finishes what a killed one started, within seconds and exactly once.

Real controller processes (``python -m recovery.controller.cli`` with the defaults a site gets)
over the real Advisor API, acting on a simulated cluster whose journal is the ground truth of
what the scheduler received. The lease is renewed from a thread while an action waits on a
slow command, so a live controller keeps its claim however slow the scheduler is.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings

from recovery.choices import AuditKind, ClusterMode, RecommendationStatus
from recovery.controller.client import AdvisorClient
from recovery.controller.controller import DEFAULT_LEASE_SECONDS, AdvisorController
from recovery.demo.live import ensure_simulated_cluster
from recovery.loop.poll import poll_cluster
from recovery.models import AuditEvent, Cluster, ControllerToken, Policy, Recommendation
from recovery.schedulers.base import CommandResult
from recovery.simulator.cluster import SimConfig
from recovery.simulator.store import SimulationStore
from tests.controller.test_controller_safety import ModelSlurm, running_job
from tests.factories import AttemptFactory, ClusterFactory, RecommendationFactory, WorkloadFactory

pytestmark = [pytest.mark.services, pytest.mark.django_db(transaction=True)]

# What a killed controller may cost: from its death to the standby's first command.
TAKEOVER_SECONDS = 15


@dataclass
class Simulated:
    cluster: Cluster
    store: SimulationStore
    tokens: list[Path] = field(default_factory=list)


@pytest.fixture
def simulated(tmp_path: Path) -> Iterator[Simulated]:
    """A simulated cluster in action mode, its clock advanced by a thread while the test runs."""
    config = SimConfig(
        name="takeover",
        nodes=12,
        jobs=3,
        seed=11,
        speedup=20.0,
        log_dir=str(tmp_path),
        faults_per_job_hour=0.0,  # only the fault this test injects
        bad_node_fraction=0.0,
        startup_seconds=(2.0, 4.0),
        requeue_delay_seconds=1.0,
    )
    cluster = ensure_simulated_cluster(config, ClusterMode.ACTION)
    Policy.objects.create(name="takeover", cluster=cluster, blast_radius_percent=100)
    store = SimulationStore.from_url(settings.REDIS_URL, config)
    store.reset()
    store.publish_config()
    stopped = threading.Event()

    def clock() -> None:
        while not stopped.wait(0.2):
            store.advance(datetime.now(UTC))

    ticking = threading.Thread(target=clock, daemon=True)
    ticking.start()
    tokens = []
    for number in (1, 2):
        _, key = ControllerToken.issue(cluster, f"takeover-{number}")
        path = tmp_path / f"controller-{number}.token"
        path.write_text(key)
        tokens.append(path)
    try:
        yield Simulated(cluster, store, tokens)
    finally:
        stopped.set()
        ticking.join()


def ready_after_a_fault(simulated: Simulated) -> Recommendation:
    """Run the poller until a checkpointed job's GPU fault is a ready restart."""
    store, cluster = simulated.store, simulated.cluster
    deadline = time.monotonic() + 60
    victim = None
    while victim is None:
        poll_cluster(cluster)
        running = [job for job in store.reading().jobs() if job.native_state == "RUNNING"]
        checkpointed = [j for j in running if "saved checkpoint" in Path(j.stdout_path).read_text()]
        victim = checkpointed[0] if checkpointed else None
        assert time.monotonic() < deadline, "no job reached a checkpoint"
        time.sleep(0.3)
    with store.changing() as simulation:
        simulation.inject(victim.job_id, "gpu_faulty", node=1, at=datetime.now(UTC).timestamp())
    while True:
        poll_cluster(cluster)
        ready = Recommendation.objects.filter(
            workload__job_id=victim.job_id, status=RecommendationStatus.READY
        ).first()
        if ready is not None:
            return ready
        assert time.monotonic() < deadline, "the fault was never recommended for a restart"
        time.sleep(0.3)


def start_controller(
    live_server: Any, simulated: Simulated, number: int
) -> subprocess.Popen[bytes]:
    """A controller process with the options a site leaves at their defaults."""
    command = [
        sys.executable, "-m", "recovery.controller.cli", "--cluster", simulated.cluster.name,
        "--simulated", "--url", live_server.url, "--token-file", str(simulated.tokens[number - 1]),
    ]  # fmt: skip
    env = {
        **os.environ,
        "REDIS_URL": settings.REDIS_URL,
        "WR_SIM_CALLER": f"controller-{number}",
        # The simulator kills a process that opted in right after an armed command took effect.
        "WR_SIM_KILLABLE": "1",
    }
    return subprocess.Popen(
        command,
        cwd=settings.BASE_DIR,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )


def commands_for(simulated: Simulated, job_id: str) -> list[Any]:
    """What the simulated scheduler received for the job: argv, caller, time, effect."""
    journal = simulated.store.reading().journal()
    return [c for c in journal["commands"] if str(c["job_id"]) == job_id]


def wait_for(what: str, found: Callable[[], Any], seconds: float) -> Any:
    deadline = time.monotonic() + seconds
    while True:
        value = found()
        if value:
            return value
        assert time.monotonic() < deadline, f"{what}: not within {seconds:g} s"
        time.sleep(0.1)


def test_a_standby_finishes_a_killed_controllers_restart_within_15_s_exactly_once(
    live_server: Any, simulated: Simulated
) -> None:
    """
    GIVEN two controller processes of one cluster, at their default lease and interval, and a
          ready restart
    WHEN the one that claims it is SIGKILLed right after its requeuehold took effect
    THEN the other finishes the restart within 15 s of that death (it releases the job and
         requeues nothing), and the trail says who did what
    """
    recommendation = ready_after_a_fault(simulated)
    job_id = recommendation.workload.job_id
    simulated.store.set_chaos(kills_after_command=1)
    processes = [start_controller(live_server, simulated, number) for number in (1, 2)]
    try:
        killed = wait_for(
            "the controller that claimed is killed after its first command",
            lambda: next((c for c in commands_for(simulated, job_id) if c["killed_after"]), None),
            60,
        )
        assert killed["argv"][1] == "requeuehold"
        dead = wait_for(
            "the killed process is gone",
            lambda: [p for p in processes if p.poll() is not None],
            10,
        )
        assert [p.returncode for p in dead] == [-signal.SIGKILL]
        (standby,) = [p for p in processes if p.poll() is None]
        released = wait_for(
            "the standby releases the job",
            lambda: next(
                (c for c in commands_for(simulated, job_id) if c["argv"][1] == "release"), None
            ),
            TAKEOVER_SECONDS + 30,
        )
        took = released["at"] - killed["at"]
        assert took <= TAKEOVER_SECONDS, f"the standby took {took:.1f} s"
        assert released["caller"] != killed["caller"]
        wait_for(
            "the standby reports",
            lambda: Recommendation.objects.filter(
                pk=recommendation.pk, status=RecommendationStatus.EXECUTED
            ).exists(),
            15,
        )
    finally:
        for process in processes:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
    assert standby.returncode == -signal.SIGKILL  # stopped by the test, never died on its own
    verbs = [c["argv"][1] for c in commands_for(simulated, job_id)]
    assert verbs.count("requeuehold") == 1, verbs
    assert verbs.count("release") == 1, verbs
    claims = list(
        AuditEvent.objects.filter(kind=AuditKind.CLAIMED, payload__recommendation=recommendation.pk)
        .order_by("pk")
        .values_list("payload", flat=True)
    )
    assert len(claims) == 2
    assert claims[1]["previous_instance"] == claims[0]["controller_instance"]
    assert AuditEvent.objects.filter(kind=AuditKind.SCHEDULER_ACTION).count() == 1


class BlockingSlurm(ModelSlurm):
    """A scheduler whose requeuehold takes ``seconds`` of real time, as a busy slurmctld's may."""

    def __init__(self, seconds: float) -> None:
        super().__init__(running_job())
        self.seconds = seconds

    def _done(self, *argv: str) -> CommandResult:
        if argv[1] == "requeuehold":
            time.sleep(self.seconds)
        return super()._done(*argv)


def test_a_live_controller_keeps_its_claim_through_a_command_longer_than_its_lease(
    live_server: Any,
) -> None:
    """
    GIVEN a controller acting on a ready restart with the default lease
    WHEN its requeuehold blocks for twice the lease
    THEN its lease is renewed meanwhile, so another controller is never offered the
         recommendation, and the restart is finished and reported by the controller that began it
    """
    workload = WorkloadFactory(cluster=ClusterFactory())
    attempt = AttemptFactory(workload=workload)
    recommendation = RecommendationFactory(
        workload=workload, attempt=attempt, status=RecommendationStatus.READY
    )
    slow, standby = (
        AdvisorClient(live_server.url, ControllerToken.issue(workload.cluster, name)[1])
        for name in ("slow", "standby")
    )
    slurm = BlockingSlurm(seconds=2 * DEFAULT_LEASE_SECONDS)
    slurm.job = running_job(
        job_id=workload.job_id,
        user=workload.user,
        submit_time=workload.submit_time,
        start_time=attempt.started_at,
    )
    controller = AdvisorController(slow, slurm, poll_seconds=0.1, settle_seconds=5)
    outcome: list[list[tuple[int, str]]] = []
    acting = threading.Thread(target=lambda: outcome.append(controller.run_once()))
    started = time.monotonic()
    acting.start()
    asked_until = started
    while acting.is_alive():
        if Recommendation.objects.filter(pk=recommendation.pk, lease_owner="").exists():
            time.sleep(0.1)  # not claimed yet
            continue
        assert standby.ready() == [], "the blocked controller's claim was offered to another"
        asked_until = time.monotonic()
        time.sleep(0.5)
    acting.join()
    assert asked_until - started > 1.5 * DEFAULT_LEASE_SECONDS
    assert outcome == [[(recommendation.pk, "executed")]]
    assert slurm.commands == ["requeuehold", "update", "release"]
    recommendation.refresh_from_db()
    assert recommendation.status == RecommendationStatus.EXECUTED
    assert recommendation.lease_owner == "controller:slow"
