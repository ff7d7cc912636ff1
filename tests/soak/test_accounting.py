"""The soak's accounting: which control-plane commands were false actions, and what became of
each real fault, judged from the simulator's journal alone."""

from __future__ import annotations

from typing import Any

from bench.soak.accounting import (
    AnomalySeen,
    JournalBook,
    false_actions,
    judge_faults,
    simulated_job_hours,
)

T = 1_800_000_000.0


def command(
    at: float,
    argv: list[str],
    *,
    attempt: int | None = 0,
    state: str = "FAILED",
    caller: str = "controller-1",
    effective: bool = True,
    returncode: int = 0,
) -> dict[str, Any]:
    job = (
        argv[-1]
        if argv[0] == "scancel" or argv[1] in {"requeue", "requeuehold", "release", "hold"}
        else None
    )
    if job is None and argv[2].startswith("JobId="):
        job = argv[2].split("=", 1)[1]
    return {
        "at": at,
        "argv": argv,
        "job_id": int(job) if job else None,
        "attempt": attempt if job else None,
        "job_state": state if job else None,
        "returncode": returncode,
        "effective": effective,
        "caller": caller,
        "timed_out_after": False,
        "killed_after": False,
    }


def restart(at: float, job: int, attempt: int, state: str, nodes: str = "") -> list[dict[str, Any]]:
    """A controller's restart: requeuehold on the attempt it found, then the next one."""
    commands = [command(at, ["scontrol", "requeuehold", str(job)], attempt=attempt, state=state)]
    if nodes:
        commands.append(
            command(
                at + 0.1,
                ["scontrol", "update", f"JobId={job}", f"ExcNodeList={nodes}"],
                attempt=attempt + 1,
                state="PENDING",
            )
        )
    commands.append(
        command(at + 0.2, ["scontrol", "release", str(job)], attempt=attempt + 1, state="PENDING")
    )
    return commands


def failure(
    at: float, job: int, attempt: int, kind: str = "gpu_faulty", **more: Any
) -> dict[str, Any]:
    effects = {
        "gpu_faulty": "crash",
        "hang": "hang",
        "node_death": "node_death",
        "gpu_thermal": "straggler",
        "app_exception": "crash",
    }
    return {
        "job_id": job,
        "attempt": attempt,
        "attempt_started_at": at - 60,
        "at": at,
        "kind": kind,
        "category": "gpu_hardware",
        "effect": effects[kind],
        "node": more.get("node", "gpu-0002" if kind in {"gpu_faulty", "node_death"} else ""),
    }


def benign(at: float, job: int, kind: str = "admin_requeue", node: str = "") -> dict[str, Any]:
    return {
        "job_id": job,
        "attempt": 0,
        "at": at,
        "kind": kind,
        "node": node,
        "until": None,
        "detail": {},
    }


def test_a_restart_of_the_attempt_that_failed_is_no_false_action() -> None:
    found = false_actions(
        restart(T + 5, 1001, 0, "FAILED", nodes="gpu-0002"), [failure(T, 1001, 0)], []
    )
    assert found == []


def test_a_restart_after_an_administrators_requeue_is_one_false_action_of_its_commands() -> None:
    """GIVEN an administrator's requeue of a healthy job (the scheduler's attempt 1 pending)
    WHEN a controller holds it, sets its exclusions and releases it THEN that is one false
    action, listing the three commands and the requeue that preceded it."""
    requeue = command(T, ["scontrol", "requeue", "1001"], state="RUNNING", caller="administrator")
    hold = command(T + 3, ["scontrol", "hold", "1001"], attempt=1, state="PENDING")
    exclude = command(
        T + 3.1,
        ["scontrol", "update", "JobId=1001", "ExcNodeList=gpu-0009"],
        attempt=1,
        state="PENDING",
    )
    release = command(T + 3.2, ["scontrol", "release", "1001"], attempt=1, state="PENDING")
    found = false_actions(
        [requeue, hold, exclude, release],
        [failure(T - 300, 77, 0, node="gpu-0009")],
        [benign(T, 1001)],
    )
    assert [(f["kind"], len(f["commands"])) for f in found] == [("job_action", 3)]
    assert found[0]["preceding_benign"] == [benign(T, 1001)]
    assert "attempt 1" in found[0]["why"]


def test_a_restart_that_reaches_the_running_successor_of_a_failed_attempt_is_false() -> None:
    late = command(T + 30, ["scontrol", "requeue", "1001"], attempt=1, state="RUNNING")
    found = false_actions([late], [failure(T, 1001, 0)], [])
    assert [(f["kind"], f["why"]) for f in found] == [
        ("job_action", "attempt 1 was running and had no real fault")
    ]


def test_commands_that_changed_nothing_or_came_from_people_are_not_counted() -> None:
    found = false_actions(
        [
            command(T, ["scontrol", "requeue", "1001"], state="RUNNING", caller="administrator"),
            command(T, ["scancel", "1002"], state="RUNNING", caller="user"),
            command(T, ["scontrol", "release", "1003"], effective=False),
        ],
        [],
        [],
    )
    assert found == []


def test_a_node_no_fault_blamed_is_a_false_exclusion_once_per_job() -> None:
    commands = [
        *restart(T + 5, 1001, 0, "FAILED", nodes="gpu-0002,gpu-0050"),
        *restart(T + 95, 1001, 1, "FAILED", nodes="gpu-0002,gpu-0050"),
    ]
    found = false_actions(commands, [failure(T, 1001, 0), failure(T + 90, 1001, 1)], [])
    assert [(f["kind"], f["node"]) for f in found] == [("exclusion", "gpu-0050")]


def test_a_drain_of_a_node_no_fault_blamed_is_false_and_of_one_that_failed_is_not() -> None:
    drain = ["scontrol", "update", "NodeName={}", "State=DRAIN", "Reason=workload-recovery: x"]
    found = false_actions(
        [
            command(T + 5, [part.format("gpu-0002") for part in drain]),
            command(T + 6, [part.format("gpu-0007") for part in drain]),
        ],
        [failure(T, 1001, 0, node="gpu-0002")],
        [benign(T - 10, 1005, "admin_drain", node="gpu-0007")],
    )
    assert [(f["kind"], f["node"]) for f in found] == [("drain", "gpu-0007")]
    assert found[0]["preceding_benign"][0]["kind"] == "admin_drain"


def test_job_hours_are_real_running_time_times_the_speedup() -> None:
    attempts: list[dict[str, Any]] = [
        {"job_id": 1, "attempt": 0, "started_at": T, "ended_at": T + 60},
        {"job_id": 2, "attempt": 0, "started_at": T + 30, "ended_at": None},
    ]
    assert simulated_job_hours(attempts, speedup=300, until=T + 90) == 300 * 120 / 3600


def seen(job: int, attempt: int, at: float, confirmation: str = "confirmed") -> AnomalySeen:
    return AnomalySeen(job, attempt, "crash", confirmation, at)


def test_faults_are_detected_acted_on_or_need_no_action_or_are_missed() -> None:
    failures = [
        failure(T, 1001, 0),  # restarted
        failure(T, 1002, 0, "node_death"),  # Slurm requeued it itself
        failure(T, 1003, 0, "gpu_thermal"),  # a slowdown
        failure(T, 1004, 0),  # an administrator requeued it first
        failure(T, 1005, 0, "app_exception"),  # seen, never acted on
        failure(T + 500, 1006, 0),  # too late to judge
        failure(T, 1007, 0, "app_exception"),  # stopped: the job had ended, nothing to send
    ]
    attempts = [
        {
            "job_id": 1002,
            "attempt": 0,
            "started_at": T - 60,
            "ended_at": T + 12,
            "end": "requeued",
            "by_command": False,
        },
        {
            "job_id": 1004,
            "attempt": 0,
            "started_at": T - 60,
            "ended_at": T + 1,
            "end": "requeued",
            "by_command": True,
        },
    ]
    commands = [
        *restart(T + 5, 1001, 0, "FAILED"),
        command(T + 1, ["scontrol", "requeue", "1004"], state="RUNNING", caller="administrator"),
    ]
    verdict = judge_faults(
        failures,
        attempts,
        commands,
        [
            seen(1001, 0, T + 2),
            seen(1005, 0, T + 3),
            seen(1007, 0, T + 2),
            seen(1002, 0, T - 30, "survived"),
        ],
        recorded_actions=[(1007, 0, T + 4)],
        judged_until=T + 100,
        hang_judged_until=T - 100,
    )
    assert verdict["injected"] == {
        "gpu_faulty": 3,
        "node_death": 1,
        "gpu_thermal": 1,
        "app_exception": 2,
    }
    assert verdict["judged"] == 6
    assert verdict["not_judged_too_late"] == {"gpu_faulty": 1}
    assert verdict["detected"] == {"gpu_faulty": 1, "app_exception": 2}
    assert verdict["acted_on"] == {"gpu_faulty": 1, "app_exception": 1}
    assert verdict["not_actionable"] == {
        "Slurm requeued the attempt itself (node failure)": 1,
        "a slowdown: recorded, no scheduler action by design": 1,
        "the attempt was ended by the administrator's requeue first": 1,
    }
    assert [(f["job_id"], f["kind"]) for f in verdict["missed"]] == [(1005, "app_exception")]


def test_a_hang_is_judged_only_once_its_timeout_could_have_passed() -> None:
    verdict = judge_faults(
        [failure(T, 1001, 0, "hang")], [], [], [], judged_until=T + 100, hang_judged_until=T - 1
    )
    assert verdict["not_judged_too_late"] == {"hang": 1} and verdict["missed"] == []


def test_the_book_keeps_every_entry_it_saw_and_knows_when_some_were_dropped_unseen() -> None:
    book = JournalBook()
    first = command(T, ["scancel", "1001"])
    second = command(T + 1, ["scancel", "1002"])
    journal: dict[str, Any] = {
        "commands": [first],
        "failures": [],
        "attempts": [],
        "dropped": {"commands": 0, "failures": 0, "attempts": 0},
    }
    book.add(journal, {"events": [], "counts": {}, "dropped": 0})
    # The simulator dropped the first before the next read, having journaled a second one.
    book.add(
        {**journal, "commands": [second], "dropped": {**journal["dropped"], "commands": 1}},
        {"events": [], "counts": {}, "dropped": 0},
    )
    assert book.complete and len(book.commands) == 2
    book.add(
        {**journal, "commands": [], "dropped": {**journal["dropped"], "commands": 3}},
        {"events": [], "counts": {}, "dropped": 0},
    )
    assert not book.complete
    assert JournalBook.load(book.dump()).commands == book.commands


def test_the_node_a_jobs_own_fault_showed_on_may_be_kept_out_of_that_job_only() -> None:
    """An application error or a hang that showed on a node blames no node for the cluster,
    but keeping that node out of the same job's next attempt is no false action; keeping it
    out of another job is."""
    hung = {**failure(T, 1001, 0, "hang"), "host": "gpu-0005"}
    found = false_actions(
        [
            *restart(T + 5, 1001, 0, "FAILED", nodes="gpu-0005"),
            *restart(T + 6, 1002, 0, "FAILED", nodes="gpu-0005"),
        ],
        [hung, failure(T, 1002, 0, "app_exception")],
        [],
    )
    assert [(f["kind"], f["job_id"], f["node"]) for f in found] == [("exclusion", 1002, "gpu-0005")]
