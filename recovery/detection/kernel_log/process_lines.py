"""Process lines: the segfault, trap and OOM-killer messages, read field by field.

Kept apart from the device lines because they carry a tenant's text (``comm``, cgroup paths):
they are read first, and the job they name comes only from slurmstepd's own cgroup paths.
"""

from __future__ import annotations

from typing import Any

from recovery.detection.kernel_log.facts import ProcessEvent, ProcessFact, Shape
from recovery.detection.linear_regex import compile_linear
from recovery.detection.taxonomy import Attribution, FailureCategory, Severity

# Tried before any hardware structure: their first fields are the kernel's, and the user's
# text follows them.

# arch/x86/mm/fault.c show_signal_msg: "%s[%d]: segfault at %lx ip %px sp %px error %lx",
# then " in <file>[...]" (print_vma_addr) and, since 6.1, " likely on CPU %d (core %d, ...)".
_SEGFAULT = compile_linear(
    r"(.{0,15}?)\[([0-9]{1,10})\]: segfault at [0-9a-f]{1,16} ip [0-9a-f]{1,16} "
    r"sp [0-9a-f]{1,16} error [0-9a-f]{1,8}"
)
# arch/x86/kernel/traps.c (pr_fmt "traps: "): "%s[%d] general protection fault ip:%lx sp:%lx
# error:%lx" (before 5.x "general protection ip:"), and do_trap's "%s[%d] trap %s ip:...".
_TRAP = compile_linear(
    r"traps: (.{0,15}?)\[([0-9]{1,10})\] (general protection(?: fault)?|trap [a-z0-9 ]{1,40}?) "
    r"ip:[0-9a-f]{1,16} sp:[0-9a-f]{1,16} error:[0-9a-f]{1,8}"
)
# mm/oom_kill.c __oom_kill_process: "%s: Killed process %d (%s) total-vm:..." with "Out of
# memory" or "Memory cgroup out of memory"; before 4.19 "Kill process %d (%s) score ...".
_OOM_KILLED = compile_linear(
    r"(?:Out of memory(?: \(oom_kill_allocating_task\))?|Memory cgroup out of memory): "
    r"Kill(?:ed)? process ([0-9]{1,10}) \((.{0,15}?)\)(?: |,|$)"
)
# mm/oom_kill.c dump_header: "%s invoked oom-killer: gfp_mask=%#x(%pGg), order=%d, ...".
_OOM_INVOKED = compile_linear(r"(.{0,15}?) invoked oom-killer: gfp_mask=0x[0-9a-f]{1,16}")
# mm/oom_kill.c dump_oom_summary (4.19 on): "oom-kill:constraint=%s,nodemask=%*pbl" then
# ",cpuset=<path>,mems_allowed=<list>", ",oom_memcg=<path>" or ",global_oom",
# ",task_memcg=<path>", ",task=%s,pid=%d,uid=%d". The paths are cgroup names, which may hold
# any character but "/": only their start, which the site's daemons create, is read.
_OOM_SUMMARY = compile_linear(r"oom-kill:constraint=(CONSTRAINT_[A-Z_]{1,20}),nodemask=")
_OOM_SUMMARY_END = compile_linear(r",task=(.{0,15}),pid=([0-9]{1,10}),uid=([0-9]{1,10})$")
# mm/oom_kill.c oom_reap_task_mm: "oom_reaper: reaped process %d (%s), now anon-rss:...".
_OOM_REAPED = compile_linear(r"oom_reaper: reaped process [0-9]{1,10} \(")
# The job cgroups slurmstepd creates: cgroup v1 (proctrack/task cgroup plugins)
# "/slurm[_<node>]/uid_<uid>/job_<id>/...", cgroup v2 (cgroup/v2 plugin)
# "/system.slice/[<node>_]slurmstepd.scope/job_<id>/...". The first job_<id> is Slurm's:
# anything below it a job's processes may have created themselves.
_SLURM_V1_JOB = compile_linear(
    r"/slurm(?:_[A-Za-z0-9._-]{1,64})?/uid_([0-9]{1,10})/job_([0-9]{1,10})(?:/|,)"
)
_SLURM_V2_JOB = compile_linear(
    r"/system\.slice/(?:[A-Za-z0-9._-]{1,64}_)?slurmstepd\.scope/job_([0-9]{1,10})(?:/|,)"
)


def _process_fact(message: str) -> ProcessFact | Shape | None:
    head = message[:48]
    if "]: segfault at " in head and (found := _SEGFAULT.match(message)) is not None:
        return _crash(message, ProcessEvent.SEGFAULT, found.group(1), int(found.group(2)))
    if message.startswith("traps: ") and (found := _TRAP.match(message)) is not None:
        return _crash(
            message,
            ProcessEvent.TRAP,
            found.group(1),
            int(found.group(2)),
            detail={"trap": found.group(3)},
        )
    if (
        message.startswith(("Out of memory", "Memory cgroup out of memory"))
        and (found := _OOM_KILLED.match(message)) is not None
    ):
        pid, comm = int(found.group(1)), found.group(2)
        return _oom(message, ProcessEvent.OOM_KILLED, pid=pid, comm=comm)
    if " invoked oom-killer: " in head and (found := _OOM_INVOKED.match(message)) is not None:
        return _oom(message, ProcessEvent.OOM_INVOKED, comm=found.group(1))
    if message.startswith("oom-kill:") and (found := _OOM_SUMMARY.match(message)) is not None:
        return _oom_summary(message, found.group(1))
    if message.startswith("oom_reaper: ") and _OOM_REAPED.match(message) is not None:
        return Shape.PROCESS
    return None


def _crash(
    message: str,
    event: ProcessEvent,
    comm: str,
    pid: int,
    *,
    detail: dict[str, Any] | None = None,
) -> ProcessFact:
    return ProcessFact(
        signature="segmentation-fault",
        event=event,
        category=FailureCategory.SEGFAULT,
        attribution=Attribution.UNKNOWN,
        severity=Severity.ERROR,
        message=message,
        pid=pid,
        comm=comm,
        detail=detail or {},
    )


def _oom(
    message: str,
    event: ProcessEvent,
    *,
    pid: int | None = None,
    comm: str = "",
    job_id: str | None = None,
    uid: int | None = None,
    detail: dict[str, Any] | None = None,
) -> ProcessFact:
    return ProcessFact(
        signature="kernel-oom-killer",
        event=event,
        category=FailureCategory.HOST_OOM,
        attribution=Attribution.APPLICATION,
        severity=Severity.ERROR,
        message=message,
        pid=pid,
        comm=comm,
        job_id=job_id,
        uid=uid,
        detail=detail or {},
    )


def _oom_summary(message: str, constraint: str) -> ProcessFact:
    end = _OOM_SUMMARY_END.search(message)
    pid = int(end.group(2)) if end is not None else None
    uid = int(end.group(3)) if end is not None else None
    comm = end.group(1) if end is not None else ""
    detail: dict[str, Any] = {"constraint": constraint}
    job_id, why = slurm_job_of_oom(message, uid)
    if job_id is None:
        detail["no_job"] = why
    return _oom(
        message,
        ProcessEvent.OOM_SUMMARY,
        pid=pid,
        comm=comm,
        job_id=job_id,
        uid=uid,
        detail=detail,
    )


def slurm_job_of_oom(message: str, uid: int | None) -> tuple[str | None, str]:
    """The Slurm job whose cgroup the OOM killer's summary names, or None and why not.

    The victim's memory cgroup (``task_memcg=``) must start with a job cgroup slurmstepd
    creates; ``oom_memcg=``, when it is a job's too, must name the same job; in cgroup v1 the
    path's ``uid_<n>`` must be the victim's uid. Each field must appear once: cgroup names may
    hold commas and these very words, and a line where they repeat cannot be read.
    """
    if uid is None:
        return None, "the line does not end with the task, pid and uid"
    paths = {}
    for name in ("task_memcg", "oom_memcg"):
        marker = f",{name}="
        first = message.find(marker)
        if first != -1 and message.find(marker, first + 1) != -1:
            return None, f"{name} appears more than once"
        paths[name] = None if first == -1 else message[first + len(marker) :]
    task_path = paths["task_memcg"]
    if task_path is None:
        return None, "no task_memcg"
    job, owner = _slurm_job(task_path)
    if job is None:
        return None, "the task's memory cgroup is not a Slurm job's"
    if owner is not None and owner != uid:
        return None, "the cgroup's uid is not the task's"
    oom_path = paths["oom_memcg"]
    if oom_path is not None:
        other, _ = _slurm_job(oom_path)
        if other is not None and other != job:
            return None, "oom_memcg and task_memcg name different jobs"
    return job, ""


def _slurm_job(path: str) -> tuple[str | None, int | None]:
    """The job id at the start of a cgroup path slurmstepd made, and the uid it names (v1)."""
    found = _SLURM_V1_JOB.match(path)
    if found is not None:
        return found.group(2), int(found.group(1))
    found = _SLURM_V2_JOB.match(path)
    return (found.group(1), None) if found is not None else (None, None)
