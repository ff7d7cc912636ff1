"""Which labels (Loki) or fields (VictoriaLogs) name a log line's job, node and rank.

Sites label their logs their own way (``slurm_job_id``, ``jobid``, ``job``; ``host``, ``node``,
``instance``), so the mapping is configuration, validated once here. Every value that reaches a
query goes through :func:`logql_string` or :func:`logsql_string`, never into a query raw.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

# Prometheus label names, which Loki stream labels follow.
LOKI_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
# VictoriaLogs accepts any field name once quoted; keep to the names log shippers produce
# (dotted for flattened JSON, dashes and slashes for Kubernetes-style keys).
LOGSQL_FIELD_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.\-/]{0,127}")
MAX_SELECTOR_VALUE = 512
MAX_STATIC_SELECTORS = 16

# Names commonly used for each role, most specific first: the configurator's first guess.
JOB_LABEL_CANDIDATES = ("slurm_job_id", "job_id", "jobid", "slurm_jobid", "job")
NODE_LABEL_CANDIDATES = ("node", "hostname", "host", "nodename", "instance", "host.name")
RANK_LABEL_CANDIDATES = ("rank", "global_rank", "task_id", "slurm_procid", "local_rank")


class MappingError(ValueError):
    """The label mapping is unusable; the message says which name or value and why."""


@dataclass(frozen=True)
class LabelMapping:
    """Where a log store keeps a line's job id, node and rank, and which streams to look in.

    ``static_selectors`` narrow every query (``{"cluster": "a100"}``), so one log store can
    serve several clusters whose job ids overlap.
    """

    job: str
    node: str = ""
    rank: str = ""
    static_selectors: Mapping[str, str] = field(default_factory=dict)

    def validate_for_loki(self) -> None:
        self._validate(LOKI_LABEL_NAME, "a Loki label name ([a-zA-Z_][a-zA-Z0-9_]*)")

    def validate_for_logsql(self) -> None:
        self._validate(LOGSQL_FIELD_NAME, "a VictoriaLogs field name ([A-Za-z_][A-Za-z0-9_.-/]*)")

    def _validate(self, pattern: re.Pattern[str], what: str) -> None:
        if not self.job:
            raise MappingError("the mapping names no job id label")
        names = [("job", self.job), ("node", self.node), ("rank", self.rank)]
        names += [("selector", name) for name in self.static_selectors]
        for role, name in names:
            if name and not pattern.fullmatch(name):
                raise MappingError(f"{role} label {name!r} is not {what}")
        if len(self.static_selectors) > MAX_STATIC_SELECTORS:
            raise MappingError(f"more than {MAX_STATIC_SELECTORS} static selectors")
        if self.job in self.static_selectors:
            raise MappingError(f"{self.job!r} is both the job id label and a static selector")
        for name, value in self.static_selectors.items():
            check_selector_value(value, f"selector {name!r}")

    def to_dict(self) -> dict[str, Any]:
        return {
            "job": self.job,
            "node": self.node,
            "rank": self.rank,
            "static_selectors": dict(self.static_selectors),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> LabelMapping:
        """Read a mapping saved in a cluster's settings; wrong types are a ``MappingError``."""
        if not isinstance(data, Mapping):
            raise MappingError("the label mapping must be an object")
        unknown = set(data) - {"job", "node", "rank", "static_selectors"}
        if unknown:
            raise MappingError(f"unknown mapping keys: {', '.join(sorted(unknown))}")
        values = {key: data.get(key, "") for key in ("job", "node", "rank")}
        for key, value in values.items():
            if not isinstance(value, str):
                raise MappingError(f"{key} must be a label name (a string)")
        selectors = data.get("static_selectors")
        selectors = {} if selectors is None else selectors
        if not isinstance(selectors, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in selectors.items()
        ):
            raise MappingError("static_selectors must map label names to strings")
        return cls(static_selectors=dict(selectors), **values)

    def node_of(self, labels: Mapping[str, str]) -> str | None:
        return (labels.get(self.node) or None) if self.node else None

    def rank_of(self, labels: Mapping[str, str]) -> int | None:
        if not self.rank:
            return None
        value = (labels.get(self.rank) or "").strip()
        return int(value) if value.isdigit() and len(value) <= 7 else None


def check_selector_value(value: str, what: str) -> None:
    if not value:
        raise MappingError(f"{what} has an empty value: it would match every stream")
    if len(value) > MAX_SELECTOR_VALUE:
        raise MappingError(f"{what} is longer than {MAX_SELECTOR_VALUE} characters")
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in value):
        raise MappingError(f"{what} contains control characters")


def logql_string(value: str) -> str:
    """``value`` as a LogQL double-quoted string (Go escaping), safe inside a stream selector."""
    out = ['"']
    for char in value:
        if char in '"\\':
            out.append("\\" + char)
        elif ord(char) < 0x20 or ord(char) == 0x7F:
            out.append(f"\\x{ord(char):02x}")
        else:
            out.append(char)
    out.append('"')
    return "".join(out)


def logsql_string(value: str) -> str:
    """``value`` as a LogsQL double-quoted string: quotes and backslashes escaped.

    JSON string syntax is a subset of the Go quoted strings LogsQL parses, and a quoted value is
    always a literal: it can't close the filter and start a pipe.
    """
    return json.dumps(value, ensure_ascii=True)


def suggest_mapping(names: Iterable[str]) -> dict[str, str]:
    """A first guess at the job / node / rank labels among ``names`` (empty where none fits)."""
    available = {name.lower(): name for name in names}

    def first(candidates: tuple[str, ...]) -> str:
        return next((available[c] for c in candidates if c in available), "")

    return {
        "job": first(JOB_LABEL_CANDIDATES),
        "node": first(NODE_LABEL_CANDIDATES),
        "rank": first(RANK_LABEL_CANDIDATES),
    }
