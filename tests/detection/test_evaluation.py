"""``make eval-detect``: the scores it prints and writes, and the corpora it refuses."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from recovery.detection.classify import Classification
from recovery.detection.evaluation import (
    CASCADE_NOISE_LINES,
    Case,
    CorpusError,
    cascade_of,
    evaluate,
    load_cases,
    main,
)

DATA = Path(__file__).parent / "data"
TIMEOUT_LINE = "[E ProcessGroupNCCL.cpp:458] [Rank 3] Watchdog caught collective operation timeout"


def case(id: str, category: str, attribution: str, log: str) -> Case:
    return Case(id, category, attribution, f"https://example.org/{id}", log)


def by_keyword(text: str) -> Classification:
    """A stand-in classifier: the first keyword of the text decides, timeouts last."""
    for word, attribution in (("xid", "hardware"), ("oom", "application"), ("nan", "unknown")):
        if word in text:
            category = {"xid": "gpu_hardware", "oom": "gpu_oom", "nan": "nan_divergence"}[word]
            return Classification(category, attribution, "crash", word)
    if "Watchdog" in text:
        return Classification("nccl_timeout", "unknown", "crash", "Watchdog")
    return Classification("healthy", "none", None, "")


CASES = [
    case("a", "gpu_hardware", "hardware", "xid 79"),
    case("b", "gpu_oom", "application", "oom"),
    case("c", "nan_divergence", "application", "loss nan"),  # attribution wrong
    case("d", "storage_io", "system_software", "Stale file handle"),  # missed: healthy
    case("e", "healthy", "none", "step 10 loss 2.1"),
    case("f", "healthy", "none", "an oom that was not"),  # a false alarm
    case("g", "nccl_timeout", "unknown", f"{TIMEOUT_LINE}\nstep 9"),
]


def test_it_scores_category_attribution_false_alarms_and_cascades() -> None:
    result = evaluate(CASES, by_keyword)
    figures = result.as_dict()
    assert figures["overall"] == {"cases": 7, "category": round(5 / 7, 4), "attribution": 0.5714}
    assert figures["false_alarms"] == {"healthy_cases": 2, "alarms": ["f"]}
    assert figures["by_category"]["nan_divergence"] == {
        "cases": 1,
        "category": 1.0,
        "attribution": 0.0,
    }
    assert {"label": "storage_io", "verdict": "healthy", "count": 1} in figures["confusion"]
    # Four failures other than the timeout are buried in it; three keep their cause.
    assert figures["cascades"] == {
        "cases": 4,
        "root_cause_kept": 0.75,
        "lost": {"d": "nccl_timeout"},
    }
    assert [miss["id"] for miss in figures["misses"]] == ["c", "d", "f"]


def test_a_cascade_wraps_the_root_cause_in_another_jobs_timeouts() -> None:
    text = cascade_of(CASES[0], [TIMEOUT_LINE])
    lines = text.splitlines()
    assert len(lines) == CASCADE_NOISE_LINES + 1
    assert lines[CASCADE_NOISE_LINES // 2] == "xid 79"


@pytest.mark.parametrize(
    ("line", "problem"),
    [
        ("{not json", "not JSON"),
        ("[1, 2]", "not a JSON object"),
        ('{"id": "x", "category": "healthy"}', "no text for attribution, source, log"),
    ],
)
def test_a_corpus_line_that_is_not_a_case_is_refused_with_where(
    tmp_path: Path, line: str, problem: str
) -> None:
    corpus = tmp_path / "cases.jsonl"
    corpus.write_text(line + "\n", encoding="utf-8")
    with pytest.raises(CorpusError, match=rf"cases.jsonl:1: {problem}"):
        load_cases([corpus])


def test_an_id_used_twice_across_files_is_refused(tmp_path: Path) -> None:
    row = {"id": "x", "category": "healthy", "attribution": "none", "source": "s", "log": "ok"}
    for name in ("one.jsonl", "two.jsonl"):
        (tmp_path / name).write_text(json.dumps(row) + "\n", encoding="utf-8")
    with pytest.raises(CorpusError, match="id 'x' is also at"):
        load_cases([tmp_path / "one.jsonl", tmp_path / "two.jsonl"])


def test_the_whole_corpus_is_scored_printed_and_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "eval" / "detection.json"
    corpus = sorted(DATA.glob("*.jsonl"))
    assert main([*map(str, corpus), "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert printed.startswith(f"cases {len(load_cases(corpus))}: category ")
    written = json.loads(out.read_text(encoding="utf-8"))
    assert written["overall"]["cases"] == len(load_cases(corpus))
    alarms = written["false_alarms"]
    assert f"false alarms: {len(alarms['alarms'])} of {alarms['healthy_cases']} " in printed
    assert set(written) >= {"overall", "by_category", "confusion", "cascades", "misses"}
    assert "confusion" in printed


def test_an_unreadable_corpus_is_an_error_not_a_score(tmp_path: Path) -> None:
    with pytest.raises(SystemExit) as exit_:
        main([str(tmp_path / "missing.jsonl")])
    assert exit_.value.code == 2


def test_each_prospective_round_is_scored_on_its_own_beside_its_score_before(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rounds = DATA / "rounds"
    out = tmp_path / "detection.json"
    assert (
        main([str(DATA / "real_failures_dev.jsonl"), "--rounds", str(rounds), "--json", str(out)])
        == 0
    )
    printed = capsys.readouterr().out
    written = json.loads(out.read_text(encoding="utf-8"))
    assert "round-1" in written["rounds"]
    round_1 = written["rounds"]["round-1"]
    assert round_1["now"]["overall"]["cases"] == len(load_cases([rounds / "round-1.jsonl"]))
    assert round_1["before"]["overall"]["cases"] == round_1["now"]["overall"]["cases"]
    assert "prospective rounds" in printed
    assert "    before: category " in printed and "    now:    category " in printed


def test_a_round_whose_score_before_is_not_figures_is_refused(tmp_path: Path) -> None:
    (tmp_path / "round-2.jsonl").write_text(
        json.dumps(case("x1", "healthy", "none", "step 1 loss 2.0").__dict__) + "\n",
        encoding="utf-8",
    )
    (tmp_path / "round-2.before.json").write_text('{"score": 1}', encoding="utf-8")
    with pytest.raises(SystemExit) as exit_:
        main([str(DATA / "real_failures_dev.jsonl"), "--rounds", str(tmp_path)])
    assert exit_.value.code == 2
