"""Where a simulated cluster lives between processes: its state in Redis, changed under a lock.

The ``simulate`` command advances the cluster's clock; the poller reads it and the Advisor
Controller acts on it, each from its own process, like Slurm's clients talking to slurmctld.
Every change loads the state, applies itself and saves, under one lock per cluster, so an
action never interleaves with a clock tick.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import redis

from recovery.simulator.cluster import SimConfig, SimulatedCluster
from recovery.sources.schedulers.base import SchedulerError

# A tick of a few thousand nodes takes well under this; a holder killed mid-way frees it then.
LOCK_TIMEOUT_SECONDS = 30
LOCK_WAIT_SECONDS = 20


def config_from_settings(settings: dict[str, Any]) -> SimConfig:
    """The ``simulator`` entry of a cluster's connection settings as a ``SimConfig``."""
    fields = {field.name: field for field in dataclasses.fields(SimConfig)}
    unknown = sorted(set(settings) - set(fields))
    if unknown:
        raise SchedulerError(f"unknown simulator settings: {', '.join(unknown)}")
    # JSON turned the ranges (tuples) into lists.
    values: dict[str, Any] = {
        name: tuple(value) if isinstance(value, list) else value for name, value in settings.items()
    }
    try:
        return SimConfig(**values)
    except TypeError as exc:
        raise SchedulerError(f"simulator settings incomplete: {exc}") from None


class SimulationStore:
    def __init__(self, client: redis.Redis, config: SimConfig) -> None:
        self.client = client
        self.config = config
        self.key = f"wr:sim:{config.name}:state"
        self.lock_key = f"wr:sim:{config.name}:lock"

    @classmethod
    def from_url(cls, url: str, config: SimConfig) -> SimulationStore:
        return cls(redis.Redis.from_url(url), config)

    @classmethod
    def published(cls, url: str, name: str) -> SimulationStore:
        """The store of a running simulation, found by name (what a controller knows)."""
        client = redis.Redis.from_url(url)
        raw = client.get(f"wr:sim:{name}:config")
        if raw is None:
            raise SchedulerError(f"no simulation named {name!r} runs on this Redis")
        return cls(client, config_from_settings(json.loads(raw)))

    def publish_config(self) -> None:
        """Let other processes (a controller) find this simulation by its name."""
        self.client.set(
            f"wr:sim:{self.config.name}:config", json.dumps(dataclasses.asdict(self.config))
        )

    def _load(self, now: datetime) -> SimulatedCluster:
        raw = self.client.get(self.key)
        state = json.loads(raw) if raw else None
        return SimulatedCluster(self.config, state, now=now)

    def _save(self, cluster: SimulatedCluster) -> None:
        self.client.set(self.key, json.dumps(cluster.to_state(), separators=(",", ":")))

    @contextmanager
    def changing(self, now: datetime | None = None) -> Iterator[SimulatedCluster]:
        """The cluster, saved when the block ends without an exception."""
        lock = self.client.lock(
            self.lock_key, timeout=LOCK_TIMEOUT_SECONDS, blocking_timeout=LOCK_WAIT_SECONDS
        )
        if not lock.acquire():
            raise SchedulerError(f"simulated cluster {self.config.name} is busy: lock not free")
        try:
            cluster = self._load(now or datetime.now(UTC))
            yield cluster
            self._save(cluster)
        finally:
            # A lock that expired during a very slow change has nothing left to release.
            with contextlib.suppress(redis.exceptions.LockError):
                lock.release()

    def reading(self, now: datetime | None = None) -> SimulatedCluster:
        """A snapshot of the cluster for reading; changes to it are not saved."""
        return self._load(now or datetime.now(UTC))

    def advance(self, now: datetime | None = None) -> None:
        now = now or datetime.now(UTC)
        with self.changing(now) as cluster:
            cluster.advance(now)

    def reset(self) -> None:
        """Forget the cluster and its output: a fresh one numbers its jobs from the start."""
        self.client.delete(self.key)
        shutil.rmtree(Path(self.config.log_dir) / self.config.name, ignore_errors=True)
