"""The development cluster behaves as the recovery code expects: jobs run, print Megatron-style
progress, checkpoint, and resume after requeue, also on another node after an exclusion.

Slurm is read here directly, as an administrator would (``slurm_cluster.run``), not through the
project's adapter; the two JSON dialects (22.05's plain values, 24.11's lists and
``{"set", "infinite", "number"}`` objects) are flattened to 22.05's by ``job_view``.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.slurm.conftest import DEFAULT_COMMENT, SlurmCluster, SubmittedJob

PROGRESS = re.compile(
    r"^ iteration +(?P<step>\d+)/ +(?P<total>\d+) \| consumed samples: +\d+ \| "
    r"elapsed time per iteration \(ms\): [\d.]+ \|.* lm loss: [\d.E+-]+ \|",
    re.MULTILINE,
)
RESUMED = re.compile(
    r"resuming from checkpoint at iteration (?P<step>\d+) "
    r"\(SLURM_RESTART_COUNT=(?P<restarts>\d+), SLURMD_NODENAME=(?P<node>\w+)"
)
FAST = {"STEP_SECONDS": "0.1", "CKPT_EVERY": "5"}
# Base job states; 24.11 lists them with flags (["PENDING", "REQUEUED"]).
BASE_STATES = {
    "PENDING", "RUNNING", "SUSPENDED", "COMPLETED", "CANCELLED", "FAILED", "TIMEOUT",
    "NODE_FAIL", "PREEMPTED", "BOOT_FAIL", "DEADLINE", "OUT_OF_MEMORY",
}  # fmt: skip


@pytest.fixture(autouse=True)
def _cluster(slurm_cluster: SlurmCluster) -> None:
    global CLUSTER
    CLUSTER = slurm_cluster


CLUSTER: SlurmCluster


def slurm(*args: str) -> Any:
    return CLUSTER.run(list(args))


def _plain(value: Any) -> Any:
    """24.11's ``{"set": true, "infinite": false, "number": N}`` as N (None when not set)."""
    if isinstance(value, dict) and "number" in value and "set" in value:
        return value["number"] if value["set"] else None
    return value


def job_view(job: dict[str, Any]) -> dict[str, Any]:
    """A job of ``squeue --json`` with 24.11's values flattened to 22.05's."""
    view = {key: _plain(value) for key, value in job.items()}
    state = job["job_state"]
    if isinstance(state, list):
        view["job_state"] = next((s for s in state if s in BASE_STATES), state[0] if state else "")
        view["job_state_flags"] = state
    exit_code = job["exit_code"]
    if isinstance(exit_code, dict):  # 24.11: {"status", "return_code", "signal"}
        code = _plain(exit_code.get("return_code")) or 0
        signal = _plain((exit_code.get("signal") or {}).get("id")) or 0
        view["exit_code"] = (code << 8) | signal  # 22.05's raw wait status
    return view


def job_info(job_id: int) -> dict[str, Any]:
    # 22.05's squeue --json lists every job still in memory (it ignores -j and -t); 24.11's
    # lists only pending and running jobs unless asked for all states.
    result = slurm("squeue", "--json", "--states=all")
    assert result.returncode == 0, result.stderr
    for job in json.loads(result.stdout)["jobs"]:
        if job["job_id"] == job_id:
            return job_view(job)
    raise AssertionError(f"job {job_id} is not known to slurmctld")


def wait_for(
    job: SubmittedJob, condition: Callable[[dict[str, Any]], bool], what: str, timeout: float = 30
) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        info = job_info(job.job_id)
        if condition(info):
            return info
        if time.monotonic() > deadline:
            log = job.output.read_text() if job.output.exists() else "(no output yet)"
            raise AssertionError(
                f"job {job.job_id} not {what} after {timeout}s: state={info['job_state']} "
                f"reason={info['state_reason']} restarts={info['restart_cnt']}\n{log[-3000:]}"
            )
        time.sleep(0.1)


def wait_for_checkpoint(job: SubmittedJob, step: int, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not (job.ckpt_dir / f"step_{step}").exists():
        assert time.monotonic() < deadline, f"no checkpoint step_{step} after {timeout}s"
        time.sleep(0.05)


def newest_checkpoint(directory: Path) -> int:
    return max((int(p.name.removeprefix("step_")) for p in directory.glob("step_*")), default=0)


def wait_until_pending(job: SubmittedJob) -> None:
    """Wait for the requeued job to be pending again, and let the requeue delay run.

    Skipping the delay (``StartTime=now``) lets Slurm start the job again on the same node
    within ``cred_expire`` seconds, where slurmd still holds the job's revoked credential:
    slurmctld then logs "Killing non-startable batch JobId=N: Job credential revoked" and the
    job fails at once. The delay (cred_expire + 1 s = 6 s here) is what prevents that.
    """
    wait_for(job, lambda j: j["job_state"] == "PENDING", "pending again")


def node_partitions() -> tuple[dict[str, str], dict[str, list[str]]]:
    """Each node's state and partitions (sinfo's JSON differs between versions; this does not)."""
    listed = slurm("sinfo", "-h", "-N", "-o", "%N %t %R")
    assert listed.returncode == 0, listed.stderr
    states: dict[str, str] = {}
    partitions: dict[str, list[str]] = {}
    for line in listed.stdout.splitlines():
        name, state, partition = line.split()
        states[name] = state
        partitions[name] = sorted({*partitions.get(name, []), partition})
    return states, partitions


def test_cluster_has_four_idle_nodes_and_two_partitions(slurm_cluster: SlurmCluster) -> None:
    assert slurm_cluster.conf == slurm_cluster.directory / "etc" / "slurm.conf"
    assert os.environ["SLURM_CONF"] == str(slurm_cluster.conf)
    assert " is UP" in slurm("scontrol", "ping").stdout
    assert slurm("scontrol", "version").stdout.split()[-1].startswith(slurm_cluster.version)

    deadline = time.monotonic() + 15
    while True:  # a job cancelled by an earlier test may still be completing
        states, partitions = node_partitions()
        if set(states.values()) == {"idle"} or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert states == dict.fromkeys(slurm_cluster.nodes, "idle")
    assert partitions == {
        "node001": ["canary", "debug"],
        "node002": ["canary", "debug"],
        "node003": ["debug"],
        "node004": ["debug"],
    }
    summary = slurm("sinfo", "-h", "-o", "%P %D").stdout.split("\n")
    assert summary[:2] == ["debug* 4", "canary 2"]

    config = slurm("scontrol", "show", "config").stdout
    assert re.search(r"^AuthInfo\s+= cred_expire=5$", config, re.MULTILINE)
    first_job = re.search(r"^FirstJobId\s+= (\d+)$", config, re.MULTILINE)
    assert first_job is not None
    first_job_id = int(first_job[1])
    assert first_job_id > 1  # ids do not restart at 1 after a fresh start


def test_job_runs_prints_progress_checkpoints_and_completes(
    submit_job: Callable[..., SubmittedJob],
) -> None:
    job = submit_job({**FAST, "TOTAL_STEPS": "10"})

    info = wait_for(job, lambda j: j["job_state"] == "COMPLETED", "completed")

    assert info["exit_code"] == 0
    assert info["restart_cnt"] == 0
    assert info["name"] == job.name
    assert info["standard_output"] == str(job.output)
    assert json.loads(info["comment"]) == DEFAULT_COMMENT
    log = job.output.read_text()
    assert "starting from scratch (SLURM_RESTART_COUNT=0, SLURMD_NODENAME=node" in log
    assert [int(m["step"]) for m in PROGRESS.finditer(log)] == list(range(1, 11))
    assert {m["total"] for m in PROGRESS.finditer(log)} == {"10"}
    for step in (5, 10):
        assert (job.ckpt_dir / f"step_{step}").read_text() == f"{step}\n"
        assert f"successfully saved checkpoint from iteration {step:8d} to {job.ckpt_dir}" in log
    assert "training finished at iteration 10" in log


def test_requeue_restarts_and_resumes_from_newest_checkpoint(
    submit_job: Callable[..., SubmittedJob],
) -> None:
    job = submit_job({**FAST, "TOTAL_STEPS": "30"})
    wait_for(job, lambda j: j["job_state"] == "RUNNING", "running")
    wait_for_checkpoint(job, 5)
    newest_before = newest_checkpoint(job.ckpt_dir)

    result = slurm("scontrol", "requeue", str(job.job_id))
    assert result.returncode == 0, result.stderr
    wait_until_pending(job)
    wait_for(job, lambda j: j["job_state"] == "RUNNING" and j["restart_cnt"] == 1, "restarted")
    info = wait_for(job, lambda j: j["job_state"] == "COMPLETED", "completed")

    assert info["restart_cnt"] == 1
    log = job.output.read_text()  # appended to, not truncated, by the restart
    assert log.count("starting from scratch") == 1
    assert f"*** JOB {job.job_id} ON " in log and "DUE TO JOB REQUEUE ***" in log
    resumed = RESUMED.search(log)
    assert resumed, log
    step = int(resumed["step"])
    assert step >= newest_before > 0
    assert step % 5 == 0
    assert resumed["restarts"] == "1"
    after = [int(m["step"]) for m in PROGRESS.finditer(log, resumed.end())]
    assert after == list(range(step + 1, 31))
    assert "training finished at iteration 30" in log


def test_failed_job_requeued_resumes_and_completes(
    submit_job: Callable[..., SubmittedJob],
) -> None:
    job = submit_job({**FAST, "TOTAL_STEPS": "12", "FAIL_AT_STEP": "8"})

    failed = wait_for(job, lambda j: j["job_state"] == "FAILED", "failed")
    assert failed["exit_code"] == 256  # raw wait status: exit 1
    log = job.output.read_text()
    assert "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB." in log, log
    assert newest_checkpoint(job.ckpt_dir) == 5

    result = slurm("scontrol", "requeue", str(job.job_id))
    assert result.returncode == 0, result.stderr
    wait_until_pending(job)
    info = wait_for(job, lambda j: j["job_state"] == "COMPLETED", "completed after requeue")

    assert info["restart_cnt"] == 1
    log = job.output.read_text()
    resumed = RESUMED.search(log)
    assert resumed and resumed["step"] == "5" and resumed["restarts"] == "1", log
    assert log.count("torch.OutOfMemoryError") == 1  # the second attempt got past step 8
    assert "training finished at iteration 12" in log


def test_requeuehold_exclude_release_restarts_on_another_node(
    submit_job: Callable[..., SubmittedJob],
) -> None:
    job = submit_job({**FAST, "TOTAL_STEPS": "1000"})
    running = wait_for(job, lambda j: j["job_state"] == "RUNNING", "running")
    first_node = running["batch_host"]
    wait_for_checkpoint(job, 5)

    # The exclusion is refused while the job runs, and accepted once it is requeued.
    refused = slurm("scontrol", "update", f"JobId={job.job_id}", f"ExcNodeList={first_node}")
    assert refused.returncode == 1
    assert "no longer pending" in refused.stderr
    result = slurm("scontrol", "requeuehold", str(job.job_id))
    assert result.returncode == 0, result.stderr
    result = slurm("scontrol", "update", f"JobId={job.job_id}", f"ExcNodeList={first_node}")
    assert result.returncode == 0, result.stderr

    held = wait_for(job, lambda j: j["job_state"] == "PENDING", "pending and held")
    # scontrol shows Reason=job_requeued_in_held_state; JSON splits it into reason and text.
    assert held["state_reason"] == "JobHeldUser"
    assert held["state_description"] == "job requeued in held state"
    assert held["priority"] == 0
    assert held["excluded_nodes"] == first_node
    result = slurm("scontrol", "release", str(job.job_id))
    assert result.returncode == 0, result.stderr
    wait_until_pending(job)
    restarted = wait_for(
        job, lambda j: j["job_state"] == "RUNNING" and j["restart_cnt"] == 1, "restarted"
    )

    assert restarted["batch_host"] != first_node
    deadline = time.monotonic() + 10
    while not (resumed := RESUMED.search(job.output.read_text())):
        assert time.monotonic() < deadline, job.output.read_text()
        time.sleep(0.05)
    assert resumed["node"] == restarted["batch_host"]
    assert int(resumed["step"]) >= 5


def test_up_again_is_a_fast_no_op(slurm_cluster: SlurmCluster) -> None:
    run = slurm_cluster.directory / "run"
    pids = {path.name: path.read_text() for path in run.glob("*.pid")}

    started = time.monotonic()
    result = slurm_cluster.up(timeout=30)
    elapsed = time.monotonic() - started

    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == f"export SLURM_CONF={slurm_cluster.conf}"
    if slurm_cluster.ssh is None:
        assert lines == lines[:1]
    else:
        assert f"export SLURM_DEV_SSH_PORT={slurm_cluster.ssh.port}" in lines
        assert f"export SLURM_DEV_SSH_KNOWN_HOSTS={slurm_cluster.ssh.known_hosts}" in lines
    assert "already up" in result.stderr
    assert elapsed < 2, f"up.sh took {elapsed:.2f}s on a running cluster"
    assert {path.name: path.read_text() for path in run.glob("*.pid")} == pids
