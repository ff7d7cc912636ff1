"""The live part of the demo: simulated clusters whose jobs train, fail and get restarted.

One cluster runs in monitor mode (recommendations wait for an operator's approval in the
Console), one in action mode (the Advisor Controller carries them out by itself). The real
poller, detectors, policy engine, watchdog and controller do the work; only the cluster is
simulated.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from recovery.choices import ClusterMode, Connection, SchedulerKind
from recovery.models import Cluster, ControllerToken, Policy
from recovery.simulator.cluster import SimConfig
from recovery.simulator.store import simulation_store


@dataclass(frozen=True)
class LiveCluster:
    name: str
    mode: str
    nodes: int
    jobs: int
    seed: int


LIVE_CLUSTERS = (
    LiveCluster("live-monitor", ClusterMode.MONITOR, nodes=48, jobs=12, seed=1),
    LiveCluster("live-action", ClusterMode.ACTION, nodes=64, jobs=16, seed=2),
)
# Training runs this much faster than real time, so failures show up within a minute.
DEMO_SPEEDUP = 20.0
# Far more often than a real cluster (Llama 3 saw one interruption per ~3 h on 16k GPUs), so
# that a visitor sees several failures a minute across a few dozen jobs.
DEMO_FAULTS_PER_JOB_HOUR = 0.5


class NotSimulated(Exception):
    """A cluster of that name exists and is not a simulated one."""


def ensure_simulated_cluster(config: SimConfig, mode: str | None = None) -> Cluster:
    """Create or update the cluster row a simulation runs behind."""
    with transaction.atomic():
        cluster, _ = Cluster.objects.select_for_update().get_or_create(
            name=config.name,
            defaults={
                "scheduler_kind": SchedulerKind.SIMULATED,
                "connection": Connection.SIMULATED,
                "environment": config.environment,
            },
        )
        if cluster.connection != Connection.SIMULATED:
            raise NotSimulated(f"cluster {config.name} exists and is not a simulated one")
        cluster.connection_settings = {
            **(cluster.connection_settings or {}),
            "simulator": dataclasses.asdict(config),
        }
        if mode is not None:
            cluster.mode = mode
            cluster.acknowledge_scheduler_actions = mode == ClusterMode.ACTION
        cluster.save()
    return cluster


def live_config(live: LiveCluster, log_dir: Path) -> SimConfig:
    return SimConfig(
        name=live.name,
        nodes=live.nodes,
        jobs=live.jobs,
        seed=live.seed,
        speedup=DEMO_SPEEDUP,
        faults_per_job_hour=DEMO_FAULTS_PER_JOB_HOUR,
        log_dir=str(log_dir),
    )


def prepare_live_clusters(var_dir: Path) -> list[tuple[LiveCluster, Path]]:
    """Cluster rows, a policy each, and a fresh controller token file each."""
    prepared = []
    for live in LIVE_CLUSTERS:
        config = live_config(live, var_dir / "sim")
        cluster = ensure_simulated_cluster(config, live.mode)
        # Published now, so the controller finds the simulation even before its first tick.
        simulation_store(
            config, redis_url=settings.REDIS_URL, state_dir=settings.SIMULATOR_STATE_DIR
        ).publish_config()
        Policy.objects.get_or_create(
            name=f"{live.name} defaults",
            defaults={
                "cluster": cluster,
                # A demo cluster is small: excluding one node is more than the 10 % default.
                "blast_radius_percent": 25,
                "decision_timeout_seconds": 60,
            },
        )
        # Every live cluster has a controller: in monitor mode it carries out approvals.
        token_file = var_dir / "demo" / f"{live.name}.token"
        token_file.parent.mkdir(parents=True, exist_ok=True)
        # A fresh token each start: the key of the last one was never stored.
        _, key = ControllerToken.issue(
            cluster, f"demo-controller-{timezone.now():%Y%m%d-%H%M%S-%f}"
        )
        token_file.write_text(key)
        token_file.chmod(0o600)
        prepared.append((live, token_file))
    return prepared
