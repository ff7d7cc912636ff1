"""Identifiers are checked before any scheduler command runs. Pure Python: no Django."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from recovery.schedulers.validation import (
    MAX_JOB_ID_LENGTH,
    MAX_NODE_NAME_LENGTH,
    MAX_PARTITION_LENGTH,
    InvalidIdentifier,
    validate_job_id,
    validate_node_name,
    validate_node_names,
    validate_partition,
)

PROJECT_ROOT = Path(__file__).resolve().parents[3]
SHELL_METACHARACTERS = [";", "&", "|", "$", "`", "(", ")", "<", ">", "*", "?", "'", '"', "\\"]


def test_it_loads_the_scheduler_modules_without_django() -> None:
    code = (
        "import sys\n"
        "import recovery.schedulers.nodelist, recovery.schedulers.optin\n"
        "import recovery.schedulers.validation\n"
        "assert not [m for m in sys.modules if m == 'django' or m.startswith('django.')], "
        "'django imported'\n"
    )
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(PROJECT_ROOT)}
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


# --- job ids ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("1", "1"),
        ("123", "123"),
        ("4294967294", "4294967294"),
        ("123_4", "123_4"),
        ("123_0", "123_0"),  # --array=0-15 starts at task 0
        ("123+1", "123+1"),
        ("123+0", "123+0"),  # the first het job component
        (123, "123"),
        (1, "1"),
    ],
)
def test_it_accepts_slurm_job_ids(value: str | int, expected: str) -> None:
    assert validate_job_id(value) == expected


@pytest.mark.parametrize(
    "value",
    [
        "",
        "0",
        0,
        -1,
        "-1",
        "-h",
        "--help",
        " 123",
        "123 ",
        "12 3",
        "123\n",
        "+123",
        "0123",
        "123_",
        "123+",
        "_4",
        "+1",
        "123_04",
        "123_4_5",
        "123_4+1",
        "123+1_4",
        "123+1+2",
        "123_[1-3]",
        "123_1-3",
        "123.0",
        "1e3",
        "0x1f",
        "\u0661\u0662\u0663",  # Arabic-Indic digits: str.isdigit() says yes, Slurm no
        "\uff11\uff12\uff13",  # fullwidth digits
        "123;reboot",
        "123 && rm -rf /",
        "$(id)",
        "`id`",
        "1" * (MAX_JOB_ID_LENGTH + 1),
        True,
        False,
        None,
        12.0,
        b"123",
        ["123"],
    ],
)
def test_it_refuses_anything_else_as_a_job_id(value: object) -> None:
    with pytest.raises(InvalidIdentifier):
        validate_job_id(value)  # type: ignore[arg-type]


@pytest.mark.parametrize("metacharacter", SHELL_METACHARACTERS)
def test_it_refuses_shell_metacharacters_in_job_ids(metacharacter: str) -> None:
    with pytest.raises(InvalidIdentifier):
        validate_job_id(f"123{metacharacter}")


def test_it_accepts_a_job_id_of_the_maximum_length() -> None:
    value = "9" * MAX_JOB_ID_LENGTH

    assert validate_job_id(value) == value


def test_it_names_the_refused_job_id_in_the_message() -> None:
    with pytest.raises(InvalidIdentifier, match=r"invalid Slurm job id '12;3'"):
        validate_job_id("12;3")


def test_it_explains_what_a_job_id_looks_like() -> None:
    with pytest.raises(InvalidIdentifier, match=r"array task like 123_4"):
        validate_job_id("abc")


def test_it_says_why_zero_is_refused() -> None:
    with pytest.raises(InvalidIdentifier, match="zero"):
        validate_job_id(0)


def test_it_truncates_a_long_refused_value_in_the_message() -> None:
    with pytest.raises(InvalidIdentifier) as caught:
        validate_job_id("x" * 10_000)

    message = str(caught.value)
    assert len(message) < 150
    assert "..." in message


def test_invalid_identifier_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="job id"):
        validate_job_id("nope")


# --- node names ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value",
    [
        "node001",
        "node002",
        "gpu-a100-17",
        "gpu_17",
        "node1.cluster.example",
        "n",
        "7",
        "7node",
        "Node-X",
        "a" * MAX_NODE_NAME_LENGTH,
    ],
)
def test_it_accepts_node_names(value: str) -> None:
    assert validate_node_name(value) == value


@pytest.mark.parametrize(
    ("value", "why"),
    [
        ("", "empty"),
        ("-node1", "start with a letter or a digit"),
        ("--help", "start with a letter or a digit"),
        ("_node", "start with a letter or a digit"),
        (".node", "start with a letter or a digit"),
        ("node 1", r"contains ' '"),
        (" node1", "start with a letter or a digit"),
        ("node1\n", r"contains '\\n'"),
        ("node[1-2]", "not a list"),
        ("node1,node2", "not a list"),
        ("node]", "not a list"),
        ("node/1", r"contains '/'"),
        ("nöde1", r"contains 'ö'"),
        ("n\u043ede1", "contains '\u043e'"),  # a Cyrillic o
        ("a" * (MAX_NODE_NAME_LENGTH + 1), "longer than 64"),
        (None, "not a string"),
        (7, "not a string"),
    ],
)
def test_it_refuses_bad_node_names_and_says_why(value: object, why: str) -> None:
    with pytest.raises(InvalidIdentifier, match=why):
        validate_node_name(value)  # type: ignore[arg-type]


@pytest.mark.parametrize("metacharacter", SHELL_METACHARACTERS)
def test_it_refuses_shell_metacharacters_in_node_names(metacharacter: str) -> None:
    with pytest.raises(InvalidIdentifier, match="invalid node name"):
        validate_node_name(f"node1{metacharacter}x")


def test_it_validates_a_list_of_node_names_in_order() -> None:
    names = ("node002", "node001", "node002")

    assert validate_node_names(names) == ["node002", "node001", "node002"]
    assert validate_node_names(iter(["node004"])) == ["node004"]
    assert validate_node_names([]) == []


def test_it_refuses_a_list_with_one_bad_name() -> None:
    with pytest.raises(InvalidIdentifier, match="'-rf'"):
        validate_node_names(["node001", "-rf", "node002"])


def test_it_refuses_a_single_string_where_a_list_of_names_is_expected() -> None:
    # Iterated, "node001" would become seven one-character names that all look valid.
    with pytest.raises(InvalidIdentifier, match="list of node names"):
        validate_node_names("node001")


# --- partitions ------------------------------------------------------------------------------


@pytest.mark.parametrize("value", ["debug", "gpu", "gpu_long", "a100-80g", "p.1", "7"])
def test_it_accepts_partitions(value: str) -> None:
    assert validate_partition(value) == value


@pytest.mark.parametrize(
    "value",
    [
        "",
        "-p",
        "debug,gpu",
        "debug gpu",
        "debug;reboot",
        "$(id)",
        "gpu[1]",
        "p" * (MAX_PARTITION_LENGTH + 1),
        None,
    ],
)
def test_it_refuses_bad_partitions(value: object) -> None:
    with pytest.raises(InvalidIdentifier, match="invalid partition"):
        validate_partition(value)  # type: ignore[arg-type]
