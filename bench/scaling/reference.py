"""The reference: the detector alone, one process, scanning the bytes the jobs wrote."""

from __future__ import annotations

import statistics
import time
from pathlib import Path


def detector_reference(log_dir: Path, runs: int) -> dict[str, float]:
    """The detector alone on a step's logs in ``log_dir``: one scanner over all of it, and per file."""
    from recovery.detection.signature_set import SignatureSet
    from recovery.loop.logs import scan

    blobs = [path.read_bytes() for path in sorted(log_dir.glob("*.out"))]
    data = b"".join(blobs)
    lines = data.count(b"\n")
    signatures = SignatureSet.builtin()
    whole: list[float] = []
    per_file: list[float] = []
    for _ in range(runs):
        began = time.perf_counter()
        scan(data, signatures)
        whole.append(time.perf_counter() - began)
        began = time.perf_counter()
        for blob in blobs:
            scan(blob)
        per_file.append(time.perf_counter() - began)
    return {
        "files": len(blobs),
        "mb": len(data) / 1e6,
        "lines": lines,
        "whole_lines_s": lines / statistics.median(whole),
        "whole_mb_s": len(data) / 1e6 / statistics.median(whole),
        "per_file_lines_s": lines / statistics.median(per_file),
        "per_file_ms": statistics.median(per_file) / max(1, len(blobs)) * 1000,
    }
