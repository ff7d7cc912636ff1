"""A Slurm job's opt-in, read from its comment.

A job opts in with ``--comment='{"nvidia-recovery":{"environment":"prod","mode":"observe"}}'``
(the key ``recovery`` works too). Users write these comments by hand, so a bad one is never an
error: the job is simply not opted in, and the Console shows "not opted in: <reason>" so that
its owner can fix the comment.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from recovery.schedulers.compat import StrEnum
from recovery.schedulers.validation import name_problem, shown


class OptInMode(StrEnum):
    """The ``mode`` a job's opt-in asks for.

    The one definition of these values: ``recovery.choices.OptInMode`` wraps it for the models
    and forms. Declared here, Django-free, because the Advisor Controller reads opt-ins on login
    nodes. The values are what users write in their job comments: they must not change.
    """

    OBSERVE = "observe"
    ACT = "act"


# The first key present wins, so a job carrying both is read by its specific key.
COMMENT_KEYS = ("nvidia-recovery", "recovery")

# A comment longer than this is not an opt-in someone typed; it is not parsed at all.
MAX_COMMENT_LENGTH = 4096
# Environment names are DNS-label sized so they fit in metric labels and host-style names.
MAX_ENVIRONMENT_LENGTH = 63
# Workflow names follow the same rules, longer: they often carry a run's version and date.
MAX_WORKFLOW_LENGTH = 128

# An opt-in is two or three levels deep. Deeper comments are refused before decoding, on every
# Python: how deep json may go before a RecursionError differs between versions (3.13's decoder
# takes thousands of levels that 3.11's refuses).
MAX_NESTING = 32

# What Slurm shows for a job without a comment.
_NO_COMMENT = frozenset({"", "(null)"})


@dataclass(frozen=True)
class OptIn:
    """Whether a job opted in, and how; ``reason`` says why not."""

    opted_in: bool
    environment: str = ""
    mode: OptInMode = OptInMode.OBSERVE
    # The raw object under the key, unknown keys included; excluded from hashing as it is a dict.
    settings: dict[str, Any] = field(default_factory=dict, hash=False)
    reason: str = ""
    # The workflow the job's owner put it in: with the owner's other jobs of that name on the
    # cluster it shares one retry budget and one set of excluded nodes. "" for none.
    workflow: str = ""
    # Why a ``workflow`` key was not taken; the job stays opted in, in no workflow.
    workflow_ignored: str = ""

    @property
    def summary(self) -> str:
        """One line for the Console."""
        if self.opted_in:
            return f"opted in: {self.environment}, {self.mode}"
        return f"not opted in: {self.reason}"


def _not_opted_in(reason: str) -> OptIn:
    return OptIn(opted_in=False, reason=reason)


def _json_type(value: object) -> str:
    """How a decoded JSON value is called in JSON's own words."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return "an object"


def _unwrap(comment: str) -> str:
    """The comment without the whitespace and single quotes Slurm tools may leave around it."""
    text = comment.strip()
    # Written as --comment="'{...}'", or copied from a shell line, the quotes become part of it.
    if len(text) >= 2 and text[0] == "'" and text[-1] == "'":
        text = text[1:-1].strip()
    return text


def _nesting_depth(text: str) -> int:
    """How deep ``text``'s brackets nest outside JSON strings (one pass, any text)."""
    depth = deepest = 0
    in_string = escaped = False
    for char in text:
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif char in "]}":
            depth -= 1
    return deepest


def parse_job_comment(comment: str | None) -> OptIn:
    """The opt-in settings in a job's comment. Never raises, whatever the comment holds."""
    if isinstance(comment, (bytes, bytearray)):
        comment = bytes(comment).decode("utf-8", errors="replace")
    if comment is None:
        return _not_opted_in("no comment")
    if not isinstance(comment, str):
        return _not_opted_in(f"comment is {type(comment).__name__}, not text")
    # Checked before any other work so that a huge comment costs nothing.
    if len(comment) > MAX_COMMENT_LENGTH:
        return _not_opted_in(
            f"comment is too long ({len(comment)} characters, at most {MAX_COMMENT_LENGTH})"
        )
    text = _unwrap(comment)
    if text in _NO_COMMENT:
        return _not_opted_in("no comment")
    if _nesting_depth(text) > MAX_NESTING:
        return _not_opted_in("comment is not JSON: nested too deeply")
    try:
        document = json.loads(text)
    except json.JSONDecodeError as error:
        return _not_opted_in(f"comment is not JSON: {error.msg}")
    except ValueError as error:
        # Any other refusal from the decoder still leaves the job listed, with its words.
        return _not_opted_in(f"comment is not JSON: {str(error)[:60]}")

    keys = [key for key in COMMENT_KEYS if key in document] if isinstance(document, dict) else []
    if not keys:
        return _not_opted_in(f"no '{COMMENT_KEYS[0]}' key in the comment")
    settings = document[keys[0]]
    if not isinstance(settings, dict):
        return _not_opted_in(f"'{keys[0]}' must be an object, got {_json_type(settings)}")

    mode = settings.get("mode", OptInMode.OBSERVE)
    if not isinstance(mode, str) or mode not in tuple(OptInMode):
        return _not_opted_in(
            f"mode must be {OptInMode.OBSERVE} or {OptInMode.ACT}, got {shown(mode)}"
        )
    # Without an environment the job takes its cluster's (and that environment's policies).
    environment = settings.get("environment", "")
    if not isinstance(environment, str):
        return _not_opted_in(f"environment must be a string, got {_json_type(environment)}")
    problem = name_problem(environment, max_length=MAX_ENVIRONMENT_LENGTH) if environment else None
    if problem is not None:
        return _not_opted_in(f"environment {shown(environment)} {problem}")
    workflow, workflow_ignored = _workflow_of(settings)
    return OptIn(
        opted_in=True,
        environment=environment,
        mode=OptInMode(mode),
        settings=dict(settings),
        workflow=workflow,
        workflow_ignored=workflow_ignored,
    )


def _workflow_of(settings: dict[str, Any]) -> tuple[str, str]:
    """The workflow the settings name, and why a ``workflow`` key was ignored.

    A bad workflow name costs the job its workflow, not its opt-in: it is still restarted, with
    a budget of its own, and the Console says why the name was not taken.
    """
    if "workflow" not in settings:
        return "", ""
    workflow = settings["workflow"]
    if not isinstance(workflow, str):
        return "", f"workflow must be a string, got {_json_type(workflow)}"
    problem = name_problem(workflow, max_length=MAX_WORKFLOW_LENGTH)
    if problem is not None:
        return "", f"workflow {shown(workflow)} {problem}"
    return workflow, ""
