"""The chaos a harness injects through the simulated adapter: an unreachable scheduler, a command
that times out after it took effect, a controller killed between two commands."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from recovery.schedulers.base import SchedulerError
from recovery.simulator.adapter import SimulatedAdapter
from recovery.simulator.store import FileSimulationStore
from tests.simulator.test_cluster import only_job, quiet_config

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def store(tmp_path: Path) -> FileSimulationStore:
    """A quiet simulation in files, published, with its one job running."""
    store = FileSimulationStore(tmp_path / "state", quiet_config(tmp_path / "logs"))
    store.publish_config()
    store.advance()
    return store


def every_call(adapter: SimulatedAdapter, job_id: str) -> dict[str, Callable[[], object]]:
    return {
        "list_jobs": adapter.list_jobs,
        "get_job": lambda: adapter.get_job(job_id),
        "list_nodes": adapter.list_nodes,
        "cluster_name": adapter.cluster_name,
        "requeue": lambda: adapter.requeue(job_id, hold=True),
        "set_excluded_nodes": lambda: adapter.set_excluded_nodes(job_id, ["gpu-0001"]),
        "clear_start_delay": lambda: adapter.clear_start_delay(job_id),
        "release": lambda: adapter.release(job_id),
        "hold": lambda: adapter.hold(job_id),
        "cancel": lambda: adapter.cancel(job_id),
        "disable_requeue": lambda: adapter.disable_requeue(job_id),
    }


def test_chaos_is_off_by_default_and_set_values_replace_only_themselves(
    store: FileSimulationStore,
) -> None:
    assert store.chaos() == {
        "unreachable_until": None,
        "timeouts_after_effect": 0,
        "kills_after_command": 0,
        "refused_while_unreachable": 0,
    }
    store.set_chaos(unreachable_until=2e9, timeouts_after_effect=2)
    assert store.set_chaos(kills_after_command=1) == {
        "unreachable_until": 2e9,
        "timeouts_after_effect": 2,
        "kills_after_command": 1,
        "refused_while_unreachable": 0,
    }
    store.set_chaos(unreachable_until=0, timeouts_after_effect=0)
    assert store.chaos()["unreachable_until"] is None
    with pytest.raises(ValueError, match="must not be negative"):
        store.set_chaos(kills_after_command=-1)


def test_an_outage_refuses_every_read_and_command_until_it_ends(
    store: FileSimulationStore,
) -> None:
    """GIVEN an outage of the scheduler WHEN anything is asked of it THEN it raises without a
    result, nothing reaches the scheduler (no journal entry, no change) and the refused commands
    are counted; once the outage is over everything works again."""
    adapter = SimulatedAdapter(store)
    job_id = only_job(store.reading())
    job_before = store.reading().jobs_by_id[int(job_id)].to_dict()
    until = time.time() + 2.0
    store.set_chaos(unreachable_until=until)

    for name, call in every_call(adapter, job_id).items():
        with pytest.raises(SchedulerError, match="is unreachable: connection refused") as raised:
            call()
        assert raised.value.result is None, name

    cluster = store.reading()
    assert cluster.journal()["commands"] == []
    assert cluster.jobs_by_id[int(job_id)].to_dict() == job_before
    assert cluster.chaos["refused_while_unreachable"] == 7
    time.sleep(max(0.0, until - time.time()) + 0.05)
    assert adapter.cluster_name() == "lab" and adapter.get_job(job_id) is not None
    adapter.requeue(job_id, hold=True)
    assert len(store.reading().journal()["commands"]) == 1


def test_reads_during_an_outage_do_not_wait_for_the_lock(store: FileSimulationStore) -> None:
    adapter = SimulatedAdapter(store)
    store.set_chaos(unreachable_until=time.time() + 60)
    with store.changing():  # a clock tick or a command holding the lock
        started = time.monotonic()
        with pytest.raises(SchedulerError, match="unreachable"):
            adapter.list_jobs()
        assert time.monotonic() - started < 1.0


def test_a_command_times_out_after_it_took_effect(store: FileSimulationStore) -> None:
    """GIVEN one timeout armed WHEN a command that changes nothing, then one that does, are sent
    THEN the first returns, the second takes effect, is journaled and then raises a timeout
    without a result; the next one returns again."""
    adapter = SimulatedAdapter(store)
    job_id = only_job(store.reading())
    store.set_chaos(timeouts_after_effect=1)
    adapter.cancel("424242")  # accepted, and changes nothing
    with pytest.raises(SchedulerError, match="no longer pending"):
        adapter.release(job_id)  # refused
    assert store.chaos()["timeouts_after_effect"] == 1

    with pytest.raises(SchedulerError) as raised:
        adapter.requeue(job_id, hold=True)

    assert raised.value.result is None
    assert str(raised.value) == (
        f"`scontrol requeuehold {job_id}` timed out after 30 s waiting for scontrol"
    )
    cluster = store.reading()
    job = cluster.get_job(job_id)
    assert job is not None and job.restart_count == 1 and job.held
    last = cluster.journal()["commands"][-1]
    assert (last["effective"], last["timed_out_after"], last["killed_after"]) == (True, True, False)
    assert cluster.chaos["timeouts_after_effect"] == 0
    assert adapter.release(job_id).returncode == 0


def send_in_another_process(store: FileSimulationStore, *, killable: bool, job_id: str) -> int:
    env = {**os.environ, "WR_SIM_CALLER": "controller-1"}
    env.pop("WR_SIM_KILLABLE", None)
    if killable:
        env["WR_SIM_KILLABLE"] = "1"
    result = subprocess.run(
        [sys.executable, "-m", "tests.simulator.sim_process", "call",
         str(store.folder.parent), store.config.name, "requeue", job_id],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    return result.returncode


def test_a_killable_caller_dies_right_after_its_command_took_effect(
    store: FileSimulationStore,
) -> None:
    """GIVEN one kill armed WHEN a process that opted in sends a command THEN the command is
    applied and journaled as killed after, and the process died of SIGKILL."""
    job_id = only_job(store.reading())
    store.set_chaos(kills_after_command=1)

    returncode = send_in_another_process(store, killable=True, job_id=job_id)

    assert returncode == -signal.SIGKILL
    cluster = store.reading()
    job = cluster.get_job(job_id)
    assert job is not None and job.restart_count == 1
    [entry] = cluster.journal()["commands"]
    assert (entry["caller"], entry["effective"], entry["killed_after"]) == (
        "controller-1",
        True,
        True,
    )
    assert cluster.chaos["kills_after_command"] == 0


def test_a_caller_that_did_not_opt_in_is_never_killed(store: FileSimulationStore) -> None:
    job_id = only_job(store.reading())
    store.set_chaos(kills_after_command=1)

    returncode = send_in_another_process(store, killable=False, job_id=job_id)

    assert returncode == 0
    cluster = store.reading()
    [entry] = cluster.journal()["commands"]
    assert (entry["effective"], entry["killed_after"]) == (True, False)
    assert cluster.chaos["kills_after_command"] == 1  # left for a controller
