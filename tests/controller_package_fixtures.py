"""The Advisor Controller's own distribution, built once per session and installed into fresh
virtual environments of each Python this machine has from 3.9 on (tests/deploy, and the restart
on real Slurm in tests/slurm/test_controller_wheel.py).

The wheel is built from ``deploy/controller-wheel/pyproject.toml`` with pip and hatchling, as an
operator builds it. Each virtual environment holds the wheel, what it depends on, and pytest;
never Django. Environments are kept under ``var/deploy-check/`` by the wheel's hash, so an
unchanged wheel is not installed again on the next run; a changed one gets new environments.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGE_DIR = REPO / "deploy" / "controller-wheel"
STATE_DIR = REPO / "var" / "deploy-check"
# The oldest Python the controller's distribution supports, and the newer ones it is run on:
# all of them in `make deploy-check`; `make test` names the oldest and the newest in
# WR_CONTROLLER_PYTHONS ("9,13"), the ones the restart on Slurm runs with, to keep its time down.
SUPPORTED_MINORS = (9, 10, 11, 12, 13)
PYTHON_MINORS = (
    tuple(int(minor) for minor in os.environ.get("WR_CONTROLLER_PYTHONS", "").split(",") if minor)
    or SUPPORTED_MINORS
)
# Installed beside the wheel to run the project's own tests of the modules it ships.
TEST_RUNNER = "pytest>=8,<10"


@dataclass(frozen=True)
class ControllerVenv:
    root: Path
    python_version: str

    @property
    def python(self) -> Path:
        return self.root / "bin" / "python"

    @property
    def script(self) -> Path:
        return self.root / "bin" / "workload-recovery-controller"

    def run(
        self, argv: list[str], *, env: dict[str, str] | None = None, cwd: Path | None = None,
        timeout: float = 300,
    ) -> subprocess.CompletedProcess[str]:  # fmt: skip
        """Run ``argv`` with this environment's bin first on the path and nothing of the
        control plane's: not its virtual environment, not the checkout on ``sys.path``."""
        base = {key: value for key, value in os.environ.items() if key not in {"PYTHONPATH"}}
        base["PATH"] = f"{self.root / 'bin'}:/usr/local/bin:/usr/bin:/bin"
        base.pop("VIRTUAL_ENV", None)
        base.pop("DJANGO_SETTINGS_MODULE", None)
        return subprocess.run(
            argv,
            cwd=cwd or STATE_DIR,
            env={**base, **(env or {})},
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )


def find_python(minor: int) -> Path | None:
    """An interpreter of Python 3.``minor``: this one, one on PATH, or one pyenv installed."""
    if sys.version_info[:2] == (3, minor):
        return Path(sys.executable)
    candidates = []
    found = shutil.which(f"python3.{minor}")
    if found:
        candidates.append(Path(found))
    pyenv_root = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv"))
    candidates += sorted((pyenv_root / "versions").glob(f"3.{minor}.*/bin/python3.{minor}"))
    for candidate in candidates:
        # pyenv's shims are on PATH for every version it has, and fail for those not selected.
        probe = subprocess.run(
            [str(candidate), "-c", "import sys, venv; print(sys.version_info[:2])"],
            capture_output=True,
            text=True,
            check=False,
        )
        if probe.returncode == 0 and probe.stdout.strip() == f"(3, {minor})":
            return candidate
    return None


def run_or_fail(argv: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
    """Run a build or install step; the test fails with the step's error output."""
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def build_wheel(out_dir: Path) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    for old in out_dir.glob("*.whl"):
        old.unlink()
    command = [
        sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
        "--disable-pip-version-check", "--wheel-dir", str(out_dir), str(PACKAGE_DIR),
    ]  # fmt: skip
    run_or_fail(command, timeout=300)
    (wheel,) = out_dir.glob("workload_recovery_controller-*.whl")
    return wheel


@pytest.fixture(scope="session")
def controller_wheel() -> Path:
    # Each test worker builds its own (a few seconds): the builds are reproducible, so every
    # worker's wheel has the same hash and finds the same venvs.
    return build_wheel(STATE_DIR / "dist" / (os.environ.get("PYTEST_XDIST_WORKER") or "main"))


@contextlib.contextmanager
def machine_lock(name: str) -> Iterator[None]:
    """Held by one test worker at a time on this machine: the others wait for it."""
    STATE_DIR.mkdir(parents=True, exist_ok=True)
    with (STATE_DIR / f"{name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


@pytest.fixture(scope="session")
def controller_venv(controller_wheel: Path) -> Callable[[int], ControllerVenv]:
    """A fresh environment of Python 3.``minor`` holding the wheel; skips when this machine has
    no such Python."""
    digest = hashlib.sha256(controller_wheel.read_bytes()).hexdigest()[:16]
    made: dict[int, ControllerVenv] = {}

    def venv_for(minor: int) -> ControllerVenv:
        if minor in made:
            return made[minor]
        python = find_python(minor)
        if python is None:
            pytest.skip(f"no Python 3.{minor} on this machine (PATH or pyenv)")
        root = STATE_DIR / "venvs" / f"py3.{minor}-{digest}"
        # Two workers (each Slurm cluster's) may want the same venv at once: one makes it.
        with machine_lock(f"venv-py3.{minor}"):
            if not (root / ".complete").exists():
                for stale in (STATE_DIR / "venvs").glob(f"py3.{minor}-*"):
                    shutil.rmtree(stale)
                subprocess.run([str(python), "-m", "venv", str(root)], check=True, timeout=300)
                install = [
                    str(root / "bin" / "python"), "-m", "pip", "install", "--quiet",
                    "--disable-pip-version-check", str(controller_wheel), TEST_RUNNER,
                ]  # fmt: skip
                run_or_fail(install, timeout=600)
                (root / ".complete").touch()
        version = subprocess.run(
            [
                str(root / "bin" / "python"),
                "-c",
                "import platform; print(platform.python_version())",
            ],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        assert re.fullmatch(rf"3\.{minor}\.\d+", version), version
        made[minor] = ControllerVenv(root, version)
        return made[minor]

    return venv_for
