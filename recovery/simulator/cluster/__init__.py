"""A simulated Slurm cluster running training jobs that fail the way real ones do.

Only the cluster is simulated: the job lifecycle and the recovery actions behave as Slurm's do
(see ``/work/shared/notes/slurm-lab.md``), and the jobs write log files that the real
detectors read. Time is real time: ``advance(now)`` runs everything that happened between the
previous call and ``now``; training runs ``speedup`` times faster than real time, while the
scheduler's own delays (requeue delay, node timeout, how long finished jobs stay listed) are
real seconds, as they are on a real cluster.

Everything, the random generator included, is kept in a JSON-able state so that a cluster
restored from ``to_state()`` in another process continues exactly as it would have.

The package: ``config`` (``SimConfig``), ``records`` (per node and per job), ``journal`` (the
commands received, the failures and attempts, the benign events, and the chaos controls, kept in
the state), ``state``, ``benign``, ``training`` and ``slurm`` (the layers of
``SimulatedCluster``, see ``state``).
"""

from __future__ import annotations

from recovery.simulator.cluster.config import SimConfig
from recovery.simulator.cluster.slurm import SimulatedCluster

__all__ = ("SimConfig", "SimulatedCluster")
