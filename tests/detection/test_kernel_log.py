"""A node's kernel log read as the kernel writes it: real lines of each subsystem, the prefixes
dmesg, syslog and the journal put before them, and the lines a tenant's process can make the
kernel print, which are never read as hardware."""

from __future__ import annotations

import subprocess
import sys
import time
from datetime import UTC, datetime

import pytest
from django.conf import settings

from recovery.detection.kernel_log.facts import DeviceFact, ProcessEvent, ProcessFact, Shape
from recovery.detection.kernel_log.prefixes import peel
from recovery.detection.kernel_log.process_lines import slurm_job_of_oom
from recovery.detection.kernel_log.reading import classify, parse_kernel_log
from recovery.detection.kernel_log.reporting import PRINTED_BY, findings

XID_79 = "NVRM: Xid (PCI:0000:3b:00): 79, pid=2231, name=python, GPU has fallen off the bus."


def device(message: str) -> DeviceFact:
    fact = classify(message)
    assert isinstance(fact, DeviceFact), (message, fact)
    return fact


def process(message: str) -> ProcessFact:
    fact = classify(message)
    assert isinstance(fact, ProcessFact), (message, fact)
    return fact


# ------------------------------------------------------------------------------------ prefixes


@pytest.mark.parametrize(
    ("line", "record", "clock"),
    [
        # dmesg, dmesg -r, dmesg -x
        (f"[87430.975714] {XID_79}", "87430.975714", None),
        (f"[    5.000001] {XID_79}", "5.000001", None),
        (f"<4>[87430.975714] {XID_79}", "87430.975714", None),
        (f"kern  :err   : [87430.975714] {XID_79}", "87430.975714", None),
        # dmesg -T
        (f"[Fri Aug 30 11:43:09 2024] {XID_79}", None, "Fri Aug 30 11:43:09 2024"),
        # rsyslog, with and without the kernel's timestamp kept
        (
            f"Nov 29 03:14:15 node002 kernel: [87430.975714] {XID_79}",
            "87430.975714",
            "Nov 29 03:14:15",
        ),
        (f"Nov  9 03:14:15 node002 kernel: {XID_79}", None, "Nov  9 03:14:15"),
        # journalctl -o short-precise, short-iso, short-monotonic
        (f"Nov 29 03:14:15.123456 node002 kernel: {XID_79}", None, "Nov 29 03:14:15.123456"),
        (
            f"2026-11-29T03:14:15+0000 node002 kernel: {XID_79}",
            None,
            "2026-11-29T03:14:15+0000",
        ),
        (f"[87430.975714] node002 kernel: {XID_79}", "87430.975714", None),
        # a bare tag, a host and tag, a printk caller id
        (f"kernel: {XID_79}", None, None),
        (f"node002 kernel: {XID_79}", None, None),
        (f"[87430.975714] [ T1234] {XID_79}", "87430.975714", None),
        (XID_79, None, None),
    ],
)
def test_the_prefixes_of_dmesg_syslog_and_the_journal_are_peeled(
    line: str, record: str | None, clock: str | None
) -> None:
    prefix = peel(line)
    assert prefix.message == XID_79
    assert (prefix.record, prefix.clock, prefix.foreign, prefix.indented) == (
        record,
        clock,
        False,
        False,
    )
    assert device(prefix.message).detail["xid"] == 79


def test_an_iso_time_is_when_the_line_was_printed() -> None:
    prefix = peel(f"2026-11-29T03:14:15.250000+00:00 node002 kernel: {XID_79}")
    assert prefix.at == datetime(2026, 11, 29, 3, 14, 15, 250000, tzinfo=UTC)


def test_a_syslog_line_of_another_program_is_not_the_kernels() -> None:
    prefix = peel(f"Nov 29 03:14:15 node002 python[4242]: {XID_79}")
    assert prefix.foreign
    read = parse_kernel_log(f"Nov 29 03:14:15 node002 python[4242]: {XID_79}\n")
    assert read.entries == [] and read.foreign == 1
    assert [e.fact.signature for e in read.not_from_kernel] == ["nvidia-xid"]


def test_the_host_in_a_prefix_is_never_the_facts_node() -> None:
    read = parse_kernel_log(f"Nov 29 03:14:15 gpu-a100-009 kernel: {XID_79}\n")
    (finding,) = findings(read.entries, "gpu-a100-001")
    assert finding.nodes == ["gpu-a100-001"]


# ------------------------------------------------------------------------------ NVIDIA driver


@pytest.mark.parametrize(
    ("message", "code", "pid"),
    [
        # Today's drivers (kernel_rc.c): pid and name, '<unknown>' when no channel.
        (XID_79, 79, 2231),
        (
            "NVRM: Xid (PCI:0000:b7:00): 48, pid='<unknown>', name=<unknown>, An uncorrectable "
            "double bit error (DBE) has been detected on GPU in the framebuffer at partition 6, "
            "subpartition 0.",
            48,
            None,
        ),
        # A MIG instance; R4xx drivers' pid without a name; older drivers' no pid.
        (
            "NVRM: Xid (PCI:0000:3b:00 GPU-I:01 GPU-CI:00): 95, pid=311, name=python3, "
            "Uncontained: FBHUB. RST: Yes, D-RST: No",
            95,
            311,
        ),
        ("NVRM: Xid (PCI:0000:3b:00): 79, pid=2231, GPU has fallen off the bus.", 79, 2231),
        ("NVRM: Xid (PCI:0000:02:00): 79, GPU has fallen off the bus.", 79, None),
        (
            "NVRM: Xid (PCI:0000:18:00): 119, pid=1582, name=nvidia-smi, Timeout after 6s of "
            "waiting for RPC response from GPU0 GSP! Expected function 76 (GSP_RM_CONTROL).",
            119,
            1582,
        ),
    ],
)
def test_a_hardware_xid_is_a_device_fact_decided_by_its_code(
    message: str, code: int, pid: int | None
) -> None:
    fact = device(message)
    assert (fact.signature, fact.attribution, fact.category) == (
        "nvidia-xid",
        "hardware",
        "gpu_hardware",
    )
    assert fact.hardware
    assert fact.detail["xid"] == code
    assert fact.device == message[len("NVRM: Xid (PCI:") :][:10]


@pytest.mark.parametrize("code", [13, 31, 43])
def test_an_applications_xid_is_a_fact_about_its_process(code: int) -> None:
    fact = process(
        f"NVRM: Xid (PCI:0000:4e:00): {code}, pid=1201, name=python, Graphics SM Warp "
        "Exception on (GPC 1, TPC 0, SM 1): Out Of Range Address"
    )
    assert (fact.event, fact.pid, fact.attribution) == (
        ProcessEvent.APPLICATION_XID,
        1201,
        "application",
    )
    assert fact.job_id is None


@pytest.mark.parametrize(("code", "severity"), [(45, "warning"), (38, "error"), (999, "error")])
def test_an_xid_of_unknown_cause_is_no_hardware_fact(code: int, severity: str) -> None:
    fact = device(f"NVRM: Xid (PCI:0000:3b:00): {code}, pid=1, name=python, Ch 00000010")
    assert not fact.hardware
    assert fact.severity == severity


@pytest.mark.parametrize(
    ("message", "signature", "severity"),
    [
        ("NVRM: GPU 0000:41:00.0: GPU has fallen off the bus.", "gpu-fallen-off-bus", "fatal"),
        ("NVRM: GPU 0000:01:00.0: RmInitAdapter failed! (0x22:0x56:667)", "gpu-lost", "error"),
        (
            "NVRM: GPU 0000:01:00.0: rm_init_adapter failed, device minor number 0",
            "gpu-lost",
            "error",
        ),
        ("NVRM: RmInitAdapter failed! (0x26:0x65:1474)", "gpu-lost", "error"),
    ],
)
def test_a_gpu_the_driver_lost_is_a_hardware_fact(
    message: str, signature: str, severity: str
) -> None:
    fact = device(message)
    assert (fact.signature, fact.severity, fact.attribution) == (signature, severity, "hardware")


@pytest.mark.parametrize(
    "message",
    [
        "NVRM: GPU at PCI:0000:3b:00: GPU-8b9c5d4e-1f2a-3b4c-5d6e-7f8091a2b3c4",
        "NVRM: GPU Board Serial Number: 1321021034567",
        "NVRM: GPU 0000:3b:00.0: request_irq() failed (-22)",
        "nvidia-nvlink: Nvlink Core is being initialized, major device number 234",
        "nvidia 0000:3b:00.0: enabling device (0000 -> 0003)",
    ],
)
def test_a_drivers_context_line_reports_no_fact(message: str) -> None:
    assert classify(message) is Shape.DEVICE


@pytest.mark.parametrize(
    ("message", "severity", "sxid"),
    [
        (
            "nvidia-nvswitch3: SXid (PCI:0000:07:00.0): 24007, Fatal, Link 50 sourcetrack "
            "TCEN0 crumbstore ECC DBE Error",
            "error",
            24007,
        ),
        (
            "nvidia-nvswitch2: SXid (PCI:0000:c5:00.0): 12028, Non-fatal, Link 44 egress "
            "non-posted PRIV error",
            "warning",
            12028,
        ),
    ],
)
def test_an_nvswitch_sxid_is_the_fabrics_hardware(message: str, severity: str, sxid: int) -> None:
    fact = device(message)
    assert (fact.category, fact.severity, fact.detail["sxid"]) == ("interconnect", severity, sxid)


# ------------------------------------------------------------------------- PCIe, NIC, memory


@pytest.mark.parametrize(
    ("message", "signature", "severity"),
    [
        (
            "pcieport 0000:00:03.0: PCIe Bus Error: severity=Uncorrected (Fatal), "
            "type=Transaction Layer, (Receiver ID)",
            "pcie-aer-uncorrected",
            "error",
        ),
        (
            "pcieport 0000:80:01.0: AER: Uncorrected (Non-Fatal) error received: 0000:81:00.0",
            "pcie-aer-uncorrected",
            "error",
        ),
        (
            "pcieport 0000:00:03.0: AER: PCIe Bus Error: severity=Uncorrectable (Fatal), "
            "type=Inaccessible, (Unregistered Agent ID)",
            "pcie-aer-uncorrected",
            "error",
        ),
        (
            "pcieport 0000:00:1c.5: AER: Multiple Correctable error message received from "
            "0000:3b:00.0",
            "pcie-aer-corrected",
            "warning",
        ),
        (
            "nvidia 0000:3b:00.0: PCIe Bus Error: severity=Corrected, type=Physical Layer, "
            "(Receiver ID)",
            "pcie-aer-corrected",
            "warning",
        ),
        (
            "pcieport 0000:00:03.0: DPC: containment event, status:0x1f01 source:0x0000",
            "pcie-dpc-containment",
            "error",
        ),
        (
            "mlx5_core 0000:5e:00.0: poll_health:739:(pid 0): Fatal error 1 detected",
            "mlx5-fatal-error",
            "fatal",
        ),
        (
            "mlx5_core 0000:5e:00.0: poll_health:722:(pid 0): device's health compromised - "
            "reached miss count",
            "mlx5-health-compromised",
            "error",
        ),
        ("mlx5_core 0000:3b:00.0 ib0: Link down", "mlx5-link-down", "warning"),
        (
            "EDAC MC0: 1 UE memory read error on CPU_SrcID#0_Ha#0_Chan#0_DIMM#0 (channel:0 "
            "slot:0 page:0x1234 offset:0x0 grain:32 - err_code:0x0000:0x009f)",
            "edac-uncorrected",
            "error",
        ),
        (
            "EDAC MC1: 3 CE memory read error on CPU_SrcID#1_MC#0_Chan#1_DIMM#0 (channel:1 "
            "slot:0 page:0x5678 offset:0x40 grain:32 syndrome:0x0)",
            "edac-corrected",
            "warning",
        ),
        # MCi_STATUS with UC and PCC (processor context corrupt), and UC alone (recoverable).
        (
            "mce: [Hardware Error]: CPU 12: Machine Check Exception: 5 Bank 4: be00000000800400",
            "mce-uncorrected",
            "fatal",
        ),
        (
            "mce: [Hardware Error]: CPU 3: Machine Check Exception: 7 Bank 1: bd80000000100134",
            "mce-uncorrected",
            "error",
        ),
        (
            "mce: [Hardware Error]: CPU 0: Machine Check: 0 Bank 7: cc00008000010090",
            "mce-corrected",
            "warning",
        ),
        ("mce: [Hardware Error]: Machine check events logged", "mce-corrected", "warning"),
        (
            "mce: Uncorrected hardware memory error in user-access at 3fbe4c400",
            "mce-uncorrected",
            "error",
        ),
        (
            "Memory failure: 0x3fbe4c: recovery action for dirty LRU page: Recovered",
            "memory-failure",
            "error",
        ),
    ],
)
def test_pcie_nic_and_memory_errors_are_hardware_facts(
    message: str, signature: str, severity: str
) -> None:
    fact = device(message)
    assert (fact.signature, fact.severity, fact.attribution) == (signature, severity, "hardware")
    assert fact.signature in PRINTED_BY


def test_a_nics_errors_are_the_fabrics_and_a_gpus_the_gpus() -> None:
    nic = device("mlx5_core 0000:5e:00.0: PCIe Bus Error: severity=Uncorrected (Fatal), type=x")
    gpu = device("nvidia 0000:3b:00.0: PCIe Bus Error: severity=Uncorrected (Fatal), type=x")
    assert (nic.category, gpu.category) == ("interconnect", "gpu_hardware")


# ------------------------------------------------------------------------------ process lines


@pytest.mark.parametrize(
    ("message", "event", "comm", "pid"),
    [
        (
            "python[1234]: segfault at 0 ip 00007f8b2c0a1000 sp 00007ffd3c2b1e40 error 4 in "
            "libc.so.6[7f8b2c000000+195000] likely on CPU 3 (core 3, socket 0)",
            ProcessEvent.SEGFAULT,
            "python",
            1234,
        ),
        (
            "pt_main_thread[88]: segfault at 7f0 ip 00007f8b sp 00007ffd error 6 in "
            "libtorch_cuda.so[7f8b2c000000+1000]",
            ProcessEvent.SEGFAULT,
            "pt_main_thread",
            88,
        ),
        (
            "traps: python[1234] general protection fault ip:7f8b2c0a1000 sp:7ffd3c2b1e40 "
            "error:0 in libc.so.6[7f8b2c000000+195000]",
            ProcessEvent.TRAP,
            "python",
            1234,
        ),
        (
            "traps: python3[99] general protection ip:7f8b2c0a1000 sp:7ffd3c2b1e40 error:0",
            ProcessEvent.TRAP,
            "python3",
            99,
        ),
        (
            "traps: python[1234] trap invalid opcode ip:7f8b2c0a1000 sp:7ffd3c2b1e40 error:0 "
            "in libtorch_cpu.so[7f8b2c000000+1000]",
            ProcessEvent.TRAP,
            "python",
            1234,
        ),
        (
            "Out of memory: Killed process 12345 (python) total-vm:123456kB, "
            "anon-rss:98765kB, file-rss:0kB, shmem-rss:0kB, UID:1000 pgtables:400kB "
            "oom_score_adj:0",
            ProcessEvent.OOM_KILLED,
            "python",
            12345,
        ),
        (
            "Out of memory: Kill process 25635 (python) score 974 or sacrifice child",
            ProcessEvent.OOM_KILLED,
            "python",
            25635,
        ),
        (
            "Memory cgroup out of memory: Killed process 5151 (python) total-vm:8123456kB, "
            "anon-rss:7987654kB, file-rss:0kB, shmem-rss:0kB, UID:1000 pgtables:16000kB "
            "oom_score_adj:0",
            ProcessEvent.OOM_KILLED,
            "python",
            5151,
        ),
        (
            "python invoked oom-killer: gfp_mask=0x100cca(GFP_HIGHUSER_MOVABLE), order=0, "
            "oom_score_adj=0",
            ProcessEvent.OOM_INVOKED,
            "python",
            None,
        ),
    ],
)
def test_process_lines_are_facts_about_a_process(
    message: str, event: ProcessEvent, comm: str, pid: int | None
) -> None:
    fact = process(message)
    assert (fact.event, fact.comm, fact.pid, fact.job_id) == (event, comm, pid, None)


V2_JOB = "/system.slice/slurmstepd.scope/job_4242"
V1_JOB = "/slurm/uid_1000/job_4242"


def oom_summary(oom_memcg: str, task_memcg: str, task: str = "python", uid: int = 1000) -> str:
    return (
        "oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=/,mems_allowed=0-1,"
        f"oom_memcg={oom_memcg},task_memcg={task_memcg},task={task},pid=5151,uid={uid}"
    )


@pytest.mark.parametrize(
    "message",
    [
        oom_summary(V2_JOB, f"{V2_JOB}/step_0/user/task_0"),
        oom_summary(f"{V1_JOB}", f"{V1_JOB}/step_0/task_0"),
        oom_summary(
            "/system.slice/node7_slurmstepd.scope/job_4242",
            "/system.slice/node7_slurmstepd.scope/job_4242/step_batch/user/task_0",
        ),
        # A process name with commas and the very words: the line's end is the kernel's.
        oom_summary(V2_JOB, f"{V2_JOB}/step_0/user/task_0", task="x,pid=9,uid=0"),
        (
            "oom-kill:constraint=CONSTRAINT_NONE,nodemask=(null),cpuset=/,mems_allowed=0-1,"
            f"global_oom,task_memcg={V2_JOB}/step_0/user/task_0,task=python,pid=5151,uid=1000"
        ),
    ],
)
def test_the_oom_killers_summary_names_the_slurm_job_whose_cgroup_it_was(message: str) -> None:
    fact = process(message)
    assert (fact.event, fact.job_id, fact.pid, fact.uid) == (
        ProcessEvent.OOM_SUMMARY,
        "4242",
        5151,
        1000,
    )


@pytest.mark.parametrize(
    ("message", "why"),
    [
        # Not a cgroup slurmstepd made: a user's systemd slice, the root.
        (
            oom_summary("/user.slice/user-1000.slice", "/user.slice/user-1000.slice/job_4242"),
            "not a Slurm job's",
        ),
        # A job_<id> a job's process created below its own job's: the first is Slurm's.
        (
            oom_summary(f"{V2_JOB}/step_0/user/job_9999", f"{V2_JOB}/step_0/user/job_9999/task_0"),
            "",
        ),
        # The cgroup v1 path's uid is not the task's.
        (oom_summary(V1_JOB, f"{V1_JOB}/step_0", uid=2001), "uid"),
        # A cgroup name holding ",task_memcg=" makes the line unreadable.
        (
            oom_summary(
                f"/user.slice/x,task_memcg={V2_JOB}/y",
                "/user.slice/user-2001.slice/z",
                uid=2001,
            ),
            "more than once",
        ),
        (
            oom_summary("/system.slice/slurmstepd.scope/job_1", f"{V2_JOB}/step_0"),
            "different jobs",
        ),
    ],
)
def test_a_summary_that_does_not_say_which_slurm_job_names_none(message: str, why: str) -> None:
    fact = process(message)
    if why:
        assert fact.job_id is None
        assert why in fact.detail["no_job"]
    else:
        assert fact.job_id == "4242"


def test_a_summary_without_its_end_names_no_job() -> None:
    assert slurm_job_of_oom(oom_summary(V2_JOB, V2_JOB)[:-20], None)[0] is None


# --------------------------------------------------------- forged lines, read both ways round


@pytest.mark.parametrize(
    "message",
    [
        # The driver's first 15 characters as a process name: "[pid]" where the address goes.
        "NVRM: Xid (PCI:[1234]: segfault at 0 ip 0000000000000000 sp 00007ffd3c2b1e40 error 4 "
        "in 0000:3b:00): 79, pid=1, GPU has fallen off the bus[7f3a2c000000+1000]",
        "Xid error 79[4242]: segfault at 0 ip 00007f3a2c0a1000 sp 00007ffd3c2b1e40 error 4 in "
        "p on node gpu-a100-009 x.so[7f3a2c000000+1000]",
        "EDAC MC0: 1 UE[7]: segfault at 0 ip 0 sp 0 error 4 in libx.so[7f3a2c000000+1000]",
        "pcieport 0000:[7]: segfault at 0 ip 0 sp 0 error 4 in 0:00:03.0: PCIe Bus Error: "
        "severity=Uncorrected (Fatal), type=x[7f3a2c000000+1000]",
        "traps: NVRM: Xid (PCI:[1234] general protection fault ip:7f8b sp:7ffd error:0 in "
        "0000:3b:00): 79, x.so[7f8b2c000000+1000]",
        "NVRM: Xid (PCI: invoked oom-killer: gfp_mask=0xcc0(GFP_KERNEL), order=0",
        "Out of memory: Killed process 4242 (Xid error 79) total-vm:1kB, anon-rss:1kB",
        "Out of memory: Killed process 4242 (NVRM: Xid (PCI:) total-vm:1kB, anon-rss:1kB",
    ],
)
def test_a_process_line_whose_user_text_looks_like_hardware_is_a_process_line(
    message: str,
) -> None:
    assert process(message).job_id is None


@pytest.mark.parametrize(
    "message",
    [
        # The process name in the driver's name= field looking like a process line.
        "NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=a[2]: segfault, GPU has fallen off the bus.",
        "NVRM: Xid (PCI:0000:3b:00): 48, pid=1, name=traps: x[1] ge, An uncorrectable double "
        "bit error (DBE) has been detected on GPU in the framebuffer at partition 6",
        "NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=Out of memory:, GPU has fallen off the bus.",
    ],
)
def test_a_hardware_line_whose_user_text_looks_like_a_process_line_is_hardware(
    message: str,
) -> None:
    assert device(message).hardware


@pytest.mark.parametrize(
    "message",
    [
        # An Xid's code is a number right after the address; it is never taken from later text.
        "NVRM: Xid (PCI:0000:3b:00): 13, pid=1, name=Xid 79, (PCI:0000:3b:00): 79, x",
        "NVRM: Xid (PCI:0000:3b:0): 79, pid=1, GPU has fallen off the bus.",
        "NVRM: Xid (PCI:0000:3b:00):79, pid=1, GPU has fallen off the bus.",
        "NVRM: Xid (PCI:zzzz:3b:00): 79, pid=1, GPU has fallen off the bus.",
        "Xid error 79 detected on GPU 0000:3b:00",
        "python: NVRM: Xid (PCI:0000:3b:00): 79, pid=1, GPU has fallen off the bus.",
        "GPU has fallen off the bus.",
        "pcieport 00:03.0: PCIe Bus Error: severity=Uncorrected (Fatal), type=Transaction",
        "EDAC MC0: one UE memory read error",
        "oom-kill:constraint=whatever",
    ],
)
def test_text_resembling_a_structure_is_not_that_structure(message: str) -> None:
    fact = classify(message)
    assert not (isinstance(fact, DeviceFact) and fact.hardware and fact.detail.get("xid") == 79)
    assert not (isinstance(fact, DeviceFact) and fact.severity != "warning" and fact.hardware), fact


# ---------------------------------------------------------------------- records and newlines


def test_a_newline_in_a_file_name_continues_the_record_it_was_printed_in() -> None:
    """Through syslog(2) each line of a record carries the record's timestamp."""
    read = parse_kernel_log(
        "[87476.000321] python[4242]: segfault at 0 ip 00007f3a sp 00007ffd error 4 in x\n"
        f"[87476.000321] {XID_79}[7f3a2c000000+1000]\n"
        f"[87476.000321] EDAC MC0: 1 UE memory read error on DIMM_A1[7f3a2c000000+1000]\n"
    )
    assert [type(e.fact).__name__ for e in read.entries] == ["ProcessFact"]
    assert read.continuations == 2
    assert [e.fact.signature for e in read.in_continuations] == ["nvidia-xid", "edac-uncorrected"]


def test_a_record_after_it_with_its_own_timestamp_is_read() -> None:
    read = parse_kernel_log(
        "[87476.000321] python[4242]: segfault at 0 ip 00007f3a sp 00007ffd error 4 in x[1+1]\n"
        f"[87476.000322] {XID_79}\n"
    )
    assert [e.fact.signature for e in read.entries] == ["segmentation-fault", "nvidia-xid"]


def test_a_line_of_unknown_structure_may_carry_user_text_of_any_length() -> None:
    """The driver's API-mismatch message prints a version string a program passed."""
    read = parse_kernel_log(
        "[100.000001] NVRM: API mismatch: the client has the version x\n"
        f"[100.000001] {XID_79}, but\n"
        "[100.000001] NVRM: this kernel module has the version 535.104.05.\n"
        f"[100.000002] {XID_79}\n"
    )
    assert [e.line for e in read.entries] == [4]
    assert read.continuations == 2


def test_journalctl_and_dmesg_indent_a_records_further_lines() -> None:
    read = parse_kernel_log(
        "Nov 29 03:14:15 node002 kernel: python[4242]: segfault at 0 ip 0 sp 0 error 4 in x\n"
        f"                                 {XID_79}\n"
        f"[   12.000000] python[1]: segfault at 0 ip 0 sp 0 error 4 in y\n"
        f"               {XID_79}\n"
    )
    assert [e.fact.signature for e in read.entries] == ["segmentation-fault"] * 2
    assert read.continuations == 2


def test_without_timestamps_a_process_line_continues_for_one_records_length() -> None:
    filler = "x" * 2100
    read = parse_kernel_log(
        f"python[4242]: segfault at 0 ip 0 sp 0 error 4 in x\n{XID_79}\n{filler}\n{XID_79}\n"
    )
    assert [e.line for e in read.entries] == [1, 4]


def test_without_timestamps_a_line_of_unknown_structure_does_not_hide_the_next() -> None:
    read = parse_kernel_log(f"usb 1-1: new high-speed USB device number 2\n{XID_79}\n")
    assert [e.line for e in read.entries] == [2]


def test_a_facts_line_does_not_hide_the_next_one_at_the_same_time() -> None:
    read = parse_kernel_log(
        "[10.000001] NVRM: GPU at PCI:0000:3b:00: GPU-8b9c5d4e-1f2a-3b4c-5d6e-7f8091a2b3c4\n"
        "[10.000001] NVRM: GPU Board Serial Number: 1321021034567\n"
        f"[10.000001] {XID_79}\n"
        f"[10.000001] {XID_79.replace('3b:00', '5e:00')}\n"
    )
    assert [e.line for e in read.entries] == [3, 4]


# ------------------------------------------------------------------------------- as findings


def test_device_facts_implicate_the_logs_host_and_process_facts_no_node() -> None:
    read = parse_kernel_log(
        f"[1.0] {XID_79}\n"
        f"[1.5] {XID_79}\n"
        "[2.0] pcieport 0000:00:03.0: PCIe Bus Error: severity=Corrected, type=Physical Layer\n"
        f"[3.0] {oom_summary(V2_JOB, V2_JOB + '/step_0')}\n"
    )
    made = {f.signature: f for f in findings(read.entries, "gpu-001")}
    xid = made["nvidia-xid"]
    assert (xid.count, xid.nodes, xid.first_line, xid.detail["last_line"]) == (
        2,
        ["gpu-001"],
        1,
        2,
    )
    assert xid.detail["xid"] == 79 and xid.detail["role"] == "cause"
    assert xid.detail["printed_by"].startswith("the NVIDIA driver")
    oom = made["kernel-oom-killer"]
    assert (oom.nodes, oom.implicates_nodes) == ([], False)
    assert oom.detail["reported_by_nodes"] == ["gpu-001"]
    assert oom.detail["job_id"] == "4242"
    assert made["pcie-aer-corrected"].severity == "warning"


def test_every_fact_names_what_prints_it() -> None:
    names = {
        "nvidia-xid",
        "gpu-fallen-off-bus",
        "gpu-lost",
        "nvswitch-sxid",
        "pcie-aer-uncorrected",
        "pcie-aer-corrected",
        "pcie-dpc-containment",
        "mlx5-fatal-error",
        "mlx5-health-compromised",
        "mlx5-link-down",
        "edac-uncorrected",
        "edac-corrected",
        "mce-uncorrected",
        "mce-corrected",
        "memory-failure",
        "segmentation-fault",
        "kernel-oom-killer",
    }
    assert set(PRINTED_BY) == names


# ------------------------------------------------------------------------------- linear time


@pytest.mark.parametrize(
    "piece",
    ["[", "NVRM: Xid (PCI:", ",task_memcg=", "0000:3b:00): ", "a[1]: ", "EDAC MC0: "],
)
def test_lines_built_to_backtrack_are_read_in_linear_time(piece: str) -> None:
    line = (piece * (4000 // len(piece)))[:3990]
    data = "\n".join(
        [f"[1.0] {line}", f"[1.1] oom-kill:constraint=CONSTRAINT_NONE,nodemask={line}"] * 200
    )
    started = time.perf_counter()
    parse_kernel_log(data)
    assert time.perf_counter() - started < 2.0


def test_the_kernel_log_reader_imports_no_django() -> None:
    code = (
        "import sys\n"
        "import recovery.detection.kernel_log\n"
        "assert not [m for m in sys.modules if m == 'django' or m.startswith('django.')], "
        "'django imported'\n"
    )
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(settings.BASE_DIR)}
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
