"""The soak's real text: tracebacks cut as a handler prints them, warnings that are no progress."""

from __future__ import annotations

from bench.soak.corpus import build, handled_traceback
from recovery.detection.normalize import parse_line
from recovery.detection.progress.parser import parse_progress
from recovery.detection.tracebacks import Printed, printed_as


def test_every_traceback_starts_at_a_function_and_ends_with_its_exception() -> None:
    corpus = build()
    assert len(corpus["tracebacks"]) >= 5
    for entry in corpus["tracebacks"]:
        assert entry["source"].startswith("https://")
        assert entry["category"] in {"storage_io", "gpu_oom", "host_oom", "app_exception"}
        lines = entry["lines"]
        assert lines[0].startswith('  File "') and "in <module>" not in lines[0]
        assert not lines[-1].startswith(" ")
        assert printed_as("ERROR:train:skipping a batch", lines[0]) == Printed.HANDLED


def test_warnings_come_from_healthy_logs_and_none_reads_as_progress() -> None:
    corpus = build()
    assert len(corpus["warnings"]) >= 3
    for entry in corpus["warnings"]:
        assert entry["category"] == "healthy"
        for line in entry["lines"]:
            assert parse_progress(parse_line(line).message) is None


def test_a_traceback_cut_off_before_its_exception_is_not_used() -> None:
    log = 'Traceback (most recent call last):\n  File "train.py", line 3, in main\n    step()\n'
    assert handled_traceback(log) is None
    log += "RuntimeError: boom\n"
    assert handled_traceback(log) == (
        ['  File "train.py", line 3, in main', "    step()", "RuntimeError: boom"],
        0,
    )


def test_module_and_launcher_frames_are_dropped_or_refused() -> None:
    top = (
        "[rank3]: Traceback (most recent call last):\n"
        '[rank3]:   File "/w/trainer.py", line 58, in <module>\n'
        "[rank3]:     main()\n"
        '[rank3]:   File "/w/trainer.py", line 54, in main\n'
        "[rank3]:     loop()\n"
        "[rank3]: OSError: [Errno 5] Input/output error\n"
    )
    assert handled_traceback(top) == (
        [
            '  File "/w/trainer.py", line 54, in main',
            "    loop()",
            "OSError: [Errno 5] Input/output error",
        ],
        1,
    )
    launcher = top.replace("/w/trainer.py", "/opt/torch/distributed/run.py")
    assert handled_traceback(launcher) is None
