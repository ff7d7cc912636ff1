"""``make bench-ssh``: a thousand job output files swept over SSH, as the poller reads them.

Against the real login node of the Slurm 24.11 test cluster: deploy/slurm-dev/up.sh starts it in
its Debian 13 chroot (built on first use) with its sshd on 127.0.0.1, in var/slurm-ssh-bench on
ports 17520-17524 and 2520 (``WR_BENCH_SSH_SLURM_DIR``, ``..._CTLD_PORT``, ``..._NODE_PORT``,
``..._SSH_PORT`` move it), and stops it at the end unless it was up already.

The files lie in var/ssh-bench/home/<user>/runs/<job>/ (the repository is mounted at the same
place in the chroot), owned by four job users. A writer process appends lines as jobs print
them: most files a progress line every 2 to 6 s, some never (idle), a few in bursts of hundreds
of lines. Each sweep, every ``--interval`` seconds, does what a poll does with the batch calls:
``output_sizes`` of every file, then ``open_outputs`` of those that grew, reading the complete
lines since each file's offset. The network round trip of a remote login node is added by a TCP
proxy on loopback in front of the sshd that holds every chunk for the delay, each way. (``tc
netem`` would need the sshd and the bench in a network namespace of their own; the bench only
prints whether this kernel has it.)

The reference, measured in the same run over the same delay on a sample of the files: the way
output files were read before the batch calls (one file after another: an ``lstat`` per
directory, ``lstat``, open, ``fstat``, read, close, each a round trip), extrapolated to all the
files, since the poller opened every file at every poll. Figures go to var/bench/ssh.json and,
under ``ssh_sweep``, into var/bench/scale.json.
"""

from __future__ import annotations

import argparse
import contextlib
import heapq
import json
import math
import multiprocessing
import os
import random
import shlex
import shutil
import socket
import stat
import statistics
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from recovery.schedulers.output_files import (
    OutputAccess,
    OutputRefused,
    check_file,
    joined,
)
from recovery.schedulers.ssh_transport import SSHTransport

ROOT = Path(__file__).resolve().parent.parent
WORK = ROOT / "var" / "ssh-bench"
RESULTS = ROOT / "var" / "bench" / "ssh.json"
SCALE_RESULTS = ROOT / "var" / "bench" / "scale.json"
UP = ROOT / "deploy" / "slurm-dev" / "up.sh"
DOWN = ROOT / "deploy" / "slurm-dev" / "down.sh"
CLUSTER_ENV = {
    "SLURM_DEV_VERSION": "24.11",
    "SLURM_DEV_DIR": str(ROOT / os.environ.get("WR_BENCH_SSH_SLURM_DIR", "var/slurm-ssh-bench")),
    "SLURM_DEV_CTLD_PORT": os.environ.get("WR_BENCH_SSH_CTLD_PORT", "17520"),
    "SLURM_DEV_NODE_PORT": os.environ.get("WR_BENCH_SSH_NODE_PORT", "17521"),
    "SLURM_DEV_SSH_PORT": os.environ.get("WR_BENCH_SSH_SSH_PORT", "2520"),
}
JOB_UIDS = (42001, 42002, 42003, 42004)
# What a sweep reads ahead of each grown file, and what the poller asks of a file at once
# (MAX_READ_BYTES in recovery/loop/logs.py).
READ_AHEAD = 64 * 1024
READ_BYTES = 4 * 1024 * 1024
TARGET_SWEEP_S = 2.0
IDLE_SHARE = 0.15
BURST_SHARE = 0.05

PROGRESS = (
    " iteration {step:8d}/ 2500000 | consumed samples: {samples:12d} | elapsed time per "
    "iteration (ms): {ms:.1f} | learning rate: 2.999E-04 | global batch size:  1024 | lm loss: "
    "{loss:.6E} | loss scale: 1.0 | grad norm: {gnorm:.3f} |\n"
)
BURST = (
    "gpu-{node:03d}:{pid}:{pid} [{gpu}] NCCL INFO Channel {channel:02d}/32 : {rank} -> {peer} "
    "via P2P/IPC/read\n"
)


# ---------------------------------------------------------------------- the job files


@dataclass(frozen=True)
class JobFile:
    path: str
    uid: int
    work_dir: str
    # "steady" (a line every few seconds), "idle" (nothing) or "burst" (hundreds at once).
    kind: str

    @property
    def access(self) -> OutputAccess:
        return OutputAccess(self.uid, (self.work_dir,))


def progress_line(rng: random.Random, step: int) -> bytes:
    return PROGRESS.format(
        step=step,
        samples=step * 1024,
        ms=rng.uniform(900, 1100),
        loss=rng.uniform(1.5, 3.0),
        gnorm=rng.uniform(0.1, 2.0),
    ).encode()


def burst_lines(rng: random.Random, count: int) -> bytes:
    pid = rng.randint(1000, 99999)
    return b"".join(
        BURST.format(
            node=rng.randint(1, 512),
            pid=pid,
            gpu=rng.randint(0, 7),
            channel=rng.randint(0, 31),
            rank=rng.randint(0, 4095),
            peer=rng.randint(0, 4095),
        ).encode()
        for _ in range(count)
    )


def make_files(root: Path, count: int, seed: int) -> list[JobFile]:
    """``count`` job output files with some output already, owned by their job's user."""
    rng = random.Random(seed)
    shutil.rmtree(root, ignore_errors=True)
    files = []
    for number in range(count):
        uid = JOB_UIDS[number % len(JOB_UIDS)]
        home = root / f"u{uid}"
        work_dir = home / "runs" / f"job-{number:04d}"
        work_dir.mkdir(parents=True, exist_ok=True)
        for directory in (home, home / "runs", work_dir):
            os.chown(directory, uid, uid)
        path = work_dir / f"slurm-{number:04d}.out"
        path.write_bytes(b"".join(progress_line(rng, step) for step in range(20)))
        os.chown(path, uid, uid)
        draw = rng.random()
        kind = "idle" if draw < IDLE_SHARE else "burst" if draw < IDLE_SHARE + BURST_SHARE else ""
        files.append(JobFile(str(path), uid, str(work_dir), kind or "steady"))
    return files


def write_lines(files: Sequence[tuple[str, str]], seed: int, stop: Any) -> None:
    """Appends to ``(path, kind)`` files as their jobs would, until ``stop`` is set."""
    rng = random.Random(seed)
    with contextlib.ExitStack() as stack:
        handles = {
            path: stack.enter_context(Path(path).open("ab", buffering=0)) for path, _ in files
        }
        steps = dict.fromkeys(handles, 20)
        now = time.monotonic()
        due = [(now + rng.uniform(0, 6), path, kind) for path, kind in files if kind != "idle"]
        heapq.heapify(due)
        while due and not stop.is_set():
            at, path, kind = heapq.heappop(due)
            wait = at - time.monotonic()
            if wait > 0 and stop.wait(wait):
                break
            if kind == "burst":
                # NCCL's setup, a traceback, an evaluation: sometimes more than a read-ahead.
                lines = rng.choice((50, 200, 400, 1500))
                handles[path].write(burst_lines(rng, lines))
                heapq.heappush(due, (at + rng.uniform(8, 20), path, kind))
            else:
                steps[path] += 1
                handles[path].write(progress_line(rng, steps[path]))
                heapq.heappush(due, (at + rng.uniform(2, 6), path, kind))


# ---------------------------------------------------------------------- the added delay


def netem_refusal() -> str | None:
    """Why ``tc netem`` cannot delay a network namespace's loopback here, or None when it can."""
    if os.geteuid() != 0 or not shutil.which("ip") or not shutil.which("tc"):
        return "needs root, ip and tc"
    namespace = f"wr-ssh-bench-probe-{os.getpid()}"
    added = subprocess.run(["ip", "netns", "add", namespace], capture_output=True, text=True)
    if added.returncode != 0:
        return f"ip netns add: {added.stderr.strip()}"
    try:
        delayed = subprocess.run(
            ["tc", "-n", namespace, "qdisc", "add", "dev", "lo", "root", "netem", "delay", "2ms"],
            capture_output=True,
            text=True,
        )
        return None if delayed.returncode == 0 else f"tc netem: {delayed.stderr.strip()}"
    finally:
        subprocess.run(["ip", "netns", "del", namespace], capture_output=True)


class _DelayedPipe:
    """One direction of a proxied connection: every chunk received is sent ``delay`` later."""

    def __init__(self, source: socket.socket, target: socket.socket, delay: float) -> None:
        self.source = source
        self.target = target
        self.delay = delay
        self.chunks: deque[tuple[float, bytes]] = deque()
        self.ready = threading.Condition()

    def start(self) -> None:
        for run in (self._receive, self._send):
            threading.Thread(target=run, daemon=True).start()

    def _receive(self) -> None:
        while True:
            try:
                data = self.source.recv(256 * 1024)
            except OSError:
                data = b""
            with self.ready:
                self.chunks.append((time.monotonic() + self.delay, data))
                self.ready.notify()
            if not data:
                return

    def _send(self) -> None:
        while True:
            with self.ready:
                while not self.chunks:
                    self.ready.wait()
                due, data = self.chunks.popleft()
            wait = due - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            try:
                if not data:
                    self.target.shutdown(socket.SHUT_WR)
                    return
                self.target.sendall(data)
            except OSError:
                return


def relay(listener: socket.socket, upstream: tuple[str, int], delay: float) -> None:
    """Accepts connections on ``listener`` and relays each to ``upstream``, both ways delayed."""
    while True:
        client, _ = listener.accept()
        server = socket.create_connection(upstream)
        for end in (client, server):
            end.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        _DelayedPipe(client, server, delay).start()
        _DelayedPipe(server, client, delay).start()


@contextlib.contextmanager
def delaying_proxy(upstream_port: int, delay_ms: float) -> Iterator[int]:
    """A proxy process on a free loopback port that delays each chunk ``delay_ms`` each way."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    context = multiprocessing.get_context("fork")
    process = context.Process(
        target=relay, args=(listener, ("127.0.0.1", upstream_port), delay_ms / 1000), daemon=True
    )
    process.start()
    port = int(listener.getsockname()[1])
    listener.close()
    try:
        yield port
    finally:
        process.terminate()
        process.join(10)


# ---------------------------------------------------------------------- sweeps


@dataclass
class Sweep:
    seconds: float
    sizes_seconds: float
    client_cpu_seconds: float
    grown: int
    bytes: int
    refused: int = 0


@dataclass
class Sweeper:
    """The poller's view of the files: the offset up to which each was read."""

    files: Sequence[JobFile]
    offsets: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.offsets:
            self.offsets = {job.path: Path(job.path).stat().st_size for job in self.files}
        self.accesses: Mapping[str, OutputAccess] = {job.path: job.access for job in self.files}

    def sweep(self, transport: SSHTransport) -> Sweep:
        """``output_sizes`` of every file, then ``open_outputs`` of the grown ones, reading the
        complete lines since each offset, as ``read_new_lines`` does."""
        began, cpu = time.perf_counter(), time.process_time()
        sizes = transport.output_sizes([job.path for job in self.files])
        sized = time.perf_counter()
        grown = {
            path: self.offsets[path]
            for path, size in sizes.items()
            if size is not None and size != self.offsets[path]
        }
        read = refused = 0
        for path, outcome in transport.open_outputs(grown, self.accesses, READ_AHEAD).items():
            if outcome is None or isinstance(outcome, OutputRefused):
                refused += 1
                continue
            read += self._consume(path, outcome.size, outcome.read)
            outcome.close()
        return Sweep(
            seconds=time.perf_counter() - began,
            sizes_seconds=sized - began,
            client_cpu_seconds=time.process_time() - cpu,
            grown=len(grown),
            bytes=read,
            refused=refused,
        )

    def _consume(self, path: str, size: int, read: Any) -> int:
        offset = self.offsets[path] if self.offsets[path] <= size else 0
        data = read(offset, READ_BYTES)
        cut = data.rfind(b"\n") + 1
        self.offsets[path] = offset + cut
        return int(cut)

    def settled(self, transport: SSHTransport) -> list[str]:
        """Sweeps until nothing grows (the writer stopped); the files whose offset is then not
        their size (read twice, or not at all)."""
        for _ in range(20):
            if self.sweep(transport).grown == 0:
                break
        return [
            job.path
            for job in self.files
            if Path(job.path).stat().st_size != self.offsets[job.path]
        ]


def old_open_and_read(sftp: Any, job: JobFile, offset: int) -> bytes:
    """How a file was read before the batch calls: each step its own round trip."""
    names = job.access.admit(job.path)
    for depth in range(1, len(names)):
        mode = sftp.lstat(joined(names[:depth])).st_mode
        if mode is None or stat.S_ISLNK(mode) or not stat.S_ISDIR(mode):
            raise AssertionError(f"{joined(names[:depth])} is not a plain directory")
    seen = sftp.lstat(job.path)
    check_file(job.path, seen.st_mode, seen.st_uid, job.uid)
    with sftp.open(job.path, "rb") as handle:
        opened = handle.stat()
        check_file(job.path, opened.st_mode, opened.st_uid, job.uid)
        size = int(opened.st_size or 0)
        handle.seek(offset if offset <= size else 0)
        return bytes(handle.read(READ_BYTES))


def reference(transport: SSHTransport, sweeper: Sweeper, sample: Sequence[JobFile]) -> float:
    """Seconds per file the old way, over ``sample``, every file opened as the old poll did."""
    sftp = transport._sftp_client()
    began = time.perf_counter()
    for job in sample:
        data = old_open_and_read(sftp, job, sweeper.offsets[job.path])
        sweeper.offsets[job.path] += data.rfind(b"\n") + 1
    return (time.perf_counter() - began) / len(sample)


def percentile(values: Sequence[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[max(0, math.ceil(share * len(ordered)) - 1)]


# ---------------------------------------------------------------------- the cluster


def exports(output: str) -> dict[str, str]:
    settings = {}
    for line in output.splitlines():
        words = shlex.split(line)
        if len(words) == 2 and words[0] == "export" and "=" in words[1]:
            name, _, value = words[1].partition("=")
            settings[name] = value
    return settings


def start_cluster() -> tuple[dict[str, str], bool]:
    """The cluster's exported settings, and whether this start brought it up."""
    print("starting the Slurm 24.11 cluster and its sshd (a first start builds the chroot) ...")
    started = subprocess.run(
        [str(UP)], env={**os.environ, **CLUSTER_ENV}, capture_output=True, text=True, check=False
    )
    if started.returncode != 0:
        raise SystemExit(f"deploy/slurm-dev/up.sh failed:\n{started.stdout}{started.stderr}")
    return exports(started.stdout), "is already up" not in started.stderr


def stop_cluster() -> None:
    subprocess.run([str(DOWN)], env={**os.environ, **CLUSTER_ENV}, capture_output=True, check=False)


def known_hosts_for(port: int, known_hosts: Path, ssh_port: int, target: Path) -> Path:
    """``target``, a known_hosts naming the login node's key at ``port`` (the proxy in front)."""
    lines = known_hosts.read_text().splitlines()
    ours = [line for line in lines if line.startswith(f"[127.0.0.1]:{ssh_port} ")]
    target.write_text(
        "".join(line.replace(f":{ssh_port} ", f":{port} ", 1) + "\n" for line in ours)
    )
    return target


def server_version(port: int) -> str:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as connection:
        return connection.recv(256).decode(errors="replace").strip()


# ---------------------------------------------------------------------- the run


def run(args: argparse.Namespace) -> dict[str, Any]:
    settings, started = start_cluster()
    ssh_port = int(settings["SLURM_DEV_SSH_PORT"])
    key = settings["SLURM_DEV_SSH_KEY"]
    known_hosts = Path(settings["SLURM_DEV_SSH_KNOWN_HOSTS"])
    context = multiprocessing.get_context("fork")
    writer = None
    stop = context.Event()
    try:
        refusal = netem_refusal()
        method = "loopback TCP proxy"
        login_node = server_version(ssh_port)
        print(f"login node: {login_node} in the chroot on 127.0.0.1:{ssh_port}")
        files = make_files(WORK / "home", args.files, args.seed)
        kinds = {
            kind: sum(job.kind == kind for job in files) for kind in ("steady", "idle", "burst")
        }
        print(
            f"{len(files)} output files of {len(JOB_UIDS)} job users in {WORK / 'home'}: "
            f"{kinds['steady']} with a line every 2-6 s, {kinds['idle']} idle, {kinds['burst']} "
            f"bursting (50-1,500 lines every 8-20 s); {os.cpu_count()} cores shared by all"
        )
        netem = "available, not used" if refusal is None else f"not available ({refusal})"
        print(f"tc netem: {netem}; the delay is a {method}")
        sweeper = Sweeper(files)
        writer = context.Process(
            target=write_lines,
            args=([(job.path, job.kind) for job in files], args.seed + 1, stop),
            daemon=True,
        )
        writer.start()
        with delaying_proxy(ssh_port, args.delay_ms) as proxy_port:
            delayed = SSHTransport(
                "127.0.0.1",
                port=proxy_port,
                user="root",
                key_file=key,
                known_hosts=str(
                    known_hosts_for(proxy_port, known_hosts, ssh_port, WORK / "known_hosts")
                ),
            )
            direct = SSHTransport(
                "127.0.0.1", port=ssh_port, user="root", key_file=key, known_hosts=str(known_hosts)
            )
            print(
                f"delay: {args.delay_ms:g} ms each way ({2 * args.delay_ms:g} ms round trip) by "
                f"the {method} on 127.0.0.1:{proxy_port}; a sweep every {args.interval:g} s, "
                f"{args.sweeps} sweeps after one to connect"
            )
            try:
                sweeper.sweep(delayed)  # connects, and reads what was written meanwhile
                time.sleep(args.interval)
                sweeps = []
                for _ in range(args.sweeps):
                    began = time.monotonic()
                    sweeps.append(sweeper.sweep(delayed))
                    last = sweeps[-1]
                    print(
                        f"  sweep {len(sweeps):3d}: {last.seconds:6.3f} s ({last.sizes_seconds:.3f}"
                        f" s sizes), {last.grown:4d} files grown, {last.bytes:8,d} bytes",
                        flush=True,
                    )
                    time.sleep(max(0.0, began + args.interval - time.monotonic()))
                direct_sweeps = []
                sweeper.sweep(direct)
                for _ in range(args.direct_sweeps):
                    began = time.monotonic()
                    direct_sweeps.append(sweeper.sweep(direct))
                    time.sleep(max(0.0, began + args.interval - time.monotonic()))
                sample = random.Random(args.seed).sample(
                    list(files), min(args.reference_files, len(files))
                )
                sweeper.sweep(delayed)
                reference_runs = [
                    reference(delayed, sweeper, sample) for _ in range(args.reference_runs)
                ]
                stop.set()
                writer.join(10)
                unread = sweeper.settled(delayed)
                connections = (delayed.connections_opened, delayed.sftp_sessions_opened)
            finally:
                delayed.close()
                direct.close()
    finally:
        stop.set()
        if writer is not None and writer.is_alive():
            writer.terminate()
            writer.join(10)
        if started and not args.keep_cluster:
            stop_cluster()

    seconds = [sweep.seconds for sweep in sweeps]
    per_file = statistics.median(reference_runs)
    figures: dict[str, Any] = {
        "files": len(files),
        "sweeps": len(sweeps),
        "interval_s": args.interval,
        "sweep_s": {"median": statistics.median(seconds), "p95": percentile(seconds, 0.95)},
        "sizes_s_median": statistics.median(sweep.sizes_seconds for sweep in sweeps),
        "client_cpu_s_median": statistics.median(sweep.client_cpu_seconds for sweep in sweeps),
        "files_grown_per_sweep_median": statistics.median(sweep.grown for sweep in sweeps),
        "bytes_per_sweep_median": statistics.median(sweep.bytes for sweep in sweeps),
        "refused_or_missing": sum(sweep.refused for sweep in sweeps),
        "delay_ms": args.delay_ms,
        "delay_method": method,
        "netem_refusal": refusal,
        "connections_opened": connections[0],
        "sftp_sessions_opened": connections[1],
        "no_delay_sweep_s": {
            "median": statistics.median(sweep.seconds for sweep in direct_sweeps),
            "p95": percentile([sweep.seconds for sweep in direct_sweeps], 0.95),
        }
        if direct_sweeps
        else None,
        "reference": {
            "how": "one file after another: lstat per directory, lstat, open, fstat, read, close",
            "files_measured": len(sample),
            "directories_per_path": len(Path(files[0].path).parts) - 2,
            "runs": len(reference_runs),
            "ms_per_file_median": per_file * 1000,
            "sweep_s_extrapolated": per_file * len(files),
        },
        "unread_or_read_twice": len(unread),
        "target_sweep_s": TARGET_SWEEP_S,
        "login_node": login_node,
    }
    return figures


def report(figures: dict[str, Any]) -> None:
    sweep = figures["sweep_s"]
    reference = figures["reference"]
    print("\n==== bench-ssh summary")
    print(
        f"batch sweep of {figures['files']} files ({figures['delay_ms']:g} ms each way by the "
        f"{figures['delay_method']}): median {sweep['median']:.3f} s, p95 {sweep['p95']:.3f} s "
        f"over {figures['sweeps']} sweeps"
    )
    print(
        f"  per sweep (medians): {figures['files_grown_per_sweep_median']:g} files grown, "
        f"{figures['bytes_per_sweep_median']:,.0f} bytes read, {figures['sizes_s_median']:.3f} s "
        f"for the sizes of all, {figures['client_cpu_s_median']:.3f} s of this process's CPU"
    )
    if figures["no_delay_sweep_s"]:
        direct = figures["no_delay_sweep_s"]
        print(f"  without the delay: median {direct['median']:.3f} s, p95 {direct['p95']:.3f} s")
    print(
        f"reference, the old way (one file after another, {reference['directories_per_path']} "
        f"directories on each path) on {reference['files_measured']} files:"
        f" {reference['ms_per_file_median']:.1f} ms per file, so {reference['sweep_s_extrapolated']:.1f}"
        f" s per sweep of {figures['files']} files (extrapolated)"
    )
    print(
        f"speed-up: {reference['sweep_s_extrapolated'] / sweep['median']:.0f}x; connections "
        f"opened {figures['connections_opened']}, SFTP sessions {figures['sftp_sessions_opened']}"
    )
    print(
        f"check: {figures['unread_or_read_twice']} files not read exactly up to their end once "
        f"the writer stopped, {figures['refused_or_missing']} refused or missing"
    )
    met = sweep["median"] <= TARGET_SWEEP_S and sweep["p95"] <= TARGET_SWEEP_S
    print(
        f"target: a full sweep of {figures['files']} files within {TARGET_SWEEP_S:g} s: "
        f"{'met' if met else 'NOT met'}"
    )


def save(figures: dict[str, Any]) -> None:
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(figures, indent=2) + "\n")
    scale: dict[str, Any] = {}
    if SCALE_RESULTS.exists():
        scale = json.loads(SCALE_RESULTS.read_text())
    scale["ssh_sweep"] = {
        "sweep_s": figures["sweep_s"],
        "files": figures["files"],
        "delay_ms": figures["delay_ms"],
        "delay_method": figures["delay_method"],
        "reference": figures["reference"],
    }
    SCALE_RESULTS.write_text(json.dumps(scale, indent=2) + "\n")
    print(f"\nwritten: {RESULTS.relative_to(ROOT)}, {SCALE_RESULTS.relative_to(ROOT)} (ssh_sweep)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=1000)
    parser.add_argument("--sweeps", type=int, default=30)
    parser.add_argument("--interval", type=float, default=2.0, help="seconds between sweeps")
    parser.add_argument("--delay-ms", type=float, default=2.0, help="added each way")
    parser.add_argument("--direct-sweeps", type=int, default=5, help="without the delay")
    parser.add_argument("--reference-files", type=int, default=100)
    parser.add_argument("--reference-runs", type=int, default=3)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--keep-cluster", action="store_true", help="leave the cluster running")
    args = parser.parse_args()
    WORK.mkdir(parents=True, exist_ok=True)
    figures = run(args)
    report(figures)
    save(figures)
    return 0


if __name__ == "__main__":
    sys.exit(main())
