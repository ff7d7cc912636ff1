"""How a traceback was printed, read from the lines around it, as the scanner reports it."""

from __future__ import annotations

import pytest

from recovery.detection.quiet_phases import parse_evaluation_start
from recovery.detection.scanner.log_scanner import LogScanner
from recovery.detection.taxonomy import Severity
from recovery.detection.tracebacks import Printed, least_handled, printed_as


def printing(log: str) -> set[str]:
    """How the tracebacks behind each failure of ``log`` were printed, as the scanner says
    (failures from the first header on: a logging record before it may be one of its own;
    warnings are never acted on, so how they were printed is not read)."""
    header = next(n for n, line in enumerate(log.splitlines(), 1) if "Traceback (most" in line)
    scanner = LogScanner()
    scanner.feed(log.encode())
    return {
        f.detail.get("printed", "absent")
        for f in scanner.finish().findings
        if (f.first_line or 0) >= header and f.severity != Severity.WARNING
    }


UNCAUGHT_UNDER_TORCHRUN = """\
[rank1]: Traceback (most recent call last):
[rank1]:   File "/workspace/megatron/pretrain_gpt.py", line 245, in <module>
[rank1]:     pretrain(train_valid_test_datasets_provider, model_provider)
[rank1]:   File "/workspace/megatron/training/training.py", line 311, in pretrain
[rank1]:     iteration, num_floating_point_operations_so_far = train(
[rank1]: RuntimeError: shape '[4096, -1, 32, 128]' is invalid for input of size 1048576
"""

UNCAUGHT_UNDER_PYTHON_M = """\
Traceback (most recent call last):
  File "/usr/lib/python3.10/runpy.py", line 196, in _run_module_as_main
    return _run_code(code, main_globals, None,
  File "/opt/app/train/__main__.py", line 12, in <module>
    main()
ValueError: num_samples should be a positive integer value, but got num_samples=0
"""

LOGGED_BY_LOGGING_EXCEPTION = """\
2024-05-01 12:00:00,123 - train.data - ERROR - could not decode sample 4211, skipping it
Traceback (most recent call last):
  File "/opt/app/data/webdataset.py", line 88, in __iter__
    sample = decode(raw)
PIL.UnidentifiedImageError: cannot identify image file <_io.BytesIO object at 0x7f3c>
"""

LOGGED_BY_LOGURU = """\
2024-05-01 12:00:00.123 | ERROR    | trainer.callbacks:on_step_end:51 - wandb upload failed
Traceback (most recent call last):
  File "/opt/app/trainer/callbacks.py", line 49, in on_step_end
    self.run.log(metrics)
KeyError: 'val/loss'
"""

PRINTED_BY_PRINT_EXC = """\
Traceback (most recent call last):
  File "/opt/app/eval/harness.py", line 140, in evaluate_task
    result = task.run(model)
ZeroDivisionError: division by zero
"""

THREAD_DIED = """\
Exception in thread Thread-3 (_pin_memory_loop):
Traceback (most recent call last):
  File "/usr/lib/python3.10/threading.py", line 1016, in _bootstrap_inner
    self.run()
  File "/usr/lib/python3.10/threading.py", line 953, in run
    self._target(*self._args, **self._kwargs)
RuntimeError: Pin memory thread exited unexpectedly
"""

CHILD_DIED = """\
Process SpawnProcess-2:
Traceback (most recent call last):
  File "/usr/lib/python3.10/multiprocessing/process.py", line 314, in _bootstrap
    self.run()
  File "/usr/lib/python3.10/multiprocessing/process.py", line 108, in run
    self._target(*self._args, **self._kwargs)
OSError: [Errno 28] No space left on device
"""


@pytest.mark.parametrize(
    ("log", "expected"),
    [
        (UNCAUGHT_UNDER_TORCHRUN, "top_level"),
        (UNCAUGHT_UNDER_PYTHON_M, "top_level"),
        (LOGGED_BY_LOGGING_EXCEPTION, "handled"),
        (LOGGED_BY_LOGURU, "handled"),
        (PRINTED_BY_PRINT_EXC, "handled"),
        (THREAD_DIED, "thread_died"),
        (CHILD_DIED, "child_died"),
    ],
)
def test_how_a_traceback_was_printed_is_read_from_its_frames_and_the_line_before(
    log: str, expected: str
) -> None:
    assert printing(log) == {expected}


def test_a_top_level_handler_that_logs_on_the_way_out_is_not_handled() -> None:
    """
    GIVEN a script whose top level catches everything, logs it and exits
    THEN its traceback ends at the module: the program is ending, whatever the logger says
    """
    log = (
        "ERROR:__main__:training failed\n"
        "Traceback (most recent call last):\n"
        '  File "/opt/app/train.py", line 300, in <module>\n'
        "    main()\n"
        "KeyError: 'optimizer'\n"
    )
    assert printing(log) == {"top_level"}


def test_other_ranks_lines_between_do_not_hide_the_first_frame() -> None:
    log = (
        "1: ERROR:train.data:skipping sample 17\n"
        "0: step: 12  loss: 2.3100\n"
        "1: Traceback (most recent call last):\n"
        "0: step: 13  loss: 2.3000\n"
        '1:   File "/workspace/train/ddp_train.py", line 214, in <module>\n'
        "1:     main()\n"
        "1: KeyError: 'shard-00017/sample-004211'\n"
    )
    assert printing(log) == {"top_level"}


def test_a_traceback_whose_frames_were_not_read_is_unknown() -> None:
    assert printing("Traceback (most recent call last):\n") == {""}
    assert printed_as(None, None) == Printed.UNKNOWN


def test_of_several_tracebacks_the_least_handled_speaks_for_the_finding() -> None:
    """
    GIVEN the same exception logged and skipped once, then uncaught at the top level
    THEN the finding is not one the program handled
    """
    handled = LOGGED_BY_LOGGING_EXCEPTION.replace(
        "PIL.UnidentifiedImageError: cannot identify image file <_io.BytesIO object at 0x7f3c>",
        "KeyError: 'shard-00017/sample-004211'",
    )
    uncaught = UNCAUGHT_UNDER_PYTHON_M.replace(
        "ValueError: num_samples should be a positive integer value, but got num_samples=0",
        "KeyError: 'shard-00017/sample-004211'",
    )
    assert printing(handled + uncaught) == {"top_level"}
    assert least_handled({Printed.HANDLED, Printed.THREAD_DIED}) == Printed.THREAD_DIED
    assert least_handled(set()) == Printed.UNKNOWN


def test_a_failure_line_far_from_any_header_says_nothing_of_printing() -> None:
    log = THREAD_DIED + "".join(f"0: step: {n}  loss: 2.3\n" for n in range(700))
    log += "NCCL error: unhandled system error, NCCL version 2.18.1\n"
    scanner = LogScanner()
    scanner.feed(log.encode())
    nccl = [f for f in scanner.finish().findings if "NCCL" in f.evidence]
    assert nccl and "printed" not in nccl[0].detail


@pytest.mark.parametrize(
    "line",
    [
        "***** Running Evaluation *****",
        "Running evaluation on 2048 samples",
        "Starting validation at iteration 1000",
        "Evaluating on the validation set...",
        "Validation: 0it [00:00, ?it/s]",
        "Validation DataLoader 0:   0%|          | 0/50 [00:00<?, ?it/s]",
        "[eval] begin",
    ],
)
def test_announcements_of_an_evaluation_pass(line: str) -> None:
    assert parse_evaluation_start(line)


@pytest.mark.parametrize(
    "line",
    [
        "validation loss at iteration 1000 | lm loss value: 2.31",
        "{'eval_loss': 2.31, 'eval_runtime': 41.2, 'epoch': 1.0}",
        "step: 12  loss: 2.3100  memory: 0.10GiB  tps: 5,231",
        "ValueError: evaluation strategy must be one of no, steps, epoch",
        "model.eval() called",
    ],
)
def test_results_and_mentions_of_evaluation_announce_nothing(line: str) -> None:
    assert not parse_evaluation_start(line)


def test_a_chain_of_exceptions_is_decided_by_the_one_that_propagated() -> None:
    """
    GIVEN torch.save failing inside a handler that raises a new error from it, uncaught
    THEN the cause's traceback (whose frames start where it was caught) is not "handled": the
         last traceback of the chain reached the module, and speaks for every exception in it
    """
    log = (
        "Traceback (most recent call last):\n"
        '  File "/usr/lib/python3/site-packages/torch/serialization.py", line 652, in save\n'
        "    _save(obj, opened_zipfile, pickle_module, pickle_protocol)\n"
        "RuntimeError: [enforce fail at inline_container.cc:595] . unexpected pos 4096 vs 3944\n"
        "\n"
        "During handling of the above exception, another exception occurred:\n"
        "\n"
        "Traceback (most recent call last):\n"
        '  File "/opt/app/train.py", line 300, in <module>\n'
        "    main()\n"
        "OSError: [Errno 28] No space left on device\n"
    )
    assert printing(log) == {"top_level"}


def test_a_new_traceback_after_a_chain_starts_a_chain_of_its_own() -> None:
    log = PRINTED_BY_PRINT_EXC + "1: step: 12  loss: 2.3\n" + UNCAUGHT_UNDER_PYTHON_M
    scanner = LogScanner()
    scanner.feed(log.encode())
    printed = {f.evidence[:17]: f.detail.get("printed") for f in scanner.finish().findings}
    assert printed["ZeroDivisionError"] == "handled"
    assert printed["ValueError: num_s"] == "top_level"
