"""Refuse bad identifiers before any scheduler command runs.

Job ids, node names and partitions end up as arguments of ``scontrol``, ``scancel`` and friends,
sometimes through SSH, where a remote shell parses the command line again. Only identifiers that
Slurm itself could have produced get through: a value such as ``-h``, ``1;reboot`` or ``node[1-2]``
is refused here, with the offending value in the message, instead of being quoted and hoped for.
"""

from __future__ import annotations

import string
from collections.abc import Iterable

# A job id longer than this is not one Slurm hands out (ids are 32-bit; array task and het
# component suffixes add a few digits), so a longer value is garbage or an attack.
MAX_JOB_ID_LENGTH = 20

# Slurm keeps host names in buffers of this size (MAXHOSTNAMELEN), and partition names alike.
MAX_NODE_NAME_LENGTH = 64
MAX_PARTITION_LENGTH = 64

DIGITS = frozenset(string.digits)
LETTERS_AND_DIGITS = frozenset(string.ascii_letters + string.digits)
# ASCII only on purpose: str.isalnum() would also accept look-alike letters from other scripts.
NAME_CHARACTERS = LETTERS_AND_DIGITS | frozenset("-_.")

# Characters that show the caller passed a Slurm node list where one name was expected.
_LIST_CHARACTERS = frozenset("[],")

# Enough of a bad value to recognise it, never a whole pasted log.
_SHOWN_VALUE_LENGTH = 40

JOB_ID_FORMS = "a positive number, an array task like 123_4 or a het job component like 123+1"


class InvalidIdentifier(ValueError):
    """A job id, node name or partition that must not reach a scheduler command."""


def shown(value: object) -> str:
    """The value's repr, cut short so that messages stay one readable line."""
    text = repr(value)
    if len(text) <= _SHOWN_VALUE_LENGTH:
        return text
    return text[: _SHOWN_VALUE_LENGTH - 3] + "..."


def name_problem(value: object, *, max_length: int) -> str | None:
    """Why ``value`` is not a safe Slurm name, or None when it is one.

    Safe means: 1 to ``max_length`` ASCII letters, digits, '-', '_' or '.', starting with a letter
    or a digit. The first character matters most: a leading '-' would be read as an option.
    """
    if not isinstance(value, str):
        return f"is {type(value).__name__}, not a string"
    if not value:
        return "is empty"
    if len(value) > max_length:
        return f"is longer than {max_length} characters"
    if value[0] not in LETTERS_AND_DIGITS:
        return f"starts with {value[0]!r}; it must start with a letter or a digit"
    for character in value:
        if character in _LIST_CHARACTERS:
            return f"contains {character!r}; one name is expected, not a list"
        if character not in NAME_CHARACTERS:
            return f"contains {character!r}; only letters, digits, '-', '_' and '.' are allowed"
    return None


def _is_canonical_number(text: str, *, allow_zero: bool) -> bool:
    """ASCII digits written the way Slurm prints them: no sign, no leading zeros."""
    if not text or any(character not in DIGITS for character in text):
        return False
    if text == "0":
        return allow_zero
    return text[0] != "0"


def _job_id_problem(text: str) -> str | None:
    if not text:
        return "is empty"
    if len(text) > MAX_JOB_ID_LENGTH:
        return f"is longer than {MAX_JOB_ID_LENGTH} characters"
    if text == "0":
        return "is zero; Slurm job ids start at 1"
    job, separator, component = text, "", ""
    for mark in ("_", "+"):
        if mark in text:
            job, separator, component = text.partition(mark)
            break
    # Array task ids and het job offsets count from 0 ("--array=0-15", "123+0"); the job id does
    # not. Leading zeros are refused because Slurm never prints them.
    if not _is_canonical_number(job, allow_zero=False):
        return f"must be {JOB_ID_FORMS}"
    if separator and not _is_canonical_number(component, allow_zero=True):
        return f"must be {JOB_ID_FORMS}"
    return None


def validate_job_id(value: str | int) -> str:
    """The job id as Slurm writes it: ``123``, ``123_4`` (array task) or ``123+1`` (het job)."""
    # bool is an int subclass: True must not become job 1.
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise InvalidIdentifier(
            f"invalid Slurm job id {shown(value)}: must be a string or an integer"
        )
    text = str(value)
    problem = _job_id_problem(text)
    if problem is not None:
        raise InvalidIdentifier(f"invalid Slurm job id {shown(value)}: {problem}")
    return text


def validate_node_name(value: str) -> str:
    """One node name, such as ``node001`` or ``gpu-a100-17.rack3``."""
    problem = name_problem(value, max_length=MAX_NODE_NAME_LENGTH)
    if problem is not None:
        raise InvalidIdentifier(f"invalid node name {shown(value)}: {problem}")
    return value


def validate_node_names(values: Iterable[str]) -> list[str]:
    """Every name in ``values``, in the given order; the first bad one is refused."""
    # Iterating a string yields its characters: "node001" would pass as seven one-letter names.
    if isinstance(values, (str, bytes)):
        raise InvalidIdentifier(
            f"expected a list of node names, got the single value {shown(values)}"
        )
    return [validate_node_name(value) for value in values]


def validate_partition(value: str) -> str:
    """A partition name, such as ``debug`` or ``gpu_long``."""
    problem = name_problem(value, max_length=MAX_PARTITION_LENGTH)
    if problem is not None:
        raise InvalidIdentifier(f"invalid partition {shown(value)}: {problem}")
    return value
