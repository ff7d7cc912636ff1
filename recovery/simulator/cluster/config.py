"""How the simulated cluster looks and behaves, and the constants of its world."""

from __future__ import annotations

from dataclasses import dataclass

from recovery.schedulers.optin import OptInMode
from recovery.simulator import logtext

# 2: the journal (commands, failures, attempts) and the chaos controls joined the state.
STATE_VERSION = 2
# Entries kept per journal list, the newest (the older ones are counted as dropped). A chaos run
# of minutes journals hundreds; the demo's action cluster about 3,000 commands an hour. Every
# change loads and saves the whole state: with all three lists full it is about 2.7 MB, some
# 0.13 s per change (at 20,000 it would be 11 MB and half a second, too slow for the demo).
JOURNAL_LIMIT = 5_000
# A failure's text spans the seconds before the attempt ends (first error to srun's last word).
FAILURE_TEXT_SECONDS = 2.5
GPUS = logtext.GPUS_PER_NODE
FINISHED = frozenset(
    {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED"}
)
# Log intervals a training config would use; the smallest that keeps output readable is chosen.
LOG_INTERVALS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000)
# Xid codes a node health check drains a node for, and the reason it gives.
DRAINING_XIDS = {
    48: "double bit ECC",
    62: "PMU halt",
    79: "GPU fell off the bus",
    94: "contained ECC",
    95: "uncontained ECC",
    119: "GSP timeout",
    120: "GSP error",
}
MODELS = ("llama3-8b", "llama3-70b", "mixtral-8x7b", "gpt-13b", "nemotron-15b", "qwen2-7b")
TASKS = ("pretrain", "sft", "dpo", "ablation", "long-ctx")
USERS = ("alice", "bhavik", "chen", "dmitri", "ewa", "farah", "gus", "hana")


@dataclass(frozen=True)
class SimConfig:
    """How the simulated cluster looks and behaves.

    Training runs ``speedup`` times faster than real time: step times and fault rates are in
    simulated seconds; scheduler delays are real seconds. Ranges are inclusive.
    """

    name: str
    nodes: int = 64
    jobs: int = 24
    seed: int = 0
    speedup: float = 1.0
    log_dir: str = "var/sim"
    requeue_delay_seconds: float = 6.0
    faults_per_job_hour: float = 2.0
    environment: str = "demo"
    mode: str = OptInMode.ACT
    node_prefix: str = "gpu-"
    partitions: tuple[str, ...] = ("batch",)
    nodes_per_job: tuple[int, int] = (2, 4)
    step_seconds: tuple[float, float] = (0.5, 3.0)
    total_steps: tuple[int, int] = (2_000, 20_000)
    checkpoint_every: tuple[int, int] = (100, 500)
    # Simulated seconds from the start of an attempt to its first step (loading, NCCL init).
    startup_seconds: tuple[float, float] = (20.0, 90.0)
    # Jobs with no opt-in comment, as on a shared cluster where only some users opt in.
    opted_out_fraction: float = 0.0
    # Persistently defective nodes at the start, and how often they fail a job running on them.
    bad_node_fraction: float = 0.03
    bad_node_faults_per_hour: float = 6.0
    # After a node-level fault, the chance the node stays defective (else it was a one-off).
    defect_persistence: float = 0.5
    # The chance that the epilog's health check drains a node after a GPU Xid on it.
    health_check_drain_probability: float = 0.3
    # How much a straggling node slows its job's steps.
    straggler_factor: tuple[float, float] = (1.6, 3.0)
    # Real seconds until Slurm marks a dead node DOWN (SlurmdTimeout=10 gives about 12 s).
    node_failure_detect_seconds: float = 12.0
    # Real seconds a requeued running job spends in COMPLETING.
    completing_seconds: float = 1.0
    # Real seconds finished jobs stay listed (MinJobAge).
    min_job_age_seconds: float = 300.0
    # A job Slurm forgot is replaced by a new one (the cluster keeps ``jobs`` submitted),
    # eligible to start at a random moment within this many real seconds; 0: at once. Without
    # it, every job that ended in one minute is replaced in one poll MinJobAge later.
    resubmit_spread_seconds: float = 0.0
    # NCCL's collective timeout, in simulated seconds: how long ranks wait before the
    # watchdog kills a job whose peer stopped (nccl_timeout faults).
    collective_timeout_seconds: float = 600.0
    # Logged steps per real second per job, at most; the log interval follows from it.
    max_logged_steps_per_second: float = 1.0
    # A job that catches up a long gap prints at most this many progress steps per advance.
    max_logged_steps_per_advance: int = 30
    # Per fault kind, a weight replacing its published share (e.g. {"hang": 10}).
    fault_weights: tuple[tuple[str, float], ...] = ()
    first_job_id: int = 1001
    # Real seconds after which an operator has fixed a DOWN or drained node; None: never.
    repair_after_seconds: float | None = None
    # Per kind of benign event (recovery.simulator.benign), how many a running job has per hour
    # of real time; empty: none, and the cluster behaves exactly as without them.
    benign_events: tuple[tuple[str, float], ...] = ()
    # Real seconds an announced evaluation or checkpoint pause lasts (a stall is shorter than
    # the longest pause its attempt has shown).
    benign_pause_seconds: tuple[float, float] = (10.0, 90.0)
    # The JSON file of real tracebacks and warnings the benign events print
    # (recovery.simulator.logtext.benign.load_corpus); needed when those kinds have a rate.
    benign_corpus: str = ""
