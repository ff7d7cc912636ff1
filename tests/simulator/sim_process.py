"""Another process using a simulation kept in files, as the clock, a poller or a controller do.

Run by the tests as ``python -m tests.simulator.sim_process OPERATION STATE_DIR NAME ...``:

- ``tick-and-cancel COUNT``: COUNT times, advance the clock and send ``scancel`` for a job
  that does not exist (journaled, changes nothing);
- ``call METHOD JOB_ID``: one command through the simulated adapter; exits 0 when it returned,
  3 when it raised SchedulerError;
- ``hold-lock``: take the simulation's lock, say so, and wait to be killed.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from datetime import UTC, datetime

from recovery.schedulers.base import SchedulerError
from recovery.simulator.adapter import SimulatedAdapter
from recovery.simulator.store import FileSimulationStore

UNKNOWN_JOB = "999999"


def main(argv: Sequence[str]) -> int:
    operation, state_dir, name, *rest = argv
    store = FileSimulationStore.published(state_dir, name)
    adapter = SimulatedAdapter(store)
    if operation == "tick-and-cancel":
        for _ in range(int(rest[0])):
            store.advance(datetime.now(UTC))
            adapter.cancel(UNKNOWN_JOB)
        return 0
    if operation == "call":
        method, job_id = rest
        try:
            getattr(adapter, method)(job_id)
        except SchedulerError as exc:
            sys.stderr.write(f"{exc}\n")
            return 3
        return 0
    if operation == "hold-lock":
        with store.changing():
            sys.stdout.write("held\n")
            sys.stdout.flush()
            time.sleep(60)
        return 0
    raise SystemExit(f"unknown operation {operation!r}")


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
