"""How one value of Slurm's JSON is read, whatever release printed it.

A plain number or Slurm's ``{"set", "infinite", "number"}`` object, a string, a Unix time, a
node list, an exit code (a raw wait status, or the verbose object of 23.11 and later). A value
that is absent, null, unset, infinite or in a shape not known here raises ``_Unreadable`` with
the reason, which the readers of records keep in ``unreadable``: nothing is guessed.

Apart from those readers (``slurm_json`` for the document and its jobs, ``slurm_nodes`` for
nodes) because both use them, and neither needs the other's records.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from recovery.schedulers.compat import UTC
from recovery.schedulers.nodelist import EMPTY_NODELISTS, NodeListError, expand_nodelist


class _Unreadable(ValueError):
    """A value Slurm did not give in a usable form; the message is the reason."""


_ABSENT = object()


def _shape(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, Mapping):
        return "dict"
    return type(value).__name__


def _get(raw: Mapping[str, Any], *keys: str) -> tuple[str, object]:
    """The first of ``keys`` present in the record, and its value (``_ABSENT`` if none is)."""
    for key in keys:
        if key in raw:
            return key, raw[key]
    return keys[0], _ABSENT


def _number(value: object) -> int:
    """A plain integer, or Slurm's ``{"set", "infinite", "number"}`` object."""
    if value is _ABSENT:
        raise _Unreadable("absent")
    if value is None:
        raise _Unreadable("null")
    if isinstance(value, bool):
        raise _Unreadable("unknown shape bool")
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str):
        # Slurm's "complex" output mode prints an infinite number as "Infinity".
        if value.lower() in {"infinity", "infinite", "unlimited"}:
            raise _Unreadable("infinite, not a number")
        raise _Unreadable(f"unknown shape str {value[:40]!r}")
    if isinstance(value, Mapping):
        if value.get("infinite") is True:
            raise _Unreadable("infinite, not a number")
        if value.get("set") is False:
            raise _Unreadable("not set")
        number = value.get("number")
        if value.get("set") is True and isinstance(number, int) and not isinstance(number, bool):
            return number
        raise _Unreadable(f"unknown shape dict with keys {sorted(value)}")
    raise _Unreadable(f"unknown shape {_shape(value)}")


def _plain_int(value: object) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.isdigit():
        return int(value)
    return None


def _string(value: object) -> str:
    if value is _ABSENT:
        raise _Unreadable("absent")
    if value is None:
        raise _Unreadable("null")
    if not isinstance(value, str):
        raise _Unreadable(f"unknown shape {_shape(value)}")
    return value


def _text(raw: Mapping[str, Any], key: str) -> str:
    """A descriptive string (name, partition...); not acted on, so "" when missing."""
    value = raw.get(key)
    return value.strip() if isinstance(value, str) else ""


def _epoch(value: object) -> datetime | None:
    """A Unix time; Slurm's 0 means "none" (not started, not ended)."""
    seconds = _number(value)
    if seconds < 0:
        raise _Unreadable(f"negative time {seconds}")
    if seconds == 0:
        return None
    return datetime.fromtimestamp(seconds, tz=UTC)


def _nodes(value: object) -> list[str]:
    text = _string(value).strip()
    if text in EMPTY_NODELISTS:
        return []
    try:
        return expand_nodelist(text)
    except NodeListError as exc:
        raise _Unreadable(str(exc)) from None


def decode_wait_status(status: int) -> tuple[int | None, int | None]:
    """A raw wait status as 22.05 and 23.02 print it: 768 is exit 3, 15 is SIGTERM."""
    signal = status & 0x7F
    if signal:
        return None, signal
    return (status >> 8) & 0xFF, None


# ---------------------------------------------------------------------- exit code


def _exit_code(value: object) -> tuple[int | None, int | None]:
    if isinstance(value, Mapping) and "status" in value:
        return _exit_code_verbose(value)
    # 22.05: the raw wait status; 23.02: the same inside a number object.
    return decode_wait_status(_number(value))


def _exit_code_verbose(value: Mapping[str, Any]) -> tuple[int | None, int | None]:
    """23.11 and later: ``{"status": ..., "return_code": {...}, "signal": {"id": {...}}}``.

    ``status`` is one word in some releases and a list of one word in others.
    """
    status = value.get("status")
    words = [status] if isinstance(status, str) else status
    if not isinstance(words, list) or len(words) != 1 or not isinstance(words[0], str):
        raise _Unreadable(f"unknown shape of status: {json.dumps(status)[:80]}")
    word = words[0].upper()
    if word in {"SUCCESS", "ERROR"}:
        return _number(value.get("return_code", _ABSENT)), None
    if word == "SIGNALED":
        signal = value.get("signal")
        signal_id = signal.get("id", _ABSENT) if isinstance(signal, Mapping) else _ABSENT
        return None, _number(signal_id)
    if word == "PENDING":
        raise _Unreadable("pending: the job has not ended")
    raise _Unreadable(f"status {word}")
