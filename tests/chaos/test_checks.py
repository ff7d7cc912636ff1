"""The chaos run's checks on journals made by hand: each count catches what it is meant to."""

from __future__ import annotations

from typing import Any

from bench.chaos.checks import (
    ClusterVerdict,
    Recovery,
    Strike,
    charge_actions,
    command_verb,
    recoveries,
    recovery_times,
    summarise_phases,
    times_by_fault,
    times_from_detectable,
    times_scheduler_reachable,
)
from bench.chaos.schedule import ARMED, SCHEDULER_FAULTS, WEIGHTS, fault_schedule


def command(at: float, argv: list[str], attempt: int, state: str = "FAILED") -> dict[str, Any]:
    return {
        "at": at,
        "argv": argv,
        "job_id": int(argv[-1].split("=")[-1]) if argv[0] == "scancel" else 1001,
        "attempt": attempt,
        "job_state": state,
        "returncode": 0,
        "effective": True,
        "caller": "controller-1",
        "timed_out_after": False,
        "killed_after": False,
    }


def failure(at: float, attempt: int, kind: str = "gpu_faulty") -> dict[str, Any]:
    return {
        "job_id": 1001,
        "attempt": attempt,
        "attempt_started_at": at - 30,
        "at": at,
        "kind": kind,
        "category": "gpu_hardware",
        "effect": "crash",
        "node": "gpu-0001",
    }


def verdict_of(journal: dict[str, Any]) -> ClusterVerdict:
    verdict = ClusterVerdict("c")
    charge_actions(journal, verdict)
    return verdict


def test_one_restart_per_failure_is_clean() -> None:
    journal = {
        "failures": [failure(100.0, 0), failure(200.0, 1)],
        "commands": [
            command(105.0, ["scontrol", "requeuehold", "1001"], 0),
            command(106.0, ["scontrol", "release", "1001"], 1, "PENDING"),
            command(205.0, ["scontrol", "requeuehold", "1001"], 1),
        ],
        "attempts": [],
    }
    verdict = verdict_of(journal)
    assert verdict.duplicate_actions == []
    assert verdict.acted_on_healthy_attempt == []


def test_a_second_restart_of_one_failure_is_a_duplicate() -> None:
    journal = {
        "failures": [failure(100.0, 0)],
        "commands": [
            command(105.0, ["scontrol", "requeuehold", "1001"], 0),
            command(109.0, ["scontrol", "requeuehold", "1001"], 1, "PENDING"),
        ],
        "attempts": [],
    }
    verdict = verdict_of(journal)
    assert len(verdict.duplicate_actions) == 1
    assert verdict.duplicate_actions[0]["failure_at"] == 100.0


def test_restarting_the_running_successor_is_acting_on_a_healthy_attempt() -> None:
    journal = {
        "failures": [failure(100.0, 0)],
        # Slurm requeued attempt 0 by itself; attempt 1 runs and trains; a late restart hits it.
        "commands": [command(150.0, ["scontrol", "requeuehold", "1001"], 1, "RUNNING")],
        "attempts": [],
    }
    verdict = verdict_of(journal)
    assert verdict.duplicate_actions == []
    assert len(verdict.acted_on_healthy_attempt) == 1


def test_refused_and_ineffective_commands_are_not_actions() -> None:
    refused = {**command(105.0, ["scontrol", "requeuehold", "1001"], 0), "effective": False}
    journal = {
        "failures": [failure(100.0, 0)],
        "commands": [refused, command(106.0, ["scontrol", "requeuehold", "1001"], 0)],
        "attempts": [],
    }
    assert verdict_of(journal).duplicate_actions == []


def test_recovery_time_runs_from_the_failure_to_the_release() -> None:
    journal = {
        "failures": [failure(100.0, 0)],
        "commands": [
            command(104.0, ["scontrol", "requeuehold", "1001"], 0),
            command(107.5, ["scontrol", "release", "1001"], 1, "PENDING"),
        ],
        "attempts": [],
    }
    assert recovery_times(journal) == [7.5]


def test_a_restart_belongs_to_the_jobs_latest_failure_before_it() -> None:
    """
    GIVEN a node death at 100 s that Slurm requeued by itself (no command), the next attempt
          failing at 150 s, and the control plane's restart of that one at 158 s
    WHEN recovery times are counted
    THEN the restart is the second failure's (8 s); the first, restarted by Slurm alone, has
         no figure (it would have been 58 s, charged a recovery it did not need)
    """
    journal = {
        "failures": [failure(100.0, 0), failure(150.0, 1)],
        "commands": [
            command(155.0, ["scontrol", "requeuehold", "1001"], 1),
            command(158.0, ["scontrol", "release", "1001"], 2, "PENDING"),
        ],
        "attempts": [],
    }
    assert recovery_times(journal) == [8.0]


def test_a_hang_counts_from_when_it_could_be_known() -> None:
    """A hang is a quiet job until it has lasted the hang timeout: its recovery time from when
    it could be known leaves the policy's patience out; any other failure's is its whole time."""
    journal = {
        "failures": [failure(100.0, 0, kind="hang"), failure(300.0, 1)],
        "commands": [
            command(175.0, ["scontrol", "requeue", "1001"], 0),
            command(310.0, ["scontrol", "requeue", "1001"], 1),
        ],
        "attempts": [],
    }
    found = recoveries(journal)
    assert [r.kind for r in found] == ["hang", "gpu_faulty"]
    assert recovery_times(journal) == [75.0, 10.0]
    assert times_from_detectable(found, hang_timeout_s=60.0) == [15.0, 10.0]


def test_each_kind_of_fault_is_charged_what_it_kept_away() -> None:
    """A fault strikes a recovery when it lands, or still keeps its target away, between the
    failure and the restart; it costs the time it kept away something the restart needed."""
    fast = Recovery(1001, 0, failure_at=100.0, done_at=102.0)
    slow = Recovery(1002, 0, failure_at=200.0, done_at=260.0)
    spared = Recovery(1003, 0, failure_at=400.0, done_at=404.0)
    strikes = [
        # Down since before the failure, up again during it.
        Strike("restart_mariadb", 98.0, 101.0, "mariadb"),
        Strike("scheduler_unreachable", 210.0, 230.0, "chaos-action"),
        Strike("scheduler_unreachable", 210.0, 250.0, "chaos-monitor"),  # another cluster's
        # One controller killed, then the other paused: both away from 222 to 226.
        Strike("kill_controller", 220.0, 226.0, "controller-chaos-action-1"),
        Strike("pause_controller", 222.0, 240.0, "controller-chaos-action-2"),
        Strike("kill_controller", 200.0, 259.0, "controller-chaos-monitor-1"),
        Strike("kill_worker", 300.0, 303.0, "worker-1"),  # between recoveries: struck none
    ]
    split = times_by_fault([fast, slow, spared], strikes, "chaos-action")
    total = 2.0 + 60.0 + 4.0
    assert split["restart_mariadb"]["struck"] == {"samples": 1, "median": 2.0, "p95": 2.0}
    assert split["restart_mariadb"]["away_share"] == round(1.0 / total, 3)
    assert split["scheduler_unreachable"]["struck"]["samples"] == 1
    assert split["scheduler_unreachable"]["away_share"] == round(20.0 / total, 3)
    assert split["kill_controller"]["away_share"] == round(4.0 / total, 3)
    assert split["pause_controller"]["away_share"] == round(4.0 / total, 3)
    assert split["kill_worker"]["struck"]["samples"] == 0
    assert split["kill_worker"]["away_share"] == 0.0
    # Away: the database 1 s, the scheduler 20 s (the controllers' 4 s within it).
    assert split["(nothing away)"]["away_share"] == round((total - 21.0) / total, 3)
    assert times_scheduler_reachable([fast, slow], strikes, "chaos-action") == [2.0, 40.0]


def test_where_a_recovery_spent_its_time() -> None:
    recovery = Recovery(
        1001, 0, failure_at=100.0, done_at=130.0, recommended_at=104.0, claimed_at=125.0
    )
    assert recovery.phases() == {"to_recommendation": 4.0, "to_claim": 21.0, "to_restart": 5.0}
    unknown = Recovery(1002, 0, failure_at=100.0, done_at=130.0)
    assert unknown.phases() == {}
    phases = summarise_phases([recovery, unknown])
    assert phases["to_claim"] == {"samples": 1, "median": 21.0, "p95": 21.0}


def test_command_verbs() -> None:
    assert command_verb(["scancel", "7"]) == "scancel"
    assert command_verb(["scontrol", "update", "JobId=7", "ExcNodeList=a"]) == "update:ExcNodeList"
    assert command_verb(["scontrol", "requeuehold", "7"]) == "requeuehold"


def test_the_schedule_is_a_function_of_the_seed() -> None:
    first = fault_schedule(7, 300, 120.0)
    assert first == fault_schedule(7, 300, 120.0)
    assert first != fault_schedule(8, 300, 120.0)
    assert [fault.at_s for fault in first] == sorted(fault.at_s for fault in first)
    assert all(0 <= fault.at_s < 120.0 for fault in first)
    # Every kind, struck and armed, appears in a schedule of this size.
    assert {fault.kind for fault in first} == set(WEIGHTS)
    assert set(WEIGHTS) >= ARMED


def test_a_control_plane_schedule_holds_no_fault_of_the_scheduler() -> None:
    """``--control-plane-only``: as many faults, every other kind, none of the scheduler's."""
    schedule = fault_schedule(7, 300, 120.0, without=SCHEDULER_FAULTS)
    assert len(schedule) == 300
    assert {fault.kind for fault in schedule} == set(WEIGHTS) - set(SCHEDULER_FAULTS)


def test_a_hang_too_recent_to_have_timed_out_is_not_lost(db: None) -> None:
    from datetime import UTC, datetime

    from bench.chaos.checks import check_records
    from tests.factories import ClusterFactory, WorkloadFactory

    cluster = ClusterFactory(name="chaos-test")
    WorkloadFactory(cluster=cluster, job_id="7")
    now = datetime.now(UTC)
    journal: dict[str, Any] = {
        "failures": [
            {"job_id": 7, "attempt": 0, "at": now.timestamp() - 200, "effect": "hang"},
            {"job_id": 7, "attempt": 1, "at": now.timestamp() - 20, "effect": "hang"},
        ],
        "commands": [],
    }
    strict = check_records("chaos-test", journal, failures_until=now.timestamp(), now=now)
    assert len(strict.lost) == 2
    fair = check_records(
        "chaos-test", journal, failures_until=now.timestamp(), now=now, hang_detection_s=90
    )
    assert [lost["attempt"] for lost in fair.lost] == [0]
    assert fair.failures_checked == 1
