"""Signatures of a job's life as the scheduler and launchers report it: Slurm's time limit,
preemption, node failure and cancel notices, submitit, torchrun's and srun's reports that a child
process ended, and a job told to stop by a signal.
"""

from __future__ import annotations

from recovery.detection.linear_regex import compile_linear
from recovery.detection.signatures.base import SYMPTOM, WRAPPER, Signature, define
from recovery.detection.taxonomy import Attribution, FailureCategory, Severity

CANCEL_NOTICE = "slurm-cancelled"
# slurmstepd's notice that the whole job was cancelled with nothing said of why: an scancel by its
# owner, an administrator or a stop. Slurm's own ends say why ("DUE TO TIME LIMIT", "PREEMPTION",
# "NODE FAILURE", "JOB REQUEUE"), and a step's notice ("*** STEP N.0 ...") is also srun ending a
# step after one of its tasks failed.
_JOB_CANCELLED_BY_SOMEONE = compile_linear(r"\*\*\* JOB \S+ ON \S+ CANCELLED AT \S+ \*\*\*")


def cancelled_by_someone(signature: str, evidence: str) -> bool:
    """Whether a finding is slurmstepd's notice of a job someone cancelled."""
    return signature == CANCEL_NOTICE and _JOB_CANCELLED_BY_SOMEONE.search(evidence) is not None


SIGNATURES: tuple[Signature, ...] = (
    define(
        "torch-signal-exception",
        FailureCategory.SCHEDULER_EVENT,
        Attribution.UNKNOWN,
        r"(?:SignalException: Process \d+ got signal: (?:15|1|2|10|12)|"
        r"Received SIGTERM|got SIGTERM|Bypassing SIGTERM|KeyboardInterrupt)",
        [
            "torch.distributed.elastic.multiprocessing.api.SignalException: Process 4242 got signal: 15",
            "[rank: 0] Received SIGTERM: 15",
        ],
        ["SIGTERM handler installed"],
        role=WRAPPER,
        severity=Severity.ERROR,
        priority=12,
        description="The job was told to stop: by the scheduler, an operator or a time limit.",
        printed_by="torchelastic's agent (torch.distributed.elastic.multiprocessing.api.SignalException) when the launcher is sent a signal",
    ),
    define(
        "slurm-time-limit",
        FailureCategory.SCHEDULER_EVENT,
        Attribution.APPLICATION,
        r"(?:CANCELLED AT \S+ DUE TO TIME LIMIT|DUE TO TIME LIMIT \*\*\*|"
        r"Job \d+ exceeded (?:its )?time limit|TIMEOUT: job exceeded|"
        r"time limit exceeded|slurmstepd: .*JOB \d+ .*TIME LIMIT)",
        [
            "slurmstepd: error: *** STEP 55595933.0 ON maestro-3017 CANCELLED AT 2025-01-10T15:27:25 DUE TO TIME LIMIT ***",
            "slurmstepd: error: *** JOB 4226796 ON eos0117 CANCELLED AT 2025-12-03T14:53:02 DUE TO TIME LIMIT ***",
        ],
        ["#SBATCH --time=04:00:00", "Job has not timed out. Ran 1 minutes out of requested 20"],
        caseless=True,
        reports_exit=True,
    ),
    define(
        "slurm-preempted",
        FailureCategory.SCHEDULER_EVENT,
        Attribution.SYSTEM_SOFTWARE,
        r"(?:DUE TO PREEMPTION|this job is preempted|job (?:was|has been) preempted|"
        r"JOB REQUEUE|job requeued|Requeuing job|requeued due to|"
        r"CANCELLED AT \S+ DUE TO JOB REQUEUE|"
        r"Caught signal SIGUSR[12].*(?:preempt|requeue)|preemption signal|"
        r"SLURM_JOB_REQUEUE|Received SIGUSR1.*requeue)",
        [
            "submitit WARNING (2022-07-12 04:18:45,881) - Caught signal SIGHUP on learnfair0293: this job is preempted.",
            "slurmstepd: error: *** JOB 123456 ON gpu-001 CANCELLED AT 2025-01-10T15:27:25 DUE TO PREEMPTION ***",
        ],
        ["--requeue flag set", "preemption mode: off"],
        caseless=True,
    ),
    define(
        "slurm-node-failure",
        FailureCategory.SCHEDULER_EVENT,
        Attribution.HARDWARE,
        r"(?:DUE TO NODE FAILURE|[Dd]ue to node failure|\(node failure\)|"
        r"JOB \d+ ON \S+ CANCELLED .*NODE FAIL|"
        r"srun: error: Node failure on|Node \S+ not responding, setting DOWN|"
        r"job .* NODE_FAIL|slurmstepd: error: .*Kill task failed|"
        r"srun: error: .*: task \d+: Exited with exit code 1.*NODE_FAIL)",
        [
            "slurmstepd: error: *** JOB 48213 ON gpu-a100-007 CANCELLED AT 2026-11-28T03:14:15 DUE TO NODE FAILURE ***",
            "srun: error: Node failure on gpu-a100-007",
            "job preempted (node failure)",
        ],
        ["Node gpu-a100-007 now responding"],
        priority=95,
        reports_exit=True,
        # slurmstepd's "*** JOB N ON gpu-007 CANCELLED ... DUE TO NODE FAILURE ***" is printed
        # on a node that is still up (the batch host): the failed node is the one srun or
        # slurmctld names. An unkillable task is the printing node's own.
        accused_node=r"Node failure on ([A-Za-z0-9][A-Za-z0-9._-]*)|"
        r"Node ([A-Za-z0-9][A-Za-z0-9._-]*) not responding|Kill task failed",
        printed_by='Slurm: slurmstepd\'s "*** JOB N ON node CANCELLED AT t DUE TO NODE FAILURE ***", srun\'s "Node failure on", slurmctld\'s "not responding, setting DOWN"; PBS/Torque job notices "(node failure)"',
    ),
    define(
        CANCEL_NOTICE,
        FailureCategory.SCHEDULER_EVENT,
        Attribution.UNKNOWN,
        r"(?:\*\*\* (?:JOB|STEP) \S+ ON \S+ CANCELLED AT \S+ \*\*\*|"
        r"\*\*\* (?:JOB|STEP) \S+ ON \S+ CANCELLED AT \S+ DUE TO SIGNAL)",
        [
            "slurmstepd: error: *** JOB 4211 ON node01 CANCELLED AT 2025-03-02T10:00:00 ***",
            "slurmstepd: error: *** STEP 4211.0 ON node01 CANCELLED AT 2025-03-02T10:00:00 ***",
        ],
        ["scancel --signal=USR1 4211"],
        severity=Severity.ERROR,
        priority=35,
        role=SYMPTOM,
        description="Cancelled by someone or something: a person, an admin, or srun ending a "
        "step after one of its tasks failed. The cause, if any, is elsewhere.",
        reports_exit=True,
    ),
    define(
        "slurm-daemon-job-failure",
        FailureCategory.SCHEDULER_EVENT,
        Attribution.SYSTEM_SOFTWARE,
        # slurmctld's and slurmd's own log lines, where a log store or the job's log holds them.
        r"(?:_job_complete: JobId=\d+ WTERMSIG \d+|Task launch for \S+ failed on node \S+|"
        r"Job credential expired|slurmstepd: error: execve\(\):|"
        r"_slurm_rpc_kill_job: .*(?:error|failed)|launch_job: .* failed|"
        r"slurmstepd: error: .*(?:prolog|epilog) failed|error: (?:Prolog|Epilog) failed|"
        r"Job \d+ launch failed|batch job complete failure)",
        [
            "[2022-05-27T11:37:57.377] _job_complete: JobId=127441 WTERMSIG 9",
            "srun: error: Task launch for 36.0 failed on node cn131: Job credential expired",
            "slurmstepd: error: execve(): /tmp/slurmd/job00089/slurm_script: No such file or directory",
        ],
        [
            "[2022-05-27T11:37:57.377] _job_complete: JobId=127441 WEXITSTATUS 0",
            "sched: Allocate JobId=127441 NodeList=c014 #CPUs=2 Partition=gpu",
        ],
        description="Slurm itself failed to launch or keep a job: a signal from outside the "
        "job, an expired credential, a step that could not start its script.",
    ),
    define(
        "slurm-killed-stuck",
        FailureCategory.SCHEDULER_EVENT,
        Attribution.SYSTEM_SOFTWARE,
        r"(?:DUE TO JOB NOT ENDING WITH SIGNALS|srun: error: Unable to allocate resources|"
        r"this job is timed[- ]out|job (?:has )?timed out after)",
        [
            "slurmstepd: error: *** JOB 4211 STEPD TERMINATED ON node01 AT 2025-03-02T10:00:00 DUE TO JOB NOT ENDING WITH SIGNALS ***",
            "srun: error: Unable to allocate resources: Requested node configuration is not available",
        ],
        ["srun: job 4211 has been allocated resources"],
        printed_by='Slurm: slurmstepd ("DUE TO JOB NOT ENDING WITH SIGNALS") and srun ("Unable to allocate resources")',
    ),
    define(
        "submitit-timeout",
        FailureCategory.SCHEDULER_EVENT,
        Attribution.APPLICATION,
        r"(?:this job is timed[- ]out|Job has timed out|timed out, requeuing)",
        [
            "submitit WARNING (2023-01-01 00:00:00,000) - Caught signal SIGUSR2 on node12: this job is timed-out."
        ],
        ["Job has not timed out. Ran 1 minutes out of requested 20 minutes."],
        printed_by="submitit, when Slurm's time limit signal reaches a job it cannot requeue",
    ),
    define(
        "torchelastic-child-failed",
        FailureCategory.APP_EXCEPTION,
        Attribution.APPLICATION,
        r"(?:ChildFailedError|torch\.distributed\.elastic\.multiprocessing\.api:failed \(exitcode: |"
        r"Root Cause \(first observed failure\)|"
        r"subprocess\.CalledProcessError: Command .* returned non-zero exit status|"
        r"exits with return code = -?\d+|Process \d+ exited with code -?\d+|"
        r"exitcode\s*:\s*-?\d+ \(pid)",
        [
            "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ",
            "ERROR:torch.distributed.elastic.multiprocessing.api:failed (exitcode: 1) local_rank: 0 (pid: 1) of binary: /usr/bin/python3",
        ],
        ["exit code: 0"],
        role=WRAPPER,
        severity=Severity.ERROR,
        priority=10,
        reports_exit=True,
    ),
    define(
        "srun-task-exited",
        FailureCategory.APP_EXCEPTION,
        Attribution.APPLICATION,
        r"(?:srun: error: \S+: tasks? [0-9,-]+: (?:Exited with exit code \d+|Killed|"
        r"Terminated|Segmentation fault|Aborted)|srun: error: Timed out waiting for job step|"
        r"srun: Job step aborted|srun: error: .*launch failed|"
        r"srun: error: Unable to create step|srun: error: task \d+ launch failed)",
        [
            "srun: error: gpu-a100-003: task 12: Exited with exit code 1",
            "srun: error: node07: tasks 0-7: Killed",
            "srun: Job step aborted: Waiting up to 32 seconds for job step to finish.",
        ],
        ["srun: job 1234 queued and waiting for resources", "srun: Step created for job 1234"],
        role=WRAPPER,
        severity=Severity.ERROR,
        priority=9,
        reports_exit=True,
    ),
    define(
        "batch-walltime-exceeded",
        FailureCategory.SCHEDULER_EVENT,
        Attribution.APPLICATION,
        r"(?:PBS: job killed: walltime \d+ exceeded limit \d+|job exceeded wallclock limit|"
        r"TERM_RUNLIMIT: job killed after reaching LSF run time limit|"
        r"=>> PBS: job killed: walltime|Job exceeded (?:its )?(?:walltime|wallclock)|"
        r"walltime \S+ exceeded limit)",
        [
            "=>> PBS: job killed: walltime 906 exceeded limit 900",
            "MOAB_INFO:  job exceeded wallclock limit",
            "TERM_RUNLIMIT: job killed after reaching LSF run time limit.",
        ],
        ["Resource_List.walltime = 24:00:00"],
        reports_exit=True,
        implicates_nodes=False,
        description="PBS, Moab or LSF ending a job at its wall-clock limit.",
        printed_by='PBS Pro/Torque ("=>> PBS: job killed: walltime"), Moab (MOAB_INFO) and '
        "LSF (TERM_RUNLIMIT)",
    ),
    define(
        "batch-memory-limit",
        FailureCategory.HOST_OOM,
        Attribution.APPLICATION,
        r"(?:TERM_MEMLIMIT: job killed after reaching LSF memory usage limit|"
        r"PBS: job killed: mem \d+\S* exceeded limit|job killed: vmem \S+ exceeded limit)",
        [
            "TERM_MEMLIMIT: job killed after reaching LSF memory usage limit.",
            "=>> PBS: job killed: mem 52428800kb exceeded limit 41943040kb",
        ],
        ["Resource_List.mem = 40gb"],
        reports_exit=True,
        implicates_nodes=False,
        description="PBS or LSF ending a job that used more host memory than it asked for.",
        printed_by='LSF (TERM_MEMLIMIT) and PBS ("job killed: mem ... exceeded limit")',
    ),
    define(
        "pod-evicted",
        FailureCategory.SCHEDULER_EVENT,
        Attribution.SYSTEM_SOFTWARE,
        r"(?:The node was low on resource: [a-z-]+|The node had condition: \[[A-Za-z]+\]|"
        r"Pod was terminated in response to imminent node shutdown|"
        r"Reason:\s+(?:Evicted|Preempting|DeadlineExceeded)\b|reason: Evicted\b|"
        r"\bEvicted\s+pod/|Preempted by [a-z0-9-]+/|preempted by pod)",
        [
            "Message:        The node was low on resource: ephemeral-storage. Container app was using 34260Ki, which exceeds its request of 0.",
            "4m7s        Warning   Evicted               pod/egg-2    The node had condition: [MemoryPressure].",
            "Message:      Pod was terminated in response to imminent node shutdown.",
        ],
        ["Reason:       Completed", "The node was low on resource:"],
        reports_exit=True,
        implicates_nodes=False,
        description="Kubernetes evicting or preempting a pod: node pressure, node shutdown or a "
        "higher-priority pod. A pod evicted for using more memory than it requested is the "
        "job's own doing.",
        printed_by="the kubelet's eviction manager and node shutdown manager, and the "
        "scheduler's preemption (kubectl describe / events)",
    ),
    define(
        "cloud-instance-reclaimed",
        FailureCategory.SCHEDULER_EVENT,
        Attribution.SYSTEM_SOFTWARE,
        r"(?:Spot (?:instance )?interruption (?:notice|payload|warning)|"
        r"Instance is going to be interrupted|"
        r"instance-action[\"']?\s*:\s*[\"']?(?:terminate|stop)|"
        r"(?:received|got) (?:a )?preemption notice|[Ii]nstance was preempted|"
        r"compute\.instances\.preempted|Preempt(?:ed)? by (?:the )?(?:cloud|provider)|"
        r"(?:[Cc]luster|[Ii]nstance|VM|[Nn]ode) (?:is|was|has been) preempted|"
        r"is in PREEMPTED state|termination is imminent|preemption is imminent)",
        [
            '{"level":"warn","message":"Spot interruption payload received: {\\"action\\":\\"terminate\\"}"}',
            '{"level":"warn","message":"Instance is going to be interrupted in 2 minutes. Exiting..."}',
        ],
        ["spot instances requested: 4", "Spot interruption handler started"],
        reports_exit=True,
        implicates_nodes=False,
        description="A cloud provider reclaiming a spot or preemptible instance under the job.",
        printed_by="AWS (spot interruption notices, instance-action), GCP (preemption, "
        "compute.instances.preempted) and the runners and agents that relay them",
    ),
    define(
        "slurm-job-state",
        FailureCategory.SCHEDULER_EVENT,
        Attribution.APPLICATION,
        # The state Slurm gave the job, as scontrol, sacct, seff and its mails print it.
        r"(?:JobState=(?:TIMEOUT|NODE_FAIL|PREEMPTED|OUT_OF_MEMORY|DEADLINE|BOOT_FAIL)\b|"
        r"Ended, Run time [0-9:-]+, (?:TIMEOUT|NODE_FAIL|PREEMPTED|OUT_OF_MEMORY)\b|"
        r"\bState: (?:TIMEOUT|NODE_FAIL|PREEMPTED|OUT_OF_MEMORY)\b|"
        r"\s(?:TIMEOUT|NODE_FAIL|PREEMPTED|OUT_OF_MEMORY|OUT_OF_ME\+)\s+\d+:\d+\s*$)",
        [
            "JobId=4242 JobName=train JobState=TIMEOUT Reason=TimeLimit Dependency=(null)",
            "Slurm Job_id=4242 Name=train Ended, Run time 1-00:00:12, TIMEOUT, ExitCode 0",
            "4242.batch        batch                 acct         16 OUT_OF_ME+    0:125",
            "State: NODE_FAIL (exit code 1)",
        ],
        [
            "JobId=4242 JobName=train JobState=RUNNING Reason=None",
            "4242         train        gpu       acct         16  COMPLETED      0:0",
            "--time limit TIMEOUT handling: requeue",
        ],
        reports_exit=True,
        # The line says what became of the job, not which node printed it or failed.
        implicates_nodes=False,
        description="Slurm's final state for a job, read where a user pasted it: a time limit is "
        "the job's request, a node failure the node's, a preemption the site's, out of memory "
        "the job's.",
        printed_by="Slurm's scontrol (JobState=), sacct (State, ExitCode columns), seff "
        "(State:) and its job mails (Ended, Run time ...)",
    ),
)
