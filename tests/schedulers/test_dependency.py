"""Reading a pending job's Slurm dependency: the jobs it is chained after."""

from __future__ import annotations

import pytest

from recovery.schedulers.dependency import chained_after


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", ()),
        ("(null)", ()),
        ("afterany:123(unfulfilled)", ("123",)),
        ("afternotok:123(unfulfilled)", ("123",)),
        ("afterany:123", ("123",)),
        ("afterany:123:124(unfulfilled)", ("123", "124")),
        ("afterany:123(unfulfilled),afternotok:124(unfulfilled)", ("123", "124")),
        ("afterany:123(unfulfilled)?afternotok:123(unfulfilled)", ("123",)),
        ("after:123+5(unfulfilled)", ()),
        ("afterok:123(unfulfilled)", ()),
        ("afterok:122(unfulfilled),afterany:123(unfulfilled)", ("123",)),
        ("singleton(unfulfilled)", ()),
        ("afterany:123_4(unfulfilled)", ("123_4",)),
        ("afterany:123_*(unfulfilled)", ()),
        ("afterany:123(failed)", ("123",)),
    ],
)
def test_it_reads_the_jobs_a_job_is_chained_after(text: str, expected: tuple[str, ...]) -> None:
    assert chained_after(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        "afterall:123(unfulfilled)",  # no such type
        "afterany(unfulfilled)",  # no job
        "afterany:-1(unfulfilled)",
        "afterany:12a(unfulfilled)",
        "afterany:0",
        "singleton:123",
        "afterany:123;rm -rf /",
        "afterany:" + "1" * 5000,
        None,
        123,
        ["afterany:123"],
    ],
)
def test_a_dependency_it_cannot_read_is_unknown_never_none(text: object) -> None:
    assert chained_after(text) is None
