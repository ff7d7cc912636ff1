"""The SSH transport against a real sshd and the real test clusters.

The sshd is the ``ssh_server`` fixture of tests/slurm_fixtures.py: for 22.05 one the session
starts on this host, for 24.11 the one in the cluster's chroot.
"""

from __future__ import annotations

import shlex
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from recovery.schedulers.base import JobInfo, SchedulerError
from recovery.schedulers.slurm import SlurmAdapter
from recovery.schedulers.ssh_transport import SSHTransport
from tests.slurm_fixtures import SSH_HOST as HOST
from tests.slurm_fixtures import SSHServer

pytestmark = pytest.mark.slurm

# Arguments a shell would split, expand, substitute or end a command at.
AWKWARD_ARGS = ["a b", "$(id)", ";", "`id`", "$HOME", "*", "'", '"', "\\", "a\nb", "&& false", ""]


@pytest.fixture
def transport(ssh_server: SSHServer) -> Iterator[SSHTransport]:
    transport = ssh_server.transport()
    yield transport
    transport.close()


def wait_for(
    adapter: SlurmAdapter, job_id: str, predicate: Callable[[JobInfo], bool], seconds: float = 30
) -> JobInfo:
    deadline = time.monotonic() + seconds
    job = None
    while time.monotonic() < deadline:
        job = adapter.get_job(job_id)
        if job is not None and predicate(job):
            return job
        time.sleep(0.3)
    raise AssertionError(f"job {job_id} did not reach the state in {seconds} s: {job}")


def tcp_connection(transport: SSHTransport) -> str:
    """The client address and port the server sees: the same for commands on one connection."""
    result = transport.run(["printenv", "SSH_CONNECTION"])
    assert result.ok, result.describe()
    return result.stdout.strip()


# ---------------------------------------------------------------------- the adapter over SSH


def test_the_adapter_over_ssh_lists_a_job_and_restarts_it_on_other_nodes(
    transport: SSHTransport, submit_job: Any
) -> None:
    adapter = SlurmAdapter(transport)
    submitted = submit_job()
    job_id = str(submitted.job_id)
    running = wait_for(adapter, job_id, lambda j: j.is_running)
    assert running.opt_in.opted_in
    assert (running.opt_in.environment, running.opt_in.mode) == ("test", "act")
    assert running.stdout_path == str(submitted.output)
    first_nodes = running.nodes
    assert first_nodes

    adapter.requeue(job_id, hold=True)
    requeued = wait_for(adapter, job_id, lambda j: j.native_state in {"PENDING", "COMPLETING"})
    assert requeued.restart_count == 1
    adapter.set_excluded_nodes(job_id, first_nodes)
    wait_for(adapter, job_id, lambda j: j.is_pending and j.held is True)
    adapter.release(job_id)
    # No clear_start_delay: the requeue delay (cred_expire + 1 s) keeps Slurm from starting the
    # job where slurmd still holds its revoked credential (see wait_until_pending).
    restarted = wait_for(adapter, job_id, lambda j: j.is_running)
    assert not set(restarted.nodes) & set(first_nodes)
    assert restarted.excluded_nodes == first_nodes
    assert restarted.restart_count == 1


def test_sftp_reads_the_job_output_from_an_offset(transport: SSHTransport, submit_job: Any) -> None:
    submitted = submit_job(env={"TOTAL_STEPS": "4", "STEP_SECONDS": "0.1"})
    deadline = time.monotonic() + 30
    seen = -1
    # Until the job has stopped writing: a read at the end must find nothing more.
    while not (submitted.output.exists() and seen == submitted.output.stat().st_size >= 200):
        assert time.monotonic() < deadline, "the job wrote no output, or never stopped"
        seen = submitted.output.stat().st_size if submitted.output.exists() else -1
        time.sleep(1.0)
    local = submitted.output.read_bytes()

    size = transport.file_size(str(submitted.output))
    assert size is not None and size >= len(local)
    assert transport.read_file(str(submitted.output), 0, 50) == local[:50]
    assert transport.read_file(str(submitted.output), 37, 100) == local[37:137]
    assert transport.read_file(str(submitted.output), size, 100) == b""
    missing = str(submitted.output.with_name("absent.log"))
    assert transport.file_size(missing) is None
    assert transport.read_file(missing, 0, 10) == b""


def test_sessions_get_slurm_conf_from_the_server_config(ssh_server: SSHServer) -> None:
    transport = ssh_server.transport(env=None)
    try:
        result = transport.run(["printenv", "SLURM_CONF"])
        assert result.stdout.strip() == str(ssh_server.slurm_conf)
        assert transport.run(["scontrol", "ping"]).stdout.count(" is UP") == 1
    finally:
        transport.close()


# ---------------------------------------------------------------------- refusals


def _never_ran(transport: SSHTransport, tmp_path: Path) -> str:
    marker = tmp_path / "ran"
    with pytest.raises(SchedulerError) as caught:
        transport.run(["touch", str(marker)])
    assert not marker.exists(), "a command ran although the connection was refused"
    assert transport._client is None
    return str(caught.value)


def test_a_changed_host_key_is_refused(ssh_server: SSHServer, tmp_path: Path) -> None:
    # Any other ed25519 key stands in for the server's "real" one: here, the client's key.
    _, other_key, _ = ssh_server.key_file.with_suffix(".pub").read_text().split(maxsplit=2)
    known_hosts = tmp_path / "known_hosts"
    known_hosts.write_text(f"[{HOST}]:{ssh_server.port} ssh-ed25519 {other_key}\n")

    transport = ssh_server.transport(known_hosts=str(known_hosts))
    message = _never_ran(transport, tmp_path)
    assert "does not match" in message
    assert "refused" in message
    server_key = ssh_server.host_key_pub.read_text().split()[1]
    assert server_key not in message  # fingerprints, not keys
    assert "SHA256:" in message


def test_an_unknown_host_is_refused(ssh_server: SSHServer, tmp_path: Path) -> None:
    known_hosts = tmp_path / "known_hosts"
    known_hosts.write_text("")
    transport = ssh_server.transport(known_hosts=str(known_hosts))
    message = _never_ran(transport, tmp_path)
    assert "is not in" in message
    assert "refused" in message
    # Nothing was added to known_hosts.
    assert known_hosts.read_text() == ""


def test_a_key_the_server_does_not_accept_fails_authentication(
    ssh_server: SSHServer, tmp_path: Path
) -> None:
    # The host's private key is a valid ed25519 key that is not in authorized_keys.
    wrong_key = tmp_path / "wrong_key"
    wrong_key.write_bytes(ssh_server.host_key.read_bytes())
    wrong_key.chmod(0o600)
    message = _never_ran(ssh_server.transport(key_file=str(wrong_key)), tmp_path)
    assert "authentication failed" in message
    assert f"root@{HOST}:{ssh_server.port}" in message
    assert str(wrong_key) in message

    missing = ssh_server.transport(key_file=str(tmp_path / "no_such_key"))
    assert "cannot read the SSH key" in _never_ran(missing, tmp_path)


# ---------------------------------------------------------------------- connection handling


def test_commands_share_one_connection_which_is_reopened_when_it_drops(
    transport: SSHTransport, tmp_path: Path
) -> None:
    first = tcp_connection(transport)
    ssh_transport = transport._client.get_transport()
    assert tcp_connection(transport) == first
    assert transport.file_size("/etc/hostname") is not None  # SFTP on the same connection
    assert transport._client.get_transport() is ssh_transport

    ssh_transport.close()
    second = tcp_connection(transport)
    assert second != first
    assert transport._client.get_transport() is not ssh_transport

    # The server ends the connection while a command runs: reported, not run again, and the
    # next command gets a new connection.
    runs = tmp_path / "runs"
    with pytest.raises(SchedulerError, match="may have run"):
        transport.run(["sh", "-c", f"echo run >> {shlex.quote(str(runs))}; kill $PPID; sleep 2"])
    assert runs.read_text() == "run\n"
    assert tcp_connection(transport) not in {first, second}


def test_a_slow_command_times_out_once_and_the_connection_stays_usable(
    transport: SSHTransport, tmp_path: Path
) -> None:
    runs = tmp_path / "runs"
    started = time.monotonic()
    with pytest.raises(SchedulerError, match="did not finish within 1 s"):
        transport.run(["sh", "-c", f"echo run >> {shlex.quote(str(runs))}; sleep 5"], timeout=1)
    assert time.monotonic() - started < 3
    assert runs.read_text() == "run\n"
    assert transport.run(["true"]).ok


def test_large_stdout_and_stderr_are_read_side_by_side(transport: SSHTransport) -> None:
    # More on stderr than the SSH window (2 MB) before anything on stdout.
    script = "head -c 3000000 /dev/zero | tr '\\0' e >&2; head -c 3000000 /dev/zero | tr '\\0' o"
    result = transport.run(["sh", "-c", script], timeout=20)
    assert result.ok
    assert (len(result.stdout), len(result.stderr)) == (3_000_000, 3_000_000)
    assert set(result.stdout) == {"o"} and set(result.stderr) == {"e"}


@pytest.mark.parametrize("env", [None, {"SLURM_CONF": "/x y/$(id)/slurm.conf"}])
def test_arguments_reach_the_remote_command_unchanged(
    ssh_server: SSHServer, env: dict[str, str] | None
) -> None:
    transport = ssh_server.transport(env=env)
    try:
        result = transport.run(["printf", "%s|", *AWKWARD_ARGS])
        assert result.ok, result.describe()
        assert result.stdout == "".join(f"{arg}|" for arg in AWKWARD_ARGS)
        assert transport.run(["sh", "-c", "exit 3"]).returncode == 3
        if env:
            assert transport.run(["printenv", "SLURM_CONF"]).stdout == env["SLURM_CONF"] + "\n"
    finally:
        transport.close()


@pytest.mark.django_db(transaction=True, reset_sequences=True)
def test_the_controller_in_ssh_mode_restarts_a_job_once(
    live_server: Any, ssh_server: SSHServer, transport: SSHTransport, submit_job: Any
) -> None:
    """
    GIVEN a ready restart for a running job, and a controller that reaches Slurm only by SSH
    WHEN it runs twice
    THEN the job restarts once on other nodes, and the report lists the commands it ran
    """
    from recovery.choices import ClusterMode, RecommendationStatus
    from recovery.controller.client import AdvisorClient
    from recovery.controller.controller import AdvisorController
    from recovery.models import Cluster, ControllerToken
    from tests.slurm.test_advisor_controller import (
        recommend_restart,
        running_job_with_checkpoint,
    )
    from tests.slurm.test_advisor_controller import wait_for as wait_for_job

    cluster = Cluster.objects.create(
        name="lab-ssh", mode=ClusterMode.ACTION, acknowledge_scheduler_actions=True
    )
    _, key = ControllerToken.issue(cluster, "ssh-advisor")
    adapter = SlurmAdapter(transport)
    controller = AdvisorController(AdvisorClient(live_server.url, key), adapter, poll_seconds=0.2)
    _, job = running_job_with_checkpoint(submit_job, adapter)
    recommendation = recommend_restart(cluster, job, RecommendationStatus.READY)

    assert controller.run_once() == [(recommendation.pk, "executed")]
    assert controller.run_once() == []
    restarted = wait_for_job(adapter, job.job_id, lambda j: j.is_running and j.restart_count == 1)
    assert not set(restarted.nodes) & set(job.nodes)
    recommendation.refresh_from_db()
    assert recommendation.result["converged"] is True
    assert recommendation.result["commands"][0]["argv"][:2] == ["scontrol", "requeuehold"]
