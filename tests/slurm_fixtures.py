"""Fixtures for tests against a real four-node Slurm cluster, started by deploy/slurm-dev/up.sh.

Registered for the whole suite in tests/conftest.py, so that tests/slurm and tests/e2e share one
cluster per session. The session starts its own cluster, by default in var/slurm-test on ports
17100-17104, so it can run beside a developer's ``make slurm-up`` cluster (var/slurm-dev, ports
6817 and 17001-17004), and stops it at the end. ``WR_TEST_SLURM_DIR``,
``WR_TEST_SLURM_CTLD_PORT`` and ``WR_TEST_SLURM_NODE_PORT`` (node001's port; the other nodes take
the next three) put it elsewhere, so that ``make e2e`` can run beside ``make test``.
"""

from __future__ import annotations

import json
import os
import subprocess
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
UP = REPO / "deploy" / "slurm-dev" / "up.sh"
DOWN = REPO / "deploy" / "slurm-dev" / "down.sh"
TRAIN = REPO / "tests" / "slurm" / "jobs" / "train.sh"
CLUSTER_DIR = (REPO / os.environ.get("WR_TEST_SLURM_DIR", "var/slurm-test")).resolve()
CLUSTER_ENV = {
    "SLURM_DEV_DIR": str(CLUSTER_DIR),
    "SLURM_DEV_CTLD_PORT": os.environ.get("WR_TEST_SLURM_CTLD_PORT", "17100"),
    "SLURM_DEV_NODE_PORT": os.environ.get("WR_TEST_SLURM_NODE_PORT", "17101"),
}
# Starting includes installing the Debian packages on a fresh machine.
START_TIMEOUT = 300

DEFAULT_COMMENT: dict[str, object] = {"nvidia-recovery": {"environment": "test", "mode": "act"}}


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "slurm: needs the four-node Slurm cluster that deploy/slurm-dev/up.sh starts"
    )


@dataclass(frozen=True)
class SlurmCluster:
    conf: Path
    directory: Path
    partitions: tuple[str, ...]
    nodes: tuple[str, ...]
    default_partition: str
    # What up.sh and down.sh need to find this cluster (to repair it after a node was killed).
    env: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class SubmittedJob:
    job_id: int
    name: str
    output: Path
    ckpt_dir: Path


def _run_script(script: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(script)],
        env={**os.environ, **CLUSTER_ENV},
        capture_output=True,
        text=True,
        timeout=START_TIMEOUT,
        check=False,
    )


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[SlurmCluster]:
    started = _run_script(UP)
    if started.returncode != 0:
        stopped = _run_script(DOWN)
        pytest.fail(
            f"deploy/slurm-dev/up.sh exited {started.returncode}:\n"
            f"{started.stdout}{started.stderr}{stopped.stdout}{stopped.stderr}",
            pytrace=False,
        )
    conf = CLUSTER_DIR / "etc" / "slurm.conf"
    assert f"export SLURM_CONF={conf}" in started.stdout
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SLURM_CONF", str(conf))
        try:
            yield SlurmCluster(
                conf=conf,
                directory=CLUSTER_DIR,
                partitions=("debug", "canary"),
                nodes=("node001", "node002", "node003", "node004"),
                default_partition="debug",
                env=dict(CLUSTER_ENV),
            )
        finally:
            stopped = _run_script(DOWN)
            assert stopped.returncode == 0, stopped.stdout + stopped.stderr


@pytest.fixture
def submit_job(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> Iterator[Callable[..., SubmittedJob]]:
    """Submit tests/slurm/jobs/train.sh; every job it submitted is cancelled at teardown.

    ``submit_job(env={"TOTAL_STEPS": "10"}, comment=..., sbatch_args=["-p", "canary"])``:
    ``env`` adds to the job's environment (train.sh reads TOTAL_STEPS, STEP_SECONDS,
    CKPT_EVERY and FAIL_AT_STEP), ``comment`` is a dict sent as JSON, a string sent as it is,
    or None for no comment.
    """
    submitted: list[int] = []

    def submit(
        env: Mapping[str, str] | None = None,
        *,
        comment: Mapping[str, object] | str | None = DEFAULT_COMMENT,
        sbatch_args: Sequence[str] = (),
    ) -> SubmittedJob:
        tag = uuid.uuid4().hex[:8]
        name = f"wr-test-{tag}"
        workdir = tmp_path / name
        ckpt_dir = workdir / "checkpoints"
        ckpt_dir.mkdir(parents=True)
        output = workdir / "train.log"
        command = [
            "sbatch",
            "--parsable",
            f"--job-name={name}",
            f"--output={output}",
            f"--chdir={workdir}",
        ]
        if comment is not None:
            text = comment if isinstance(comment, str) else json.dumps(comment)
            command.append(f"--comment={text}")
        command += [*sbatch_args, str(TRAIN)]
        job_env = {**os.environ, "SLURM_CONF": str(slurm_cluster.conf), "CKPT_DIR": str(ckpt_dir)}
        job_env.update(env or {})
        result = subprocess.run(
            command, env=job_env, capture_output=True, text=True, timeout=30, check=False
        )
        assert result.returncode == 0, f"sbatch failed: {result.stdout}{result.stderr}"
        job_id = int(result.stdout.strip().split(";")[0])
        submitted.append(job_id)
        return SubmittedJob(job_id=job_id, name=name, output=output, ckpt_dir=ckpt_dir)

    yield submit

    if submitted:
        subprocess.run(
            ["scancel", *map(str, submitted)], capture_output=True, timeout=30, check=False
        )
