"""``deploy/env.example`` names every environment variable the running code reads.

The variables are found in the code itself, every call of the typed readers in
``workload_recovery.env`` and every direct ``os.environ.get``, so a setting added without its
line in the example fails here.
"""

from __future__ import annotations

import re
from pathlib import Path

from django.conf import settings

ROOT = Path(settings.BASE_DIR)
# The packages that run in production: the control plane, its workers and the controller.
RUNTIME_PACKAGES = ("workload_recovery", "recovery", "api", "console", "tasks")
READ = re.compile(
    r"""(?:\benv_\w+|\b_api_rate|os\.environ\.get|os\.getenv)\(\s*["']([A-Z][A-Z0-9_]+)["']"""
)
# Read by the code but not settings of a deployment, each with the reason.
NOT_SETTINGS = {
    "WR_SIM_CALLER": "the simulated cluster's name for its caller, set by the chaos bench",
    "WR_SIM_KILLABLE": "lets the chaos bench kill simulated commands midway",
    "XDG_CACHE_HOME": "the desktop standard, consulted when WR_CACHE_DIR is not set",
}


def variables_read() -> dict[str, str]:
    found: dict[str, str] = {}
    for package in RUNTIME_PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            for match in READ.finditer(path.read_text(encoding="utf-8")):
                found.setdefault(match[1], str(path.relative_to(ROOT)))
    return found


def test_the_example_names_every_variable_the_code_reads() -> None:
    example = (ROOT / "deploy" / "env.example").read_text(encoding="utf-8")
    named = set(re.findall(r"\b[A-Z][A-Z0-9_]{2,}\b", example))
    read = variables_read()
    assert len(read) > 40, "the pattern no longer finds the settings"
    missing = {
        name: where
        for name, where in read.items()
        if name not in NOT_SETTINGS and name not in named and f"{name}_FILE" not in named
    }
    assert missing == {}, "add these to deploy/env.example"


def test_the_exemptions_are_still_read() -> None:
    assert set(NOT_SETTINGS) <= set(variables_read())
