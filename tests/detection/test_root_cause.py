"""Root cause, not the loudest line."""

from __future__ import annotations

import pytest

from recovery.detection.classify import classify_text

TIMEOUT = (
    "[rank{r}]:[E ProcessGroupNCCL.cpp:616] [Rank {r}] Watchdog caught collective operation "
    "timeout: WorkNCCL(SeqNum=52817, OpType=ALLREDUCE, NumelIn=1048576, NumelOut=1048576, "
    "Timeout(ms)=600000) ran for 600041 milliseconds before timing out."
)


def timeouts(skip: int, ranks: int = 64) -> list[str]:
    return [TIMEOUT.format(r=r) for r in range(ranks) if r != skip]


def test_an_xid_on_one_node_outranks_63_collective_timeouts() -> None:
    lines = [
        *timeouts(skip=17)[:30],
        "Nov 28 03:14:15 gpu-a100-007 kernel: NVRM: Xid (PCI:0000:3b:00): 79, pid=2231, GPU has "
        "fallen off the bus.",
        *timeouts(skip=17)[30:],
    ]
    verdict = classify_text("\n".join(lines))
    assert (verdict.category, verdict.attribution) == ("gpu_hardware", "hardware")
    assert verdict.nodes == ["gpu-a100-007"]
    timeout = next(s for s in verdict.secondary if s["category"] == "nccl_timeout")
    assert timeout["count"] == 63
    assert len(timeout["ranks"]) == 63


def test_an_oom_in_one_rank_outranks_the_timeouts_it_causes() -> None:
    lines = [
        *timeouts(skip=5),
        "[rank5]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.",
    ]
    verdict = classify_text("\n".join(lines))
    assert verdict.category == "gpu_oom"
    assert verdict.ranks == [5]


def test_a_python_exception_in_rank_0_outranks_the_timeouts() -> None:
    lines = [
        "[rank0]: Traceback (most recent call last):",
        '[rank0]:   File "train.py", line 12, in <module>',
        "[rank0]: KeyError: 'input_ids'",
        *timeouts(skip=0),
    ]
    verdict = classify_text("\n".join(lines))
    assert (verdict.category, verdict.attribution) == ("app_exception", "application")
    assert verdict.evidence == "KeyError: 'input_ids'"
    assert verdict.ranks == [0]


def test_a_wrapper_never_hides_the_exception_it_wraps() -> None:
    lines = [
        "ValueError: Expected input batch_size (32) to match target batch_size (64).",
        "ERROR:torch.distributed.elastic.multiprocessing.api:failed (exitcode: 1) local_rank: 0 "
        "(pid: 4242) of binary: /usr/bin/python3",
        "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ",
        "srun: error: gpu-003: task 12: Exited with exit code 1",
    ]
    verdict = classify_text("\n".join(lines))
    assert verdict.category == "app_exception"
    assert verdict.evidence.startswith("ValueError")


def test_a_wrapper_alone_still_says_a_child_died() -> None:
    verdict = classify_text("srun: error: gpu-003: task 12: Exited with exit code 1\n")
    assert verdict.category == "app_exception"
    assert verdict.nodes == ["gpu-003"]
    assert verdict.ranks == [12]


def test_hardware_outranks_the_segfault_it_causes() -> None:
    verdict = classify_text(
        "RuntimeError: CUDA error: uncorrectable ECC error encountered\n"
        "Segmentation fault (core dumped)\n"
    )
    assert verdict.category == "gpu_hardware"


def test_an_abort_after_a_collective_timeout_is_the_timeout() -> None:
    verdict = classify_text(
        TIMEOUT.format(r=3)
        + "\nterminate called after throwing an instance of 'c10::DistBackendError'\n"
        "Fatal Python error: Aborted\n"
    )
    assert verdict.category == "nccl_timeout"


def test_nccl_chatter_and_warnings_are_healthy() -> None:
    text = "\n".join(
        [
            "gpu-001:1379562:1379562 [0] NCCL INFO Bootstrap : Using enp36s0f1:10.0.0.1<0>",
            "gpu-001:1379562:1379562 [0] misc/ibvwrap.cc:63 NCCL WARN Failed to open libibverbs.so[.1]",
            "gpu-001:1379562:1379562 [0] NCCL INFO NET/Socket : Using [0]enp36s0f1:10.0.0.1<0>",
            "/usr/lib/python3/site-packages/torch/distributed/launch.py:180: FutureWarning: The module torch.distributed.launch is deprecated",
            "UserWarning: TypedStorage is deprecated.",
            "[deepspeed] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: 65536, reducing to 32768",
            "pcieport 0000:00:03.0: PCIe Bus Error: severity=Corrected, type=Data Link Layer",
            " iteration      122/  250000 | lm loss: 2.504220E+00 | grad norm: 0.231 |",
        ]
    )
    verdict = classify_text(text)
    assert verdict.healthy
    assert verdict.evidence == ""


def test_an_error_the_job_recovered_from_is_not_a_failure() -> None:
    lines = ["OSError: [Errno 116] Stale file handle"] + [
        f" iteration {step:8d}/  250000 | lm loss: 2.5 |" for step in range(100, 106)
    ]
    verdict = classify_text("\n".join([" iteration       99/  250000 | lm loss: 2.5 |", *lines]))
    assert verdict.healthy
    assert verdict.recovered
    assert verdict.secondary[0]["category"] == "storage_io"


def test_an_error_with_progress_only_in_flight_is_still_a_failure() -> None:
    text = "\n".join(
        [
            " iteration       99/  250000 | lm loss: 2.5 |",
            "[rank3]: KeyError: 'labels'",
            " iteration      100/  250000 | lm loss: 2.5 |",
            *timeouts(skip=3, ranks=8),
        ]
    )
    verdict = classify_text(text)
    assert verdict.category == "app_exception"


def test_xid_codes_decide_category_and_attribution() -> None:
    app = classify_text(
        "NVRM: Xid (PCI:0000:4e:00): 13, pid=1201, name=python, Graphics SM Warp Exception\n"
    )
    assert app.category == "cuda_error_app"
    nvlink = classify_text("NVRM: Xid (PCI:0000:4e:00): 74, pid=1201, NVLink: fatal error\n")
    assert nvlink.category == "interconnect"
    assert nvlink.attribution == "hardware"


def test_an_exception_python_ignored_at_shutdown_is_not_a_failure() -> None:
    text = "\n".join(
        [
            " iteration     1000/     1000 | lm loss: 1.9 |",
            "Exception ignored in: <function _MultiProcessingDataLoaderIter.__del__ at 0x7f>",
            "Traceback (most recent call last):",
            '  File "/usr/lib/python3/site-packages/torch/utils/data/dataloader.py", line 1479',
            "AttributeError: 'NoneType' object has no attribute 'python_exit_status'",
        ]
    )
    assert classify_text(text).healthy


def test_an_error_the_program_retries_is_not_a_failure() -> None:
    text = (
        "gpu-001:1:2 [0] NCCL WARN Net : Connect to 10.0.0.2<4242> failed : Connection refused, "
        "retrying\n"
        "requests.exceptions.ConnectionError: HTTPSConnectionPool(host='api.wandb.ai'): Max "
        "retries exceeded, will retry in 10 s\n"
    )
    assert classify_text(text).healthy


@pytest.mark.parametrize(
    ("line", "attribution"),
    [
        (
            "torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1691, "
            "invalid usage (run with NCCL_DEBUG=WARN for details), NCCL version 2.19.3",
            "application",
        ),
        (
            "torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1691, "
            "internal error - please report this issue to the NCCL developers, NCCL version 2.19.3",
            "unknown",
        ),
    ],
)
def test_nccl_misuse_is_the_application_as_nccl_documents_it(line: str, attribution: str) -> None:
    verdict = classify_text(line + "\n")
    assert (verdict.category, verdict.attribution) == ("nccl_error", attribution)


def test_a_rank_killed_outright_outranks_its_peers_timeouts() -> None:
    timeouts = "".join(
        f"[rank{rank}]:[E ProcessGroupNCCL.cpp:616] [Rank {rank}] Watchdog caught collective "
        "operation timeout: WorkNCCL(SeqNum=9, OpType=ALLREDUCE) ran for 600000 milliseconds\n"
        for rank in range(1, 8)
    )
    killed = (
        "  exitcode  : -9 (pid: 14750)\n  traceback : Signal 9 (SIGKILL) received by PID 14750\n"
    )
    assert classify_text(timeouts + killed).category == "host_oom"
    bus_error = "failed (exitcode: -7) local_rank: 0 (pid: 37386) of binary: /usr/bin/python\n"
    assert classify_text(timeouts + bus_error).category == "segfault"
    aborted = "failed (exitcode: -6) local_rank: 0 (pid: 37386) of binary: /usr/bin/python\n"
    assert classify_text(timeouts + aborted).category == "nccl_timeout"
