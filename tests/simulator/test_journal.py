"""The simulator's journal: every command it received, every fault that struck an attempt, and how
each attempt ended, saved with the state it describes."""

from __future__ import annotations

import os
from datetime import UTC, datetime
from pathlib import Path

import pytest

from recovery.schedulers.base import SchedulerError
from recovery.schedulers.validation import InvalidIdentifier
from recovery.simulator.adapter import SimulatedAdapter
from recovery.simulator.cluster import SimulatedCluster
from recovery.simulator.cluster import journal as journal_module
from recovery.simulator.faults import FAULT_KINDS, KINDS
from recovery.simulator.store import FileSimulationStore
from tests.simulator.test_cluster import START, listed_job, only_job, quiet_config, run


def only_kind(name: str) -> tuple[tuple[str, float], ...]:
    """Fault weights under which every fault is of kind ``name``."""
    return tuple((kind.name, 1.0 if kind.name == name else 0.0) for kind in FAULT_KINDS)


def file_store(tmp_path: Path) -> FileSimulationStore:
    store = FileSimulationStore(tmp_path / "state", quiet_config(tmp_path / "logs"))
    store.advance()
    return store


# ---------------------------------------------------------------------- commands


def test_a_command_is_journaled_with_the_job_as_the_scheduler_found_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WR_SIM_CALLER", "controller-a")
    store = file_store(tmp_path)
    job_id = only_job(store.reading())
    before = datetime.now(UTC).timestamp()

    SimulatedAdapter(store).requeue(job_id, hold=True)

    [entry] = store.reading().journal()["commands"]
    assert before <= entry["at"] <= datetime.now(UTC).timestamp()
    assert entry == {
        "at": entry["at"],
        "argv": ["scontrol", "requeuehold", job_id],
        "job_id": int(job_id),
        "attempt": 0,
        "job_state": "RUNNING",
        "returncode": 0,
        "effective": True,
        "caller": "controller-a",
        "timed_out_after": False,
        "killed_after": False,
    }


def test_a_refused_command_is_journaled_and_changes_nothing(tmp_path: Path) -> None:
    """GIVEN a running job WHEN a command Slurm refuses for it is sent THEN the caller gets the
    refusal, the journal keeps it with return code 1 and the job is as it was."""
    store = file_store(tmp_path)
    job_id = only_job(store.reading())
    job_before = store.reading().jobs_by_id[int(job_id)].to_dict()

    with pytest.raises(SchedulerError, match="no longer pending") as refused:
        SimulatedAdapter(store).set_excluded_nodes(job_id, ["gpu-0001"])

    assert refused.value.result is not None and refused.value.result.returncode == 1
    cluster = store.reading()
    [entry] = cluster.journal()["commands"]
    assert (entry["returncode"], entry["effective"], entry["job_state"]) == (1, False, "RUNNING")
    assert entry["argv"] == ["scontrol", "update", f"JobId={job_id}", "ExcNodeList=gpu-0001"]
    assert entry["caller"] == f"pid:{os.getpid()}"
    assert cluster.jobs_by_id[int(job_id)].to_dict() == job_before


def test_an_accepted_command_that_changes_nothing_is_not_effective(tmp_path: Path) -> None:
    store = file_store(tmp_path)
    adapter = SimulatedAdapter(store, caller="test")
    job_id = only_job(store.reading())
    adapter.requeue(job_id)  # not held: releasing it changes nothing
    adapter.release(job_id)
    adapter.cancel("424242")

    commands = store.reading().journal()["commands"]
    assert [(c["argv"][1], c["returncode"], c["effective"]) for c in commands] == [
        ("requeue", 0, True),
        ("release", 0, False),
        ("424242", 0, False),
    ]
    assert (commands[1]["attempt"], commands[1]["job_state"]) == (1, "COMPLETING")
    assert (commands[2]["job_id"], commands[2]["attempt"], commands[2]["job_state"]) == (
        424242,
        None,
        None,
    )


def test_a_command_the_adapter_refuses_to_send_is_not_journaled(tmp_path: Path) -> None:
    store = file_store(tmp_path)
    with pytest.raises(InvalidIdentifier):
        SimulatedAdapter(store).hold("1001; rm -rf /")
    assert store.reading().journal()["commands"] == []


def test_each_journal_list_keeps_its_newest_entries_and_counts_the_dropped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(journal_module, "JOURNAL_LIMIT", 3)
    cluster = SimulatedCluster(quiet_config(tmp_path), now=START)
    for job_id in range(1, 6):
        cluster.cancel(str(job_id))
    journal = cluster.journal()
    assert [command["job_id"] for command in journal["commands"]] == [3, 4, 5]
    assert journal["dropped"] == {"commands": 2, "failures": 0, "attempts": 0}


# ---------------------------------------------------------------------- failures and attempts


@pytest.mark.parametrize(
    ("kind", "end"),
    [
        ("segfault", "FAILED"),
        ("host_oom", "OUT_OF_MEMORY"),
        ("gpu_faulty", "FAILED"),
        ("app_exception", "FAILED"),
        ("preemption", "requeued"),
    ],
)
def test_every_forced_fault_is_journaled_on_the_attempt_it_ended(
    tmp_path: Path, kind: str, end: str
) -> None:
    """GIVEN faults of one kind only, and failed jobs restarted as a controller would WHEN the
    cluster runs a while THEN each fault is journaled on the attempt it struck, which ended then,
    as the kind ends it."""
    config = quiet_config(
        tmp_path,
        jobs=2,
        faults_per_job_hour=2000.0,
        fault_weights=only_kind(kind),
        health_check_drain_probability=0.0,
        defect_persistence=0.0,
        requeue_delay_seconds=1.0,
    )
    cluster = SimulatedCluster(config, now=START)
    for _ in range(60):
        run(cluster, 1.0)
        for job in cluster.jobs():
            if job.native_state in {"FAILED", "OUT_OF_MEMORY"}:
                cluster.requeue(job.job_id, caller="controller")

    journal = cluster.journal()
    failures = journal["failures"]
    assert len(failures) >= 6
    fault = KINDS[kind]
    assert {(f["kind"], f["category"], f["effect"]) for f in failures} == {
        (kind, fault.category, fault.effect)
    }
    attempts = {(a["job_id"], a["attempt"]): a for a in journal["attempts"]}
    for failure in failures:
        attempt = attempts[failure["job_id"], failure["attempt"]]
        assert attempt["started_at"] == failure["attempt_started_at"]
        assert attempt["started_at"] <= failure["at"]
        assert (attempt["ended_at"], attempt["end"], attempt["by_command"]) == (
            failure["at"],
            end,
            False,
        )
        on_node = failure["node"] in attempt["nodes"]
        assert on_node if fault.node_level else failure["node"] == ""
    # The controller's restarts ended no attempt: each job had failed already.
    assert all(c["job_state"] != "RUNNING" for c in journal["commands"])


def test_an_application_bug_is_journaled_on_every_attempt_it_fails(tmp_path: Path) -> None:
    cluster = SimulatedCluster(quiet_config(tmp_path), now=START)
    now = run(cluster, 10)
    job_id = only_job(cluster)
    cluster.inject(job_id, "app_exception", 0, now.timestamp())
    for _ in range(2):
        run(cluster, 1)
        cluster.requeue(job_id, hold=True)
        cluster.release(job_id)
        run(cluster, 30)

    failures = cluster.journal()["failures"]
    assert [(f["kind"], f["attempt"]) for f in failures] == [
        ("app_exception", 0),
        ("app_exception", 1),
        ("app_exception", 2),
    ]
    assert listed_job(cluster, job_id).native_state == "FAILED"


def test_a_dead_node_is_journaled_when_it_dies_and_slurm_ends_the_attempt_later(
    tmp_path: Path,
) -> None:
    cluster = SimulatedCluster(quiet_config(tmp_path), now=START)
    now = run(cluster, 10)
    job_id = only_job(cluster)
    victim = listed_job(cluster, job_id).nodes[1]
    cluster.inject(job_id, "node_death", 1, now.timestamp())
    run(cluster, 25)  # noticed after 12 s, requeued, started again after the requeue delay

    journal = cluster.journal()
    [failure] = journal["failures"]
    assert (failure["kind"], failure["node"], failure["at"]) == (
        "node_death",
        victim,
        now.timestamp(),
    )
    first, second = journal["attempts"]
    assert (first["end"], first["by_command"]) == ("requeued", False)
    assert first["ended_at"] == pytest.approx(now.timestamp() + 12.0)
    assert (second["attempt"], second["end"]) == (1, None)  # running again, elsewhere
    assert victim not in second["nodes"]


def test_a_hang_is_journaled_when_the_rank_stops_and_the_attempt_stays_open(
    tmp_path: Path,
) -> None:
    cluster = SimulatedCluster(quiet_config(tmp_path), now=START)
    now = run(cluster, 10)
    job_id = only_job(cluster)
    cluster.inject(job_id, "hang", 0, now.timestamp())
    run(cluster, 30)
    journal = cluster.journal()
    assert [(f["kind"], f["effect"], f["at"]) for f in journal["failures"]] == [
        ("hang", "hang", now.timestamp())
    ]
    assert [a["end"] for a in journal["attempts"]] == [None]


def test_a_hang_left_alone_ends_at_the_time_limit_journaled_as_a_scheduler_event(
    tmp_path: Path,
) -> None:
    cluster = SimulatedCluster(quiet_config(tmp_path), now=START)
    now = run(cluster, 10)
    job_id = only_job(cluster)
    limit = cluster.jobs_by_id[int(job_id)].time_limit
    cluster.inject(job_id, "hang", 0, now.timestamp())
    run(cluster, limit, tick=600)  # a frozen job does not train: big ticks cost nothing

    journal = cluster.journal()
    hang, time_limit = journal["failures"]
    assert hang["kind"] == "hang"
    assert (time_limit["kind"], time_limit["category"], time_limit["node"]) == (
        "time_limit",
        "scheduler_event",
        "",
    )
    [attempt] = journal["attempts"]
    assert attempt["end"] == "TIMEOUT"
    assert attempt["ended_at"] == time_limit["at"] == attempt["started_at"] + limit


def test_a_requeue_command_ends_the_running_attempt_by_command(tmp_path: Path) -> None:
    cluster = SimulatedCluster(quiet_config(tmp_path), now=START)
    run(cluster, 5)
    job_id = only_job(cluster)
    cluster.requeue(job_id)
    run(cluster, 10)
    first, second = cluster.journal()["attempts"]
    assert (first["attempt"], first["end"], first["by_command"]) == (0, "requeued", True)
    assert (second["attempt"], second["end"]) == (1, None)


def test_a_state_of_the_previous_version_is_refused(tmp_path: Path) -> None:
    cluster = SimulatedCluster(quiet_config(tmp_path), now=START)
    state = {**cluster.to_state(), "version": 1}
    for key in ("chaos", "attempts", "failures", "commands", "dropped"):
        del state[key]
    with pytest.raises(ValueError, match="unknown simulator state version 1"):
        SimulatedCluster(cluster.config, state, now=START)


@pytest.mark.parametrize("kind", ["hang", "app_exception", "gpu_faulty", "nccl_timeout"])
def test_a_fault_journals_the_node_it_showed_on_whatever_its_kind(
    tmp_path: Path, kind: str
) -> None:
    """A hung rank or a raising one is on a node even when its kind blames none: the soak keeps
    the job's own restarts from counting that node's exclusion as a false action."""
    cluster = SimulatedCluster(quiet_config(tmp_path), now=START)
    now = run(cluster, 10)
    job_id = only_job(cluster)
    nodes = listed_job(cluster, job_id).nodes
    cluster.inject(job_id, kind, 1, now.timestamp())
    [failure] = cluster.journal()["failures"]
    assert failure["host"] in nodes
    assert failure["node"] == (failure["host"] if KINDS[kind].node_level else "")
