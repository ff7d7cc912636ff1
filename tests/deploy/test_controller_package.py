"""The Advisor Controller as its own distribution (``workload-recovery-controller``): what the
wheel holds, and that it runs on each Python from 3.9 on without Django.

On each Python the installed wheel runs its command line and the project's own tests of the
modules it ships (copied out of the checkout, so that they import the installed wheel, not the
source tree). The restart it carries out on real Slurm is tests/slurm/test_controller_wheel.py.
"""

from __future__ import annotations

import argparse
import ast
import re
import shutil
import tomllib
import zipfile
from collections.abc import Callable
from pathlib import Path

import pytest
from django.core.management import load_command_class

from recovery.controller import cli
from tests.controller_package_fixtures import PACKAGE_DIR, PYTHON_MINORS, REPO, ControllerVenv

pytestmark = pytest.mark.deploy

CONTROL_PLANE_PACKAGES = {"django", "celery", "rest_framework", "channels", "redis", "httpx"}
# The project's tests of what the wheel ships, which need neither Django nor the control plane.
SHIPPED_MODULE_TESTS = [
    "tests/fakes.py",
    "tests/controller/test_client.py",
    "tests/controller/test_controller_safety.py",
    "tests/controller/test_controller_stop.py",
    "tests/controller/test_node_actions.py",
    "tests/schedulers/test_dependency.py",
    "tests/schedulers/test_nodelist.py",
    "tests/schedulers/test_optin.py",
    "tests/schedulers/test_slurm_adapter_reading.py",
    "tests/schedulers/test_slurm_json.py",
    "tests/schedulers/data",
]
# Imported only when --simulated is given, which the distribution refuses with a reason.
CONTROL_PLANE_ONLY = {"recovery.simulator.adapter", "recovery.simulator.store"}


def wheel_modules(wheel: Path) -> dict[str, str]:
    """Module name → source, for every Python file in the wheel."""
    with zipfile.ZipFile(wheel) as archive:
        return {
            name.removesuffix(".py").removesuffix("/__init__").replace("/", "."): archive.read(
                name
            ).decode()
            for name in archive.namelist()
            if name.endswith(".py")
        }


def imported_modules(source: str) -> set[str]:
    """Every module ``source`` imports, at any depth of the code (lazy imports included)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def test_the_wheel_ships_every_module_the_controller_imports_and_nothing_of_django(
    controller_wheel: Path,
) -> None:
    modules = wheel_modules(controller_wheel)
    assert "recovery.controller.cli" in modules
    missing: dict[str, set[str]] = {}
    for module, source in modules.items():
        imports = imported_modules(source)
        frameworks = {name for name in imports if name.split(".")[0] in CONTROL_PLANE_PACKAGES}
        assert not frameworks, f"{module} imports {sorted(frameworks)}"
        ours = {name for name in imports if name.split(".")[0] == "recovery"}
        absent = ours - set(modules) - CONTROL_PLANE_ONLY
        if absent:
            missing[module] = absent
    assert missing == {}, "modules imported but not in the wheel"
    # Each shipped file is the checkout's file, byte for byte.
    for module, source in modules.items():
        path = REPO / (module.replace(".", "/") + ".py")
        if not path.exists():
            path = REPO / module.replace(".", "/") / "__init__.py"
        assert path.read_text() == source, module


def test_the_wheel_ships_the_schedulers_and_controller_packages_whole(
    controller_wheel: Path,
) -> None:
    """No list of files to keep up to date: every module of the two packages is in the wheel,
    and nothing else of the project but the namespace file above them."""
    shipped = set(wheel_modules(controller_wheel))
    in_checkout = {
        ".".join(path.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__")
        for package in ("schedulers", "controller")
        for path in (REPO / "recovery" / package).rglob("*.py")
    }
    assert in_checkout <= shipped
    assert shipped - in_checkout == {"recovery"}


def test_the_wheel_declares_its_command_python_and_the_control_planes_version(
    controller_wheel: Path,
) -> None:
    with zipfile.ZipFile(controller_wheel) as archive:
        info = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        metadata = archive.read(info).decode()
        entry_points = archive.read(info.replace("METADATA", "entry_points.txt")).decode()
    control_plane = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert f"Version: {control_plane['version']}\n" in metadata
    assert "Requires-Python: >=3.9\n" in metadata
    requirements = [line for line in metadata.splitlines() if line.startswith("Requires-Dist:")]
    assert [re.split(r"[<>=!~ ;]", r.removeprefix("Requires-Dist: "))[0] for r in requirements] == [
        "paramiko"
    ]
    assert "workload-recovery-controller = recovery.controller.cli:main" in entry_points
    own = tomllib.loads((PACKAGE_DIR / "pyproject.toml").read_text())["project"]
    assert own["version"] == control_plane["version"]


def option_strings(help_text: str) -> set[str]:
    return {word.rstrip(",") for word in help_text.split() if word.startswith("--")}


def test_manage_py_advisor_controller_takes_the_same_options_as_the_command() -> None:
    command = load_command_class("recovery", "advisor_controller")
    django_parser = command.create_parser("manage.py", "advisor_controller")
    parser = argparse.ArgumentParser(prog=cli.PROG)
    cli.add_arguments(parser)
    own = {option for action in parser._actions for option in action.option_strings}
    django = {option for action in django_parser._actions for option in action.option_strings}
    # Django adds its own (--settings, --verbosity, ...); every controller option is there too.
    assert own - {"-h", "--help"} <= django
    assert {"--cluster", "--url", "--token-file", "--ssh", "--once", "--simulated"} <= own


@pytest.mark.parametrize("minor", PYTHON_MINORS, ids=lambda minor: f"py3.{minor}")
def test_it_runs_without_django_on_each_python(
    minor: int, controller_venv: Callable[[int], ControllerVenv], tmp_path: Path
) -> None:
    """
    GIVEN the wheel installed into a fresh virtual environment of Python 3.minor
    WHEN its command and the project's tests of the modules it ships run there
    THEN there is no Django in the environment, the command takes the controller's options and
         refuses to start without a token or with --simulated, and every test passes
    """
    venv = controller_venv(minor)
    installed = venv.run([str(venv.python), "-m", "pip", "list", "--format=freeze"])
    assert installed.returncode == 0, installed.stderr
    names = {line.split("==")[0].lower() for line in installed.stdout.split()}
    assert "workload-recovery-controller" in names
    assert not names & {"django", "celery", "djangorestframework", "channels"}, names

    shown = venv.run([str(venv.script), "--help"])
    assert shown.returncode == 0, shown.stderr
    parser = argparse.ArgumentParser(prog=cli.PROG)
    cli.add_arguments(parser)
    assert option_strings(shown.stdout) == option_strings(parser.format_help())
    assert shown.stdout.startswith("usage: workload-recovery-controller")

    no_token = venv.run(
        [str(venv.script), "--cluster", "lab", "--once"], env={"WR_CONTROLLER_TOKEN": ""}
    )
    assert no_token.returncode == 1
    assert no_token.stderr == "give the token in WR_CONTROLLER_TOKEN or --token-file\n"
    simulated = venv.run(
        [str(venv.script), "--cluster", "lab", "--once", "--simulated"],
        env={"WR_CONTROLLER_TOKEN": "wrc_test"},
    )
    assert simulated.returncode == 1
    assert "--simulated needs the control plane's code" in simulated.stderr

    copy = tmp_path / "checkout"
    for relative in SHIPPED_MODULE_TESTS:
        source, target = REPO / relative, copy / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        if source.is_dir():
            shutil.copytree(source, target)
        else:
            shutil.copy(source, target)
    for package in {path.parent for path in copy.rglob("*.py")} | {copy / "tests"}:
        (package / "__init__.py").touch()
    tested = venv.run(
        [str(venv.python), "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"], cwd=copy
    )
    assert tested.returncode == 0, tested.stdout[-5000:] + tested.stderr[-2000:]
    assert " passed" in tested.stdout.splitlines()[-1], tested.stdout[-500:]
    # The tests imported the installed wheel, not the checkout.
    where = venv.run(
        [str(venv.python), "-c", "import recovery.controller.cli as m; print(m.__file__)"], cwd=copy
    )
    assert Path(where.stdout.strip()).is_relative_to(venv.root / "lib"), where.stdout
