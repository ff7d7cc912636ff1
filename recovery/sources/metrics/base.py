"""What every metric store connector provides: PromQL queries and discovery, as typed values.

A metric store here is one that answers PromQL over the Prometheus HTTP API's shapes (Prometheus,
Thanos Query, Mimir/Cortex, VictoriaMetrics); ``gpu_health`` reads DCGM metrics through it and the
configurator discovers what it holds. Connectors are registered by kind in
``recovery.sources.metrics.SOURCES`` and built with ``build_source``.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import NamedTuple

from recovery.sources.http import HttpError

TimeArg = datetime | float
StepArg = timedelta | float


class MetricsSourceError(HttpError):
    """A metrics source could not answer; ``str()`` is a one-line diagnosis.

    ``error_type`` and ``server_message`` carry Prometheus' own ``errorType`` and ``error``
    when it gave them (a refused query, a server-side timeout).
    """

    def __init__(
        self,
        kind: str,
        diagnosis: str,
        *,
        status: int | None = None,
        reason: str = "",
        error_type: str = "",
        server_message: str = "",
    ) -> None:
        super().__init__(kind, " ".join(diagnosis.split()), status=status, reason=reason)
        self.error_type = error_type
        self.server_message = server_message


class Point(NamedTuple):
    at: datetime
    value: float


@dataclass(frozen=True)
class Sample:
    """One element of an instant vector (or a scalar, with no labels)."""

    labels: Mapping[str, str]
    at: datetime
    value: float

    @property
    def name(self) -> str:
        return self.labels.get("__name__", "")


@dataclass(frozen=True)
class Series:
    """One element of a range result (a matrix): a label set and its points, oldest first."""

    labels: Mapping[str, str]
    points: Sequence[Point] = field(default_factory=tuple)

    @property
    def name(self) -> str:
        return self.labels.get("__name__", "")


class MetricSource(abc.ABC):
    """A metric store queried in PromQL. Every failure raises ``MetricsSourceError``.

    A connector is built from its URL and the options ``build_source`` passes on.
    """

    kind: str = ""
    service: str = ""

    @abc.abstractmethod
    def __init__(
        self,
        url: str,
        *,
        timeout: float,
        bearer_token: str | None = None,
        basic_auth: tuple[str, str] | None = None,
    ) -> None: ...

    @abc.abstractmethod
    def instant(self, query: str, at: TimeArg | None = None) -> list[Sample]:
        """The value of ``query`` at ``at`` (the server's now when None)."""

    @abc.abstractmethod
    def range(self, query: str, start: TimeArg, end: TimeArg, step: StepArg) -> list[Series]:
        """The values of ``query`` every ``step`` from ``start`` to ``end``, per series."""

    @abc.abstractmethod
    def series(
        self,
        match: str | Sequence[str],
        start: TimeArg | None = None,
        end: TimeArg | None = None,
    ) -> list[dict[str, str]]:
        """The label sets of the series that ``match`` selects (one selector or several)."""

    @abc.abstractmethod
    def label_names(
        self,
        match: str | Sequence[str] = (),
        start: TimeArg | None = None,
        end: TimeArg | None = None,
    ) -> list[str]:
        """The label names in use (in the series ``match`` selects, when given)."""

    @abc.abstractmethod
    def label_values(
        self,
        name: str,
        match: str | Sequence[str] = (),
        start: TimeArg | None = None,
        end: TimeArg | None = None,
    ) -> list[str]:
        """The values label ``name`` takes (in the series ``match`` selects, when given)."""

    @abc.abstractmethod
    def build_info(self) -> dict[str, str]:
        """The server's version and build: proves it answers."""
