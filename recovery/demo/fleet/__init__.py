"""Demo users and a demo fleet for trying the Console without a real cluster.

``seed_demo_cluster`` writes two simulated Slurm clusters with nodes, workloads, attempts,
anomalies with real-looking evidence, verdicts, recommendations in every interesting status and
a coherent audit trail per workload. The stories supply what a job and its detectors would: its
runs, its progress and the evidence in its logs; the loop's own functions record, attribute and
decide on that evidence, and carry out the operators' and the controllers' part, with the clock
set to each story's time (see ``story``). It is idempotent: a workload is written whole, with
everything under it, or not at all, because the trail is append-only and can never be corrected
afterwards; clusters, nodes and policies are only created when missing.
"""

from __future__ import annotations

import random
from datetime import datetime

from django.utils import timezone

from recovery.demo.fleet.a100 import A100_CLUSTER, seed_a100
from recovery.demo.fleet.builder import Builder
from recovery.demo.fleet.h100 import H100_CLUSTER, seed_h100
from recovery.demo.fleet.parts import SeedSummary
from recovery.demo.fleet.users import DEMO_USERS, ensure_demo_users
from recovery.read.insights import (
    SNAPSHOT_WINDOW,
    backfill_goodput_snapshots,
    take_goodput_snapshots,
)

__all__ = (
    "A100_CLUSTER",
    "DEMO_USERS",
    "H100_CLUSTER",
    "SeedSummary",
    "ensure_demo_users",
    "seed_demo_cluster",
)


def seed_demo_cluster(now: datetime | None = None, seed: int = 7) -> SeedSummary:
    """Write the demo clusters ``demo-a100`` (monitor mode) and ``demo-h100`` (action mode).

    ``now`` anchors every time (default: the current time); ``seed`` drives the small
    variations (detection latencies, controller delays). Rows that already exist are left as
    they are.
    """
    anchor = (now or timezone.now()).replace(microsecond=0)
    builder = Builder(anchor, random.Random(seed))
    seed_a100(builder)
    seed_h100(builder)
    # So the Insights page has figures, and ETTR a line over the recorded days, before the
    # worker takes its first snapshot.
    take_goodput_snapshots(anchor)
    backfill_goodput_snapshots(anchor, since=anchor - SNAPSHOT_WINDOW)
    return builder.summary
