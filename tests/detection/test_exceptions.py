"""An exception's type and errno decide its category when its words are new."""

from __future__ import annotations

import pytest

from recovery.detection.classify import classify_text
from recovery.detection.exceptions import RaisedException, meaning_of, parse_exception_line


def test_the_last_line_of_a_traceback_is_parsed_into_module_type_message_and_errno() -> None:
    raised = parse_exception_line(
        "OSError: [Errno 28] No space left on device: '/scratch/ckpt/step_400.pt'"
    )
    assert raised == RaisedException(
        module="",
        name="OSError",
        wrapped="",
        message="[Errno 28] No space left on device: '/scratch/ckpt/step_400.pt'",
        errno=28,
    )
    qualified = parse_exception_line("torch.cuda.OutOfMemoryError: CUDA out of memory.")
    assert qualified is not None
    assert (qualified.module, qualified.name, qualified.qualified_name) == (
        "torch.cuda",
        "OutOfMemoryError",
        "torch.cuda.OutOfMemoryError",
    )


def test_a_wrapper_names_the_type_it_wraps() -> None:
    raised = parse_exception_line(
        "ray.exceptions.RayTaskError(OutOfMemoryError): ray::train_fn() (pid=4242)"
    )
    assert raised is not None
    assert (raised.module, raised.name, raised.wrapped) == (
        "ray.exceptions",
        "RayTaskError",
        "OutOfMemoryError",
    )


@pytest.mark.parametrize(
    "line",
    [
        "Epoch: 3",
        "Note: training resumes from step 400",
        "loss: 0.31 | ErrorRate: 0.02 | lr 3e-4",
        "",
    ],
)
def test_lines_that_are_not_an_exception_are_not_parsed_as_one(line: str) -> None:
    assert parse_exception_line(line) is None


@pytest.mark.parametrize(
    ("line", "category", "attribution"),
    [
        # A wording no signature knows: the errno says what it is.
        (
            "OSError: [Errno 28] write of 4096 bytes to shard 3 failed",
            "storage_io",
            "system_software",
        ),
        (
            "PermissionError: [Errno 30] cannot open /data/out for writing",
            "storage_io",
            "system_software",
        ),
        ("OSError: [Errno 122] quota for project p42 reached", "storage_io", "system_software"),
        ("OSError: [Errno 12] fork of worker 3 refused", "host_oom", "application"),
        # Ray's OutOfMemoryError is the host's; PyTorch's the GPU's.
        (
            "ray.exceptions.OutOfMemoryError: Task was killed: node low on memory",
            "host_oom",
            "application",
        ),
        (
            "torch.OutOfMemoryError: allocation of 2.00 GiB on device 0 failed",
            "gpu_oom",
            "application",
        ),
        (
            "jaxlib.xla_extension.XlaRuntimeError: RESOURCE_EXHAUSTED: Failed to allocate 8.0G",
            "gpu_oom",
            "application",
        ),
        (
            "tensorflow.python.framework.errors_impl.ResourceExhaustedError: failed to allocate",
            "gpu_oom",
            "application",
        ),
        (
            "FloatingPointError: Minimum loss scale reached (0.0001).",
            "nan_divergence",
            "application",
        ),
        (
            "ConnectionResetError: [Errno 104] c10d TCPStore recv from rank 7 failed",
            "interconnect",
            "system_software",
        ),
    ],
)
def test_a_known_type_or_errno_decides_the_category(
    line: str, category: str, attribution: str
) -> None:
    raised = parse_exception_line(line)
    assert raised is not None
    meaning = meaning_of(raised)
    assert meaning is not None
    assert (meaning.category, meaning.attribution) == (category, attribution)
    verdict = classify_text(
        f'Traceback (most recent call last):\n  File "train.py", line 9, in <module>\n{line}'
    )
    assert (verdict.category, verdict.attribution) == (category, attribution)


@pytest.mark.parametrize(
    "line",
    [
        # A socket error the program met downloading: not the fabric between ranks.
        "requests.exceptions.ConnectionError: [Errno 111] Connection refused",
        "KeyError: 'input_ids'",
        "ValueError: too many values to unpack (expected 2)",
        "OSError: [Errno 2] No such file or directory: 'config.yaml'",
    ],
)
def test_an_unknown_type_or_errno_stays_the_application_s(line: str) -> None:
    raised = parse_exception_line(line)
    assert raised is not None
    assert meaning_of(raised) is None
    verdict = classify_text(
        f'Traceback (most recent call last):\n  File "train.py", line 9, in <module>\n{line}'
    )
    assert verdict.category == "app_exception"


CHAINED = """\
Traceback (most recent call last):
  File "train.py", line 10, in step
    dist.all_reduce(t)
{cause}

{marker}

Traceback (most recent call last):
  File "train.py", line 30, in <module>
    main()
  File "train.py", line 22, in main
    raise RuntimeError(step) from exc
RuntimeError: step 300 failed
"""


@pytest.mark.parametrize(
    "marker",
    [
        "The above exception was the direct cause of the following exception:",
        "During handling of the above exception, another exception occurred:",
    ],
)
@pytest.mark.parametrize(
    ("cause", "category"),
    [
        (
            "torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1970, "
            "unhandled cuda error, NCCL version 2.19.3",
            "nccl_error",
        ),
        ("torch.distributed.DistStoreError: Socket Timeout", "nccl_timeout"),
        ("OSError: [Errno 28] No space left on device", "storage_io"),
        # A cause of no known meaning: the exception that propagated speaks for the chain.
        ("KeyError: 3", "app_exception"),
    ],
)
def test_a_generic_exception_raised_from_a_telling_one_only_wraps_it(
    marker: str, cause: str, category: str
) -> None:
    assert classify_text(CHAINED.format(cause=cause, marker=marker)).category == category


def test_a_generic_exception_that_starts_a_chain_is_not_a_wrapper() -> None:
    log = CHAINED.format(
        cause="ValueError: bad batch",
        marker="During handling of the above exception, another exception occurred:",
    ).replace("RuntimeError: step 300 failed", "torch.distributed.DistStoreError: Socket Timeout")
    assert classify_text(log).category == "app_exception"
