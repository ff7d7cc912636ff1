"""Run mypy and hold it to ``mypy-baseline``: the errors listed there are tolerated, no others.

mypy has no baseline of its own. Each entry in ``mypy-baseline`` is one kind of error in one file,
``COUNT PATH: CODE: MESSAGE``, without line numbers so that unrelated edits do not invalidate it.
The check fails when mypy reports an error the baseline does not list (or more of one than the
count allows), and also when a listed error no longer occurs, so that the baseline only shrinks:
after fixing errors, ``--prune`` drops the entries that are gone and never adds one.
``--regenerate`` rewrites the file from the current errors, for when the baseline is first made.

Usage: deploy/dev/mypy_baseline.py [--prune | --regenerate] [-- MYPY ARGS...]
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BASELINE = REPO / "mypy-baseline"
HEADER = """\
# mypy errors tolerated until they are fixed; `make lint` fails on any other error and on an entry
# that no longer occurs. One kind of error per line: COUNT PATH: CODE: MESSAGE (no line numbers).
# After fixing some: .venv/bin/python deploy/dev/mypy_baseline.py --prune
"""

# path:line[:column]: error: message  [code]; a file-level error has no line number.
ERROR_LINE = re.compile(
    r"^(?P<path>[^:\n]+?):(?:\d+:)?(?:\d+:)? error: "
    r"(?P<message>.*?)(?:  \[(?P<code>[a-z0-9-]+)\])?$"
)
# Messages that quote another line ("already defined on line 12") would shift like line numbers.
LINE_REFERENCE = re.compile(r"\bline \d+\b")

Entry = tuple[str, str, str]


def run_mypy(mypy_args: Sequence[str]) -> tuple[int, list[str]]:
    """mypy's exit status and its error lines (notes and the summary are left out)."""
    command = [sys.executable, "-m", "mypy", "--no-pretty", "--no-error-summary"]
    command += ["--show-error-codes", "--hide-error-context", "--no-color-output", *mypy_args]
    completed = subprocess.run(
        command,
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    )
    if completed.returncode not in (0, 1):
        # 2 means mypy itself failed (bad configuration, a crash): nothing to compare.
        sys.stderr.write(completed.stdout + completed.stderr)
        raise SystemExit(completed.returncode)
    lines = [line for line in completed.stdout.splitlines() if " error: " in line]
    return completed.returncode, lines


def entry_of(line: str) -> Entry:
    match = ERROR_LINE.match(line)
    if match is None:
        return ("", "misc", line)
    path = Path(match["path"]).as_posix()
    message = LINE_REFERENCE.sub("line N", match["message"].strip())
    return (path, match["code"] or "misc", message)


def count_entries(lines: Iterable[str]) -> Counter[Entry]:
    return Counter(entry_of(line) for line in lines)


def read_baseline(path: Path) -> Counter[Entry]:
    entries: Counter[Entry] = Counter()
    if not path.exists():
        return entries
    for number, raw in enumerate(path.read_text().splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        count, _, rest = line.partition(" ")
        file_path, _, rest = rest.partition(": ")
        code, _, message = rest.partition(": ")
        if not count.isdigit() or not message:
            raise SystemExit(f"{path.name}:{number}: not COUNT PATH: CODE: MESSAGE: {raw!r}")
        entries[(file_path, code, message)] += int(count)
    return entries


def write_baseline(path: Path, entries: Counter[Entry]) -> None:
    body = "".join(
        f"{entries[entry]} {entry[0]}: {entry[1]}: {entry[2]}\n"
        for entry in sorted(entries)
        if entries[entry] > 0
    )
    path.write_text(HEADER + body)


def describe(entries: Counter[Entry]) -> str:
    return "".join(
        f"  {count} {file_path}: {code}: {message}\n"
        for (file_path, code, message), count in sorted(entries.items())
    )


def say(text: str) -> None:
    sys.stdout.write(text + "\n")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Run mypy and hold it to mypy-baseline.")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--prune", action="store_true", help="drop entries that no longer occur")
    mode.add_argument("--regenerate", action="store_true", help="list every current error")
    parser.add_argument("--baseline", type=Path, default=BASELINE)
    parser.add_argument("mypy_args", nargs="*", help="passed to mypy (after --)")
    options = parser.parse_args(argv)

    _, lines = run_mypy(options.mypy_args)
    current = count_entries(lines)
    baseline = read_baseline(options.baseline)
    if options.regenerate:
        write_baseline(options.baseline, current)
        say(f"{options.baseline.name}: {sum(current.values())} errors listed")
        return 0

    new = current - baseline
    gone = baseline - current
    if options.prune:
        write_baseline(options.baseline, baseline - gone)
        say(f"{options.baseline.name}: {sum(gone.values())} entries that no longer occur dropped")
    elif gone:
        say(
            f"{sum(gone.values())} errors in {options.baseline.name} no longer occur; "
            "drop them with deploy/dev/mypy_baseline.py --prune:\n" + describe(gone)
        )
    if new:
        new_lines = [line for line in lines if new[entry_of(line)] > 0]
        say(
            f"{sum(new.values())} mypy errors not in {options.baseline.name} "
            f"(every line of a kind that has more than its baseline count is shown):\n"
            + "".join(f"  {line}\n" for line in new_lines)
        )
    tolerated = sum((current & baseline).values())
    say(f"mypy: {sum(current.values())} errors, {tolerated} of them in {options.baseline.name}")
    return 1 if new or (gone and not options.prune) else 0


if __name__ == "__main__":
    raise SystemExit(main())
