"""The loop, its monitors and the findings read a job's phase, never a scheduler's own states.

A second scheduler maps its states to ``Phase`` in its adapter and nothing here changes: so no
module here may name one of Slurm's job states in a string (a comment may).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from recovery.schedulers.slurm_json import JOB_BASE_STATES, JOB_STATE_FLAGS
from recovery.schedulers.slurm_phase import SLURM_PHASES

ROOT = Path(__file__).resolve().parents[2]
NEUTRAL = ("recovery/loop", "recovery/detection/facts", "recovery/read", "recovery/audit")
SLURM_JOB_STATES = frozenset(SLURM_PHASES) | JOB_BASE_STATES | JOB_STATE_FLAGS


def strings_in(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    return [
        (node.lineno, node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str)
    ]


def neutral_modules() -> list[Path]:
    return sorted(path for folder in NEUTRAL for path in (ROOT / folder).rglob("*.py"))


def test_the_neutral_packages_are_where_they_are_said_to_be() -> None:
    assert len(neutral_modules()) > 40


@pytest.mark.parametrize("folder", NEUTRAL)
def test_no_neutral_module_names_a_slurm_job_state(folder: str) -> None:
    named = [
        f"{path.relative_to(ROOT)}:{line}: {text!r}"
        for path in sorted((ROOT / folder).rglob("*.py"))
        for line, text in strings_in(path)
        if text.strip() in SLURM_JOB_STATES
    ]
    assert named == []


def test_the_check_sees_a_state_where_one_is_named(tmp_path: Path) -> None:
    module = tmp_path / "module.py"
    module.write_text('# COMPLETING in a comment is fine\nENDED = {"NODE_FAIL"}\n')
    found = [text for _, text in strings_in(module) if text in SLURM_JOB_STATES]
    assert found == ["NODE_FAIL"]
