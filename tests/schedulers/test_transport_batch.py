"""Many job output files at once: ``output_sizes`` and ``open_outputs``, on this host and over
SFTP against the real sshd of the SSH tests (the 24.11 chroot's, or the one beside 22.05).

A batch applies every rule ``open_output`` applies (``output_files``): each refusal is tested
here through the batch, beside a file the same batch reads, so that one file refused never fails
the others. Over SFTP a batch costs a few pipelined exchanges and keeps its connection.
"""

from __future__ import annotations

import os
import stat
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from recovery.schedulers.base import SchedulerError, Transport
from recovery.schedulers.output_files import (
    OutputAccess,
    OutputRefusal,
    OutputRefused,
    PrefetchedOutput,
)
from recovery.schedulers.sftp_batch import BATCH_FILES, READ_REQUEST
from recovery.schedulers.ssh_transport import SSHTransport
from recovery.schedulers.transport import LocalTransport
from tests.slurm_fixtures import SSHServer

TENANT = 12345  # the job's user
OTHER = 23456  # another user
LIMIT = 64 * 1024


@dataclass
class Run:
    """A job's working directory owned by the tenant, and another user's home beside it."""

    root: Path
    run: Path
    victim: Path

    @property
    def access(self) -> OutputAccess:
        return OutputAccess(TENANT, (str(self.run),))

    def put(self, name: str, text: str | bytes = "step 1\n", *, owner: int = TENANT) -> str:
        path = self.run / name
        path.parent.mkdir(parents=True, exist_ok=True)
        os.chown(path.parent, owner, owner)
        if isinstance(text, str):
            path.write_text(text)
        else:
            path.write_bytes(text)
        os.chown(path, owner, owner)
        return str(path)


@pytest.fixture
def run(tmp_path: Path) -> Run:
    run = tmp_path / "home" / "mallory" / "run"
    run.mkdir(parents=True)
    for directory in (run, run.parent):
        os.chown(directory, TENANT, TENANT)
    victim = tmp_path / "home" / "victor"
    victim.mkdir()
    secret = victim / "secret.log"
    secret.write_text("API_TOKEN=victor-secret\n")
    os.chown(secret, OTHER, OTHER)
    return Run(root=tmp_path, run=run, victim=victim)


@pytest.fixture
def sftp(ssh_server: SSHServer) -> Iterator[SSHTransport]:
    over_ssh: SSHTransport = ssh_server.transport()
    yield over_ssh
    over_ssh.close()


def prefetched(outcome: object) -> PrefetchedOutput:
    assert isinstance(outcome, PrefetchedOutput), outcome
    return outcome


def refused(outcome: object, reason: OutputRefusal, *words: str) -> None:
    assert isinstance(outcome, OutputRefused), outcome
    assert outcome.reason == reason
    for word in words:
        assert word in outcome.detail, outcome.detail
    assert "victor-secret" not in str(outcome)


class TestOnThisHost:
    """The rules and the read-ahead on this host (``LocalTransport``); ``TestOverSFTP`` runs
    the same tests over SFTP."""

    @pytest.fixture
    def transport(self) -> Transport:
        return LocalTransport()

    # ------------------------------------------------------------------ reading ahead

    def test_it_reads_each_file_ahead_from_its_offset(self, run: Run, transport: Transport) -> None:
        fresh = run.put("fresh.log", "step 1\nstep 2\n")
        grown = run.put("grown.log", "old line\nnew line\n")
        idle = run.put("idle.log", "all read\n")
        outcomes = transport.open_outputs({fresh: 0, grown: 9, idle: 9}, run.access, LIMIT)
        assert list(outcomes) == [fresh, grown, idle]
        first, second, third = (prefetched(outcomes[path]) for path in (fresh, grown, idle))
        assert (first.size, first.start, first.prefetched) == (14, 0, b"step 1\nstep 2\n")
        assert (second.start, second.prefetched) == (9, b"new line\n")
        assert third.prefetched == b""
        # What the poller asks for (4 MiB from its cursor) is answered by what was read ahead.
        assert second.read(9, 4 * 1024 * 1024) == b"new line\n"
        assert second.read(13, 3) == b"lin"
        assert third.read(9, 4 * 1024 * 1024) == b""

    def test_a_file_shorter_than_its_offset_is_read_from_the_start(
        self, run: Run, transport: Transport
    ) -> None:
        """A truncated file (a restart without --open-mode=append) is read again from 0."""
        path = run.put("train.log", "restarted\n")
        output = prefetched(transport.open_outputs({path: 5000}, run.access, LIMIT)[path])
        assert (output.size, output.start, output.prefetched) == (10, 0, b"restarted\n")
        assert output.read(0, 100) == b"restarted\n"

    def test_a_read_beyond_what_was_read_ahead_goes_back_to_the_file(
        self, run: Run, transport: Transport
    ) -> None:
        body = b"".join(b"line %06d of a long burst\n" % number for number in range(8000))
        path = run.put("burst.log", body)
        output = prefetched(transport.open_outputs({path: 100}, run.access, LIMIT)[path])
        assert output.size == len(body)
        assert output.prefetched == body[100 : 100 + LIMIT]
        assert output.read(100, 4 * 1024 * 1024) == body[100:]
        assert output.read(0, 10) == body[:10]
        assert output.read(len(body) - 5, 100) == body[-5:]

    def test_nothing_read_ahead_with_a_limit_of_zero(self, run: Run, transport: Transport) -> None:
        path = run.put("train.log", "step 1\n")
        output = prefetched(transport.open_outputs({path: 0}, run.access, 0)[path])
        assert output.prefetched == b""
        assert output.read(0, 100) == b"step 1\n"

    def test_files_absent_or_on_a_missing_way_are_none(
        self, run: Run, transport: Transport
    ) -> None:
        present = run.put("train.log")
        run.put("plain-file", "not a directory\n")
        wanted = {
            present: 0,
            str(run.run / "missing.log"): 0,
            str(run.run / "no-such-dir" / "train.log"): 0,
            str(run.run / "plain-file" / "train.log"): 0,
        }
        outcomes = transport.open_outputs(wanted, run.access, LIMIT)
        assert prefetched(outcomes.pop(present)).prefetched == b"step 1\n"
        assert outcomes == dict.fromkeys(outcomes)

    def test_each_file_is_checked_against_its_own_jobs_rules(
        self, tmp_path: Path, transport: Transport
    ) -> None:
        """One batch for every job of a sweep: each path has its job's owner and directories."""
        first = tmp_path / "alice" / "train.log"
        second = tmp_path / "bob" / "train.log"
        for path, uid in ((first, 20001), (second, 20002)):
            path.parent.mkdir()
            path.write_text(f"uid {uid}\n")
            os.chown(path, uid, uid)
        accesses = {
            str(first): OutputAccess(20001, (str(first.parent),)),
            str(second): OutputAccess(20001, (str(second.parent),)),  # not bob's uid
        }
        outcomes = transport.open_outputs({str(first): 0, str(second): 0}, accesses, LIMIT)
        assert prefetched(outcomes[str(first)]).prefetched == b"uid 20001\n"
        refused(outcomes[str(second)], OutputRefusal.OTHER_OWNER, "uid 20002")

    # ------------------------------------------------------------------ every refusal, batched

    def test_every_refusal_holds_in_a_batch_and_fails_no_other_file(
        self, run: Run, transport: Transport
    ) -> None:
        own = run.put("train.log", "own output\n")
        link = run.run / "link.log"
        link.symlink_to(run.victim / "secret.log")
        (run.run / "logs").symlink_to(run.victim)
        through_link = run.run / "logs" / "secret.log"
        other_owner = run.put("planted.log", "API_TOKEN=victor-secret\n", owner=OTHER)
        fifo = run.run / "pipe.log"
        os.mkfifo(fifo)
        os.chown(fifo, TENANT, TENANT)
        device = run.run / "null.log"
        os.mknod(device, stat.S_IFCHR | 0o600, os.makedev(1, 3))
        os.chown(device, TENANT, TENANT)
        directory = run.run / "a-directory.log"
        directory.mkdir()
        os.chown(directory, TENANT, TENANT)
        outside = str(run.victim / "secret.log")
        wanted = {
            own: 0,
            str(link): 0,
            str(through_link): 0,
            other_owner: 0,
            str(fifo): 0,
            str(device): 0,
            str(directory): 0,
            outside: 0,
            "relative/train.log": 0,
            str(run.run / ".." / "victor" / "secret.log"): 0,
        }
        began = time.monotonic()
        outcomes = transport.open_outputs(wanted, run.access, LIMIT)
        assert time.monotonic() - began < 10, "the FIFO blocked the batch"
        assert prefetched(outcomes[own]).prefetched == b"own output\n"
        refused(outcomes[str(link)], OutputRefusal.SYMLINK, f"{link} is a symbolic link")
        refused(outcomes[str(through_link)], OutputRefusal.SYMLINK, f"{run.run / 'logs'} is a")
        refused(outcomes[other_owner], OutputRefusal.OTHER_OWNER, f"uid {OTHER}")
        refused(outcomes[str(fifo)], OutputRefusal.NOT_A_FILE, "a FIFO")
        refused(outcomes[str(device)], OutputRefusal.NOT_A_FILE, "a character device")
        refused(outcomes[str(directory)], OutputRefusal.NOT_A_FILE, "a directory")
        refused(outcomes[outside], OutputRefusal.OUTSIDE, "allowed:")
        refused(outcomes["relative/train.log"], OutputRefusal.BAD_PATH)
        refused(outcomes[str(run.run / ".." / "victor" / "secret.log")], OutputRefusal.BAD_PATH)

    def test_a_working_directory_reached_through_a_link_admits_nothing(
        self, run: Run, transport: Transport
    ) -> None:
        alias = run.run.parent / "alias"
        alias.symlink_to(run.victim)
        path = str(alias / "secret.log")
        outcomes = transport.open_outputs({path: 0}, OutputAccess(TENANT, (str(alias),)), LIMIT)
        refused(outcomes[path], OutputRefusal.SYMLINK, f"{alias} is a symbolic link")

    def test_an_unknown_owner_reads_nothing(self, run: Run, transport: Transport) -> None:
        path = run.put("train.log")
        outcomes = transport.open_outputs({path: 0}, OutputAccess(None, (str(run.run),)), LIMIT)
        refused(outcomes[path], OutputRefusal.OWNER_UNKNOWN)

    def test_a_file_swapped_for_a_link_after_the_batch_is_not_read_through_it(
        self, run: Run, transport: Transport
    ) -> None:
        """A read beyond what was read ahead opens the file again, under the same checks."""
        path = run.put("train.log", "x" * (LIMIT + 10))
        output = prefetched(transport.open_outputs({path: 0}, run.access, LIMIT)[path])
        Path(path).unlink()
        Path(path).symlink_to(run.victim / "secret.log")
        assert output.read(0, 100) == b"x" * 100  # inside what was read ahead
        with pytest.raises(SchedulerError, match="symbolic link"):
            output.read(0, 4 * 1024 * 1024)

    def test_open_output_is_a_batch_of_one_with_the_same_rules(
        self, run: Run, transport: Transport
    ) -> None:
        path = run.put("train.log", "step 1\nstep 2\n")
        output = transport.open_output(path, run.access)
        assert output is not None
        try:
            assert output.size == 14
            assert output.read(7, 4 * 1024 * 1024) == b"step 2\n"
            assert output.read(0, 4) == b"step"
        finally:
            output.close()
        link = run.run / "link.log"
        link.symlink_to(run.victim / "secret.log")
        with pytest.raises(OutputRefused) as raised:
            transport.open_output(str(link), run.access)
        assert raised.value.reason == OutputRefusal.SYMLINK
        assert transport.open_output(str(run.run / "missing.log"), run.access) is None

    # ------------------------------------------------------------------ sizes

    def test_output_sizes_looks_at_links_themselves(self, run: Run, transport: Transport) -> None:
        path = run.put("train.log", "12345\n")
        link = run.run / "link.log"
        link.symlink_to(run.victim / "secret.log")
        missing = str(run.run / "missing.log")
        paths = [path, str(link), missing, "relative.log", "/nul\x00byte"]
        sizes = transport.output_sizes(paths)
        assert list(sizes) == paths
        assert sizes[path] == 6
        assert sizes[str(link)] == len(str(run.victim / "secret.log"))  # the link's own size
        assert sizes[missing] is None
        assert sizes["relative.log"] is None
        assert sizes["/nul\x00byte"] is None
        assert transport.output_sizes([]) == {}


@pytest.mark.slurm
class TestOverSFTP(TestOnThisHost):
    @pytest.fixture
    def transport(self, ssh_server: SSHServer) -> Iterator[Transport]:
        over_ssh = ssh_server.transport()
        yield over_ssh
        over_ssh.close()


# ---------------------------------------------------------------------- over SFTP


def requests_of(monkeypatch: pytest.MonkeyPatch, transport: SSHTransport) -> Counter[str]:
    """Counts the SFTP requests ``transport`` sends from now on, by type."""
    from paramiko.sftp import CMD_NAMES

    sent: Counter[str] = Counter()
    client = transport._sftp_client()
    send = client._async_request

    def counting(fileobj: Any, kind: int, *arguments: Any) -> int:
        sent[CMD_NAMES[kind]] += 1
        return int(send(fileobj, kind, *arguments))

    monkeypatch.setattr(client, "_async_request", counting)
    return sent


@pytest.mark.slurm
def test_sftp_looks_at_a_shared_directory_once_per_batch(
    run: Run, sftp: SSHTransport, monkeypatch: pytest.MonkeyPatch
) -> None:
    count = BATCH_FILES + 44  # more than one chunk
    paths = [run.put(f"jobs/{number}.out", f"job {number}\n") for number in range(count)]
    depth = len(Path(paths[0]).parts) - 1  # directories on the way, / left out
    sent = requests_of(monkeypatch, sftp)
    outcomes = sftp.open_outputs(dict.fromkeys(paths, 0), run.access, LIMIT)
    for number, path in enumerate(paths):
        assert prefetched(outcomes[path]).prefetched == f"job {number}\n".encode()
    assert sent == {
        "lstat": depth - 1 + count,
        "open": count,
        "fstat": count,
        "read": count,
        "close": count,
    }
    sent.clear()
    sizes = sftp.output_sizes(paths)
    assert sent == {"lstat": count}
    assert set(sizes.values()) == {len("job 1\n"), len("job 10\n"), len("job 100\n")}


@pytest.mark.slurm
def test_sftp_reads_a_large_read_ahead_in_pipelined_requests(
    run: Run, sftp: SSHTransport, monkeypatch: pytest.MonkeyPatch
) -> None:
    body = os.urandom(3 * READ_REQUEST + 17)
    path = run.put("burst.log", body)
    sent = requests_of(monkeypatch, sftp)
    output = prefetched(sftp.open_outputs({path: 0}, run.access, len(body))[path])
    assert output.prefetched == body
    assert sent["read"] == 4
    assert output.read(0, 4 * 1024 * 1024) == body


@pytest.mark.slurm
def test_sftp_sweeps_keep_one_connection_and_one_session(run: Run, ssh_server: SSHServer) -> None:
    """The poller keeps its transport per process: sweep after sweep goes over the one SSH
    connection and SFTP session it opened first, as the server's own log confirms."""
    log = ssh_server.host_key.parent / "sshd.log"
    accepted_before = log.read_text().count("Accepted publickey")
    paths = [run.put(f"jobs/{number}.out", "step 0\n") for number in range(20)]
    offsets = dict.fromkeys(paths, 0)
    transport = ssh_server.transport()
    try:
        for sweep in range(5):
            for path in paths[sweep::5]:
                with Path(path).open("a") as handle:
                    handle.write(f"step {sweep + 1}\n")
            sizes = transport.output_sizes(paths)
            grown = {path: offsets[path] for path in paths if (sizes[path] or 0) > offsets[path]}
            assert len(grown) == (20 if sweep == 0 else 4)
            for path, outcome in transport.open_outputs(grown, run.access, LIMIT).items():
                output = prefetched(outcome)
                offsets[path] += len(output.read(offsets[path], 4 * 1024 * 1024))
                output.close()
        assert (transport.connections_opened, transport.sftp_sessions_opened) == (1, 1)
    finally:
        transport.close()
    assert log.read_text().count("Accepted publickey") - accepted_before == 1


@pytest.mark.slurm
def test_sftp_reconnects_once_when_the_connection_dropped(run: Run, sftp: SSHTransport) -> None:
    path = run.put("train.log", "step 1\n")
    assert sftp.output_sizes([path]) == {path: 7}
    sftp._client.get_transport().close()  # the connection drops between two polls
    outcomes = sftp.open_outputs({path: 0}, run.access, LIMIT)
    assert prefetched(outcomes[path]).prefetched == b"step 1\n"
    assert sftp.connections_opened == 2
    sftp._client.get_transport().close()
    assert sftp.output_sizes([path]) == {path: 7}
    assert sftp.connections_opened == 3


@pytest.mark.slurm
def test_sftp_without_a_server_is_a_scheduler_error(run: Run, ssh_server: SSHServer) -> None:
    path = run.put("train.log")
    nowhere = ssh_server.transport(port=1, connect_timeout=2.0)
    with pytest.raises(SchedulerError, match="cannot reach"):
        nowhere.output_sizes([path])
    with pytest.raises(SchedulerError, match="cannot reach"):
        nowhere.open_outputs({path: 0}, run.access, LIMIT)


@pytest.mark.slurm
def test_the_ssh_sweep_bench_reads_every_line_once(tmp_path: Path, ssh_server: SSHServer) -> None:
    """``make bench-ssh``'s sweep, short: 50 files, a writer appending, a 1 ms proxy delay."""
    import multiprocessing

    from bench import ssh_sweep

    files = ssh_sweep.make_files(tmp_path / "home", 50, seed=3)
    sweeper = ssh_sweep.Sweeper(files)
    context = multiprocessing.get_context("fork")
    stop = context.Event()
    writer = context.Process(
        target=ssh_sweep.write_lines, args=([(f.path, f.kind) for f in files], 4, stop)
    )
    writer.start()
    try:
        with ssh_sweep.delaying_proxy(ssh_server.port, 1.0) as port:
            known_hosts = ssh_sweep.known_hosts_for(
                port, ssh_server.known_hosts, ssh_server.port, tmp_path / "known_hosts"
            )
            transport = ssh_server.transport(port=port, known_hosts=str(known_hosts))
            try:
                sweeps = []
                for _ in range(6):
                    sweeps.append(sweeper.sweep(transport))
                    time.sleep(0.5)
                per_file = ssh_sweep.reference(transport, sweeper, files[:5])
                stop.set()
                writer.join(10)
                assert sweeper.settled(transport) == []
                assert (transport.connections_opened, transport.sftp_sessions_opened) == (1, 1)
            finally:
                transport.close()
    finally:
        stop.set()
        writer.join(10)
        if writer.is_alive():
            writer.terminate()
    assert sum(sweep.grown for sweep in sweeps) > 0
    assert sum(sweep.bytes for sweep in sweeps) > 0
    assert all(sweep.refused == 0 for sweep in sweeps)
    assert per_file > 0.002  # at least the round trip the proxy adds
