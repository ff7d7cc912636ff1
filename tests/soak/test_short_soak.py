"""The short soak: healthy jobs against the whole process layout, and not one false action.

``make soak`` runs at least 10,000 simulated job-hours; this is the version ``make test`` runs, a
few hundred job-hours in a few minutes. It brings its own MariaDB and Redis, so it needs neither
the shared services nor a Django database of the test run.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from django.conf import settings

from recovery.simulator.benign import KERNEL, KINDS, OUTPUT, SCHEDULER

ROOT = Path(settings.BASE_DIR)
SEED = 1


def test_a_short_soak_takes_no_action_on_a_healthy_job_and_misses_no_fault() -> None:
    run = subprocess.run(
        [sys.executable, "-m", "bench.soak", "--short", "--seed", str(SEED)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    report_path = ROOT / "var" / "soak" / f"report-short-seed-{SEED}.json"
    assert report_path.exists(), run.stdout[-3000:] + run.stderr[-3000:]
    report = json.loads(report_path.read_text())
    false = report["false_actions"]
    details = json.dumps(false["list"], indent=1, default=str)[:6000]
    assert false["count"] == 0, f"{run.stdout[-2000:]}\n{details}"
    assert report["real_faults"]["missed"] == [], run.stdout[-2000:]
    assert report["journal_complete"]
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    # The report's accounting: a few hundred job-hours, benign events of most kinds the soak
    # schedules (a few minutes may miss one of the rare ones) and of each place they show in,
    # real faults injected and judged.
    assert report["simulated_job_hours"] >= 300
    assert report["jobs"] >= report["options"]["jobs"]
    kinds = set(report["benign_events"]["by_kind"])
    assert kinds <= set(KINDS) and len(kinds) >= len(KINDS) - 3, kinds
    assert {KINDS[kind].shows_in for kind in kinds} == {OUTPUT, SCHEDULER, KERNEL}
    assert report["benign_events"]["total"] == sum(report["benign_events"]["by_kind"].values())
    assert false["per_1000_job_hours"] == 0
    faults = report["real_faults"]
    assert sum(faults["injected"].values()) > 0 and faults["judged"] > 0
    assert report["policy"]["hang_timeout_s"] > report["policy"]["longest_benign_pause_s"]
    assert {entry["source"][:19] for entry in report["corpus"]["tracebacks"]} == {
        "https://github.com/"
    }
