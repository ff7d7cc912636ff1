"""Slurm hostlist expressions, both ways. Pure Python: no Django."""

from __future__ import annotations

import random

import pytest

from recovery.schedulers.nodelist import (
    MAX_EXPANDED_NAMES,
    MAX_RANGE_SIZE,
    NodeListError,
    compress_nodelist,
    expand_nodelist,
    sort_node_names,
)
from recovery.schedulers.validation import validate_node_name

# hypothesis is not installed in this project: the property tests draw many seeded cases.
RANDOM_CASES = 2_000


# --- expanding -------------------------------------------------------------------------------


def test_it_expands_a_padded_range_and_a_single_value() -> None:
    assert expand_nodelist("node[001-004,007]") == [
        "node001",
        "node002",
        "node003",
        "node004",
        "node007",
    ]


def test_it_expands_the_lab_partition_where_padding_sits_in_the_prefix() -> None:
    # slurm-lab.md: PartitionName=debug Nodes=node00[1-4]
    assert expand_nodelist("node00[1-4]") == ["node001", "node002", "node003", "node004"]


def test_it_expands_the_lab_restart_node_list() -> None:
    # slurm-lab.md: the -N3 job restarted on node[001,003-004] after excluding node002.
    assert expand_nodelist("node[001,003-004]") == ["node001", "node003", "node004"]


def test_it_reads_a_single_node_name() -> None:
    assert expand_nodelist("node002") == ["node002"]


def test_it_expands_several_top_level_groups_in_order() -> None:
    assert expand_nodelist("gpu[01-02],cpu7,login[1-2]") == [
        "gpu01",
        "gpu02",
        "cpu7",
        "login1",
        "login2",
    ]


def test_it_multiplies_out_two_bracket_groups_in_slurm_order() -> None:
    assert expand_nodelist("rack[1-2]-node[01-02]") == [
        "rack1-node01",
        "rack1-node02",
        "rack2-node01",
        "rack2-node02",
    ]


def test_it_nests_three_bracket_groups_the_way_slurm_does() -> None:
    # hostlist.c takes the last group innermost and the others from right to left around it.
    assert expand_nodelist("a[1-2]b[3-4]c[5-6]") == [
        "a1b3c5",
        "a1b3c6",
        "a2b3c5",
        "a2b3c6",
        "a1b4c5",
        "a1b4c6",
        "a2b4c5",
        "a2b4c6",
    ]


def test_it_expands_ranges_without_padding_across_a_digit_boundary() -> None:
    assert expand_nodelist("n[1-10]") == [f"n{number}" for number in range(1, 11)]


def test_it_takes_the_width_from_the_low_end_of_each_range() -> None:
    assert expand_nodelist("n[08-10]") == ["n08", "n09", "n10"]
    assert expand_nodelist("n[8-010]") == ["n8", "n9", "n10"]
    assert expand_nodelist("n[001-2]") == ["n001", "n002"]
    assert expand_nodelist("n[98-100]") == ["n98", "n99", "n100"]


def test_it_keeps_padding_per_range() -> None:
    assert expand_nodelist("n[5,01-02]") == ["n5", "n01", "n02"]


def test_it_expands_a_single_value_in_brackets() -> None:
    assert expand_nodelist("n[5]") == ["n5"]
    assert expand_nodelist("n[005]") == ["n005"]


def test_it_expands_a_range_of_one() -> None:
    assert expand_nodelist("n[5-5]") == ["n5"]


def test_it_expands_brackets_without_a_prefix() -> None:
    assert expand_nodelist("[1-3]") == ["1", "2", "3"]


def test_it_keeps_text_between_bracket_groups() -> None:
    assert expand_nodelist("r[1-2]_gpu.n[7]") == ["r1_gpu.n7", "r2_gpu.n7"]


def test_it_keeps_order_and_duplicates_as_written() -> None:
    assert expand_nodelist("n[3,1],n1") == ["n3", "n1", "n1"]


@pytest.mark.parametrize("text", ["", "   ", "(null)", "None assigned", "  (null)\n"])
def test_it_reads_slurm_s_empty_node_lists_as_no_nodes(text: str) -> None:
    assert expand_nodelist(text) == []


def test_it_tolerates_whitespace_around_the_list_and_its_groups() -> None:
    assert expand_nodelist("  node[1-2] ,\tnode5\n") == ["node1", "node2", "node5"]


def test_it_splits_on_spaces_and_skips_empty_groups_like_slurm() -> None:
    assert expand_nodelist("node1 node2,,node3,") == ["node1", "node2", "node3"]


def test_it_expands_a_range_of_exactly_the_slurm_limit() -> None:
    names = expand_nodelist(f"n[1-{MAX_RANGE_SIZE}]")

    assert len(names) == MAX_RANGE_SIZE
    assert names[-1] == f"n{MAX_RANGE_SIZE}"


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("node[1-2", r"'\[' without a matching '\]'"),
        ("node1-2]", r"'\]' without a matching '\['"),
        ("node[1-[2]]", r"'\[' inside brackets"),
        ("node]1[", r"'\]' without a matching '\['"),
        ("n[5-1]", "runs backwards"),
        ("n[010-009]", "runs backwards"),
        ("n[a-c]", "not a number"),
        ("n[1-b]", "not a number"),
        ("n[1-]", "not a number"),
        ("n[-3]", "not a number"),
        ("n[1--3]", "not a number"),
        ("n[1-2-3]", "not a number"),
        ("n[+1]", "not a number"),
        ("n[1, 2]", "not a number"),
        ("n[1,,2]", "not a number"),
        ("n[1,]", "not a number"),
        ("n[0x10]", "not a number"),
        ("n[\u0661-\u0663]", "not a number"),  # Arabic-Indic digits are not ASCII digits
        ("n[]", "empty brackets"),
        ("node[1-2]-ib", "follows the last bracket group"),
        ("node[1-2].cluster", "follows the last bracket group"),
        (f"n[0-{MAX_RANGE_SIZE}]", "more than 65536 nodes"),
        ("n[1-99999999999999999999999]", "more than 65536 nodes"),
        (f"n[{'9' * 100}]", "too long"),
        ("node1;reboot", "';' is not allowed"),
        ("node$(id)", "'\\$' is not allowed"),
        ("node`id`", "'`' is not allowed"),
        ("node1|x", r"'\|' is not allowed"),
        ("node1&", "'&' is not allowed"),
        ("node/1", "'/' is not allowed"),
        ("'node1'", "is not allowed"),
        ("nöde1", "is not allowed"),
        ("-node1", "start with a letter or a digit"),
        ("node1,--help", "start with a letter or a digit"),
        ("-n[1-2]", "start with a letter or a digit"),
        ("_n[1-2]", "start with a letter or a digit"),
        ("n" * 64 + "[1-2]", "longer than 64"),
    ],
)
def test_it_refuses_bad_node_lists_and_says_why(text: str, why: str) -> None:
    with pytest.raises(NodeListError, match=why):
        expand_nodelist(text)


def test_it_refuses_a_short_expression_that_multiplies_out_to_too_many_names() -> None:
    with pytest.raises(NodeListError, match=f"more than {MAX_EXPANDED_NAMES} nodes"):
        expand_nodelist("n[0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9]")


def test_it_refuses_too_many_names_over_several_groups() -> None:
    with pytest.raises(NodeListError, match="more than"):
        expand_nodelist(f"a[1-{MAX_RANGE_SIZE}],b[1-2]")


def test_it_names_the_bad_list_in_the_message() -> None:
    with pytest.raises(NodeListError, match=r"invalid node list 'n\[5-1\]'"):
        expand_nodelist("n[5-1]")


def test_it_refuses_something_that_is_not_text() -> None:
    with pytest.raises(NodeListError, match="must be a string"):
        expand_nodelist(None)  # type: ignore[arg-type]


def test_node_list_error_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="invalid node list"):
        expand_nodelist("n[")


# --- compressing -----------------------------------------------------------------------------


def test_it_compresses_padded_names_into_ranges() -> None:
    names = ["node001", "node002", "node003", "node004", "node007"]

    assert compress_nodelist(names) == "node[001-004,007]"


def test_it_compresses_the_lab_restart_node_list() -> None:
    assert compress_nodelist(["node004", "node001", "node003"]) == "node[001,003-004]"


def test_it_leaves_a_single_name_as_it_is() -> None:
    assert compress_nodelist(["node007"]) == "node007"
    assert compress_nodelist(["login"]) == "login"


def test_it_compresses_nothing_to_an_empty_string() -> None:
    assert compress_nodelist([]) == ""


def test_it_sorts_numerically_not_alphabetically() -> None:
    names = ["n10", "n9", "n1", "n2", "n100"]

    assert compress_nodelist(names) == "n[1-2,9-10,100]"


def test_it_joins_unpadded_numbers_across_a_digit_boundary() -> None:
    assert compress_nodelist(["n8", "n9", "n10", "n11"]) == "n[8-11]"


def test_it_keeps_padded_and_unpadded_numbers_apart() -> None:
    # "010" cannot be written inside a range that starts at "9": it would come back as "10".
    assert compress_nodelist(["n9", "n010", "n011"]) == "n[9,010-011]"
    assert compress_nodelist(["n1", "n01"]) == "n[1,01]"


def test_it_joins_padded_numbers_running_into_a_wider_one() -> None:
    assert compress_nodelist(["n098", "n099", "n100", "n101"]) == "n[098-101]"


def test_it_removes_duplicates() -> None:
    assert compress_nodelist(["node2", "node1", "node2", "node1"]) == "node[1-2]"


def test_it_joins_mixed_prefixes_with_commas_in_a_stable_order() -> None:
    names = ["login2", "gpu02", "cpu7", "gpu01", "login1"]
    expected = "cpu7,gpu[01-02],login[1-2]"

    assert compress_nodelist(names) == expected
    assert compress_nodelist(reversed(names)) == expected
    assert compress_nodelist(sorted(names)) == expected


def test_it_orders_prefixes_naturally() -> None:
    names = ["rack10-n1", "rack2-n1", "rack2-n2", "rack1-n3"]

    assert compress_nodelist(names) == "rack1-n3,rack2-n[1-2],rack10-n1"


def test_it_only_groups_by_the_trailing_number() -> None:
    names = ["rack1-node01", "rack1-node02", "rack2-node01", "rack2-node02"]

    assert compress_nodelist(names) == "rack1-node[01-02],rack2-node[01-02]"


def test_it_keeps_names_without_a_numeric_suffix_whole() -> None:
    names = ["login", "head-a", "node1", "node2", "node"]

    assert compress_nodelist(names) == "head-a,login,node,node[1-2]"


def test_it_compresses_all_digit_names() -> None:
    assert compress_nodelist(["123", "124", "007"]) == "[007,123-124]"


def test_it_accepts_any_iterable_of_names() -> None:
    assert compress_nodelist(name for name in ("n2", "n1")) == "n[1-2]"
    assert compress_nodelist({"n2", "n1"}) == "n[1-2]"


@pytest.mark.parametrize(
    "bad", ["", "-n1", "n 1", "n[1-2]", "n1,n2", "n;1", "n" * 65, "nöde", None]
)
def test_it_refuses_to_compress_bad_names(bad: object) -> None:
    with pytest.raises(NodeListError, match="invalid node name"):
        compress_nodelist(["node1", bad])  # type: ignore[list-item]


def test_it_refuses_a_single_string_where_names_are_expected() -> None:
    with pytest.raises(NodeListError, match="single value"):
        compress_nodelist("node001")


def test_it_sorts_node_names_in_the_order_compress_writes_them() -> None:
    names = ["n10", "login", "n9", "n09", "n9", "a1"]

    assert sort_node_names(names) == ["a1", "login", "n9", "n09", "n10"]
    assert expand_nodelist(compress_nodelist(names)) == sort_node_names(names)


# --- properties over many random cases -------------------------------------------------------

PREFIXES = ["node", "n", "gpu-", "rack1-node", "rack10-node", "rack2-node", "", "a.b_", "x9y"]
BARE_NAMES = ["login", "head-a", "node", "gpu-", "ctl.example"]


def random_node_name(rng: random.Random) -> str:
    if rng.random() < 0.08:
        return rng.choice(BARE_NAMES)
    prefix = rng.choice(PREFIXES)
    number = rng.choice([rng.randint(0, 20), rng.randint(0, 2_000), rng.randint(95, 105)])
    width = rng.choice([0, 0, 2, 3, 4])  # 0: written without padding
    digits = str(number).zfill(width)
    return prefix + digits


def test_it_round_trips_random_sets_of_names() -> None:
    rng = random.Random(20250301)
    for _ in range(RANDOM_CASES):
        names = [random_node_name(rng) for _ in range(rng.randint(0, 40))]

        compressed = compress_nodelist(names)
        expanded = expand_nodelist(compressed)

        assert expanded == sort_node_names(names), compressed
        assert sorted(expanded) == sorted(set(names)), compressed
        # Already compressed: compressing again changes nothing.
        assert compress_nodelist(expanded) == compressed


def test_it_round_trips_long_consecutive_runs() -> None:
    rng = random.Random(7)
    for _ in range(200):
        prefix = rng.choice(PREFIXES)
        width = rng.choice([1, 3, 4])
        start = rng.randint(0, 5_000)
        stop = start + rng.randint(0, 300)
        names = [prefix + str(number).zfill(width) for number in range(start, stop + 1)]
        rng.shuffle(names)

        compressed = compress_nodelist(names)

        assert expand_nodelist(compressed) == sort_node_names(names)
        assert compressed.count(",") == 0


def naive_expansion(prefix: str, items: list[tuple[int, int, int]]) -> list[str]:
    return [
        prefix + str(number).zfill(width)
        for low, high, width in items
        for number in range(low, high + 1)
    ]


def test_it_expands_random_bracket_expressions_like_a_plain_loop() -> None:
    rng = random.Random(99)
    for _ in range(RANDOM_CASES):
        prefix = rng.choice(PREFIXES) or "n"
        items: list[tuple[int, int, int]] = []
        written: list[str] = []
        for _ in range(rng.randint(1, 5)):
            low = rng.randint(0, 500)
            high = low + rng.choice([0, 0, rng.randint(1, 30)])
            width = rng.choice([len(str(low)), len(str(low)) + 1, 3])
            width = max(width, len(str(low)))
            items.append((low, high, width))
            low_text = str(low).zfill(width)
            written.append(low_text if high == low else f"{low_text}-{high}")
        text = f"{prefix}[{','.join(written)}]"

        assert expand_nodelist(text) == naive_expansion(prefix, items), text


def test_it_never_fails_on_garbage_with_anything_but_node_list_error() -> None:
    rng = random.Random(4242)
    alphabet = "[]-,0123456789ab. _;$\t'\"\\/é"
    for _ in range(RANDOM_CASES * 2):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 24)))
        try:
            names = expand_nodelist(text)
        except NodeListError:
            continue
        for name in names:
            assert validate_node_name(name) == name, text
