"""The simulation kept in files: shared by processes, changed under a file lock, and still there
when Redis restarts empty."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
import redis
from django.conf import settings

from recovery.schedulers.base import SchedulerError
from recovery.simulator import store as store_module
from recovery.simulator.adapter import SimulatedAdapter
from recovery.simulator.cluster import SimConfig
from recovery.simulator.store import (
    FileSimulationStore,
    RedisSimulationStore,
    published_simulation,
    simulation_store,
)
from tests.simulator.sim_process import UNKNOWN_JOB
from tests.simulator.test_cluster import only_job, quiet_config

REPO = Path(__file__).resolve().parents[2]


def file_store(tmp_path: Path, **changes: object) -> FileSimulationStore:
    """A quiet simulation in files, published, with its one job running."""
    store = FileSimulationStore(tmp_path / "state", quiet_config(tmp_path / "logs", **changes))
    store.publish_config()
    store.advance()
    return store


def sim_process(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.simulator.sim_process", *args],
        cwd=REPO,
        env={**os.environ, **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_it_keeps_the_state_in_a_json_file_that_a_new_store_finds_by_name(tmp_path: Path) -> None:
    store = file_store(tmp_path)
    job_id = only_job(store.reading())
    SimulatedAdapter(store).requeue(job_id, hold=True)

    found = FileSimulationStore.published(tmp_path / "state", "lab")

    assert found.config == store.config
    job = found.reading().get_job(job_id)
    assert job is not None and job.held and job.restart_count == 1
    saved = json.loads((tmp_path / "state" / "lab" / "state.json").read_text())
    assert saved["version"] == 2 and saved["commands"][0]["argv"][1] == "requeuehold"
    # Every save went through a temporary file that was renamed: none is left behind.
    assert sorted(path.name for path in (tmp_path / "state" / "lab").iterdir()) == [
        "config.json",
        "lock",
        "state.json",
    ]


def test_an_unpublished_or_unsafe_name_is_not_found(tmp_path: Path) -> None:
    with pytest.raises(SchedulerError, match="no simulation named 'lab' is published"):
        FileSimulationStore.published(tmp_path, "lab")
    with pytest.raises(SchedulerError, match="not a simulation name"):
        FileSimulationStore.published(tmp_path, "../etc")


def test_two_processes_ticking_and_commanding_at_once_lose_no_update(tmp_path: Path) -> None:
    """GIVEN a simulation in files WHEN two processes each advance it and send a command 40
    times, concurrently THEN every command of both is in the journal."""
    store = file_store(tmp_path)
    state_dir = str(tmp_path / "state")
    processes = [
        sim_process("tick-and-cancel", state_dir, "lab", "40", env={"WR_SIM_CALLER": caller})
        for caller in ("first", "second")
    ]
    for process in processes:
        _, err = process.communicate(timeout=120)
        assert process.returncode == 0, err

    commands = store.reading().journal()["commands"]
    assert Counter(command["caller"] for command in commands) == {"first": 40, "second": 40}
    assert {command["job_id"] for command in commands} == {int(UNKNOWN_JOB)}
    at = [command["at"] for command in commands]
    assert at == sorted(at)  # one after the other, under the lock


def test_a_change_waits_for_the_lock_then_gives_up_as_busy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = file_store(tmp_path)
    monkeypatch.setattr(store_module, "LOCK_WAIT_SECONDS", 0.3)
    other = FileSimulationStore.published(tmp_path / "state", "lab")
    with store.changing():
        started = time.monotonic()
        with pytest.raises(SchedulerError, match="simulated cluster lab is busy"):
            other.advance()
        assert time.monotonic() - started >= 0.3
        other.reading()  # a read takes no lock


def test_a_lock_holder_killed_mid_change_frees_the_lock(tmp_path: Path) -> None:
    store = file_store(tmp_path)
    holder = sim_process("hold-lock", str(tmp_path / "state"), "lab")
    assert holder.stdout is not None and holder.stdout.readline() == "held\n"
    holder.send_signal(signal.SIGKILL)
    holder.wait(timeout=30)
    holder.communicate()

    started = time.monotonic()
    store.advance()
    assert time.monotonic() - started < 5  # not LOCK_WAIT_SECONDS


def test_reset_forgets_the_state_and_the_output(tmp_path: Path) -> None:
    store = file_store(tmp_path)
    SimulatedAdapter(store).cancel(only_job(store.reading()))
    killed_writer_left = tmp_path / "state" / "lab" / ".state.json.x1y2.tmp"
    killed_writer_left.write_text("{")
    store.reset()
    assert not (tmp_path / "state" / "lab" / "state.json").exists()
    assert not killed_writer_left.exists()
    assert not (tmp_path / "logs" / "lab").exists()
    assert store.reading().journal()["commands"] == []


def test_a_state_directory_means_files_and_none_means_redis(tmp_path: Path) -> None:
    config = SimConfig(name="lab", log_dir=str(tmp_path))
    in_files = simulation_store(config, redis_url="redis://unused:1/0", state_dir=tmp_path)
    assert isinstance(in_files, FileSimulationStore)
    in_redis = simulation_store(config, redis_url=settings.REDIS_URL, state_dir="")
    assert isinstance(in_redis, RedisSimulationStore) and in_redis.key == "wr:sim:lab:state"
    assert in_files.location == str(tmp_path / "lab" / "state.json")


@pytest.mark.services
def test_a_simulation_in_files_outlives_a_redis_flush_and_one_in_redis_does_not(
    tmp_path: Path,
) -> None:
    """GIVEN the same simulation in files and in Redis, each with a command applied WHEN Redis
    restarts empty (FLUSHDB) THEN the one in files is found by name with its state and journal,
    and the one in Redis is gone."""
    client = redis.Redis.from_url(settings.REDIS_URL)
    stores = {}
    for state_dir in (str(tmp_path / "state"), ""):
        config = quiet_config(tmp_path / f"logs-{bool(state_dir)}", name="lab-flush")
        store = simulation_store(config, redis_url=settings.REDIS_URL, state_dir=state_dir)
        store.reset()
        store.publish_config()
        store.advance()
        SimulatedAdapter(store).requeue(only_job(store.reading()), hold=True)
        stores[state_dir] = store

    client.flushdb()

    found = published_simulation(
        "lab-flush", redis_url=settings.REDIS_URL, state_dir=str(tmp_path / "state")
    )
    cluster = found.reading()
    assert [command["argv"][1] for command in cluster.journal()["commands"]] == ["requeuehold"]
    assert [job.restart_count for job in cluster.jobs()] == [1]
    with pytest.raises(SchedulerError, match="no simulation named 'lab-flush' runs on this"):
        published_simulation("lab-flush", redis_url=settings.REDIS_URL, state_dir="")
    assert stores[""].reading().journal()["commands"] == []  # a fresh cluster


def test_listings_share_one_decoded_state_until_it_changes(tmp_path: Path) -> None:
    """
    GIVEN a simulation whose state nothing changes
    WHEN the adapter lists jobs and then nodes, then holds the job, then lists jobs again
    THEN the first two listings decode the state once; after the hold the listing shows it
    """
    store = file_store(tmp_path)
    adapter = SimulatedAdapter(store)
    first = store.shared_reading()
    [job] = adapter.list_jobs()
    adapter.list_nodes()
    assert store.shared_reading() is first
    assert not job.held

    adapter.requeue(job.job_id, hold=True)
    assert store.shared_reading() is not first
    [held] = adapter.list_jobs()
    assert held.held
