"""The burst step: output that arrives all at once, read by the worker's own code path.

A large job's start-up prints tens of thousands of NCCL lines between two polls, and a failing
job a traceback from every rank. This step writes both into the output files of running
workloads (``BURST_JOBS`` jobs printing ``BURST_LINES`` NCCL lines each, and one job whose
``FLOOD_RANKS`` ranks each print a CUDA error's traceback and NCCL's abort), then calls the
per-workload part of a poll (``recovery.loop.workloads.process_workloads``, what a worker's
shard task runs) until every byte is read, and measures this process's CPU time: lines per
worker CPU second under a burst. MariaDB's own CPU is not in it, as in the load steps.

The reference, measured in the same run on the same bytes: the detector alone, one scanner per
file. The step also checks what the burst led to: the failing job gets one anomaly (one
decision per read, not per line), the NCCL chatter none.
"""

from __future__ import annotations

import os
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

BURST_JOBS = 4
BURST_LINES = 50_000
FLOOD_RANKS = 64
# Worker CPU per burst line, at least this many lines a second (issue target).
TARGET_BURST_LINES_PER_CPU_S = 20_000


def nccl_startup(host: str, ranks: int, lines: int) -> list[str]:
    """What NCCL_DEBUG=INFO prints while a large job builds its communicators."""
    out: list[str] = []
    pid = 4100
    while len(out) < lines:
        for rank in range(ranks):
            gpu = rank % 8
            prefix = f"{host}-{rank // 8:03d}:{pid + rank}:{pid + rank + 77} [{gpu}] NCCL INFO"
            channel = len(out) % 32
            out.append(
                f"{prefix} Channel {channel:02d}/32 : {rank} {(rank + 1) % ranks} "
                f"{(rank + 2) % ranks} {(rank + 3) % ranks}"
            )
            out.append(
                f"{prefix} Channel {channel:02d}/0 : {rank}[{gpu}] -> {(rank + 1) % ranks}"
                f"[{(gpu + 1) % 8}] via P2P/CUMEM/read"
            )
            out.append(f"{prefix} Connected all rings, use ring PXN 0 GDR 1")
            if len(out) >= lines:
                break
    return out[:lines]


def rank_flood(ranks: int) -> list[str]:
    """Every rank's last words after an illegal memory access: torch's traceback, NCCL's
    watchdog and torchrun's summary, as ranks interleave them."""
    out: list[str] = []
    for rank in range(ranks):
        tag = f"[rank{rank}]:"
        out += [
            f"{tag} Traceback (most recent call last):",
            f'{tag}   File "/workspace/train.py", line 412, in <module>',
            f"{tag}     main()",
            f'{tag}   File "/workspace/train.py", line 398, in main',
            f"{tag}     loss = train_step(model, batch)",
            f'{tag}   File "/workspace/train.py", line 201, in train_step',
            f"{tag}     loss.backward()",
            f'{tag}   File "/usr/lib/python3/dist-packages/torch/_tensor.py", line 581, in backward',
            f"{tag}     torch.autograd.backward(",
            f"{tag} RuntimeError: CUDA error: an illegal memory access was encountered",
            f"{tag} CUDA kernel errors might be asynchronously reported at some other API call, "
            "so the stacktrace below might be incorrect.",
            f"{tag} For debugging consider passing CUDA_LAUNCH_BLOCKING=1",
            f"{tag} Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.",
            f"[rank{rank}]:[E1204 10:15:02.123456 {9000 + rank} ProcessGroupNCCL.cpp:1595] "
            f"[PG 0 (default_pg) Rank {rank}] Process group watchdog thread terminated with "
            "exception: CUDA error: an illegal memory access was encountered",
            "terminate called after throwing an instance of 'c10::DistBackendError'",
        ]
    out += [
        "E1204 10:15:09.000000 8841 torch/distributed/elastic/multiprocessing/api.py:869] "
        "failed (exitcode: -6) local_rank: 0 (pid: 9000) of binary: /usr/bin/python3",
        "torch.distributed.elastic.multiprocessing.errors.ChildFailedError:",
    ]
    return out


def run_burst(work: Path, reference_runs: int = 3) -> dict[str, Any]:
    """The burst step on the bench's database (emptied before); its figures."""
    from django.utils import timezone

    from recovery.choices import WorkloadState
    from recovery.detection.signature_set import SignatureSet
    from recovery.loop.logs import scan
    from recovery.loop.workloads import process_workloads
    from recovery.models import Anomaly, Attempt, Cluster, Workload
    from recovery.schedulers.transport import LocalTransport

    directory = work / "burst"
    directory.mkdir(parents=True, exist_ok=True)
    cluster = Cluster.objects.create(name="scale-burst", environment="bench")
    now = timezone.now()
    texts = {
        f"nccl-{index}": nccl_startup(f"gpu{index}", 64, BURST_LINES) for index in range(BURST_JOBS)
    }
    texts["flood"] = rank_flood(FLOOD_RANKS)
    workloads: dict[str, Workload] = {}
    for index, name in enumerate(texts):
        path = directory / f"{name}.out"
        path.write_text("")
        workload = Workload.objects.create(
            cluster=cluster,
            job_id=str(900_000 + index),
            name=name,
            user="bench",
            user_uid=os.getuid(),
            partition="gpu",
            submit_time=now - timedelta(minutes=10),
            opted_in=True,
            state=WorkloadState.RUNNING,
            current_attempt=1,
            stdout_path=str(path),
            work_dir=str(directory),
        )
        Attempt.objects.create(
            workload=workload, number=1, started_at=now - timedelta(minutes=5), nodes=["gpu-001"]
        )
        workloads[name] = workload
    ids = [w.pk for w in workloads.values()]
    transport = LocalTransport()
    # The first poll finds the files empty and creates their cursors, as a job's first one does.
    process_workloads(cluster, ids, transport)
    blobs = {name: ("\n".join(lines) + "\n").encode() for name, lines in texts.items()}
    for name, blob in blobs.items():
        Path(workloads[name].stdout_path).write_bytes(blob)
    lines = sum(len(lines) for lines in texts.values())
    total = sum(len(blob) for blob in blobs.values())

    polls = 0
    read = 0
    full_reads = 0
    cpu_began, wall_began = time.process_time(), time.perf_counter()
    while read < total and polls < 50:
        done = process_workloads(cluster, ids, transport)
        polls += 1
        read += done.log_bytes
        full_reads += done.full_reads
    cpu_s = time.process_time() - cpu_began
    wall_s = time.perf_counter() - wall_began

    signatures = SignatureSet.builtin()
    timings: list[float] = []
    for _ in range(reference_runs):
        began = time.process_time()
        for blob in blobs.values():
            scan(blob, signatures)
        timings.append(time.process_time() - began)
    reference_cpu_s = sorted(timings)[len(timings) // 2]

    anomalies = {
        name: list(Anomaly.objects.filter(workload=workload).values_list("signature", flat=True))
        for name, workload in workloads.items()
    }
    flood = anomalies["flood"]
    return {
        "name": "burst",
        "jobs": len(workloads),
        "lines": lines,
        "bytes": total,
        "bytes_read": read,
        "polls": polls,
        "full_reads": full_reads,
        "worker_cpu_s": round(cpu_s, 4),
        "wall_s": round(wall_s, 4),
        "burst_lines_per_worker_cpu_s": round(lines / cpu_s) if cpu_s else None,
        "reference_detector_lines_per_cpu_s": round(lines / reference_cpu_s)
        if reference_cpu_s
        else None,
        "anomalies_flood": len(flood),
        "anomaly_signatures_flood": sorted(set(flood)),
        "anomalies_nccl": sum(len(found) for name, found in anomalies.items() if name != "flood"),
        # Every byte read; one anomaly per cause the flood shows, not one per rank or line;
        # nothing from the NCCL chatter.
        "passed": bool(cpu_s)
        and lines / cpu_s >= TARGET_BURST_LINES_PER_CPU_S
        and read == total
        and 0 < len(flood) == len(set(flood))
        and not any(found for name, found in anomalies.items() if name != "flood"),
    }


def print_burst(figures: dict[str, Any]) -> None:
    print(
        f"\nBurst: {figures['jobs']} jobs, {figures['lines']:,} lines "
        f"({int(figures['bytes']) / 1e6:.1f} MB: {BURST_JOBS} x {BURST_LINES:,} NCCL start-up lines, "
        f"{FLOOD_RANKS} ranks' tracebacks) read in {figures['polls']} polls: "
        f"{figures['burst_lines_per_worker_cpu_s']:,} lines per worker CPU second "
        f"(target >= {TARGET_BURST_LINES_PER_CPU_S:,}); the detector alone on the same bytes "
        f"{figures['reference_detector_lines_per_cpu_s']:,} lines per CPU second. Anomalies: "
        f"{figures['anomalies_flood']} for the failing job, one per cause "
        f"({', '.join(map(str, figures['anomaly_signatures_flood']))}; "
        f"{figures['full_reads']} reads recorded one by one), {figures['anomalies_nccl']} for "
        "the NCCL chatter."
    )
