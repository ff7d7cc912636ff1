"""The recovery loop, one module per step, listed in the order the steps run.

A poll of a cluster (``poll.poll_cluster``) takes steps 1 to 9. ``tasks.polling`` runs it every
few seconds split across workers: the snapshot (steps 1, 2 and the nodes' sources of 3) under
the cluster's lock, then the per-workload steps (a job's output, 3 to 7, its ending and its
progress, 8: ``workloads``) in shards of workloads, and the cluster-wide rest of 8 and 9
(``poll.judge_cluster``), each a task of its own:

1. Poll the scheduler's snapshot, jobs then nodes (``poll``).
2. Sync it (``poll``): node states are stored (``poll_nodes``), each opted-in job becomes a
   workload and its attempts (``poll_jobs``), state changes become audit events, jobs no longer
   listed become unknown.
3. Read what was written since the last poll (``logs``): each node's kernel log first (an Xid
   there is the cause a job's CUDA error shows), then each job's output files (a shard's at
   once: ``workload_outputs``); then the cluster's log store (``log_stores``, through
   ``recovery.sources.logs``) and its DCGM metrics (``gpu_checks``, through
   ``recovery.sources.metrics``).
   Lines and heartbeats a job pushes between polls (``push``, within the caps of
   ``push_budget``) join here too; a scheduler hook's word only asks for a poll
   (``scheduler_hooks``).
4. Record anomalies (``anomalies``): a read's progress and checkpoints (``progress``), then its
   findings (scanned with the signatures of ``patterns``), each on the attempt it is about
   (``evidence_attempts``), past the caps on new anomalies folded (``anomaly_caps``); a crash
   the job printed stays suspected until its process is seen to end (``confirmation``).
5. Attribute each new anomaly: hardware, interconnect, the job's own code... (``attribution``).
   The built-in verdict is recorded with the read; an external provider is asked once the
   read is committed, never under its locks, and the decision waits for its verdict.
6. Flag suspect nodes, implicated in the failures of several workloads (``suspects``).
7. Decide (``policy``, by the rules of ``policy_rules``): a recommendation, or wait for the
   cause or the confirmation.
8. Monitors (``monitors``), on what the logs did not say: how attempts ended, nodes out of
   service (``poll_nodes``), suspected crashes confirmed, survived or stalled
   (``confirmation``), hangs, stragglers; each becomes an anomaly through steps 4 to 7.
9. Recommend (``policy.decide_pending``): the anomalies that were waiting are decided, after
   the provider is asked for verdicts a dead worker left awaited
   (``anomalies.finish_awaited_attributions``).

Outside the poll:

10. Controller claims (``recommendations``): operators approve or reject; Advisor Controllers
    claim, carry out and report, under a lease that lapses when they go silent (``leases``).
11. Watchdog (``watchdog``): jobs held past their decision timeout are released, and ready
    advice nobody carried out expires.
"""
