"""`manage.py demo` as a child process for the tests that run it whole."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

from django.conf import settings

BASE_DIR = Path(settings.BASE_DIR)


def processes_with_marker(marker: str) -> list[int]:
    """PIDs whose environment contains ``marker`` (the demo's private var directory)."""
    found = []
    for environ in Path("/proc").glob("[0-9]*/environ"):
        try:
            if marker.encode() in environ.read_bytes():
                found.append(int(environ.parent.name))
        except OSError:
            continue
    return found


def wait_for_http(url: str, process: subprocess.Popen[bytes], seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError(f"demo exited early with code {process.returncode}")
        try:
            urllib.request.urlopen(url, timeout=2)
            return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            # Refused while it starts, or accepted but not answered yet on a busy machine.
            time.sleep(0.5)
    raise AssertionError(f"{url} did not answer within {seconds} s")


class DemoRun:
    """The demo started with ``env`` over the test's environment; its output is collected."""

    def __init__(self, env: dict[str, str]) -> None:
        environment = {**os.environ, **env}
        environment.pop("DEBUG", None)
        self.process = subprocess.Popen(
            [sys.executable, "manage.py", "demo"],
            cwd=BASE_DIR,
            env=environment,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self._output: list[bytes] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self._output.append(line)

    @property
    def output(self) -> str:
        return b"".join(self._output).decode(errors="replace")

    def wait_for_output(self, text: str, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while text not in self.output:
            if self.process.poll() is not None:
                raise AssertionError(f"demo exited early:\n{self.output[-3000:]}")
            if time.monotonic() > deadline:
                raise AssertionError(f"{text!r} not printed within {seconds} s")
            time.sleep(0.5)

    def stop(self, seconds: float = 60) -> str:
        """Ctrl-C, as a person stops it; its whole output once it has exited."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
        try:
            self.process.wait(timeout=seconds)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
            raise AssertionError(f"demo did not stop within {seconds} s of SIGINT") from None
        self._reader.join(timeout=10)
        return self.output
