"""A simulated Slurm cluster for demos and load tests: only the cluster is simulated.

``cluster.SimulatedCluster`` behaves like Slurm towards the scheduler adapter (job states,
requeue, exclusions, holds, node states) and runs training jobs that write realistic logs and
fail with the shares in ``faults``; ``logtext`` holds the text they write.
"""
