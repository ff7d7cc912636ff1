"""A job's comment says whether and how it opted in. Pure Python: no Django."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest

from recovery.schedulers.optin import (
    MAX_COMMENT_LENGTH,
    OptIn,
    OptInMode,
    parse_job_comment,
)

# The example from DESIGN.md and slurm-lab.md, exactly as squeue "%k" prints it.
LAB_COMMENT = '{"nvidia-recovery":{"environment":"prod","mode":"observe"}}'

# hypothesis is not installed in this project: the property tests draw many seeded cases.
RANDOM_CASES = 3_000


def comment(value: Any) -> str:
    return json.dumps(value)


def reason_for(text: str | None) -> str:
    result = parse_job_comment(text)
    assert not result.opted_in
    return result.reason


# --- opting in -------------------------------------------------------------------------------


def test_it_reads_the_lab_example() -> None:
    result = parse_job_comment(LAB_COMMENT)

    assert result == OptIn(
        opted_in=True,
        environment="prod",
        mode=OptInMode.OBSERVE,
        settings={"environment": "prod", "mode": "observe"},
    )
    assert result.reason == ""


def test_it_reads_act_mode() -> None:
    result = parse_job_comment(comment({"nvidia-recovery": {"environment": "prod", "mode": "act"}}))

    assert result.opted_in
    assert result.mode == OptInMode.ACT


def test_it_observes_when_the_mode_is_missing() -> None:
    result = parse_job_comment(comment({"nvidia-recovery": {"environment": "staging"}}))

    assert result.opted_in
    assert result.mode == OptInMode.OBSERVE
    assert result.environment == "staging"


def test_it_accepts_the_short_recovery_key() -> None:
    result = parse_job_comment(comment({"recovery": {"environment": "dev", "mode": "act"}}))

    assert result.opted_in
    assert (result.environment, result.mode) == ("dev", OptInMode.ACT)


def test_it_prefers_the_nvidia_recovery_key_when_both_are_there() -> None:
    both = {
        "recovery": {"environment": "dev", "mode": "act"},
        "nvidia-recovery": {"environment": "prod", "mode": "observe"},
    }

    result = parse_job_comment(comment(both))

    assert (result.environment, result.mode) == ("prod", OptInMode.OBSERVE)


def test_it_does_not_fall_back_to_recovery_when_nvidia_recovery_is_bad() -> None:
    both = {"nvidia-recovery": "yes", "recovery": {"environment": "dev"}}

    assert reason_for(comment(both)) == "'nvidia-recovery' must be an object, got a string"


def test_it_keeps_unknown_keys_in_the_settings_and_ignores_them() -> None:
    settings = {"environment": "prod", "mode": "act", "max_restarts": 3, "owner": "ml-infra"}

    result = parse_job_comment(comment({"nvidia-recovery": settings, "other-tool": {"x": 1}}))

    assert result.opted_in
    assert result.settings == settings


def test_it_ignores_other_top_level_keys() -> None:
    text = comment({"team": "llm", "nvidia-recovery": {"environment": "prod"}})

    assert parse_job_comment(text).opted_in


@pytest.mark.parametrize(
    "text",
    [
        f"'{LAB_COMMENT}'",
        f"  {LAB_COMMENT}\n",
        f" ' {LAB_COMMENT} ' ",
        f"\t'{LAB_COMMENT}'\n",
    ],
)
def test_it_tolerates_quotes_and_whitespace_slurm_leaves_around_the_comment(text: str) -> None:
    result = parse_job_comment(text)

    assert result.opted_in
    assert result.environment == "prod"


def test_it_accepts_json_with_spaces_inside() -> None:
    text = '{ "nvidia-recovery" : { "environment" : "prod" , "mode" : "act" } }'

    assert parse_job_comment(text).mode == OptInMode.ACT


@pytest.mark.parametrize(
    "environment",
    ["prod", "staging-2", "team_a.prod", "a", "7", "e" * 63],
)
def test_it_accepts_short_environment_names(environment: str) -> None:
    result = parse_job_comment(comment({"nvidia-recovery": {"environment": environment}}))

    assert result.opted_in
    assert result.environment == environment


def test_it_reads_a_comment_of_exactly_the_maximum_length() -> None:
    padding = "x" * 100
    base = {"nvidia-recovery": {"environment": "prod", "note": ""}}
    room = MAX_COMMENT_LENGTH - len(comment(base))
    base["nvidia-recovery"]["note"] = (padding * 50)[:room]
    text = comment(base)
    assert len(text) == MAX_COMMENT_LENGTH

    assert parse_job_comment(text).opted_in


def test_it_accepts_the_comment_as_bytes() -> None:
    assert parse_job_comment(LAB_COMMENT.encode()).opted_in  # type: ignore[arg-type]


# --- not opting in, and why ------------------------------------------------------------------


@pytest.mark.parametrize("text", [None, "", "   ", "(null)", "''", " ' ' ", "'(null)'"])
def test_it_says_no_comment_when_there_is_none(text: str | None) -> None:
    assert reason_for(text) == "no comment"


def test_it_says_when_the_comment_is_not_json() -> None:
    assert reason_for("please restart me") == "comment is not JSON: Expecting value"


def test_it_reads_the_lab_comment_cut_to_20_characters_as_not_json() -> None:
    # slurm-lab.md: squeue -O Comment cuts the comment to 20 characters.
    reason = reason_for(LAB_COMMENT[:20])

    assert reason.startswith("comment is not JSON: ")
    assert len(reason) < 100


def test_it_says_when_the_comment_uses_single_quoted_json() -> None:
    reason = reason_for("{'nvidia-recovery': {'environment': 'prod'}}")

    assert reason == "comment is not JSON: Expecting property name enclosed in double quotes"


@pytest.mark.parametrize(
    "text",
    ['"nvidia-recovery"', "[1, 2]", "42", "null", "true", "{}", '{"other": {}}', '{"nvidia": {}}'],
)
def test_it_says_the_key_is_missing_for_other_json(text: str) -> None:
    assert reason_for(text) == "no 'nvidia-recovery' key in the comment"


def test_it_looks_for_the_key_only_at_the_top_level() -> None:
    nested = comment({"tools": {"nvidia-recovery": {"environment": "prod"}}})

    assert reason_for(nested) == "no 'nvidia-recovery' key in the comment"


@pytest.mark.parametrize(
    ("value", "kind"),
    [
        ("prod", "a string"),
        (["prod"], "an array"),
        (1, "a number"),
        (1.5, "a number"),
        (True, "a boolean"),
        (None, "null"),
    ],
)
def test_it_says_when_the_value_is_not_an_object(value: object, kind: str) -> None:
    assert reason_for(comment({"nvidia-recovery": value})) == (
        f"'nvidia-recovery' must be an object, got {kind}"
    )


def test_it_names_the_short_key_when_its_value_is_not_an_object() -> None:
    assert reason_for(comment({"recovery": 1})) == "'recovery' must be an object, got a number"


@pytest.mark.parametrize(
    ("mode", "shown"),
    [
        ("x", "'x'"),
        ("ACT", "'ACT'"),
        ("Observe", "'Observe'"),
        ("act ", "'act '"),
        ("", "''"),
        (1, "1"),
        (None, "None"),
        (["act"], "['act']"),
        (True, "True"),
    ],
)
def test_it_refuses_an_unknown_mode(mode: object, shown: str) -> None:
    text = comment({"nvidia-recovery": {"environment": "prod", "mode": mode}})

    assert reason_for(text) == f"mode must be observe or act, got {shown}"


def test_it_shortens_a_long_unknown_mode_in_the_reason() -> None:
    text = comment({"nvidia-recovery": {"environment": "prod", "mode": "a" * 500}})

    reason = reason_for(text)

    assert reason.startswith("mode must be observe or act, got 'aaa")
    assert len(reason) < 100


def test_an_environment_is_optional() -> None:
    opt_in = parse_job_comment(comment({"nvidia-recovery": {"mode": "act"}}))

    assert opt_in.opted_in
    assert opt_in.environment == ""
    assert opt_in.mode == "act"


@pytest.mark.parametrize(
    ("environment", "why"),
    [
        ("e" * 64, "longer than 63"),
        ("prod env", "contains ' '"),
        ("prod;rm", "contains ';'"),
        ("-prod", "must start with a letter or a digit"),
        ("../etc", "must start with a letter or a digit"),
        ("prod/eu", "contains '/'"),
        ("pröd", "contains 'ö'"),
    ],
)
def test_it_refuses_environments_that_are_not_short_names(environment: str, why: str) -> None:
    text = comment({"nvidia-recovery": {"environment": environment}})

    reason = reason_for(text)

    assert reason.startswith("environment ")
    assert why in reason


@pytest.mark.parametrize(("value", "kind"), [(7, "a number"), (["prod"], "an array")])
def test_it_refuses_an_environment_that_is_not_a_string(value: object, kind: str) -> None:
    text = comment({"nvidia-recovery": {"environment": value}})

    assert reason_for(text) == f"environment must be a string, got {kind}"


def test_it_refuses_a_comment_that_is_too_long_without_parsing_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def must_not_parse(text: str) -> object:
        raise AssertionError("a huge comment was parsed")

    monkeypatch.setattr("recovery.schedulers.optin.json.loads", must_not_parse)
    huge = '{"nvidia-recovery":{"environment":"prod","x":"' + "y" * 1_000_000 + '"}}'

    reason = reason_for(huge)

    assert reason.startswith("comment is too long")
    assert str(MAX_COMMENT_LENGTH) in reason


def test_it_refuses_one_character_over_the_limit() -> None:
    text = LAB_COMMENT + " " * (MAX_COMMENT_LENGTH + 1 - len(LAB_COMMENT))

    assert reason_for(text).startswith("comment is too long")


def test_it_survives_deeply_nested_json() -> None:
    # Within the length limit, yet deeper than Python's recursion limit allows json to decode.
    assert reason_for("[" * 2048 + "]" * 2048) == "comment is not JSON: nested too deeply"


def test_it_refuses_nesting_deeper_than_an_opt_in_on_every_python() -> None:
    # Valid JSON that some Pythons decode and others refuse with a RecursionError.
    deep = '{"nvidia-recovery": {"environment": "prod", "x": ' + "[" * 40 + "]" * 40 + "}}"

    assert reason_for(deep) == "comment is not JSON: nested too deeply"


def test_it_counts_no_brackets_inside_strings() -> None:
    quoted = '{"nvidia-recovery": {"environment": "prod", "note": "' + '[{\\"' * 50 + '"}}'

    assert parse_job_comment(quoted).opted_in


def test_it_shows_a_console_summary() -> None:
    assert parse_job_comment(LAB_COMMENT).summary == "opted in: prod, observe"
    assert parse_job_comment(None).summary == "not opted in: no comment"


def test_an_opt_in_is_immutable_and_hashable() -> None:
    result = parse_job_comment(LAB_COMMENT)

    with pytest.raises(AttributeError):
        result.mode = OptInMode.ACT  # type: ignore[misc]
    assert hash(result) == hash(parse_job_comment(LAB_COMMENT))


def test_changing_the_settings_does_not_change_a_later_parse() -> None:
    first = parse_job_comment(LAB_COMMENT)
    first.settings["mode"] = "act"

    assert parse_job_comment(LAB_COMMENT).settings["mode"] == "observe"


# --- never raises ----------------------------------------------------------------------------


def assert_well_formed(result: OptIn) -> None:
    assert isinstance(result, OptIn)
    if result.opted_in:
        assert result.mode in (OptInMode.OBSERVE, OptInMode.ACT)
        assert isinstance(result.environment, str)
        assert result.reason == ""
    else:
        assert result.reason
        assert "\n" not in result.reason
        assert len(result.reason) < 200
    assert not (result.workflow and result.workflow_ignored)
    assert "\n" not in result.workflow_ignored
    assert len(result.workflow_ignored) < 200


def test_it_never_raises_on_random_text() -> None:
    rng = random.Random(1234)
    alphabet = "{}[]\":,'nvidia-recovery environment mode act observe prod 0123456789\\\t\n\x00é€😀"
    for _ in range(RANDOM_CASES):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 80)))
        assert_well_formed(parse_job_comment(text))


def test_it_never_raises_on_random_bytes() -> None:
    rng = random.Random(5678)
    for _ in range(RANDOM_CASES):
        raw = bytes(rng.randrange(256) for _ in range(rng.randint(0, 64)))
        assert_well_formed(parse_job_comment(raw.decode("utf-8", errors="replace")))
        assert_well_formed(parse_job_comment(raw.decode("latin-1")))
        assert_well_formed(parse_job_comment(raw))  # type: ignore[arg-type]


def test_it_never_raises_on_damaged_opt_in_comments() -> None:
    rng = random.Random(9012)
    pieces = ['"', "{", "}", "[", "]", ",", ":", "'", " ", "null", "1e999", "-", "\\u00", "act"]
    for _ in range(RANDOM_CASES):
        characters = list(LAB_COMMENT)
        for _ in range(rng.randint(1, 4)):
            position = rng.randrange(len(characters) + 1)
            action = rng.choice(["insert", "delete", "replace"])
            if action == "insert":
                characters.insert(position, rng.choice(pieces))
            elif characters and position < len(characters):
                if action == "delete":
                    del characters[position]
                else:
                    characters[position] = rng.choice(pieces)
        assert_well_formed(parse_job_comment("".join(characters)))


def test_it_never_raises_on_every_prefix_of_a_valid_comment() -> None:
    for length in range(len(LAB_COMMENT) + 1):
        result = parse_job_comment(LAB_COMMENT[:length])
        assert_well_formed(result)
        assert result.opted_in == (length == len(LAB_COMMENT))


@pytest.mark.parametrize("value", [12, 1.5, ["x"], {"nvidia-recovery": {}}, object()])
def test_it_never_raises_on_values_that_are_not_text(value: object) -> None:
    assert_well_formed(parse_job_comment(value))  # type: ignore[arg-type]


def test_a_workflow_key_names_the_jobs_workflow() -> None:
    result = parse_job_comment('{"nvidia-recovery":{"mode":"act","workflow":"llama-70b.v3"}}')
    assert result.opted_in
    assert (result.workflow, result.workflow_ignored) == ("llama-70b.v3", "")


def test_a_comment_without_a_workflow_key_names_none() -> None:
    result = parse_job_comment(LAB_COMMENT)
    assert (result.workflow, result.workflow_ignored) == ("", "")


@pytest.mark.parametrize(
    ("value", "why"),
    [
        ('"-rf"', "workflow '-rf' starts with '-'"),
        ('"a b"', "workflow 'a b' contains ' '"),
        ('"a,b"', "one name is expected, not a list"),
        ('""', "workflow '' is empty"),
        ('"' + "w" * 129 + '"', "is longer than 128 characters"),
        ("7", "workflow must be a string, got a number"),
        ("null", "workflow must be a string, got null"),
    ],
)
def test_a_bad_workflow_is_ignored_with_its_reason_and_the_job_stays_opted_in(
    value: str, why: str
) -> None:
    result = parse_job_comment('{"recovery":{"mode":"act","workflow":' + value + "}}")
    assert result.opted_in
    assert result.workflow == ""
    assert why in result.workflow_ignored
