"""The command line: classify, scan and export-signatures."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from recovery.detection.signatures import SIGNATURES

ROOT = Path(__file__).resolve().parents[2]
XID = "NVRM: Xid (PCI:0000:3b:00): 79, pid=2231, GPU has fallen off the bus."


def run(*args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "recovery.detection", *args],
        cwd=ROOT,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_classify_reads_json_lines_from_standard_input() -> None:
    records = [
        {"id": "a", "log": "step 1\n" + XID},
        {"id": "b", "log": " iteration       10/     100 | lm loss: 2.5 |"},
    ]
    result = run("classify", "-", stdin="\n".join(json.dumps(r) for r in records) + "\n")
    assert result.returncode == 0, result.stderr
    rows = [json.loads(line) for line in result.stdout.splitlines()]
    assert [r["id"] for r in rows] == ["a", "b"]
    assert rows[0]["category"] == "gpu_hardware"
    assert rows[0]["attribution"] == "hardware"
    assert rows[0]["kind"] == "crash"
    assert rows[0]["evidence"] == XID
    assert rows[1]["category"] == "healthy"
    assert rows[1]["attribution"] == "none"
    assert set(rows[0]) == {
        "id", "category", "attribution", "kind", "evidence", "nodes", "ranks", "secondary"
    }  # fmt: skip


def test_classify_reports_bad_lines_and_goes_on(tmp_path: Path) -> None:
    source = tmp_path / "cases.jsonl"
    source.write_text('not json\n{"id": "x"}\n{"id": "ok", "log": "KeyError: 1"}\n')
    result = run("classify", str(source))
    assert result.returncode == 1
    assert "line 1: ignored" in result.stderr
    assert "line 2: ignored" in result.stderr
    assert json.loads(result.stdout)["category"] == "app_exception"


def test_scan_prints_a_table_with_line_numbers(tmp_path: Path) -> None:
    log = tmp_path / "job.out"
    log.write_text(" iteration       10/     100 | lm loss: 2.5 |\n" + XID + "\n")
    result = run("scan", str(log))
    assert result.returncode == 0, result.stderr
    assert "verdict: gpu_hardware / hardware" in result.stdout
    assert "nvidia-xid" in result.stdout
    assert "progress: 1 lines, steps 10 → 10" in result.stdout


def test_scan_json_for_machines(tmp_path: Path) -> None:
    log = tmp_path / "job.out"
    log.write_bytes(b"\xff\xfe binary\n" + XID.encode() + b"\n")
    result = run("scan", "--json", str(log))
    report = json.loads(result.stdout)
    assert report["verdict"]["category"] == "gpu_hardware"
    assert report["findings"][0]["first_line"] == 2
    assert report["lines"] == 2


def test_scan_says_which_file_it_cannot_read(tmp_path: Path) -> None:
    result = run("scan", str(tmp_path / "missing.log"))
    assert result.returncode == 1
    assert "missing.log" in result.stderr
    assert "No such file" in result.stderr


def test_export_signatures_for_grep() -> None:
    result = run("export-signatures", "--grep")
    assert result.returncode == 0
    patterns = result.stdout.splitlines()
    assert len(patterns) == len(SIGNATURES)
    grep = subprocess.run(
        ["grep", "-E", "-c", "-f", "/dev/stdin"],
        input=result.stdout,
        capture_output=True,
        text=True,
    )
    assert grep.returncode in (0, 1), grep.stderr  # grep accepts every pattern
