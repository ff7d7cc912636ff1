"""Command line: ``python -m recovery.detection classify|scan|export-signatures``."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import IO, Any

from recovery.detection.classify import classify_scan, classify_text
from recovery.detection.scanner.log_scanner import LogScanner
from recovery.detection.scanner.results import ScanResult
from recovery.detection.signature_set import SignatureSet, export_grep_patterns

READ_SIZE = 4 * 1024 * 1024


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m recovery.detection", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)

    classify = commands.add_parser(
        "classify", help="classify JSON lines with 'id' and 'log'; one JSON result a line"
    )
    classify.add_argument("file", help="a .jsonl file, or - for standard input")
    classify.add_argument("--engine", default="auto", choices=["auto", "hyperscan", "re2"])

    scan = commands.add_parser("scan", help="scan log files and print the findings")
    scan.add_argument("logs", nargs="+", type=Path)
    scan.add_argument("--json", action="store_true", help="one JSON object per file")
    scan.add_argument("--engine", default="auto", choices=["auto", "hyperscan", "re2"])

    export = commands.add_parser("export-signatures", help="print the signature set")
    export.add_argument("--grep", action="store_true", help="as POSIX extended regexes")

    args = parser.parse_args(argv)
    if args.command == "classify":
        return _classify(args.file, args.engine, sys.stdout)
    if args.command == "scan":
        return _scan(args.logs, args.json, args.engine, sys.stdout)
    return _export(args.grep, sys.stdout)


def _records(source: str) -> Iterator[tuple[int, str]]:
    handle = (
        sys.stdin if source == "-" else Path(source).open(encoding="utf-8", errors="replace")  # noqa: SIM115
    )
    try:
        yield from enumerate(handle, start=1)
    finally:
        if handle is not sys.stdin:
            handle.close()


def _classify(source: str, engine: str, out: IO[str]) -> int:
    problems = 0
    for number, raw in _records(source):
        if not raw.strip():
            continue
        try:
            record = json.loads(raw)
            if not isinstance(record, dict) or not isinstance(record.get("log"), str):
                raise ValueError("expected an object with a string 'log'")
        except ValueError as exc:
            problems += 1
            sys.stderr.write(f"line {number}: ignored: {exc}\n")
            continue
        verdict = classify_text(record["log"], engine=engine)
        row: dict[str, Any] = {
            "id": record.get("id"),
            "category": verdict.category,
            "attribution": verdict.attribution,
            "kind": verdict.kind,
            "evidence": verdict.evidence,
            "nodes": verdict.nodes,
            "ranks": verdict.ranks,
            "secondary": verdict.secondary,
        }
        out.write(json.dumps(row, ensure_ascii=False) + "\n")
    return 1 if problems else 0


def scan_file(path: Path, engine: str = "auto") -> ScanResult:
    scanner = LogScanner(engine=engine)
    with path.open("rb") as handle:
        while chunk := handle.read(READ_SIZE):
            scanner.feed(chunk)
    return scanner.finish()


def _scan(paths: list[Path], as_json: bool, engine: str, out: IO[str]) -> int:
    status = 0
    for path in paths:
        try:
            result = scan_file(path, engine)
        except OSError as exc:
            sys.stderr.write(f"{path}: {exc.strerror or exc}\n")
            status = 1
            continue
        verdict = classify_scan(result)
        if as_json:
            out.write(
                json.dumps(
                    {
                        "file": str(path),
                        "verdict": verdict.to_dict(),
                        "findings": [f.to_dict() for f in result.findings],
                        "progress": _progress_summary(result),
                        "lines": result.lines,
                        "bytes": result.bytes,
                    },
                    ensure_ascii=False,
                    default=str,
                )
                + "\n"
            )
            continue
        out.write(_table(path, result, verdict))
    return status


def _progress_summary(result: ScanResult) -> dict[str, Any]:
    steps = [p.step for p in result.progress]
    saved = [c for c in result.checkpoints if c.completed]
    return {
        "progress_lines": result.progress_lines,
        "first_step": steps[0] if steps else None,
        "last_step": steps[-1] if steps else None,
        "last_loss": next((p.loss for p in reversed(result.progress) if p.loss is not None), None),
        "checkpoints_saved": len(saved),
        "last_checkpoint_step": saved[-1].step if saved else None,
        "last_checkpoint_line": saved[-1].line if saved else None,
    }


def _table(path: Path, result: ScanResult, verdict: Any) -> str:
    lines = [f"{path}  ({result.lines} lines, {result.bytes} bytes, engine {result.engine})"]
    if verdict.healthy:
        note = " (failures recovered: training went on)" if verdict.recovered else ""
        lines.append(f"  verdict: healthy{note}")
    else:
        lines.append(
            f"  verdict: {verdict.category} / {verdict.attribution}  "
            f"line {verdict.first_line}: {verdict.evidence[:160]}"
        )
    if result.findings:
        lines.append(f"  {'line':>8}  {'count':>6}  {'category':<16} {'signature':<28} evidence")
        for finding in result.findings:
            lines.append(
                f"  {finding.first_line or 0:>8}  {finding.count:>6}  {finding.category:<16} "
                f"{finding.signature:<28} {finding.evidence[:100]}"
            )
    summary = _progress_summary(result)
    lines.append(
        f"  progress: {summary['progress_lines']} lines, steps "
        f"{summary['first_step']} → {summary['last_step']}, last loss {summary['last_loss']}; "
        f"checkpoints saved: {summary['checkpoints_saved']}"
        + (
            f" (last at step {summary['last_checkpoint_step']}, "
            f"line {summary['last_checkpoint_line']})"
            if summary["checkpoints_saved"]
            else ""
        )
    )
    return "\n".join(lines) + "\n"


def _export(as_grep: bool, out: IO[str]) -> int:
    signatures = SignatureSet.builtin()
    if as_grep:
        for pattern in export_grep_patterns(signatures):
            out.write(pattern + "\n")
        return 0
    for signature in signatures.signatures:
        out.write(
            json.dumps(
                {
                    "name": signature.name,
                    "category": signature.category,
                    "attribution": signature.attribution,
                    "severity": signature.severity,
                    "role": signature.role,
                    "priority": signature.priority,
                    "caseless": signature.caseless,
                    "pattern": signature.pattern,
                }
            )
            + "\n"
        )
    return 0
