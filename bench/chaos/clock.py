"""The simulated cluster's clock, as a process: advances one published simulation until stopped.

``manage.py simulate`` does the same but writes the cluster's row first, which needs the
database; the chaos run stops the database at random moments, and the scheduler must not stop
with it. This process needs only the simulation's state directory.

    python -m bench.chaos.clock --cluster chaos-action --state-dir var/chaos/.../sim-state
"""

from __future__ import annotations

import argparse
import signal
import sys
import time
from datetime import UTC, datetime

from recovery.schedulers.base import SchedulerError
from recovery.simulator.store import published_simulation


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.chaos.clock")
    parser.add_argument("--cluster", required=True)
    parser.add_argument("--state-dir", required=True)
    parser.add_argument("--tick", type=float, default=0.5)
    options = parser.parse_args(argv)
    store = published_simulation(options.cluster, redis_url="", state_dir=options.state_dir)
    stopping = False

    def stop(signum: int, frame: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    while not stopping:
        started = time.monotonic()
        try:
            store.advance(datetime.now(UTC))
        except SchedulerError as exc:
            print(f"{options.cluster}: {exc}", file=sys.stderr, flush=True)
        time.sleep(max(0.0, options.tick - (time.monotonic() - started)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
