"""Write deploy/image/requirements.txt: every package the control plane runs on, pinned.

The list is the closure of the dependencies in pyproject.toml (which pins each of them), with
each dependency's environment markers evaluated for the image's Python: Debian 12's python3,
which is 3.11.2. Versions are those installed in the virtual environment that runs this script,
the ones the test suite runs against. A package that only the image's Python needs is not
installed there; its version is in TARGET_ONLY. The image installs exactly this list, without
resolving anything (``pip install --no-deps``), and ``pip check`` then proves it complete.

Run it after a change to the dependencies in pyproject.toml, once ``make`` has installed them:

    .venv/bin/python deploy/image/lock.py
"""

from __future__ import annotations

import importlib.metadata
import sys
import tomllib
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
LOCK = HERE / "requirements.txt"
HEADER = """\
# Every package the control plane's image installs, pinned: the dependencies in pyproject.toml
# and, at the versions installed beside them, everything they depend on on Linux and Python 3.11.
# Written by deploy/image/lock.py; do not edit by hand.
"""
# Debian 12's python3.11 (security fixes are backported; the version stays).
TARGET_PYTHON = "3.11.2"
# Needed on the image's Python only, so not installed in a development environment of a later
# 3.11: redis-py uses async-timeout before 3.11.3, whose asyncio.timeout had a bug it avoids.
TARGET_ONLY = {"async-timeout": "5.0.1"}


def runtime_closure(requirements: list[str]) -> dict[str, str]:
    """Canonical name -> installed version, for ``requirements`` and all they depend on."""
    environment = {key: str(value) for key, value in default_environment().items()}
    environment.update(
        python_version=TARGET_PYTHON.rpartition(".")[0],
        python_full_version=TARGET_PYTHON,
        implementation_version=TARGET_PYTHON,
    )
    pinned: dict[str, str] = {}
    extras_seen: dict[str, set[str]] = {}
    pending = [Requirement(text) for text in requirements]
    while pending:
        requirement = pending.pop()
        name = canonicalize_name(requirement.name)
        extras = set(requirement.extras)
        if name in extras_seen and extras <= extras_seen[name]:
            continue
        extras_seen.setdefault(name, set()).update(extras)
        if name in TARGET_ONLY:
            pinned[name] = TARGET_ONLY[name]
            continue
        try:
            distribution = importlib.metadata.distribution(requirement.name)
        except importlib.metadata.PackageNotFoundError:
            sys.exit(
                f"{requirement.name} is not installed here: run `make` first, or pin it in "
                "TARGET_ONLY if only the image's Python needs it"
            )
        if not requirement.specifier.contains(distribution.version, prereleases=True):
            sys.exit(f"{requirement.name} {distribution.version} is installed, not {requirement}")
        pinned[name] = distribution.version
        wanted_extras = extras_seen[name] or {""}
        for text in distribution.requires or []:
            dependency = Requirement(text)
            marker = dependency.marker
            if marker is None or any(
                marker.evaluate({**environment, "extra": extra}) for extra in wanted_extras
            ):
                pending.append(dependency)
    return pinned


def main() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    pinned = runtime_closure(project["dependencies"])
    lines = [f"{name}=={version}" for name, version in sorted(pinned.items())]
    LOCK.write_text(HEADER + "\n".join(lines) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
