"""Signatures of the host under the job: host memory exhausted (the kernel OOM killer, Slurm's
cgroup, DataLoader workers), storage errors, and processes killed by a signal.
"""

from __future__ import annotations

from recovery.detection.signatures.base import WRAPPER, Signature, define
from recovery.detection.taxonomy import Attribution, FailureCategory, Severity

SIGNATURES: tuple[Signature, ...] = (
    define(
        "kernel-oom-killer",
        FailureCategory.HOST_OOM,
        Attribution.APPLICATION,
        # "Kill process N (x) score N or sacrifice child": the kernel's words before 4.19.
        r"(?:Out of memory: Kill(?:ed)? process|invoked oom-killer|oom-kill:|"
        r"Memory cgroup out of memory|oom_reaper: reaped process|"
        r"Some of your processes may have been killed by the cgroup out-of-memory handler|"
        r"detected \d+ oom[_-]kill events?|OOM Killed|OOMKilled|"
        r"exceeded (?:job |step )?memory limit|killed by the OOM killer)",
        [
            "kernel: Out of memory: Killed process 12345 (python) total-vm:123456kB, anon-rss:98765kB",
            "slurmstepd: error: Detected 1 oom_kill event in StepId=123.0. Some of your processes may have been killed by the cgroup out-of-memory handler.",
            "python invoked oom-killer: gfp_mask=0x100cca(GFP_HIGHUSER_MOVABLE), order=0, oom_score_adj=0",
            "[3017506.733819] Out of memory: Kill process 25635 (python) score 974 or sacrifice child",
        ],
        ["oom_score_adj=0 set for training process"],
        caseless=True,
    ),
    define(
        "native-allocation-failed",
        FailureCategory.HOST_OOM,
        Attribution.APPLICATION,
        # Rust's allocator (tokenizers, safetensors) and C++'s std::bad_alloc abort this way;
        # glibc-based tools print "Cannot allocate memory" (ENOMEM) for the same.
        r"(?:memory allocation of \d+ bytes failed|terminate called after throwing an instance "
        r"of 'std::bad_alloc'|DefaultCPUAllocator: (?:can't|not enough memory)|"
        r"\[enforce fail at alloc_cpu\.cpp:\d+\])",
        [
            "memory allocation of 2097152 bytes failed",
            "terminate called after throwing an instance of 'std::bad_alloc'",
            "RuntimeError: [enforce fail at alloc_cpu.cpp:83] err == 0. DefaultCPUAllocator: can't allocate memory: you tried to allocate 34359738368 bytes. Error code 12 (Cannot allocate memory)",
        ],
        ["allocating 2097152 bytes for the prefetch buffer"],
        description="A native allocator could not get host memory: the process dies without "
        "the kernel's OOM killer having to step in.",
    ),
    define(
        "dataloader-worker-killed",
        FailureCategory.HOST_OOM,
        Attribution.APPLICATION,
        r"(?:DataLoader worker \(pid \d+\) is killed by signal: Killed|"
        r"DataLoader worker \(pid\(s\) [^)]*\) exited unexpectedly|"
        r"Cannot allocate memory|std::bad_alloc|\bMemoryError\b|"
        r"unable to mmap \d+ bytes|(?:^|\]:? )Killed\s*$|line \d+:\s+\d+ Killed)",
        [
            "RuntimeError: DataLoader worker (pid 2637) is killed by signal: Killed.",
            "Killed",
            "MemoryError: Unable to allocate 3.2 GiB for an array with shape (1024, 1024, 800)",
            "OSError: [Errno 12] Cannot allocate memory",
            "/var/spool/slurmd/job123/slurm_script: line 20: 12345 Killed                  python train.py",
        ],
        [
            "Killed process group cleanly",
            "killed by signal: Segmentation fault",
            "torch.OutOfMemoryError: CUDA out of memory.",
            "srun: error: node07: tasks 0-7: Killed",
        ],
        priority=83,
    ),
    define(
        "sigkill-child",
        FailureCategory.HOST_OOM,
        Attribution.UNKNOWN,
        r"(?:Signal 9 \(SIGKILL\) received|exitcode\s*:?\s*-9\b|failed \(exitcode: -9\)|"
        r"died with <Signals\.SIGKILL: 9>|exited with code 137|exit code 137|"
        r"terminated by signal 9|Killed by signal 9)",
        [
            "traceback : Signal 9 (SIGKILL) received by PID 14750",
            "ERROR:torch.distributed.elastic.multiprocessing.api:failed (exitcode: -9) local_rank: 0 (pid: 1234) of binary: /usr/bin/python",
        ],
        ["exitcode  : -11 (pid: 6421)"],
        role=WRAPPER,
        severity=Severity.ERROR,
        # Above the collective timeouts (30) the killed rank's peers print while they wait for
        # it: a watchdog ends a process with SIGABRT, not SIGKILL.
        priority=31,
        description="A child killed with SIGKILL: usually the OOM killer, sometimes the scheduler.",
        reports_exit=True,
        printed_by='torchelastic ("exitcode: -9", "Signal 9 (SIGKILL) received"), Python\'s multiprocessing ("died with <Signals.SIGKILL: 9>"), shells and container runtimes (exit code 137 = 128 + SIGKILL)',
    ),
    define(
        "storage-errno",
        FailureCategory.STORAGE_IO,
        Attribution.SYSTEM_SOFTWARE,
        r"(?:Input/output error|\[Errno 5\]|Stale file handle|\[Errno 116\]|"
        r"No space left on device|\[Errno 28\]|Disk quota exceeded|\[Errno 122\]|"
        r"Read-only file system|\[Errno 30\]|Transport endpoint is not connected|"
        r"Remote I/O error|\[Errno 121\]|Structure needs cleaning|"
        r"PytorchStreamWriter failed writing file|PytorchStreamReader failed reading|"
        r"file write failed|unexpected pos \d+ vs \d+|"
        r"Lustre(?:Error)?:.*(?:failed|error|evict)|LustreError|"
        r"nfs: server \S+ not responding|NFS: .*(?:error|timed out)|"
        r"blk_update_request: I/O error|Buffer I/O error|EXT4-fs error|XFS .*error|"
        r"gpfs.*(?:error|failed)|mmfs.*(?:error|failed)|"
        r"Errno 52|Connection to the filesystem lost|fsspec.*(?:Timeout|IOError))",
        [
            "RuntimeError: write(): fd 29 failed with Input/output error",
            "OSError: [Errno 116] Stale file handle",
            "RuntimeError: [enforce fail at inline_container.cc:471] . PytorchStreamWriter failed writing file data/228: file write failed",
            "OSError: [Errno 28] No space left on device: '/checkpoints/step_2000'",
            "LustreError: 11-0: scratch-OST0007-osc-ffff8800: operation ost_write to node 10.0.0.7@o2ib failed: rc = -107",
            "nfs: server fileserver01 not responding, still trying",
        ],
        ["Saved checkpoint to /checkpoints/step_2000", "nfs: server fileserver01 OK"],
    ),
    define(
        "segmentation-fault",
        FailureCategory.SEGFAULT,
        Attribution.UNKNOWN,
        r"(?:[Ss]egmentation fault|SIGSEGV|Signal 11 \(SIGSEGV\)|exitcode\s*:?\s*-11\b|"
        r"failed \(exitcode: -11\)|Fatal Python error: Segmentation|"
        r"segfault at [0-9a-f]+ ip|general protection fault|"
        r"Illegal instruction \(core dumped\)|SIGILL|"
        r"double free or corruption|free\(\): invalid pointer|malloc\(\): corrupted|"
        r"stack smashing detected)",
        [
            "traceback : Signal 11 (SIGSEGV) received by PID 6421",
            "ERROR:torch.distributed.elastic.multiprocessing.api:failed (exitcode: -11) local_rank: 0 (pid: 2012686) of binary: /gpfs/users/me/envs/ifseg/bin/python",
            "Segmentation fault (core dumped)",
            "python[1234]: segfault at 0 ip 00007f8b sp 00007ffd error 4 in libc.so.6",
        ],
        ["exitcode  : 1 (pid: 37881)", "Fault tolerance enabled", "segment 11 of 20 loaded"],
    ),
    define(
        "process-aborted",
        FailureCategory.SEGFAULT,
        Attribution.UNKNOWN,
        r"(?:SIGABRT|Signal 6 \(SIGABRT\)|exitcode\s*:?\s*-6\b|failed \(exitcode: -6\)|"
        r"Fatal Python error: Aborted|Aborted \(core dumped\))",
        [
            "logging.cc:365: *** SIGABRT received at time=1735017785 on cpu 31 ***",
            "ERROR:torch.distributed.elastic.multiprocessing.api:failed (exitcode: -6) local_rank: 0 (pid: 37386) of binary: /usr/bin/python",
            "Aborted (core dumped)",
        ],
        ["exitcode  : 1 (pid: 37881)", "Training aborted by user request flag not set"],
        priority=25,
        description=(
            "An abort: often the end of a process whose real error came first (an NCCL "
            "watchdog exception aborts the process), so it ranks below collective timeouts."
        ),
    ),
    define(
        "srun-out-of-memory",
        FailureCategory.HOST_OOM,
        Attribution.APPLICATION,
        r"(?:task \d+: Out Of Memory|DefaultCPUAllocator: can't allocate memory|"
        r"insufficient shared memory \(shm\)|Unexpected bus error encountered in worker)",
        [
            "srun: error: gpu-a100-003: task 5: Out Of Memory",
            "RuntimeError: [enforce fail at alloc_cpu.cpp:83] data. DefaultCPUAllocator: can't allocate memory: you tried to allocate 3221225472 bytes. Error code 12 (Cannot allocate memory)",
            "ERROR: Unexpected bus error encountered in worker. This might be caused by insufficient shared memory (shm).",
        ],
        ["srun: error: gpu-a100-003: task 5: Exited with exit code 1"],
        priority=85,
        reports_exit=True,
    ),
    define(
        "storage-remote",
        FailureCategory.STORAGE_IO,
        Attribution.SYSTEM_SOFTWARE,
        r"(?:unable to lock file|ReadTimeoutError: Read timeout on endpoint|"
        r"EndpointConnectionError: Could not connect to the endpoint|"
        r"failed finding central directory|Unable to open file \(file read failed|"
        r"Bad file descriptor.*(?:checkpoint|ckpt)|OSError: \[Errno 5\])",
        [
            "BlockingIOError: [Errno 11] Unable to synchronously open file (unable to lock file, errno = 11, error message = 'Resource temporarily unavailable')",
            "RuntimeError: PytorchStreamReader failed reading zip archive: failed finding central directory",
            'botocore.exceptions.ReadTimeoutError: Read timeout on endpoint URL: "https://s3.us-east-1.amazonaws.com/bucket/shard-0001.tar"',
        ],
        ["Opened zip archive with central directory at offset 12"],
    ),
    define(
        "signal-exit-codes",
        FailureCategory.SEGFAULT,
        Attribution.UNKNOWN,
        r"(?:exited on signal 11|exit code 139|exited with code 139|"
        r"(?:with|by) signal 11\b|killed by signal: Segmentation fault|"
        r"exitcode\s*:?\s*-(?:11|7)\b|failed \(exitcode: -(?:11|7)\)|"
        r"Bus error|SIGBUS|Signal 7 \(SIGBUS\))",
        [
            "mpirun noticed that process rank 3 with PID 0 on node gpu-1 exited on signal 11 (Segmentation fault).",
            "RuntimeError: DataLoader worker (pid 4242) is killed by signal: Segmentation fault.",
            "Process finished with exit code 139",
            "ERROR:torch.distributed.elastic.multiprocessing.api:failed (exitcode: -7) local_rank: 0 (pid: 37386) of binary: /home/jovyan/.conda/envs/glm/bin/python",
            "Bus error (core dumped)",
        ],
        [
            "exit code 1",
            "exited on signal 15 (Terminated)",
            "failed (exitcode: -6) local_rank: 0 (pid: 1) of binary: /usr/bin/python",
        ],
        printed_by='Open MPI\'s mpirun ("exited on signal 11"), PyTorch\'s DataLoader ("killed by signal: Segmentation fault"), shells reporting exit code 139 (128 + SIGSEGV)',
    ),
    define(
        "too-many-open-files",
        FailureCategory.STORAGE_IO,
        Attribution.SYSTEM_SOFTWARE,
        r"(?:Too many open files|\[Errno 24\])",
        ["OSError: [Errno 24] Too many open files"],
        ["ulimit -n 65536 set"],
        printed_by="the C library's EMFILE error text (errno 24, \"Too many open files\"), as Python's OSError prints it",
    ),
    define(
        "ray-memory-monitor",
        FailureCategory.HOST_OOM,
        Attribution.APPLICATION,
        r"(?:[1-9]\d* Workers? \(tasks / actors\) killed due to memory pressure|"
        r"killed due to the node running low on memory|"
        r"which exceeds the memory usage threshold of)",
        [
            "(raylet) node_manager.cc:3084: 4 Workers (tasks / actors) killed due to memory pressure (OOM), 0 Workers crashed due to other reasons at node",
            "ray.exceptions.OutOfMemoryError: Task was killed due to the node running low on memory.",
        ],
        [
            "0 Workers (tasks / actors) killed due to memory pressure (OOM), 0 Workers crashed due to other reasons"
        ],
        description="Ray's memory monitor killing tasks because the node's host memory ran out.",
        printed_by="Ray's raylet memory monitor (node_manager.cc) and ray.exceptions.OutOfMemoryError",
    ),
    define(
        "framework-memory-limit",
        FailureCategory.HOST_OOM,
        Attribution.APPLICATION,
        r"(?:exceeded \d+% memory budget|Container killed by YARN for exceeding memory limits|"
        r"Worker exceeded \d+% memory budget|is running beyond physical memory limits)",
        [
            "distributed.nanny.memory - WARNING - Worker tcp://127.0.0.1:41235 (pid=4242) exceeded 95% memory budget. Restarting...",
            "ExecutorLostFailure (executor 7 exited caused by one of the running tasks) Reason: Container killed by YARN for exceeding memory limits. 12.1 GB of 12 GB physical memory used.",
        ],
        ["distributed.worker.memory - memory budget: 95%"],
        description="Dask's nanny and YARN ending a worker that outgrew its host-memory budget.",
        printed_by='Dask distributed\'s nanny ("exceeded 95% memory budget") and Hadoop YARN',
    ),
    define(
        "ray-disk-full",
        FailureCategory.STORAGE_IO,
        Attribution.SYSTEM_SOFTWARE,
        r"(?:is over \d+% full, available space: \d+|Object creation will fail if spilling is "
        r"required|Failed to spill objects|ObjectStoreFullError)",
        [
            "(raylet) file_system_monitor.cc:105: /tmp/ray/session_1 is over 95% full, available space: 13307080704; capacity: 270475862016. Object creation will fail if spilling is required.",
            "ray.exceptions.ObjectStoreFullError: Failed to put object in object store because it is full.",
        ],
        ["Spilled 2048 MiB, 12 objects, write throughput 900 MiB/s"],
        description="Ray's object store or its spill directory running out of space.",
        printed_by="Ray's raylet (file_system_monitor.cc, object spilling) and "
        "ray.exceptions.ObjectStoreFullError",
    ),
)
