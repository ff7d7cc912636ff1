"""Hang detection adapts to the job's own step time. Pure Python: no Django."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from recovery.detection.hang import (
    HangPolicy,
    ProgressObservation,
    detect_hang,
    format_duration,
)

START = datetime(2025, 3, 1, 12, 0, 0, tzinfo=UTC)
POLICY = HangPolicy()  # floor 30 min, factor 10, start-up grace 15 min, checkpoint grace 30 min


def steps_every(
    seconds: float,
    count: int,
    *,
    first_step: int = 1,
    begin: datetime = START,
    rank: int | None = None,
    node: str | None = None,
) -> list[ProgressObservation]:
    return [
        ProgressObservation(
            at=begin + timedelta(seconds=seconds * index),
            step=first_step + index,
            rank=rank,
            node=node,
        )
        for index in range(count)
    ]


def last_at(observations: list[ProgressObservation]) -> datetime:
    return max(observation.at for observation in observations)


def test_it_reports_nothing_while_steps_keep_coming() -> None:
    observations = steps_every(10, 100)

    assert (
        detect_hang(observations, now=last_at(observations), started_at=START, policy=POLICY)
        is None
    )


def test_it_reports_a_fast_job_silent_for_longer_than_the_floor() -> None:
    observations = steps_every(10, 100)
    now = last_at(observations) + timedelta(minutes=41)

    finding = detect_hang(observations, now=now, started_at=START, policy=POLICY)

    assert finding is not None
    assert (finding.kind, finding.category, finding.attribution) == ("hang", "", "unknown")
    assert (finding.severity, finding.signature, finding.source) == (
        "error",
        "no-progress",
        "progress",
    )
    assert finding.at == now
    assert finding.detail["last_step"] == 100
    assert finding.detail["silent_seconds"] == pytest.approx(41 * 60)
    assert finding.detail["allowed_seconds"] == pytest.approx(1800)
    assert finding.detail["median_step_seconds"] == pytest.approx(10)
    assert finding.detail["last_progress_at"] == last_at(observations).isoformat()


def test_its_evidence_says_how_long_what_was_allowed_and_the_last_step() -> None:
    last = datetime(2025, 3, 1, 12, 3, 4, tzinfo=UTC)
    observations = steps_every(5, 1200, begin=last - timedelta(seconds=5 * 1199))

    finding = detect_hang(
        observations,
        now=last + timedelta(minutes=41),
        started_at=START - timedelta(hours=3),
        policy=POLICY,
    )

    assert finding is not None
    assert finding.evidence == (
        "no progress for 41 min (allowed 30 min); last step 1200 at 12:03:04 UTC"
    )


def test_it_does_not_report_a_fast_job_within_the_floor() -> None:
    observations = steps_every(2, 300)

    finding = detect_hang(
        observations,
        now=last_at(observations) + timedelta(minutes=29),
        started_at=START,
        policy=POLICY,
    )

    assert finding is None


def test_it_allows_a_job_with_twenty_minute_steps_to_be_silent_for_twenty_five_minutes() -> None:
    observations = steps_every(20 * 60, 12)

    finding = detect_hang(
        observations,
        now=last_at(observations) + timedelta(minutes=25),
        started_at=START,
        policy=POLICY,
    )

    assert finding is None


def test_it_reports_a_slow_job_once_silent_for_ten_of_its_steps() -> None:
    observations = steps_every(20 * 60, 12)
    last = last_at(observations)

    assert (
        detect_hang(
            observations, now=last + timedelta(minutes=199), started_at=START, policy=POLICY
        )
        is None
    )
    finding = detect_hang(
        observations, now=last + timedelta(minutes=201), started_at=START, policy=POLICY
    )

    assert finding is not None
    assert finding.detail["allowed_seconds"] == pytest.approx(200 * 60)
    assert finding.detail["median_step_seconds"] == pytest.approx(20 * 60)


def test_it_uses_only_the_recent_step_history_for_the_median() -> None:
    # A job that ran 20-minute steps for a long time and then 10-second steps for a long time:
    # the allowance follows the recent pace.
    slow = steps_every(20 * 60, 60)
    fast = steps_every(10, 200, first_step=61, begin=last_at(slow) + timedelta(seconds=10))
    observations = slow + fast

    finding = detect_hang(
        observations, now=last_at(fast) + timedelta(minutes=31), started_at=START, policy=POLICY
    )

    assert finding is not None
    assert finding.detail["median_step_seconds"] == pytest.approx(10)


def test_it_gives_a_starting_job_its_grace_period() -> None:
    finding = detect_hang([], now=START + timedelta(minutes=14), started_at=START, policy=POLICY)

    assert finding is None


def test_it_counts_the_silence_of_a_job_that_never_stepped_from_the_end_of_the_grace() -> None:
    # Grace ends at +15 min; the floor of 30 min then applies: no hang until +45 min.
    assert (
        detect_hang([], now=START + timedelta(minutes=44), started_at=START, policy=POLICY) is None
    )

    finding = detect_hang([], now=START + timedelta(minutes=46), started_at=START, policy=POLICY)

    assert finding is not None
    assert finding.detail["last_step"] is None
    assert finding.detail["last_progress_at"] is None
    assert finding.detail["silent_seconds"] == pytest.approx(31 * 60)
    assert "no progress step seen since the start at 12:00:00 UTC" in finding.evidence
    assert "15 min start-up grace" in finding.evidence


def test_steps_from_an_earlier_attempt_are_not_progress_of_this_one() -> None:
    earlier = steps_every(60, 30, begin=START - timedelta(hours=2))
    restarted_at = START

    finding = detect_hang(
        earlier, now=restarted_at + timedelta(minutes=10), started_at=restarted_at, policy=POLICY
    )

    assert finding is None  # still in the start-up grace, not "silent for two hours"


def test_an_earlier_attempts_pace_still_sets_the_allowance() -> None:
    earlier = steps_every(20 * 60, 10, begin=START - timedelta(hours=4))

    finding = detect_hang(
        earlier, now=START + timedelta(minutes=15 + 150), started_at=START, policy=POLICY
    )

    assert finding is None  # allowed 200 min after the grace, not 30


def test_a_long_checkpoint_save_in_progress_is_not_a_hang() -> None:
    observations = steps_every(10, 100)
    last = last_at(observations)

    finding = detect_hang(
        observations,
        now=last + timedelta(minutes=50),
        started_at=START,
        policy=POLICY,
        checkpoint_started_at=last + timedelta(seconds=5),
        checkpoint_finished_at=None,
    )

    assert finding is None


def test_a_save_in_progress_only_extends_the_allowance_by_the_checkpoint_grace() -> None:
    observations = steps_every(10, 100)
    last = last_at(observations)

    finding = detect_hang(
        observations,
        now=last + timedelta(minutes=61),
        started_at=START,
        policy=POLICY,
        checkpoint_started_at=last + timedelta(seconds=5),
    )

    assert finding is not None
    assert finding.detail["allowed_seconds"] == pytest.approx(3600)
    assert finding.detail["checkpoint_in_progress"] is True
    assert "a checkpoint save was in progress" in finding.evidence


def test_a_save_that_already_finished_gives_no_extra_allowance() -> None:
    observations = steps_every(10, 100)
    last = last_at(observations)

    finding = detect_hang(
        observations,
        now=last + timedelta(minutes=41),
        started_at=START,
        policy=POLICY,
        checkpoint_started_at=last - timedelta(minutes=5),
        checkpoint_finished_at=last - timedelta(minutes=4),
    )

    assert finding is not None
    assert finding.detail["checkpoint_in_progress"] is False


def test_a_save_that_finished_after_the_last_step_is_a_sign_of_life() -> None:
    observations = steps_every(10, 100)
    last = last_at(observations)

    finding = detect_hang(
        observations,
        now=last + timedelta(minutes=50),
        started_at=START,
        policy=POLICY,
        checkpoint_started_at=last + timedelta(seconds=5),
        checkpoint_finished_at=last + timedelta(minutes=25),
    )

    assert finding is None  # silent for 25 min since the save ended


def test_a_step_printed_again_and_again_is_not_progress() -> None:
    # A progress bar refreshed every minute without its counter moving.
    observations = steps_every(10, 50) + [
        ProgressObservation(at=START + timedelta(seconds=490 + 60 * minute), step=50)
        for minute in range(1, 40)
    ]

    finding = detect_hang(
        observations, now=START + timedelta(minutes=45), started_at=START, policy=POLICY
    )

    assert finding is not None
    assert finding.detail["last_progress_at"] == (START + timedelta(seconds=490)).isoformat()


def test_a_step_counter_that_restarts_each_epoch_is_still_progress() -> None:
    epoch_one = steps_every(10, 100)
    epoch_two = steps_every(10, 100, first_step=0, begin=last_at(epoch_one) + timedelta(seconds=10))

    finding = detect_hang(
        epoch_one + epoch_two,
        now=last_at(epoch_two) + timedelta(minutes=5),
        started_at=START,
        policy=POLICY,
    )

    assert finding is None


def test_it_names_the_ranks_that_went_silent_first() -> None:
    observations = []
    for rank in range(4):
        count = 55 if rank == 2 else 60  # rank 2 stops five steps (five minutes) early
        observations += steps_every(60, count, rank=rank, node=f"gpu-{rank // 2:03d}")

    finding = detect_hang(
        observations, now=START + timedelta(minutes=100), started_at=START, policy=POLICY
    )

    assert finding is not None
    assert finding.ranks == [2]
    assert finding.nodes == ["gpu-001"]
    assert finding.detail["silent_first"] == [
        {
            "node": "gpu-001",
            "rank": 2,
            "last_seen": (START + timedelta(minutes=54)).isoformat(),
            "last_step": 55,
        }
    ]
    assert "went silent first: rank 2 on gpu-001" in finding.evidence


def test_it_names_nobody_when_all_ranks_stopped_together() -> None:
    observations = []
    for rank in range(4):
        observations += steps_every(60, 60, rank=rank)

    finding = detect_hang(
        observations, now=START + timedelta(minutes=100), started_at=START, policy=POLICY
    )

    assert finding is not None
    assert finding.ranks == []
    assert finding.nodes == []
    assert finding.detail["silent_first"] == []


def test_it_reports_the_most_advanced_recent_step_of_a_multi_rank_job() -> None:
    observations = steps_every(60, 30, rank=0) + steps_every(60, 29, rank=1)

    finding = detect_hang(
        observations, now=START + timedelta(minutes=70), started_at=START, policy=POLICY
    )

    assert finding is not None
    assert finding.detail["last_step"] == 30


def test_it_honours_a_custom_policy() -> None:
    policy = HangPolicy(floor_seconds=60, step_time_factor=3, startup_grace_seconds=0)
    observations = steps_every(30, 10)

    finding = detect_hang(
        observations,
        now=last_at(observations) + timedelta(seconds=91),
        started_at=START,
        policy=policy,
    )

    assert finding is not None
    assert finding.detail["allowed_seconds"] == pytest.approx(90)


def test_it_refuses_naive_timestamps() -> None:
    with pytest.raises(ValueError, match="timezone-aware"):
        detect_hang([], now=datetime(2025, 3, 1, 12, 0), started_at=START, policy=POLICY)
    with pytest.raises(ValueError, match="timezone-aware"):
        detect_hang(
            [ProgressObservation(at=datetime(2025, 3, 1, 12, 0), step=1)],
            now=START,
            started_at=START,
            policy=POLICY,
        )


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (45, "45 s"),
        (119, "119 s"),
        (41 * 60, "41 min"),
        (90 * 60, "90 min"),
        (125 * 60, "2 h 05 min"),
    ],
)
def test_it_formats_durations_for_people(seconds: float, text: str) -> None:
    assert format_duration(seconds) == text
