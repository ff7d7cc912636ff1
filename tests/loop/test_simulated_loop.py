"""The real loop on a simulated cluster: shared state in Redis, the poller, the policy engine and
the Advisor Controller over the Advisor API, each talking to the simulation as to Slurm."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings

from recovery.choices import AuditKind, ClusterMode, RecommendationStatus
from recovery.controller.client import AdvisorClient
from recovery.controller.controller import AdvisorController
from recovery.demo.live import ensure_simulated_cluster
from recovery.loop.poll import adapter_for, poll_cluster
from recovery.loop.watchdog import run_watchdog
from recovery.models import AuditEvent, ControllerToken, Policy, Recommendation
from recovery.simulator.cluster import SimConfig
from recovery.simulator.store import SimulationStore

pytestmark = [pytest.mark.services, pytest.mark.django_db(transaction=True)]


def test_a_hardware_fault_is_detected_and_the_job_restarts_without_the_bad_node(
    live_server: Any, tmp_path: Path
) -> None:
    config = SimConfig(
        name="sim-loop",
        nodes=12,
        jobs=3,
        seed=7,
        speedup=20.0,
        log_dir=str(tmp_path),
        faults_per_job_hour=0.0,  # only the fault this test injects
        bad_node_fraction=0.0,
        startup_seconds=(2.0, 4.0),
        requeue_delay_seconds=1.0,
    )
    cluster = ensure_simulated_cluster(config, ClusterMode.ACTION)
    Policy.objects.create(name="sim", cluster=cluster, blast_radius_percent=100)
    store = SimulationStore.from_url(settings.REDIS_URL, config)
    store.reset()
    store.publish_config()
    _, key = ControllerToken.issue(cluster, "sim-controller")
    controller = AdvisorController(
        AdvisorClient(live_server.url, key),
        adapter_for(cluster),
        poll_seconds=0.1,
    )

    def tick() -> None:
        store.advance(datetime.now(UTC))
        poll_cluster(cluster)
        controller.run_once()
        run_watchdog()

    deadline = time.monotonic() + 30
    victim = None
    while victim is None:
        tick()
        running = [job for job in store.reading().jobs() if job.native_state == "RUNNING"]
        checkpointed = [j for j in running if "saved checkpoint" in Path(j.stdout_path).read_text()]
        victim = checkpointed[0] if checkpointed else None
        assert time.monotonic() < deadline, "no job reached a checkpoint"
        time.sleep(0.3)
    with store.changing() as simulation:
        simulation.inject(victim.job_id, "gpu_faulty", node=1, at=datetime.now(UTC).timestamp())
    bad_node = victim.nodes[1]

    deadline = time.monotonic() + 60
    while True:
        tick()
        job = store.reading().get_job(victim.job_id)
        if job is not None and job.restart_count == 1 and job.native_state == "RUNNING":
            break
        assert time.monotonic() < deadline, f"never restarted: {job}"
        time.sleep(0.3)

    assert bad_node not in job.nodes
    assert job.excluded_nodes is not None and bad_node in job.excluded_nodes
    (executed,) = Recommendation.objects.filter(
        workload__job_id=victim.job_id, status=RecommendationStatus.EXECUTED
    )
    assert executed.action == "restart_excluding"
    assert executed.anomaly is not None and executed.anomaly.attribution == "hardware"
    actions = AuditEvent.objects.filter(
        workload__job_id=victim.job_id, kind=AuditKind.SCHEDULER_ACTION
    )
    assert actions.count() == 1
    for _ in range(10):
        tick()
        time.sleep(0.3)
    assert "resuming from checkpoint" in Path(victim.stdout_path).read_text()
    assert actions.count() == 1  # nothing acted twice while it resumed
