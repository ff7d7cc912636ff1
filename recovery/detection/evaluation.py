"""How well the detectors classify a corpus of real, labelled logs: ``make eval-detect``.

Four measures, as the project judges its detectors:

* **category**: the share of failure and healthy cases whose category is the label's;
* **attribution**: the share whose attribution (the layer to blame) is the label's;
* **false alarms**: healthy cases the classifier calls a failure;
* **cascades**: a failure buried among another job's collective timeouts (the timeouts of an
  ``nccl_timeout`` case interleaved around it, as 63 surviving ranks print them) must still be
  classified as its own root cause, not as the timeout.

Per category, the same scores and a confusion table (label → verdict → count). The corpus is
JSON lines: ``id``, ``category``, ``attribution``, ``source``, ``log`` and optionally ``reason``.
Pure Python, no Django: the detectors are.

**Rounds** are the prospective part: cases collected after the rules were written, from threads
and projects the corpus does not cite, each round in its own file (``round-N.jsonl``) beside the
score today's detector had on it before any rule was changed for it (``round-N.before.json``, the
``--json`` figures of that run). A round is scored on its own, so a rule fitted to the corpus
shows as a gap between the corpus and the round, and a rule fitted to a round as a gap between
that round and the next.
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from recovery.detection.classify import Classification, classify_text

HEALTHY = "healthy"
TIMEOUT = "nccl_timeout"
# Lines of another job's collective timeouts a cascade wraps around a root cause.
CASCADE_NOISE_LINES = 40
REQUIRED_KEYS = ("id", "category", "attribution", "source", "log")

Classifier = Callable[[str], Classification]


class CorpusError(ValueError):
    """A corpus file that cannot be read as cases: which file, which line, why."""


@dataclass(frozen=True)
class Case:
    id: str
    category: str
    attribution: str
    source: str
    log: str
    reason: str = ""


def load_cases(paths: Iterable[Path]) -> list[Case]:
    """Every case of the files, in order; an id or a source seen twice is an error."""
    cases: list[Case] = []
    seen_ids: dict[str, str] = {}
    for path in paths:
        with path.open(encoding="utf-8") as handle:
            for number, line in enumerate(handle, 1):
                if not line.strip():
                    continue
                where = f"{path}:{number}"
                try:
                    data = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise CorpusError(f"{where}: not JSON ({exc.msg})") from None
                if not isinstance(data, dict):
                    raise CorpusError(f"{where}: not a JSON object")
                missing = [key for key in REQUIRED_KEYS if not isinstance(data.get(key), str)]
                if missing:
                    raise CorpusError(f"{where}: no text for {', '.join(missing)}")
                if data["id"] in seen_ids:
                    raise CorpusError(
                        f"{where}: id {data['id']!r} is also at {seen_ids[data['id']]}"
                    )
                seen_ids[data["id"]] = where
                cases.append(
                    Case(
                        id=data["id"],
                        category=data["category"],
                        attribution=data["attribution"],
                        source=data["source"],
                        log=data["log"],
                        reason=str(data.get("reason") or ""),
                    )
                )
    return cases


@dataclass
class Score:
    cases: int = 0
    category: int = 0
    attribution: int = 0

    def add(self, category_right: bool, attribution_right: bool) -> None:
        self.cases += 1
        self.category += category_right
        self.attribution += attribution_right

    def as_dict(self) -> dict[str, Any]:
        return {
            "cases": self.cases,
            "category": _share(self.category, self.cases),
            "attribution": _share(self.attribution, self.cases),
        }


@dataclass
class Evaluation:
    overall: Score = field(default_factory=Score)
    by_category: dict[str, Score] = field(default_factory=dict)
    confusion: Counter[tuple[str, str]] = field(default_factory=Counter)
    healthy: int = 0
    false_alarms: list[str] = field(default_factory=list)
    cascades: int = 0
    cascades_kept: int = 0
    misses: list[dict[str, str]] = field(default_factory=list)
    # Cases whose root cause a cascade lost: id -> what the cascade was called.
    cascades_lost: dict[str, str] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {
            "overall": self.overall.as_dict(),
            "false_alarms": {"healthy_cases": self.healthy, "alarms": self.false_alarms},
            "cascades": {
                "cases": self.cascades,
                "root_cause_kept": _share(self.cascades_kept, self.cascades),
                "lost": self.cascades_lost,
            },
            "by_category": {name: s.as_dict() for name, s in sorted(self.by_category.items())},
            "confusion": [
                {"label": label, "verdict": verdict, "count": count}
                for (label, verdict), count in sorted(self.confusion.items())
            ],
            "misses": self.misses,
        }


def _share(part: int, whole: int) -> float | None:
    return round(part / whole, 4) if whole else None


def cascade_of(case: Case, timeouts: Sequence[str]) -> str:
    """``case``'s log with another job's collective timeouts before and after it, as a job's
    output reads when its surviving ranks time out around the rank that failed."""
    noise = [timeouts[i % len(timeouts)] for i in range(CASCADE_NOISE_LINES)]
    half = len(noise) // 2
    return "\n".join([*noise[:half], case.log, *noise[half:]])


def timeout_lines(cases: Sequence[Case], classify: Classifier) -> list[str]:
    """The lines of the ``nccl_timeout`` cases that alone classify as a timeout."""
    lines = []
    for case in cases:
        if case.category != TIMEOUT:
            continue
        for line in case.log.splitlines():
            if line.strip() and classify(line).category == TIMEOUT:
                lines.append(line)
    return lines


def evaluate(cases: Sequence[Case], classify: Classifier = classify_text) -> Evaluation:
    result = Evaluation()
    for case in cases:
        verdict = classify(case.log)
        category_right = verdict.category == case.category
        attribution_right = verdict.attribution == case.attribution
        result.overall.add(category_right, attribution_right)
        result.by_category.setdefault(case.category, Score()).add(category_right, attribution_right)
        result.confusion[(case.category, verdict.category)] += 1
        if case.category == HEALTHY:
            result.healthy += 1
            if verdict.category != HEALTHY:
                result.false_alarms.append(case.id)
        if not (category_right and attribution_right):
            result.misses.append(
                {
                    "id": case.id,
                    "label": f"{case.category}/{case.attribution}",
                    "verdict": f"{verdict.category}/{verdict.attribution}",
                    "evidence": verdict.evidence[:200],
                    "source": case.source,
                }
            )
    timeouts = timeout_lines(cases, classify)
    if timeouts:
        for case in cases:
            if case.category in (HEALTHY, TIMEOUT):
                continue
            result.cascades += 1
            called = classify(cascade_of(case, timeouts)).category
            if called == case.category:
                result.cascades_kept += 1
            else:
                result.cascades_lost[case.id] = called
    return result


def report(result: Evaluation) -> str:
    """The figures as a person reads them: totals, per category, the confusion table."""
    figures = result.as_dict()
    overall = figures["overall"]
    lines = [
        f"cases {overall['cases']}: category {_percent(overall['category'])}, "
        f"attribution {_percent(overall['attribution'])}",
        f"false alarms: {len(result.false_alarms)} of {result.healthy} healthy logs"
        + (f" ({', '.join(result.false_alarms)})" if result.false_alarms else ""),
        f"cascades keeping the root cause: {_percent(figures['cascades']['root_cause_kept'])} "
        f"of {result.cascades}",
        "",
        f"{'category':<18}{'cases':>6}{'category':>10}{'attribution':>13}",
    ]
    for name, score in figures["by_category"].items():
        lines.append(
            f"{name:<18}{score['cases']:>6}{_percent(score['category']):>10}"
            f"{_percent(score['attribution']):>13}"
        )
    lines += ["", "confusion (label: right, then the wrong verdicts with their counts)"]
    for label in sorted({label for label, _ in result.confusion}):
        right = result.confusion.get((label, label), 0)
        wrong = [
            f"{verdict} x{count}"
            for (of, verdict), count in sorted(result.confusion.items())
            if of == label and verdict != label
        ]
        lines.append(f"  {label:<16} {right} right" + (f"; {', '.join(wrong)}" if wrong else ""))
    if result.misses:
        lines += ["", "misses"]
        lines += [
            f"  {m['id']}: {m['label']} -> {m['verdict']}  ({m['source']})" for m in result.misses
        ]
    if result.cascades_lost:
        lines += ["", "cascades that lost the root cause"]
        lines += [f"  {case}: called {called}" for case, called in result.cascades_lost.items()]
    return "\n".join(lines)


@dataclass(frozen=True)
class Round:
    """One prospective round: its cases and the figures recorded before rules were changed."""

    name: str
    cases: list[Case]
    before: dict[str, Any] | None


def load_rounds(directory: Path) -> list[Round]:
    """Every ``round-*.jsonl`` of ``directory`` in order, with its ``.before.json`` if any."""
    rounds = []
    for path in sorted(directory.glob("round-*.jsonl"), key=_round_number):
        before_path = path.with_suffix(".before.json")
        before = None
        if before_path.exists():
            try:
                before = json.loads(before_path.read_text(encoding="utf-8"))
            except json.JSONDecodeError as exc:
                raise CorpusError(f"{before_path}: not JSON ({exc.msg})") from None
            if not isinstance(before, dict) or "overall" not in before:
                raise CorpusError(f"{before_path}: not the figures of an evaluation")
        rounds.append(Round(path.stem, load_cases([path]), before))
    return rounds


def _round_number(path: Path) -> tuple[int, str]:
    number = path.stem.removeprefix("round-")
    return (int(number), "") if number.isdigit() else (1 << 30, number)


def headline(figures: dict[str, Any]) -> str:
    """Category, attribution, false alarms and cascades on one line."""
    overall, alarms = figures["overall"], figures["false_alarms"]
    return (
        f"category {_percent(overall['category'])}, "
        f"attribution {_percent(overall['attribution'])}, "
        f"false alarms {len(alarms['alarms'])} of {alarms['healthy_cases']}, "
        f"cascades {_percent(figures['cascades']['root_cause_kept'])}"
    )


def report_rounds(rounds: Sequence[Round], results: Sequence[Evaluation]) -> str:
    lines = ["", "prospective rounds (collected after the rules; before = when collected)"]
    for round_, result in zip(rounds, results, strict=True):
        lines.append(f"  {round_.name}: {len(round_.cases)} cases")
        if round_.before is not None:
            lines.append(f"    before: {headline(round_.before)}")
        lines.append(f"    now:    {headline(result.as_dict())}")
        lines += [
            f"      {m['id']}: {m['label']} -> {m['verdict']}  ({m['source']})"
            for m in result.misses
        ]
    return "\n".join(lines)


def _percent(share: float | None) -> str:
    return "n/a" if share is None else f"{share * 100:.1f} %"


def main(argv: Sequence[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m recovery.detection.evaluation",
        description="Score the detectors on labelled real logs (JSON lines).",
    )
    parser.add_argument("corpus", nargs="+", type=Path, help="JSON-lines files of cases")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument(
        "--rounds",
        type=Path,
        help="a directory of prospective rounds (round-N.jsonl, round-N.before.json) to score "
        "each on its own",
    )
    arguments = parser.parse_args(argv)
    try:
        cases = load_cases(arguments.corpus)
        rounds = load_rounds(arguments.rounds) if arguments.rounds is not None else []
    except (OSError, CorpusError) as exc:
        parser.exit(2, f"cannot read the corpus: {exc}\n")
    result = evaluate(cases)
    sys.stdout.write(report(result) + "\n")
    round_results = [evaluate(round_.cases) for round_ in rounds]
    if rounds:
        sys.stdout.write(report_rounds(rounds, round_results) + "\n")
    if arguments.json is not None:
        arguments.json.parent.mkdir(parents=True, exist_ok=True)
        figures = {"corpus": [str(path) for path in arguments.corpus], **result.as_dict()}
        if rounds:
            figures["rounds"] = {
                round_.name: {"before": round_.before, "now": round_result.as_dict()}
                for round_, round_result in zip(rounds, round_results, strict=True)
            }
        arguments.json.write_text(json.dumps(figures, indent=2) + "\n", encoding="utf-8")
        sys.stdout.write(f"\nwritten to {arguments.json}\n")
    return 0


if __name__ == "__main__":
    try:
        raise SystemExit(main())
    except BrokenPipeError:  # the reader went away (`| head`): stop quietly
        sys.stderr.close()
        raise SystemExit(1) from None
