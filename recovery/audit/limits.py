"""Limits on free-form JSON that comes from outside and is kept in the append-only trail.

A controller's report (``state_before``, ``commands``) is stored on the recommendation and in
an audit event that is never deleted, so its size and nesting are bounded before anything is
written. Django-free: the API's serializers and ``recovery.loop.recommendations`` both check.
"""

from __future__ import annotations

import json
from typing import Any

# Nesting: ``{"a": {"b": 1}}`` is two levels deep.
MAX_FREE_FORM_DEPTH = 8
# Serialised as compact UTF-8 JSON.
MAX_FREE_FORM_BYTES = 16 * 1024
# All the commands of one report together (each one's argv and output are capped as well).
MAX_COMMANDS_BYTES = 64 * 1024


def json_depth(value: Any, *, stop_after: int | None = None) -> int:
    """How deeply lists and objects nest in ``value`` (0 for a scalar).

    Iterative, so that no nesting can exhaust the interpreter's stack; stops counting once
    ``stop_after`` levels are exceeded.
    """
    deepest = 0
    pending: list[tuple[Any, int]] = [(value, 0)]
    while pending:
        current, depth = pending.pop()
        if isinstance(current, dict):
            children: Any = current.values()
        elif isinstance(current, list | tuple):
            children = current
        else:
            continue
        depth += 1
        deepest = max(deepest, depth)
        if stop_after is not None and deepest > stop_after:
            return deepest
        pending.extend((child, depth) for child in children)
    return deepest


def json_size(value: Any) -> int:
    """Bytes of ``value`` as compact UTF-8 JSON."""
    return len(json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=str).encode())


def free_form_problem(
    value: Any, *, max_bytes: int = MAX_FREE_FORM_BYTES, max_depth: int = MAX_FREE_FORM_DEPTH
) -> str | None:
    """Why ``value`` may not be stored, or None when it may."""
    if json_depth(value, stop_after=max_depth) > max_depth:
        return f"Nested too deeply: at most {max_depth} levels of lists and objects."
    size = json_size(value)
    if size > max_bytes:
        return f"Too large: at most {max_bytes} bytes as JSON, this is {size}."
    return None
