"""``make bench-detect``: scan throughput and memory against grep on the same file.

Generates a log of at least 500 MB (healthy Megatron-style progress lines with NCCL chatter and
a realistic sprinkling of failures), then, pinned to one core, times the scanner with each engine
and ``grep -E -c -f`` with the exported signatures. Prints medians of several runs, the ratio to
grep, and the scanner's peak memory on a tenth of the file and on all of it (flat memory means
those two are close).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from recovery.detection.signature_set import SignatureSet, export_grep_patterns

ROOT = Path(__file__).resolve().parent.parent
WORK = ROOT / "var" / "bench"

PROGRESS = (
    " iteration {step:8d}/ 2500000 | consumed samples: {samples:12d} | elapsed time per "
    "iteration (ms): {ms:.1f} | learning rate: 2.999E-04 | global batch size:  1024 | lm loss: "
    "{loss:.6E} | loss scale: 1.0 | grad norm: {gnorm:.3f} | number of skipped iterations:   0 "
    "| number of nan iterations:   0 |\n"
)
CHATTER = [
    "gpu-{node:03d}:{pid}:{tid} [{gpu}] NCCL INFO Channel {ch:02d}/32 : {r} -> {r2} via P2P/IPC/read\n",
    "gpu-{node:03d}:{pid}:{tid} [{gpu}] NCCL INFO comm 0x55c1e2a0 rank {r} nranks 512 cudaDev {gpu} busId 1b000 - Init COMPLETE\n",
    "gpu-{node:03d}:{pid}:{tid} [{gpu}] NCCL INFO NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/IB ; OOB ib0:10.1.{node}.{gpu}<0>\n",
    "[rank{r}]:[W ProcessGroupNCCL.cpp:1856] Warning: TORCH_NCCL_AVOID_RECORD_STREAMS=1 has no effect (function operator())\n",
    "/usr/local/lib/python3.10/dist-packages/torch/utils/checkpoint.py:460: UserWarning: torch.utils.checkpoint: please pass in use_reentrant=True or use_reentrant=False explicitly.\n",
    "[2026-11-29 10:{m:02d}:{s:02d},{ms:03d}] [INFO] [logging.py:96:log_dist] [Rank 0] step={step}, skipped=0, lr=[0.0003], mom=[(0.9, 0.95)]\n",
]
FAILURES = [
    "Nov 29 10:{m:02d}:{s:02d} gpu-{node:03d} kernel: NVRM: Xid (PCI:0000:3b:00): 79, pid=2231, GPU has fallen off the bus.\n",
    "[rank{r}]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU {gpu} has a total capacity of 79.15 GiB of which 1.02 GiB is free.\n",
    "[rank{r}]:[E ProcessGroupNCCL.cpp:616] [Rank {r}] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=52817, OpType=ALLREDUCE, NumelIn=1048576, NumelOut=1048576, Timeout(ms)=600000) ran for 600041 milliseconds before timing out.\n",
    "gpu-{node:03d}:{pid}:{tid} [{gpu}] transport/net_ib.cc:1295 NCCL WARN NET/IB : Got completion from peer 10.1.3.7<4545> with error 12, opcode 0, len 0, vendor err 129\n",
    "OSError: [Errno 116] Stale file handle: '/lustre/ckpt/iter_{step:07d}'\n",
    "slurmstepd: error: *** STEP 48213.0 ON gpu-{node:03d} CANCELLED AT 2026-11-29T10:{m:02d}:{s:02d} DUE TO TIME LIMIT ***\n",
]


def generate(path: Path, size_bytes: int, seed: int = 11) -> None:
    """Write a realistic training log of at least ``size_bytes``."""
    rng = random.Random(seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    step = 0
    written = 0
    with path.open("w", encoding="utf-8", buffering=8 << 20) as out:
        while written < size_bytes:
            parts = []
            for _ in range(2000):
                step += 1
                parts.append(
                    PROGRESS.format(
                        step=step,
                        samples=step * 1024,
                        ms=8600 + rng.random() * 100,
                        loss=2.5 - step * 1e-7,
                        gnorm=0.2 + rng.random() * 0.05,
                    )
                )
                for _ in range(rng.randint(2, 6)):
                    parts.append(_fill(rng.choice(CHATTER), rng, step))
                if rng.random() < 0.0005:
                    parts.append(_fill(rng.choice(FAILURES), rng, step))
            block = "".join(parts)
            out.write(block)
            written += len(block)


def _fill(template: str, rng: random.Random, step: int) -> str:
    node = rng.randint(1, 64)
    return template.format(
        node=node,
        pid=10000 + node,
        tid=20000 + node,
        gpu=rng.randint(0, 7),
        ch=rng.randint(0, 31),
        r=rng.randint(0, 511),
        r2=rng.randint(0, 511),
        m=step // 60 % 60,
        s=step % 60,
        ms=step % 1000,
        step=step,
    )


def run_measured(argv: list[str], env: dict[str, str] | None = None) -> tuple[float, int, str]:
    """Run a command; return wall seconds, peak RSS in KiB of that process, and its stdout."""
    pin = ["taskset", "-c", "0"] if shutil.which("taskset") else []
    started = time.perf_counter()
    process = subprocess.Popen([*pin, *argv], stdout=subprocess.PIPE, env=env)
    assert process.stdout is not None
    output = process.stdout.read()
    _, status, usage = os.wait4(process.pid, 0)
    elapsed = time.perf_counter() - started
    process.returncode = os.waitstatus_to_exitcode(status)
    if process.returncode not in (0, 1):
        raise SystemExit(f"{argv[0]} failed with {process.returncode}")
    return elapsed, usage.ru_maxrss, output.decode(errors="replace")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--size-mb", type=int, default=512)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()

    big = WORK / f"training-{args.size_mb}mb.log"
    small = WORK / f"training-{args.size_mb // 10}mb.log"
    for path, size in ((big, args.size_mb), (small, args.size_mb // 10)):
        if not path.exists() or path.stat().st_size < size << 20:
            print(f"generating {path.name} ...", flush=True)
            generate(path, size << 20)
    size = big.stat().st_size
    lines = int(
        subprocess.run(["wc", "-l", str(big)], capture_output=True, text=True).stdout.split()[0]
    )
    patterns = WORK / "signatures.ere"
    patterns.write_text("\n".join(export_grep_patterns(SignatureSet.builtin())) + "\n")

    scan = [sys.executable, "-m", "recovery.detection", "scan", "--json"]
    grep_env = {**os.environ, "LC_ALL": "C"}
    results: dict[str, list[float]] = {"hyperscan": [], "re2": [], "grep": []}
    peaks: dict[str, int] = {}
    counts: dict[str, str] = {}
    for _ in range(args.runs):
        for engine in ("hyperscan", "re2"):
            seconds, peak, out = run_measured([*scan, "--engine", engine, str(big)])
            results[engine].append(seconds)
            peaks[engine] = max(peaks.get(engine, 0), peak)
            report = json.loads(out)
            counts[engine] = (
                f"{len(report['findings'])} findings, "
                f"{sum(f['count'] for f in report['findings'])} failure lines"
            )
        seconds, _, out = run_measured(
            ["grep", "-E", "-c", "-f", str(patterns), str(big)], grep_env
        )
        results["grep"].append(seconds)
        counts["grep"] = out.strip()
    _, small_peak, _ = run_measured([*scan, "--engine", "hyperscan", str(small)])

    mb = size / 1e6
    grep_median = statistics.median(results["grep"])
    print()
    print(
        f"file: {big.name}, {mb:.0f} MB, {lines:,} lines; {args.runs} runs each, pinned to one core"
    )
    print(
        f"grep -E -c -f: {len(export_grep_patterns(SignatureSet.builtin()))} exported patterns, "
        f"{counts['grep']} matching lines, LC_ALL=C"
    )
    for engine in ("hyperscan", "re2"):
        print(f"scanner ({engine}): {counts[engine]}")
    if counts["hyperscan"] != counts["re2"]:
        print("WARNING: the two engines disagree")
    print(f"{'':<22}{'median s':>10}{'MB/s':>10}{'lines/s':>14}{'vs grep':>10}{'peak MB':>10}")
    for name in ("hyperscan", "re2", "grep"):
        median = statistics.median(results[name])
        label = "scanner (" + name + ")" if name != "grep" else "grep -E -c -f"
        peak_text = f"{peaks[name] / 1024:.0f}" if name in peaks else ""
        print(
            f"{label:<22}{median:>10.2f}{mb / median:>10.1f}{lines / median:>14,.0f}"
            f"{grep_median / median:>9.2f}x{peak_text:>10}"
        )
    print(
        f"peak memory of the scanner: {small_peak / 1024:.0f} MB on {small.stat().st_size / 1e6:.0f} MB, "
        f"{peaks['hyperscan'] / 1024:.0f} MB on {mb:.0f} MB"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
