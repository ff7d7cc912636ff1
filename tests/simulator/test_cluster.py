"""The simulated cluster: Slurm's job lifecycle and actions, training that fails like real jobs."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from recovery.detection.scanner.log_scanner import LogScanner
from recovery.detection.scanner.results import ProgressPoint, ScanResult
from recovery.detection.signature_set import SignatureSet
from recovery.schedulers.base import JobInfo, SchedulerError
from recovery.simulator.cluster import SimConfig, SimulatedCluster

START = datetime(2026, 11, 29, 18, 0, tzinfo=UTC)


def quiet_config(tmp_path: Path, **changes: object) -> SimConfig:
    """A cluster where nothing fails unless a test makes it, with a fixed pace."""
    config = SimConfig(
        name="lab",
        nodes=8,
        jobs=1,
        seed=7,
        speedup=10.0,
        log_dir=str(tmp_path),
        faults_per_job_hour=0.0,
        bad_node_fraction=0.0,
        nodes_per_job=(2, 2),
        step_seconds=(1.0, 1.0),
        total_steps=(100_000, 100_000),
        checkpoint_every=(50, 50),
        startup_seconds=(10.0, 10.0),
        max_logged_steps_per_second=10.0,
    )
    return replace(config, **changes)  # type: ignore[arg-type]


def run(cluster: SimulatedCluster, seconds: float, *, tick: float = 0.5) -> datetime:
    """Advance in ticks for ``seconds`` of real time after the cluster's last time."""
    now = datetime.fromtimestamp(cluster.now, tz=UTC)
    end = now + timedelta(seconds=seconds)
    while now < end:
        now = min(now + timedelta(seconds=tick), end)
        cluster.advance(now)
    return now


def only_job(cluster: SimulatedCluster) -> str:
    jobs = [job for job in cluster.jobs() if job.native_state not in {"COMPLETED", "CANCELLED"}]
    assert len(jobs) == 1
    return jobs[0].job_id


def listed_job(cluster: SimulatedCluster, job_id: str) -> JobInfo:
    """The job as the cluster lists it; the test fails if the cluster does not know it."""
    job = cluster.get_job(job_id)
    assert job is not None
    return job


def log_text(cluster: SimulatedCluster, job_id: str) -> str:
    return Path(cluster.log_path(job_id)).read_text()


def progress_steps(text: str) -> list[tuple[str, int]]:
    return [
        (match.group(1), int(match.group(2)))
        for match in re.finditer(r"Z (\S+): step:\s+(\d+) ", text)
    ]


def scan(text: str) -> ScanResult:
    scanner = LogScanner(SignatureSet.builtin())
    scanner.feed(text.encode())
    return scanner.finish()


def throughput(point: ProgressPoint) -> float:
    """A progress line's throughput; the test fails if the line carried none."""
    assert point.throughput is not None
    return point.throughput


# ---------------------------------------------------------------------- determinism and state


def test_it_is_deterministic_for_a_seed_and_call_times(tmp_path: Path) -> None:
    """GIVEN two clusters with the same seed WHEN advanced at the same times THEN identical."""
    config = SimConfig(
        name="a",
        nodes=32,
        jobs=10,
        seed=3,
        speedup=120,
        log_dir=str(tmp_path / "1"),
        faults_per_job_hour=8,
    )
    first = SimulatedCluster(config, now=START)
    second = SimulatedCluster(replace(config, log_dir=str(tmp_path / "2")), now=START)
    for cluster in (first, second):
        run(cluster, 120, tick=0.7)
    assert first.to_state() == second.to_state()
    names = sorted(path.name for path in (tmp_path / "1" / "a").iterdir())
    assert names == sorted(path.name for path in (tmp_path / "2" / "a").iterdir())
    for name in names:
        assert (tmp_path / "1" / "a" / name).read_bytes() == (
            tmp_path / "2" / "a" / name
        ).read_bytes()


def test_a_restored_cluster_continues_exactly_as_the_original(tmp_path: Path) -> None:
    config = SimConfig(
        name="a",
        nodes=32,
        jobs=10,
        seed=5,
        speedup=120,
        log_dir=str(tmp_path / "1"),
        faults_per_job_hour=8,
    )
    original = SimulatedCluster(config, now=START)
    run(original, 60)
    state = json.loads(json.dumps(original.to_state()))
    restored = SimulatedCluster(config, state, now=START + timedelta(seconds=60))
    assert restored.to_state() == original.to_state()
    run(original, 60)
    run(restored, 60)
    assert restored.to_state() == original.to_state()


def test_advancing_to_the_same_time_changes_nothing(tmp_path: Path) -> None:
    cluster = SimulatedCluster(quiet_config(tmp_path), now=START)
    now = run(cluster, 10)
    before = json.dumps(cluster.to_state())
    cluster.advance(now)
    cluster.advance(now - timedelta(seconds=5))
    assert json.dumps(cluster.to_state()) == before


# ---------------------------------------------------------------------- Slurm semantics


def test_requeuehold_makes_a_running_job_pending_held_with_restart_count_and_new_submit_time(
    tmp_path: Path,
) -> None:
    cluster = SimulatedCluster(quiet_config(tmp_path), now=START)
    run(cluster, 20)
    job_id = only_job(cluster)
    before = cluster.get_job(job_id)
    assert before is not None and before.native_state == "RUNNING" and len(before.nodes) == 2

    result = cluster.requeue(job_id, hold=True)

    assert result.argv == ("scontrol", "requeuehold", job_id) and result.returncode == 0
    completing = cluster.get_job(job_id)
    assert completing is not None and completing.native_state == "COMPLETING"
    run(cluster, 2)
    job = cluster.get_job(job_id)
    assert job is not None
    assert (job.native_state, job.held) == ("PENDING", True)
    assert job.reason == "job_requeued_in_held_state"
    assert job.restart_count == 1 and job.nodes == []
    assert job.submit_time is not None and before.submit_time is not None
    assert job.submit_time > before.submit_time
    assert "DUE TO JOB REQUEUE" in log_text(cluster, job_id)
    run(cluster, 30)
    assert listed_job(cluster, job_id).native_state == "PENDING"  # held: never starts


def test_exclusions_are_accepted_only_while_pending_and_honoured_at_the_next_start(
    tmp_path: Path,
) -> None:
    cluster = SimulatedCluster(quiet_config(tmp_path), now=START)
    run(cluster, 20)
    job_id = only_job(cluster)
    first_nodes = listed_job(cluster, job_id).nodes
    with pytest.raises(
        SchedulerError, match=f"Job is no longer pending execution for job {job_id}"
    ):
        cluster.set_excluded_nodes(job_id, first_nodes)

    cluster.requeue(job_id, hold=True)
    cluster.set_excluded_nodes(job_id, first_nodes)  # accepted during COMPLETING
    cluster.release(job_id)
    run(cluster, 2)
    job = listed_job(cluster, job_id)
    assert job.excluded_nodes == first_nodes and not job.held and job.reason == "BeginTime"
    run(cluster, 10)
    job = listed_job(cluster, job_id)
    assert job.native_state == "RUNNING"
    assert not set(job.nodes) & set(first_nodes)


def test_a_requeued_job_waits_for_the_requeue_delay(tmp_path: Path) -> None:
    cluster = SimulatedCluster(quiet_config(tmp_path, requeue_delay_seconds=6.0), now=START)
    run(cluster, 20)
    job_id = only_job(cluster)
    cluster.requeue(job_id)
    run(cluster, 5.5, tick=0.25)
    assert listed_job(cluster, job_id).native_state == "PENDING"
    run(cluster, 1.0, tick=0.25)
    job = listed_job(cluster, job_id)
    assert job.native_state == "RUNNING" and job.restart_count == 1


def test_clear_start_delay_lets_a_pending_job_start_at_once(tmp_path: Path) -> None:
    cluster = SimulatedCluster(quiet_config(tmp_path, requeue_delay_seconds=60.0), now=START)
    run(cluster, 20)
    job_id = only_job(cluster)
    cluster.requeue(job_id)
    run(cluster, 2)
    cluster.clear_start_delay(job_id)
    run(cluster, 1)
    assert listed_job(cluster, job_id).native_state == "RUNNING"


def test_refusals_carry_slurm_messages(tmp_path: Path) -> None:
    cluster = SimulatedCluster(quiet_config(tmp_path), now=START)
    run(cluster, 20)
    job_id = only_job(cluster)
    with pytest.raises(SchedulerError, match="Invalid job id specified"):
        cluster.requeue("999999")
    cluster.requeue(job_id, hold=True)
    with pytest.raises(SchedulerError, match=f"Job is pending execution for job {job_id}"):
        cluster.requeue(job_id)
    cluster.disable_requeue(job_id)
    cluster.release(job_id)
    run(cluster, 10)
    with pytest.raises(SchedulerError, match="Requested operation is presently disabled"):
        cluster.requeue(job_id)
    with pytest.raises(SchedulerError) as refused:
        cluster.hold(job_id)
    assert refused.value.result is not None and refused.value.result.returncode == 1


def test_cancel_ends_a_running_job_and_is_quiet_about_unknown_ones(tmp_path: Path) -> None:
    cluster = SimulatedCluster(quiet_config(tmp_path), now=START)
    run(cluster, 20)
    job_id = only_job(cluster)
    cluster.disable_requeue(job_id)
    assert cluster.cancel(job_id).argv == ("scancel", job_id)
    job = listed_job(cluster, job_id)
    assert (job.native_state, job.exit_signal, job.requeue_allowed) == ("CANCELLED", 15, False)
    assert all(node.state == "IDLE" for node in cluster.nodes())
    unknown = cluster.cancel("424242")
    assert unknown.returncode == 0 and "Invalid job id specified" in unknown.stderr
    with pytest.raises(SchedulerError, match="already finished"):
        cluster.disable_requeue(job_id)


def test_jobs_start_only_on_idle_healthy_nodes(tmp_path: Path) -> None:
    config = quiet_config(tmp_path, nodes=6, jobs=3)
    cluster = SimulatedCluster(config, now=START)
    for job in cluster.jobs():
        cluster.cancel(job.job_id)
    cluster.drain_node("gpu-0001", "admin: reseat cable")
    cluster.drain_node("gpu-0004", "Xid 79: GPU fell off the bus")
    run(cluster, 5)
    running = [job for job in cluster.jobs() if job.native_state == "RUNNING"]
    pending = [job for job in cluster.jobs() if job.native_state == "PENDING"]
    used = {node for job in running for node in job.nodes}
    assert len(running) == 2 and len(pending) == 1 and pending[0].reason == "Resources"
    assert used == {"gpu-0002", "gpu-0003", "gpu-0005", "gpu-0006"}
    drained = {node.name: node for node in cluster.nodes()}["gpu-0004"]
    assert drained.unavailable and drained.flags == ["DRAIN"]


def test_finished_jobs_stay_listed_for_min_job_age_then_make_room(tmp_path: Path) -> None:
    cluster = SimulatedCluster(quiet_config(tmp_path, min_job_age_seconds=30), now=START)
    run(cluster, 5)
    job_id = only_job(cluster)
    cluster.cancel(job_id)
    run(cluster, 20)
    assert cluster.get_job(job_id) is not None
    run(cluster, 15)
    assert cluster.get_job(job_id) is None
    assert len([job for job in cluster.jobs() if job.native_state != "CANCELLED"]) == 1


def test_opt_in_comment_is_parsed(tmp_path: Path) -> None:
    cluster = SimulatedCluster(
        quiet_config(tmp_path, environment="prod", mode="observe"), now=START
    )
    job = cluster.jobs()[0]
    assert json.loads(job.comment) == {
        "nvidia-recovery": {"environment": "prod", "mode": "observe"}
    }
    assert job.opt_in.opted_in and job.opt_in.mode == "observe"
    assert job.stdout_path == str(tmp_path.absolute() / "lab" / f"{job.job_id}.out")


# ---------------------------------------------------------------------- training


def test_a_restart_resumes_from_the_last_checkpoint_and_loses_the_steps_after_it(
    tmp_path: Path,
) -> None:
    cluster = SimulatedCluster(quiet_config(tmp_path), now=START)
    run(cluster, 20)  # startup 1 s, then 10 steps a second
    job_id = only_job(cluster)
    reached = max(step for _, step in progress_steps(log_text(cluster, job_id)))
    assert reached >= 150
    checkpoint = reached // 50 * 50
    cluster.requeue(job_id)
    run(cluster, 12)
    text = log_text(cluster, job_id)
    assert f"resuming from checkpoint at iteration {checkpoint} (restart 1)" in text
    after = text.split("resuming from checkpoint")[-1]
    resumed = [step for _, step in progress_steps(after)]
    assert resumed and min(resumed) <= reached  # the steps after the checkpoint are done again
    assert min(resumed) > checkpoint


def test_a_job_completes_at_its_target_step(tmp_path: Path) -> None:
    config = quiet_config(tmp_path, total_steps=(120, 120), min_job_age_seconds=1000)
    cluster = SimulatedCluster(config, now=START)
    job_id = only_job(cluster)
    run(cluster, 20)
    job = listed_job(cluster, job_id)
    assert (job.native_state, job.exit_code) == ("COMPLETED", 0)
    assert "training finished at iteration 120" in log_text(cluster, job_id)
    assert len(cluster.jobs()) == 2  # a new job replaces it


def test_an_application_bug_fails_every_attempt_at_the_same_step_without_new_checkpoint(
    tmp_path: Path,
) -> None:
    cluster = SimulatedCluster(quiet_config(tmp_path), now=START)
    now = run(cluster, 10)
    job_id = only_job(cluster)
    cluster.inject(job_id, "app_exception", 0, now.timestamp())
    run(cluster, 1)
    assert listed_job(cluster, job_id).native_state == "FAILED"
    for attempt in range(1, 4):
        cluster.requeue(job_id, hold=True)
        cluster.release(job_id)
        run(cluster, 30)
        job = listed_job(cluster, job_id)
        assert (job.native_state, job.exit_code, job.restart_count) == ("FAILED", 1, attempt)
    text = log_text(cluster, job_id)
    attempts = text.split("resuming from checkpoint")
    exceptions = re.findall(r"\n(?:\d+: \S+ \S+ )?(\w+Error: .*)", text)
    assert len(exceptions) == 4 and len(set(exceptions)) == 1
    saved = re.findall(r"successfully saved checkpoint from iteration\s+(\d+)", text)
    assert all(f"iteration {max(int(s) for s in saved):8d}" not in part for part in attempts[1:])


def test_a_bad_node_keeps_failing_jobs_until_it_is_excluded(tmp_path: Path) -> None:
    config = quiet_config(
        tmp_path, bad_node_faults_per_hour=3600.0, nodes=4, health_check_drain_probability=0.0
    )
    cluster = SimulatedCluster(config, now=START)
    job_id = only_job(cluster)
    bad = listed_job(cluster, job_id).nodes[1]
    cluster.nodes_by_name[bad].defect = "gpu_memory"
    cluster.requeue(job_id)
    for attempt in range(1, 3):
        run(cluster, 60)
        job = listed_job(cluster, job_id)
        assert job.native_state == "FAILED" and job.restart_count == attempt
        assert bad in log_text(cluster, job_id).split("restart")[-1]
        cluster.requeue(job_id, hold=True)
        if attempt == 2:
            cluster.set_excluded_nodes(job_id, [bad])
        cluster.release(job_id)
    run(cluster, 60)
    job = listed_job(cluster, job_id)
    assert job.native_state == "RUNNING" and bad not in job.nodes


def test_a_dead_node_goes_down_and_slurm_requeues_the_job(tmp_path: Path) -> None:
    cluster = SimulatedCluster(quiet_config(tmp_path), now=START)
    now = run(cluster, 10)
    job_id = only_job(cluster)
    victim = listed_job(cluster, job_id).nodes[1]
    cluster.inject(job_id, "node_death", 1, now.timestamp())
    run(cluster, 11)
    assert listed_job(cluster, job_id).native_state == "RUNNING"
    steps_before = len(progress_steps(log_text(cluster, job_id)))
    run(cluster, 2)
    node = {node.name: node for node in cluster.nodes()}[victim]
    assert (node.state, node.flags, node.reason) == ("DOWN", ["NOT_RESPONDING"], "Not responding")
    job = listed_job(cluster, job_id)
    assert job.native_state in {"COMPLETING", "PENDING"} and job.restart_count == 1
    text = log_text(cluster, job_id)
    assert f"srun: error: Node failure on {victim}" in text
    assert re.search(rf"\*\*\* JOB {job_id} ON \S+ CANCELLED AT \S+ DUE TO NODE FAILURE", text)
    assert len(progress_steps(text)) == steps_before  # nothing trained while it was dead
    run(cluster, 10)
    job = listed_job(cluster, job_id)
    assert job.native_state == "RUNNING" and victim not in job.nodes
    cluster.repair_node(victim)
    assert {node.name: node for node in cluster.nodes()}[victim].state == "IDLE"


def test_a_hang_stops_progress_one_rank_first_and_keeps_the_job_running(tmp_path: Path) -> None:
    cluster = SimulatedCluster(quiet_config(tmp_path), now=START)
    now = run(cluster, 10)
    job_id = only_job(cluster)
    hung = listed_job(cluster, job_id).nodes[0]
    cluster.inject(job_id, "hang", 0, now.timestamp())
    run(cluster, 60)
    assert listed_job(cluster, job_id).native_state == "RUNNING"
    steps = progress_steps(log_text(cluster, job_id))
    last = {host: max(step for name, step in steps if name == host) for host, _ in steps}
    other = next(host for host in last if host != hung)
    assert last[other] > last[hung]
    result = scan(log_text(cluster, job_id))
    assert not [finding for finding in result.findings if finding.severity != "warning"]
    count = len(steps)
    run(cluster, 30)
    assert len(progress_steps(log_text(cluster, job_id))) == count


def test_a_straggling_node_reports_lower_throughput_and_slows_the_job(tmp_path: Path) -> None:
    cluster = SimulatedCluster(quiet_config(tmp_path), now=START)
    now = run(cluster, 10)
    job_id = only_job(cluster)
    slow = listed_job(cluster, job_id).nodes[1]
    before = len(progress_steps(log_text(cluster, job_id)))
    cluster.inject(job_id, "gpu_thermal", 1, now.timestamp())
    run(cluster, 30)
    result = scan(log_text(cluster, job_id))
    recent = [point for point in result.progress if point.at and point.at > now]
    slow_rates = [throughput(point) for point in recent if point.node == slow]
    other_rates = [throughput(point) for point in recent if point.node != slow]
    assert slow_rates and other_rates
    assert max(slow_rates) < 0.7 * min(other_rates)
    assert {point.rank for point in recent if point.node == slow} == {8}
    pace = (len(progress_steps(log_text(cluster, job_id))) - before) / 2 / 30
    assert pace < 0.7 * 10  # fewer than the healthy 10 logged steps a second per node


# ---------------------------------------------------------------------- healthy output


def test_healthy_output_has_no_failure_and_parses_as_progress_and_checkpoints(
    tmp_path: Path,
) -> None:
    config = SimConfig(
        name="ok",
        nodes=16,
        jobs=4,
        seed=11,
        speedup=50,
        log_dir=str(tmp_path),
        faults_per_job_hour=0,
        bad_node_fraction=0,
        checkpoint_every=(50, 80),
    )
    cluster = SimulatedCluster(config, now=START)
    run(cluster, 120, tick=1.0)
    for job in cluster.jobs():
        result = scan(Path(job.stdout_path).read_text())
        assert not [f for f in result.findings if f.severity != "warning"], result.findings
        assert result.progress and all(p.node and p.rank is not None for p in result.progress)
        assert all(p.throughput and p.at for p in result.progress)
        assert result.checkpoints and all(c.step for c in result.checkpoints)
        assert any(c.completed for c in result.checkpoints)


def test_recoverys_drain_and_resume_are_scheduler_commands_in_the_journal(tmp_path: Path) -> None:
    cluster = SimulatedCluster(quiet_config(tmp_path, nodes=4, jobs=0), now=START)
    reason = "workload-recovery: hardware: gpu_hardware (xid-79) on gpu-0002"
    drained = cluster.drain("gpu-0002", reason, caller="controller")
    assert drained.argv == (
        "scontrol",
        "update",
        "NodeName=gpu-0002",
        "State=DRAIN",
        f"Reason={reason}",
    )
    node = {node.name: node for node in cluster.nodes()}["gpu-0002"]
    assert node.drained and node.reason == reason
    cluster.resume("gpu-0002", caller="controller")
    assert not {node.name: node for node in cluster.nodes()}["gpu-0002"].drained
    with pytest.raises(SchedulerError, match="Invalid node state transition"):
        cluster.resume("gpu-0002")
    with pytest.raises(SchedulerError, match="Invalid node name"):
        cluster.drain("gpu-9999", reason)
    assert [entry["argv"][3] for entry in cluster.commands] == [
        "State=DRAIN",
        "State=RESUME",
        "State=RESUME",
        "State=DRAIN",
    ]
    assert [entry["returncode"] for entry in cluster.commands] == [0, 0, 1, 1]


@pytest.mark.parametrize("spread", [0.0, 60.0])
def test_jobs_forgotten_together_are_replaced_within_the_resubmit_spread(
    tmp_path: Path, spread: float
) -> None:
    """
    GIVEN four jobs that failed at the same moment and were never restarted
    WHEN Slurm forgets them (MinJobAge) and the cluster replaces them
    THEN with no spread every replacement may start at once; with one, each becomes eligible
         at its own random moment within it
    """
    config = quiet_config(
        tmp_path, nodes=8, jobs=4, min_job_age_seconds=30, resubmit_spread_seconds=spread
    )
    cluster = SimulatedCluster(config, now=START)
    run(cluster, 20)
    first = [job.job_id for job in cluster.jobs()]
    at = cluster.now
    for job_id in first:
        cluster.inject(job_id, "gpu_oom", 0, at)
    run(cluster, 1)
    assert {listed_job(cluster, job_id).native_state for job_id in first} == {"FAILED"}
    run(cluster, 31)
    forgotten = cluster.now
    replacements = [job for job in cluster.jobs() if job.job_id not in first]
    assert len(replacements) == 4
    eligible = [
        (job.eligible_time - datetime.fromtimestamp(forgotten, tz=UTC)).total_seconds()
        for job in replacements
        if job.eligible_time is not None
    ]
    assert len(eligible) == 4
    # Forgotten in the same tick, somewhat before the end of the run.
    assert all(seconds >= -2.0 for seconds in eligible)
    if spread == 0:
        assert len(set(eligible)) == 1 and eligible[0] <= 0.0
    else:
        assert len({round(seconds, 3) for seconds in eligible}) == 4
        assert 1.0 < max(eligible) - min(eligible) <= spread
