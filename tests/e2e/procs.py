"""The processes of a job on this machine, read from /proc: ranks to signal, a node's tasks.

The harness's own view, independent of the code under test; the processes of the 24.11 chroot
are processes of this host too.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Proc:
    pid: int
    ppid: int
    comm: str
    cmdline: str
    env: dict[str, str]


def read_proc(pid: int) -> Proc | None:
    base = Path("/proc") / str(pid)
    try:
        stat = (base / "stat").read_text()
        environ = (base / "environ").read_bytes()
        cmdline = (base / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return None  # gone, or not ours to read
    # "pid (comm) state ppid ...": comm may hold spaces and parentheses.
    comm = stat[stat.index("(") + 1 : stat.rindex(")")]
    ppid = int(stat[stat.rindex(")") + 2 :].split()[1])
    env = {}
    for item in environ.split(b"\0"):
        name, sep, value = item.decode(errors="replace").partition("=")
        if sep:
            env[name] = value
    return Proc(pid, ppid, comm, cmdline, env)


def all_procs() -> list[Proc]:
    procs = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            proc = read_proc(int(entry.name))
            if proc is not None:
                procs.append(proc)
    return procs


def job_procs(job_id: str) -> list[Proc]:
    """Every process of the job: the batch script, srun, the ranks (Slurm sets their env)."""
    return [p for p in all_procs() if p.env.get("SLURM_JOB_ID") == job_id]


def rank_procs(job_id: str) -> dict[int, Proc]:
    return {
        int(p.env["SLURM_PROCID"]): p
        for p in job_procs(job_id)
        if p.comm.startswith("python") and "ddp_train.py" in p.cmdline
    }
