"""Beat killed at any moment starts again: it keeps no schedule file to leave half written."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from django.conf import settings

pytestmark = pytest.mark.services


def start_beat(var_dir: Path, log: Path) -> subprocess.Popen[bytes]:
    celery = str(Path(sys.executable).parent / "celery")
    with log.open("ab") as out:
        return subprocess.Popen(
            [celery, "-A", "tasks", "beat", "--loglevel", "INFO"],
            cwd=settings.BASE_DIR,
            env={
                **os.environ,
                "WR_VAR_DIR": str(var_dir),
                "REDIS_URL": settings.REDIS_URL,
                # A queue nobody consumes: the beats sent here must not reach a real worker.
                "WR_CELERY_QUEUE": "test-beat-restart",
            },
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def test_beat_sigkilled_while_running_starts_again(tmp_path: Path) -> None:
    """Found by the chaos run: a beat killed while it wrote its shelve file left it without its
    .dat part, and every restart exited with FileNotFoundError."""
    log = tmp_path / "beat.log"
    # What the killed beat left behind with the shelve scheduler: a schedule without its data.
    (tmp_path / "celerybeat-schedule.dir").write_text("'entries', (0, 1)\n")
    for _ in range(2):
        beat = start_beat(tmp_path, log)
        try:
            deadline = time.monotonic() + 30
            while b"Sending due task" not in log.read_bytes():
                assert beat.poll() is None, log.read_text(errors="replace")[-2000:]
                assert time.monotonic() < deadline, "beat sent nothing within 30 s"
                time.sleep(0.2)
        finally:
            os.kill(beat.pid, signal.SIGKILL)
            beat.wait()
        log.write_bytes(b"")
    assert not list(tmp_path.glob("celerybeat-schedule.dat"))
