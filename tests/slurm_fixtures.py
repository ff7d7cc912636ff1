"""Fixtures for tests against real four-node Slurm clusters, started by deploy/slurm-dev/up.sh.

Registered for the whole suite in tests/conftest.py, so that tests/slurm and tests/e2e share one
cluster per version and session. ``slurm_cluster`` is parametrized over the Slurm versions the
project supports (ids ``slurm-22.05`` and ``slurm-24.11``), so every test that uses it runs on
each; a cluster is started when the first test of its version needs it. The tests of each
version run in a test worker of their own (``tests/parallel.py``), so both run at once, and the
end-to-end scenarios have a cluster of each version of their own (``E2E_CLUSTER_ENVS``: 22.05
on ports 17500-17504 in var/slurm-test-e2e, 24.11 on 17600-17604 and sshd 2301 in
var/slurm-test-24.11-e2e; ``WR_TEST_E2E_SLURM_*`` move them, as ``make e2e`` does). Each
cluster hands out job ids from a slot of its own (``SLURM_DEV_ID_SLOT``).

* 22.05: Debian 12's packages on this host, by default in var/slurm-test on ports 17100-17104.
  The project reaches it with local commands (``LocalTransport`` and ``SLURM_CONF``).
* 24.11: Debian 13's packages in a chroot (var/slurm-trixie-root, built once), by default in
  var/slurm-test-24.11 on ports 17300-17304, with the chroot's sshd on 127.0.0.1:2300. The
  project reaches it over SSH (``SSHTransport``, strict known_hosts), as it would a login node.

Both run beside a developer's ``make slurm-up`` clusters (var/slurm-dev, ports 6817 and
17001-17004; var/slurm-dev-24.11, ports 17010-17014 and 2310). ``WR_TEST_SLURM_DIR``,
``WR_TEST_SLURM_CTLD_PORT`` and ``WR_TEST_SLURM_NODE_PORT`` (node001's port; the other nodes
take the next three) move the 22.05 cluster, ``WR_TEST_SLURM_2411_DIR``, ``..._CTLD_PORT``,
``..._NODE_PORT`` and ``..._SSH_PORT`` the 24.11 one, so that ``make e2e`` can run beside
``make test``. ``WR_TEST_SLURM_VERSIONS`` (e.g. ``22.05``) limits the versions.

``ssh_server`` is the login node the SSH transport reaches: for 22.05 an sshd on this host
(``WR_TEST_SSH_DIR`` and ``WR_TEST_SSH_PORT`` move it), for 24.11 the chroot's.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]
UP = REPO / "deploy" / "slurm-dev" / "up.sh"
DOWN = REPO / "deploy" / "slurm-dev" / "down.sh"
TRAIN = REPO / "tests" / "slurm" / "jobs" / "train.sh"
SUPPORTED_VERSIONS = ("22.05", "24.11")
VERSIONS = tuple(
    version
    for version in os.environ.get("WR_TEST_SLURM_VERSIONS", " ".join(SUPPORTED_VERSIONS))
    .replace(",", " ")
    .split()
    if version in SUPPORTED_VERSIONS
)
# The 22.05 cluster (kept under these names: tests import them).
CLUSTER_DIR = (REPO / os.environ.get("WR_TEST_SLURM_DIR", "var/slurm-test")).resolve()
CLUSTER_ENV = {
    "SLURM_DEV_VERSION": "22.05",
    "SLURM_DEV_DIR": str(CLUSTER_DIR),
    "SLURM_DEV_CTLD_PORT": os.environ.get("WR_TEST_SLURM_CTLD_PORT", "17100"),
    "SLURM_DEV_NODE_PORT": os.environ.get("WR_TEST_SLURM_NODE_PORT", "17101"),
    "SLURM_DEV_ID_SLOT": "0",
}
CLUSTER_DIR_2411 = (
    REPO / os.environ.get("WR_TEST_SLURM_2411_DIR", "var/slurm-test-24.11")
).resolve()
CLUSTER_ENV_2411 = {
    "SLURM_DEV_VERSION": "24.11",
    "SLURM_DEV_DIR": str(CLUSTER_DIR_2411),
    "SLURM_DEV_CTLD_PORT": os.environ.get("WR_TEST_SLURM_2411_CTLD_PORT", "17300"),
    "SLURM_DEV_NODE_PORT": os.environ.get("WR_TEST_SLURM_2411_NODE_PORT", "17301"),
    "SLURM_DEV_SSH_PORT": os.environ.get("WR_TEST_SLURM_2411_SSH_PORT", "2300"),
    "SLURM_DEV_ID_SLOT": "2",
}
CLUSTER_ENVS = {"22.05": CLUSTER_ENV, "24.11": CLUSTER_ENV_2411}
# The end-to-end scenarios' own clusters, one per version, beside the others: the scenarios
# take most of the suite's time, and run in a test worker of their own while tests/slurm use
# the clusters above (tests/parallel.py). Each hands out job ids from a slot of its own.
E2E_CLUSTER_ENVS = {
    "22.05": {
        **CLUSTER_ENV,
        "SLURM_DEV_DIR": str(
            (REPO / os.environ.get("WR_TEST_E2E_SLURM_DIR", "var/slurm-test-e2e")).resolve()
        ),
        "SLURM_DEV_CTLD_PORT": os.environ.get("WR_TEST_E2E_SLURM_CTLD_PORT", "17500"),
        "SLURM_DEV_NODE_PORT": os.environ.get("WR_TEST_E2E_SLURM_NODE_PORT", "17501"),
        "SLURM_DEV_ID_SLOT": "1",
    },
    "24.11": {
        **CLUSTER_ENV_2411,
        "SLURM_DEV_DIR": str(
            (
                REPO / os.environ.get("WR_TEST_E2E_SLURM_2411_DIR", "var/slurm-test-24.11-e2e")
            ).resolve()
        ),
        "SLURM_DEV_CTLD_PORT": os.environ.get("WR_TEST_E2E_SLURM_2411_CTLD_PORT", "17600"),
        "SLURM_DEV_NODE_PORT": os.environ.get("WR_TEST_E2E_SLURM_2411_NODE_PORT", "17601"),
        "SLURM_DEV_SSH_PORT": os.environ.get("WR_TEST_E2E_SLURM_2411_SSH_PORT", "2301"),
        "SLURM_DEV_ID_SLOT": "3",
    },
}
# Starting includes installing the Debian packages, or building the 24.11 chroot, on a fresh
# machine.
START_TIMEOUT = 420
# What a Slurm command finds in the chroot.
CHROOT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

# ClusterName in deploy/slurm-dev/slurm.conf.in, for both versions.
CLUSTER_NAME = "dev"

DEFAULT_COMMENT: dict[str, object] = {"nvidia-recovery": {"environment": "test", "mode": "act"}}


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "slurm: needs the four-node Slurm cluster that deploy/slurm-dev/up.sh starts"
    )


@dataclass(frozen=True)
class SSHLogin:
    """The 24.11 cluster's login node: the chroot's sshd on 127.0.0.1, key login as root."""

    host: str
    port: int
    user: str
    key_file: Path
    known_hosts: Path
    # The server's own key pair, for tests that need a key the server does not accept.
    host_key: Path


@dataclass(frozen=True)
class SlurmCluster:
    conf: Path
    directory: Path
    partitions: tuple[str, ...]
    nodes: tuple[str, ...]
    default_partition: str
    # What up.sh and down.sh need to find this cluster (to repair it after a node was killed).
    env: Mapping[str, str] = field(default_factory=dict)
    version: str = "22.05"
    # 24.11: the chroot the cluster runs in, and its login node.
    root: Path | None = None
    ssh: SSHLogin | None = None

    # ------------------------------------------------------------------ as an administrator

    @property
    def in_chroot(self) -> bool:
        return self.root is not None

    def command(self, argv: Sequence[str]) -> list[str]:
        """``argv`` as run on the cluster's host (in the chroot, with its mounts, for 24.11).
        The rest of the environment passes through."""
        if self.root is None:
            return list(argv)
        return [
            shutil.which("nsenter") or "/usr/bin/nsenter",
            f"--mount={self.directory / 'run' / 'mnt.ns'}",
            shutil.which("chroot") or "/usr/sbin/chroot",
            str(self.root),
            "/usr/bin/env",
            f"SLURM_CONF={self.conf}",
            f"PATH={CHROOT_PATH}",
            *argv,
        ]

    def run(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        timeout: float = 30,
        input: str | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """A Slurm command (sbatch, scontrol, squeue, sinfo, scancel, strigger, a daemon...) run
        as an administrator on the cluster's host would; ``env`` adds to the environment."""
        return subprocess.run(
            self.command(argv),
            env={**os.environ, "SLURM_CONF": str(self.conf), **(env or {})},
            input=input,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def up(self, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        """deploy/slurm-dev/up.sh for this cluster: a no-op when it is up, else a repair."""
        return subprocess.run(
            [str(UP)],
            env={**os.environ, **self.env},
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def pid_of(self, daemon: str) -> int | None:
        """The pid of ``slurmctld`` or ``slurmd.<node>`` from its pid file, as seen here."""
        try:
            return int((self.directory / "run" / f"{daemon}.pid").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None

    # ------------------------------------------------------------------ as the project

    def transport(self) -> Any:
        """How the project reaches this cluster: local commands, or SSH to its login node."""
        from recovery.schedulers.ssh_transport import SSHTransport
        from recovery.schedulers.transport import LocalTransport

        if self.ssh is None:
            return LocalTransport(env={"SLURM_CONF": str(self.conf)})
        return SSHTransport(
            self.ssh.host,
            port=self.ssh.port,
            user=self.ssh.user,
            key_file=str(self.ssh.key_file),
            known_hosts=str(self.ssh.known_hosts),
            env={"SLURM_CONF": str(self.conf)},
        )

    def adapter(self) -> Any:
        from recovery.schedulers.slurm import SlurmAdapter

        return SlurmAdapter(self.transport())

    def connection(self) -> tuple[str, dict[str, Any]]:
        """``(connection, connection_settings)`` for a ``recovery.models.Cluster`` row."""
        if self.ssh is None:
            return "local", {"slurm_conf": str(self.conf), "scheduler_cluster_name": CLUSTER_NAME}
        return "ssh", {
            "scheduler_cluster_name": CLUSTER_NAME,
            "host": self.ssh.host,
            "port": self.ssh.port,
            "user": self.ssh.user,
            "key_file": str(self.ssh.key_file),
            "known_hosts": str(self.ssh.known_hosts),
            "slurm_conf": str(self.conf),
        }

    def controller_args(self) -> list[str]:
        """How ``manage.py advisor_controller`` reaches this cluster."""
        if self.ssh is None:
            return ["--slurm-conf", str(self.conf)]
        return [
            "--ssh",
            f"{self.ssh.user}@{self.ssh.host}:{self.ssh.port}",
            "--key",
            str(self.ssh.key_file),
            "--known-hosts",
            str(self.ssh.known_hosts),
            "--slurm-conf",
            str(self.conf),
        ]


@dataclass(frozen=True)
class SubmittedJob:
    job_id: int
    name: str
    output: Path
    ckpt_dir: Path


def _run_script(script: Path, env: Mapping[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(script)],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=START_TIMEOUT,
        check=False,
    )


def exports(output: str) -> dict[str, str]:
    """The ``export NAME=value`` lines up.sh prints."""
    import shlex

    settings = {}
    for line in output.splitlines():
        words = shlex.split(line)
        if len(words) == 2 and words[0] == "export" and "=" in words[1]:
            name, _, value = words[1].partition("=")
            settings[name] = value
    return settings


def start_cluster(version: str, env: Mapping[str, str] | None = None) -> SlurmCluster:
    env = env or CLUSTER_ENVS[version]
    started = _run_script(UP, env)
    if started.returncode != 0:
        stopped = _run_script(DOWN, env)
        pytest.fail(
            f"deploy/slurm-dev/up.sh (Slurm {version}) exited {started.returncode}:\n"
            f"{started.stdout}{started.stderr}{stopped.stdout}{stopped.stderr}",
            pytrace=False,
        )
    directory = Path(env["SLURM_DEV_DIR"])
    conf = directory / "etc" / "slurm.conf"
    settings = exports(started.stdout)
    assert settings.get("SLURM_CONF") == str(conf), started.stdout
    root = ssh = None
    if version == "24.11":
        root = Path(settings["SLURM_DEV_ROOT"])
        ssh = SSHLogin(
            host="127.0.0.1",
            port=int(settings["SLURM_DEV_SSH_PORT"]),
            user="root",
            key_file=Path(settings["SLURM_DEV_SSH_KEY"]),
            known_hosts=Path(settings["SLURM_DEV_SSH_KNOWN_HOSTS"]),
            host_key=directory / "ssh" / "ssh_host_ed25519_key",
        )
    return SlurmCluster(
        conf=conf,
        directory=directory,
        partitions=("debug", "canary"),
        nodes=("node001", "node002", "node003", "node004"),
        default_partition="debug",
        env=dict(env),
        version=version,
        root=root,
        ssh=ssh,
    )


def without_earlier_jobs(cluster: SlurmCluster, timeout: float = 60) -> None:
    """A cluster that an interrupted session left running (up.sh then leaves it as it is) still
    holds that session's jobs and drains: cancel the jobs and resume the nodes, and wait until
    all four are idle, as a fresh cluster's are."""
    listed = cluster.run(["squeue", "-h", "-o", "%i"])
    assert listed.returncode == 0, listed.stderr
    if listed.stdout.split():
        cluster.run(["scancel", *listed.stdout.split()])
    drained = cluster.run(["sinfo", "-h", "-N", "-t", "drain,drng,down", "-o", "%N"])
    for node in sorted(set(drained.stdout.split())):
        cluster.run(["scontrol", "update", f"NodeName={node}", "State=RESUME"])
    deadline = time.monotonic() + timeout
    while True:
        states = cluster.run(["sinfo", "-h", "-N", "-o", "%N %t"]).stdout.split("\n")
        idle = {line.split()[0] for line in states if line.split()[1:] == ["idle"]}
        if idle >= set(cluster.nodes):
            return
        if time.monotonic() > deadline:
            pytest.fail(f"Slurm {cluster.version}: nodes not idle after {timeout:.0f} s: {states}")
        time.sleep(0.5)


@pytest.fixture(scope="session", params=VERSIONS, ids=lambda version: f"slurm-{version}")
def slurm_cluster(request: pytest.FixtureRequest) -> Iterator[SlurmCluster]:
    yield from running_cluster(request.param, CLUSTER_ENVS[request.param])


def running_cluster(version: str, env: Mapping[str, str]) -> Iterator[SlurmCluster]:
    """The cluster of ``version`` described by ``env``, up for as long as the caller holds it."""
    cluster = start_cluster(version, env)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SLURM_CONF", str(cluster.conf))
        try:
            without_earlier_jobs(cluster)
            yield cluster
        finally:
            stopped = _run_script(DOWN, cluster.env)
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
        result = slurm_cluster.run(command, env={"CKPT_DIR": str(ckpt_dir), **(env or {})})
        assert result.returncode == 0, f"sbatch failed: {result.stdout}{result.stderr}"
        job_id = int(result.stdout.strip().split(";")[0])
        submitted.append(job_id)
        return SubmittedJob(job_id=job_id, name=name, output=output, ckpt_dir=ckpt_dir)

    yield submit

    if submitted:
        slurm_cluster.run(["scancel", *map(str, submitted)])


# ---------------------------------------------------------------------- the login node's sshd

SSH_UP = REPO / "deploy" / "ssh-dev" / "up.sh"
SSH_DOWN = REPO / "deploy" / "ssh-dev" / "down.sh"
SSH_DIR = (REPO / os.environ.get("WR_TEST_SSH_DIR", "var/ssh-test")).resolve()
SSH_PORT = int(os.environ.get("WR_TEST_SSH_PORT", "2299"))
SSH_HOST = "127.0.0.1"


@dataclass(frozen=True)
class SSHServer:
    """An sshd that opens a root login by key, with the test cluster's SLURM_CONF."""

    port: int
    key_file: Path
    known_hosts: Path
    # The server's own key pair (its private key is a valid key the server does not accept).
    host_key: Path
    slurm_conf: Path

    @property
    def host_key_pub(self) -> Path:
        return self.host_key.with_name(self.host_key.name + ".pub")

    def transport(self, **overrides: Any) -> Any:
        """An ``SSHTransport`` to this server; ``overrides`` replace its settings."""
        from recovery.schedulers.ssh_transport import SSHTransport

        settings: dict[str, Any] = {
            "user": "root",
            "port": self.port,
            "key_file": str(self.key_file),
            "known_hosts": str(self.known_hosts),
            "env": {"SLURM_CONF": str(self.slurm_conf)},
            "connect_timeout": 5.0,
        }
        settings.update(overrides)
        return SSHTransport(SSH_HOST, **settings)


def _run_ssh_script(script: Path, slurm_conf: Path) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "SSH_DEV_DIR": str(SSH_DIR),
        "SSH_DEV_PORT": str(SSH_PORT),
        "SLURM_CONF": str(slurm_conf),
    }
    return subprocess.run(
        [str(script)], env=env, capture_output=True, text=True, timeout=300, check=False
    )


@pytest.fixture(scope="session")
def ssh_server(slurm_cluster: SlurmCluster) -> Iterator[SSHServer]:
    """The cluster's login node over SSH.

    For 22.05 the session starts its own sshd on this host (deploy/ssh-dev/up.sh), by default in
    var/ssh-test on 127.0.0.1:2299 (``WR_TEST_SSH_DIR``, ``WR_TEST_SSH_PORT``), so it can run
    beside a developer's (var/ssh-dev, port 2222), gives every session the test cluster's
    SLURM_CONF, and stops it at the end. For 24.11 the login node is the sshd that
    deploy/slurm-dev/up.sh runs in the cluster's chroot, configured the same way; it comes and
    goes with the cluster.
    """
    if slurm_cluster.ssh is not None:  # 24.11: the chroot's sshd, up with the cluster
        assert slurm_cluster.ssh.host == SSH_HOST
        yield SSHServer(
            port=slurm_cluster.ssh.port,
            key_file=slurm_cluster.ssh.key_file,
            known_hosts=slurm_cluster.ssh.known_hosts,
            host_key=slurm_cluster.ssh.host_key,
            slurm_conf=slurm_cluster.conf,
        )
        return
    started = _run_ssh_script(SSH_UP, slurm_cluster.conf)
    if started.returncode != 0:
        stopped = _run_ssh_script(SSH_DOWN, slurm_cluster.conf)
        pytest.fail(
            f"deploy/ssh-dev/up.sh exited {started.returncode}:\n"
            f"{started.stdout}{started.stderr}{stopped.stdout}{stopped.stderr}",
            pytrace=False,
        )
    settings = exports(started.stdout)
    try:
        assert settings["SSH_DEV_PORT"] == str(SSH_PORT), started.stdout
        yield SSHServer(
            port=SSH_PORT,
            key_file=Path(settings["SSH_DEV_KEY"]),
            known_hosts=Path(settings["SSH_DEV_KNOWN_HOSTS"]),
            host_key=SSH_DIR / "ssh_host_ed25519_key",
            slurm_conf=slurm_cluster.conf,
        )
    finally:
        stopped = _run_ssh_script(SSH_DOWN, slurm_cluster.conf)
        assert stopped.returncode == 0, stopped.stdout + stopped.stderr
