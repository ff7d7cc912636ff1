"""Rank and node lists written short for pages (``recovery.read.hostlist``): pure functions."""

from __future__ import annotations

import random

import pytest

from recovery.read.hostlist import compress_hostnames, compress_ranks, sorted_hostnames
from recovery.schedulers.nodelist import expand_nodelist

# --- ranks ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("ranks", "expected"),
    [
        ([], ""),
        ([5], "5"),
        (list(range(64)), "0-63"),
        ([0, 1, 2, 3, 8, 10, 11, 12], "0-3,8,10-12"),
        ([1, 3, 5], "1,3,5"),
        ([0, 1], "0-1"),
        ([12, 0, 3, 1, 2, 10, 8, 11], "0-3,8,10-12"),  # unsorted
        ([4, 4, 5, 5, 4], "4-5"),  # duplicates
        ([r for r in range(64) if r != 50], "0-49,51-63"),  # one rank missing
    ],
)
def test_ranks_are_written_as_ranges(ranks: list[int], expected: str) -> None:
    assert compress_ranks(ranks) == expected


def test_what_is_not_an_integer_is_left_out_of_the_ranks() -> None:
    # A JSON list may hold anything: booleans are not ranks, nor are strings or None.
    assert compress_ranks([0, True, "1", None, 2.0, 3]) == "0,3"


def test_a_generator_of_ranks_is_read_once() -> None:
    assert compress_ranks(r for r in (2, 1, 0)) == "0-2"


# --- node names ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("names", "expected"),
    [
        ([], ""),
        (["gpu-a100-007"], "gpu-a100-007"),
        (
            ["gpu-a100-001", "gpu-a100-002", "gpu-a100-003", "gpu-a100-004", "gpu-a100-007"],
            "gpu-a100-[001-004,007]",
        ),
        # Zero padding kept as written.
        (["node001", "node002"], "node[001-002]"),
        (["node099", "node100", "node101"], "node[099-101]"),
        # Unpadded numbers run across a change of width, as Slurm writes them.
        (["n8", "n9", "n10", "n11"], "n[8-11]"),
        # A padded and an unpadded name of the same number are different nodes.
        (["n08", "n8"], "n[08,8]"),
        # Several prefixes: one group each, in natural order.
        (
            ["gpu-h100-002", "gpu-a100-001", "gpu-h100-001", "gpu-a100-002"],
            "gpu-a100-[001-002],gpu-h100-[001-002]",
        ),
        (["gpu10-1", "gpu2-1", "gpu2-2"], "gpu2-[1-2],gpu10-1"),
        # Names without a number at their end stay whole.
        (["login", "node1-ib", "node2-ib"], "login,node1-ib,node2-ib"),
        (["node02", "login", "node01"], "login,node[01-02]"),
        # Duplicates go; order does not matter.
        (["a3", "a1", "a2", "a1", "a3"], "a[1-3]"),
        # Blank entries are not names.
        (["", "  ", "a1"], "a1"),
    ],
)
def test_node_names_are_written_in_hostlist_form(names: list[str], expected: str) -> None:
    assert compress_hostnames(names) == expected


def test_a_single_string_is_one_name_not_its_characters() -> None:
    assert compress_hostnames("gpu-a100-001") == "gpu-a100-001"


def test_the_compressed_form_expands_back_to_the_same_names() -> None:
    """Whatever the order and padding, Slurm's own reading of the text gives the names back."""
    rng = random.Random(4)
    pool = [
        *(f"gpu-a100-{n:03d}" for n in range(1, 40)),
        *(f"gpu-h100-{n:03d}" for n in range(1, 12)),
        *(f"n{n}" for n in range(5, 25)),
        *(f"rack{r}-node{n:02d}" for r in (1, 2) for n in range(1, 6)),
    ]
    for _ in range(50):
        names = rng.sample(pool, rng.randint(1, len(pool)))
        text = compress_hostnames(names)
        assert sorted(expand_nodelist(text)) == sorted(set(names)), text
        assert len(text) <= len(",".join(names))


def test_sorted_names_follow_the_compressed_order() -> None:
    assert sorted_hostnames(["n10", "n9", "login", "n9"]) == ["login", "n9", "n10"]
