"""The Advisor Controller runs on a login node without the control plane: it loads no Django.

Each check imports the controller in a fresh interpreter with ``-X importtime``, which lists every
module the import loaded, whoever imported it.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from recovery.controller import cli

REPO = Path(__file__).resolve().parents[2]
CONTROL_PLANE_PACKAGES = ("django", "celery", "rest_framework")


def loaded_modules(statement: str) -> set[str]:
    result = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", statement],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    # "import time:   self [us] | cumulative | imported package", the name indented by depth.
    return {
        line.rpartition("|")[2].strip()
        for line in result.stderr.splitlines()
        if line.startswith("import time:")
    }


@pytest.mark.parametrize(
    ("statement", "module"),
    [
        (
            "import recovery.controller.controller, recovery.controller.client",
            "recovery.controller.controller",
        ),
        ("import recovery.controller.cli", "recovery.controller.cli"),
    ],
)
def test_it_loads_no_control_plane_framework(statement: str, module: str) -> None:
    modules = loaded_modules(statement)
    assert module in modules
    loaded = sorted(module for module in modules if module.split(".")[0] in CONTROL_PLANE_PACKAGES)
    assert loaded == [], f"{statement!r} loads {loaded}"


def test_the_command_line_starts_without_django() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "recovery.controller.cli", "--help"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "--cluster" in result.stdout and "--simulated" in result.stdout


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["--cluster", "lab", "--once"], "give the token in WR_CONTROLLER_TOKEN or --token-file"),
        (["--cluster", "lab", "--ssh", "ops@login"], "--ssh needs --known-hosts and --key"),
        (
            ["--cluster", "lab", "--ssh", "login", "--known-hosts", "k", "--key", "k"],
            "--ssh wants USER@HOST[:PORT], got 'login'",
        ),
    ],
)
def test_it_refuses_to_start_when_misconfigured(
    argv: list[str], said: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("WR_CONTROLLER_TOKEN", raising=False)
    if "--ssh" in argv:
        monkeypatch.setenv("WR_CONTROLLER_TOKEN", "wrc_test")
    assert cli.main(argv) == 1
    assert capsys.readouterr().err == said + "\n"
