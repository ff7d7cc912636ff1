"""Where a simulated cluster lives between processes: its state, changed under a lock.

The ``simulate`` command advances the cluster's clock; the poller reads it and the Advisor
Controller acts on it, each from its own process, like Slurm's clients talking to slurmctld.
Every change loads the state, applies itself and saves, under one lock per cluster, so an
action never interleaves with a clock tick.

Two stores keep it. ``RedisSimulationStore`` (the demo's, and the scaling bench reads its key
``wr:sim:<name>:state``) loses the simulation when Redis restarts; ``FileSimulationStore``
keeps it in a directory, so that a chaos test can restart Redis under a simulation that is its
ground truth. ``simulation_store`` and ``published_simulation`` pick one: a state directory
means files.
"""

from __future__ import annotations

import abc
import contextlib
import copy
import dataclasses
import fcntl
import json
import os
import re
import shutil
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import redis

from recovery.schedulers.base import SchedulerError
from recovery.simulator.cluster import SimConfig, SimulatedCluster
from recovery.simulator.cluster.journal import ChaosControls

# A tick of a few thousand nodes takes well under this; a holder killed mid-way frees it then.
LOCK_TIMEOUT_SECONDS = 30
LOCK_WAIT_SECONDS = 20
# How often a change waiting for the file lock tries again.
FILE_LOCK_RETRY_SECONDS = 0.01
# A simulation's name names its files: the cluster names the control plane accepts.
SIMULATION_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}")


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


def simulation_store(
    config: SimConfig, *, redis_url: str, state_dir: str | Path
) -> BaseSimulationStore:
    """The store of this simulation: files in ``state_dir`` when one is given, else Redis."""
    if str(state_dir):
        return FileSimulationStore(state_dir, config)
    return RedisSimulationStore.from_url(redis_url, config)


def published_simulation(
    name: str, *, redis_url: str, state_dir: str | Path
) -> BaseSimulationStore:
    """The store of a running simulation found by name, where ``simulation_store`` puts it."""
    if str(state_dir):
        return FileSimulationStore.published(state_dir, name)
    return RedisSimulationStore.published(redis_url, name)


class BaseSimulationStore(abc.ABC):
    """A simulation's state, read as a snapshot or changed under the simulation's lock."""

    config: SimConfig

    @property
    @abc.abstractmethod
    def location(self) -> str:
        """Where the state is, for people."""

    @abc.abstractmethod
    def publish_config(self) -> None:
        """Let other processes (a controller) find this simulation by its name."""

    @abc.abstractmethod
    def _read_state(self) -> bytes | None: ...

    @abc.abstractmethod
    def _write_state(self, data: bytes) -> None: ...

    @abc.abstractmethod
    def _forget_state(self) -> None: ...

    @abc.abstractmethod
    def _locked(self) -> contextlib.AbstractContextManager[None]:
        """Hold the simulation's lock; SchedulerError when it stays taken LOCK_WAIT_SECONDS."""

    def _busy(self) -> SchedulerError:
        return SchedulerError(f"simulated cluster {self.config.name} is busy: lock not free")

    def _load(self, now: datetime) -> SimulatedCluster:
        return self._decoded(self._read_state(), now)

    def _decoded(self, raw: bytes | None, now: datetime) -> SimulatedCluster:
        return SimulatedCluster(self.config, json.loads(raw) if raw else None, now=now)

    def _save(self, cluster: SimulatedCluster) -> None:
        self._write_state(json.dumps(cluster.to_state(), separators=(",", ":")).encode())

    @contextmanager
    def changing(self, now: datetime | None = None) -> Iterator[SimulatedCluster]:
        """The cluster, saved when the block ends without an exception."""
        with self._locked():
            cluster = self._load(now or datetime.now(UTC))
            yield cluster
            self._save(cluster)

    def reading(self, now: datetime | None = None) -> SimulatedCluster:
        """A snapshot of the cluster for reading; changes to it are not saved."""
        return self._load(now or datetime.now(UTC))

    # The state last decoded by ``shared_reading``, with the bytes it was decoded from.
    _shared: tuple[bytes, SimulatedCluster] | None = None

    def shared_reading(self) -> SimulatedCluster:
        """A snapshot like ``reading``'s, but the same object while the stored state is the
        same bytes: for callers that only read it. A poll lists jobs and then nodes, and
        decoding the whole state for each was a tenth of a worker's time at 1,000 jobs."""
        raw = self._read_state()
        if raw is not None and self._shared is not None and self._shared[0] == raw:
            return self._shared[1]
        cluster = self._decoded(raw, datetime.now(UTC))
        self._shared = None if raw is None else (raw, cluster)
        return cluster

    def advance(self, now: datetime | None = None) -> None:
        now = now or datetime.now(UTC)
        with self.changing(now) as cluster:
            cluster.advance(now)

    def reset(self) -> None:
        """Forget the cluster and its output: a fresh one numbers its jobs from the start."""
        self._forget_state()
        shutil.rmtree(Path(self.config.log_dir) / self.config.name, ignore_errors=True)

    def set_chaos(
        self,
        *,
        unreachable_until: float | None = None,
        timeouts_after_effect: int | None = None,
        kills_after_command: int | None = None,
    ) -> ChaosControls:
        """Set what a chaos harness injects (see ``SimulatedAdapter``); returns all controls.

        Each value given replaces the current one, the others stay: ``unreachable_until`` is
        epoch seconds (0 ends an outage now), the counts are how many commands are left.
        """
        with self.changing() as cluster:
            return cluster.set_chaos(
                unreachable_until=unreachable_until,
                timeouts_after_effect=timeouts_after_effect,
                kills_after_command=kills_after_command,
            )

    def chaos(self) -> ChaosControls:
        return copy.copy(self.reading().chaos)


class RedisSimulationStore(BaseSimulationStore):
    """The state in Redis, under a Redis lock: gone when Redis restarts without persistence."""

    def __init__(self, client: redis.Redis, config: SimConfig) -> None:
        self.client = client
        self.config = config
        self.key = f"wr:sim:{config.name}:state"
        self.lock_key = f"wr:sim:{config.name}:lock"

    @classmethod
    def from_url(cls, url: str, config: SimConfig) -> RedisSimulationStore:
        return cls(redis.Redis.from_url(url), config)

    @classmethod
    def published(cls, url: str, name: str) -> RedisSimulationStore:
        """The store of a running simulation, found by name (what a controller knows)."""
        client = redis.Redis.from_url(url)
        raw = client.get(f"wr:sim:{name}:config")
        if raw is None:
            raise SchedulerError(f"no simulation named {name!r} runs on this Redis")
        return cls(client, config_from_settings(json.loads(raw)))

    @property
    def location(self) -> str:
        return f"Redis key {self.key}"

    def publish_config(self) -> None:
        self.client.set(
            f"wr:sim:{self.config.name}:config", json.dumps(dataclasses.asdict(self.config))
        )

    def _read_state(self) -> bytes | None:
        # redis-py types every answer as bytes or str; this client does not decode: bytes.
        raw: bytes | None = self.client.get(self.key)  # type: ignore[assignment]
        return raw

    def _write_state(self, data: bytes) -> None:
        self.client.set(self.key, data)

    def _forget_state(self) -> None:
        self.client.delete(self.key)

    @contextmanager
    def _locked(self) -> Iterator[None]:
        lock = self.client.lock(
            self.lock_key, timeout=LOCK_TIMEOUT_SECONDS, blocking_timeout=LOCK_WAIT_SECONDS
        )
        if not lock.acquire():
            raise self._busy()
        try:
            yield
        finally:
            # A lock that expired during a very slow change has nothing left to release.
            with contextlib.suppress(redis.exceptions.LockError):
                lock.release()


# The name bench/scaling and the loop tests know the Redis store by.
SimulationStore = RedisSimulationStore


class FileSimulationStore(BaseSimulationStore):
    """The state as a JSON file in ``<directory>/<name>/``: it outlives Redis and its clients.

    Every save replaces ``state.json`` atomically (a temporary file beside it, synced, then
    renamed), so a reader or a process killed mid-save sees the old state or the new one,
    never part of one. Changes hold an exclusive ``flock`` on ``lock``, which the kernel
    frees when its holder dies. ``config.json`` lets other processes find the simulation.
    """

    def __init__(self, directory: str | Path, config: SimConfig) -> None:
        self.config = config
        self.folder = _simulation_folder(directory, config.name)
        self.state_path = self.folder / "state.json"
        self.lock_path = self.folder / "lock"

    @classmethod
    def published(cls, directory: str | Path, name: str) -> FileSimulationStore:
        """The store of a running simulation, found by name (what a controller knows)."""
        path = _simulation_folder(directory, name) / "config.json"
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            raise SchedulerError(
                f"no simulation named {name!r} is published in {directory}"
            ) from None
        return cls(directory, config_from_settings(json.loads(raw)))

    @property
    def location(self) -> str:
        return str(self.state_path)

    def publish_config(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        data = json.dumps(dataclasses.asdict(self.config)).encode()
        _replace_atomically(self.folder / "config.json", data)

    def _read_state(self) -> bytes | None:
        try:
            return self.state_path.read_bytes()
        except FileNotFoundError:
            return None

    def _write_state(self, data: bytes) -> None:
        _replace_atomically(self.state_path, data)

    def _forget_state(self) -> None:
        with self._locked():
            self.state_path.unlink(missing_ok=True)
            # Left by a writer killed before its rename.
            for temporary in self.folder.glob(".state.json.*.tmp"):
                temporary.unlink(missing_ok=True)

    @contextmanager
    def _locked(self) -> Iterator[None]:
        self.folder.mkdir(parents=True, exist_ok=True)
        with self.lock_path.open("ab") as handle:
            # Polled: a blocking flock cannot give up after LOCK_WAIT_SECONDS.
            deadline = time.monotonic() + LOCK_WAIT_SECONDS
            while True:
                try:
                    fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() >= deadline:
                        raise self._busy() from None
                    time.sleep(FILE_LOCK_RETRY_SECONDS)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)


def _simulation_folder(directory: str | Path, name: str) -> Path:
    if not SIMULATION_NAME.fullmatch(name):
        raise SchedulerError(f"not a simulation name: {name!r}")
    return Path(directory) / name


def _replace_atomically(path: Path, data: bytes) -> None:
    """Write ``path`` so that it holds the old data or the new, whenever the writer dies."""
    handle = tempfile.NamedTemporaryFile(  # noqa: SIM115 (renamed, not deleted, on success)
        dir=path.parent, prefix=f".{path.name}.", suffix=".tmp", delete=False
    )
    temporary = Path(handle.name)
    try:
        with handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        temporary.replace(path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
    # The rename itself is durable once the directory is synced.
    folder = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(folder)
    finally:
        os.close(folder)
