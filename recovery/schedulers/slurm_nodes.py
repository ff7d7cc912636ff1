"""Slurm's node records, and ``sinfo``'s groups of nodes, read into ``NodeInfo`` for every
release from 22.05 to 25.11.

22.05 prints a lower-case base state with a separate ``state_flags`` list, 23.02 and later one
list of words; the ``sinfo --json`` of 23.02 and later prints groups of nodes that share a
state, not node records. Apart from the document and its jobs (``slurm_json``), with which
nodes share only the readers of single values (``slurm_values``).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from typing import Any

from recovery.schedulers.base import NodeInfo
from recovery.schedulers.nodelist import NodeListError, expand_nodelist
from recovery.schedulers.slurm_values import _ABSENT, _epoch, _shape, _string, _text, _Unreadable
from recovery.schedulers.validation import shown

logger = logging.getLogger(__name__)

NODE_BASE_STATES = frozenset(
    {"UNKNOWN", "DOWN", "IDLE", "ALLOCATED", "ERROR", "MIXED", "FUTURE", "INVALID"}
)


def read_node_state(state: object, flags: object = None) -> tuple[str, list[str]]:
    """22.05: ``"idle"`` plus ``state_flags``; 23.02 and later: ``["IDLE", "DRAIN"]``.

    Returns the base state and the flags. Raises ``NodeStateError`` (keeping the words it
    read) for a state that is absent, in a shape this reader does not know, without exactly
    one base state, or with flags that are not a list of words.
    """
    words: list[object]
    if isinstance(state, str):
        if flags is not None and not isinstance(flags, list):
            raise NodeStateError(f"state_flags: unknown shape {_shape(flags)}")
        words = [state, *(flags or [])]
    elif isinstance(state, list):
        words = list(state)
    elif state is _ABSENT:
        raise NodeStateError("absent")
    elif state is None:
        raise NodeStateError("null")
    else:
        raise NodeStateError(f"unknown shape {_shape(state)}")
    if not words or not all(isinstance(word, str) and word.strip() for word in words):
        raise NodeStateError(f"unknown shape list {json.dumps(words, default=str)[:80]}")
    upper = [str(word).strip().upper() for word in words]
    bases = [word for word in upper if word in NODE_BASE_STATES]
    if len(bases) != 1:
        raise NodeStateError(f"{len(bases)} base states in {upper}", upper)
    return bases[0], [word for word in upper if word != bases[0]]


class NodeStateError(_Unreadable):
    """The node's state is unknown; the words Slurm gave are kept in ``words``."""

    def __init__(self, reason: str, words: list[str] | None = None) -> None:
        super().__init__(reason)
        self.words = words or []


def node_from_record(raw: Mapping[str, Any]) -> NodeInfo:
    """One node record of ``scontrol --json show nodes`` or 22.05's ``sinfo --json``.

    ``reason_set_by_user`` and ``reason_changed_at`` say who set the reason and when; both
    versions print them for a node with no reason too (24.11 a user, 22.05 null), so they are
    kept only beside a reason.
    """
    unreadable: dict[str, str] = {}
    state: str | None = None
    flags: list[str] = []
    try:
        state, flags = read_node_state(raw.get("state", _ABSENT), raw.get("state_flags"))
    except NodeStateError as exc:
        flags = exc.words
        unreadable["state"] = f"state: {exc}"
        logger.warning("node %s: unreadable state %.100r", raw.get("name"), raw.get("state"))
    reason: str | None = None
    try:
        reason = _string(raw.get("reason", _ABSENT)).strip()
    except _Unreadable as exc:
        unreadable["reason"] = f"reason: {exc}"
    set_by, set_at = "", None
    if reason:
        by = raw.get("reason_set_by_user")
        set_by = by.strip() if isinstance(by, str) else ""
        if not set_by:
            unreadable["reason_set_by"] = f"reason_set_by_user: {shown(by)}"
        try:
            set_at = _epoch(raw.get("reason_changed_at", _ABSENT))
        except _Unreadable as exc:
            unreadable["reason_set_at"] = f"reason_changed_at: {exc}"
    return NodeInfo(
        name=_text(raw, "name"),
        state=state,
        flags=flags,
        reason=reason,
        reason_set_by=set_by,
        reason_set_at=set_at,
        unreadable=unreadable,
    )


def nodes_from_sinfo_groups(groups: Sequence[object]) -> list[NodeInfo]:
    """23.02+ ``sinfo --json`` prints groups of nodes that share a state, not node records.

    A node in several partitions appears in several groups; the first one is kept. A group
    has one reason, and Slurm gives a group of several nodes the reason of one of them (24.11
    shows three nodes drained for three reasons as one group with one reason): a node's reason
    is read only from a group of its own, and is unknown otherwise. ``SlurmAdapter`` reads the
    nodes one by one instead where it can.
    """
    nodes: dict[str, NodeInfo] = {}
    for group in groups:
        if not isinstance(group, Mapping):
            continue
        node = group.get("node")
        unreadable: dict[str, str] = {}
        state: str | None = None
        flags: list[str] = []
        try:
            state, flags = read_node_state(
                node.get("state", _ABSENT) if isinstance(node, Mapping) else _ABSENT
            )
        except NodeStateError as exc:
            flags = exc.words
            unreadable["state"] = f"node.state: {exc}"
        members = group.get("nodes")
        names = members.get("nodes") if isinstance(members, Mapping) else None
        if isinstance(names, str):
            try:
                names = expand_nodelist(names)
            except NodeListError:
                names = None
        if not isinstance(names, list):
            continue
        why = group.get("reason")
        text = why.get("description") if isinstance(why, Mapping) else why
        reason: str | None = text.strip() if isinstance(text, str) else None
        if reason is None:
            unreadable["reason"] = f"reason: {shown(why)}"
        elif len(names) > 1:
            reason = None
            unreadable["reason"] = (
                f"reason: one for a group of {len(names)} nodes, which may be another's"
            )
        for name in names:
            if isinstance(name, str) and name not in nodes:
                nodes[name] = NodeInfo(
                    name=name,
                    state=state,
                    flags=list(flags),
                    reason=reason,
                    unreadable=dict(unreadable),
                )
    return list(nodes.values())
