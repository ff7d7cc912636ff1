"""The short chaos run: at least 100 faults against the whole process layout, nothing lost.

``make chaos`` runs the full schedule (over a thousand faults); this is the version ``make test``
runs, in under three minutes. It brings its own MariaDB and Redis (it stops and starts them), so
it needs neither the shared services nor a Django database of the test run.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from django.conf import settings

from bench.chaos.__main__ import MUST_BE_ZERO
from bench.chaos.schedule import ARMED, WEIGHTS

ROOT = Path(settings.BASE_DIR)
SEED = 1


def test_a_short_chaos_run_loses_nothing_and_does_nothing_twice() -> None:
    run = subprocess.run(
        [sys.executable, "-m", "bench.chaos", "--short", "--seed", str(SEED)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=420,
        check=False,
    )
    report_path = ROOT / "var" / "chaos" / f"report-short-seed-{SEED}.json"
    assert report_path.exists(), run.stdout[-3000:] + run.stderr[-3000:]
    report = json.loads(report_path.read_text())
    found = {name: report[name] for name in MUST_BE_ZERO}
    details = json.dumps(report["clusters"], indent=1, default=str)[:6000]
    assert found == dict.fromkeys(MUST_BE_ZERO, 0), f"{run.stdout[-2000:]}\n{details}"
    assert report["faults_injected"] >= 100, run.stdout[-2000:]
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    # Every kind struck at least once. The armed ones land only when a controller acts, so how
    # often is up to the run; the report counts them.
    struck = {kind: count for kind, count in report["by_kind"].items() if kind not in ARMED}
    assert set(struck) == set(WEIGHTS) - ARMED
    assert all(count > 0 for count in struck.values()), report["by_kind"]
