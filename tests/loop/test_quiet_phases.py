"""What a read shows of a job's quiet phases: the longest gap between steps, and an announced
checkpoint or evaluation that the next step ends."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from recovery.detection.scanner.log_scanner import LogScanner
from recovery.detection.scanner.results import ScanResult
from recovery.loop.progress import note_quiet_phases
from recovery.models import Workload

T0 = datetime(2026, 12, 4, 12, 0, tzinfo=UTC)


def read(*lines: tuple[float, str]) -> ScanResult:
    scanner = LogScanner()
    scanner.feed(
        "".join(
            f"{(T0 + timedelta(seconds=at)).isoformat()} node001: {text}\n" for at, text in lines
        ).encode()
    )
    return scanner.finish()


def step(at: float, number: int) -> tuple[float, str]:
    return at, f"step: {number}  loss: 2.3100  tps: 5,231"


def test_the_longest_gap_between_steps_is_kept_across_reads() -> None:
    workload = Workload()
    note_quiet_phases(
        workload, read(step(0, 1), step(1, 2), step(31, 3)), T0, continues_attempt=True
    )
    assert workload.longest_quiet_seconds == 30
    workload.last_progress_at, workload.last_progress_step = T0 + timedelta(seconds=31), 3
    note_quiet_phases(workload, read(step(32, 4), step(33, 5)), T0, continues_attempt=True)
    assert workload.longest_quiet_seconds == 30
    workload.last_progress_at, workload.last_progress_step = T0 + timedelta(seconds=33), 5
    note_quiet_phases(workload, read(step(120, 6)), T0, continues_attempt=True)
    assert workload.longest_quiet_seconds == 87


def test_the_gap_across_a_restart_is_downtime_not_a_phase() -> None:
    workload = Workload(last_progress_at=T0, last_progress_step=40, longest_quiet_seconds=2.0)
    note_quiet_phases(workload, read(step(600, 36), step(601, 37)), T0, continues_attempt=False)
    assert workload.longest_quiet_seconds == 2.0


def test_the_same_step_printed_again_is_no_step() -> None:
    workload = Workload()
    note_quiet_phases(workload, read(step(0, 1), step(50, 1)), T0, continues_attempt=True)
    assert workload.longest_quiet_seconds is None


def test_an_announced_checkpoint_lasts_until_it_is_saved_or_a_step_follows() -> None:
    workload = Workload()
    note_quiet_phases(
        workload, read(step(0, 5), (1, "saving checkpoint at iteration 5 to /ckpt")), T0,
        continues_attempt=True,
    )  # fmt: skip
    assert (workload.quiet_phase, workload.quiet_phase_at) == (
        "checkpoint",
        T0 + timedelta(seconds=1),
    )
    note_quiet_phases(workload, read((9, "some other output")), T0, continues_attempt=True)
    assert workload.quiet_phase == "checkpoint"
    note_quiet_phases(
        workload, read((40, "successfully saved checkpoint from iteration 5 to /ckpt")), T0,
        continues_attempt=True,
    )  # fmt: skip
    assert (workload.quiet_phase, workload.quiet_phase_at) == ("", None)


def test_an_evaluation_announced_before_the_last_step_is_over() -> None:
    workload = Workload()
    note_quiet_phases(
        workload, read((0, "***** Running Evaluation *****"), step(30, 6)), T0,
        continues_attempt=True,
    )  # fmt: skip
    assert workload.quiet_phase == ""
    note_quiet_phases(
        workload, read(step(31, 7), (32, "***** Running Evaluation *****")), T0,
        continues_attempt=True,
    )  # fmt: skip
    assert workload.quiet_phase == "evaluation"
