"""Metric stores: the Prometheus HTTP API, and the DCGM exporter's GPU metrics read through it.

``MetricSource`` is what every connector provides (PromQL queries and discovery: series, label
names and values, for the configurator); ``SOURCES`` registers them by kind and
``build_source`` makes one. ``source_from_settings`` reads what ``configure_signals`` saved in a
cluster's settings; ``gpu_health`` turns a window of DCGM metrics into per node/GPU findings.
"""

from __future__ import annotations

from recovery.sources.http import ErrorKind
from recovery.sources.metrics.base import (
    MetricSource,
    MetricsSourceError,
    Point,
    Sample,
    Series,
)
from recovery.sources.metrics.dcgm import (
    DETECTOR_METRICS,
    ESSENTIAL_METRICS,
    DcgmLabels,
    GpuHealth,
    gpu_health,
)
from recovery.sources.metrics.prometheus import DEFAULT_TIMEOUT, PrometheusSource

SOURCES: dict[str, type[MetricSource]] = {
    PrometheusSource.kind: PrometheusSource,
}
DEFAULT_NODE_LABEL = "Hostname"


def build_source(
    kind: str,
    url: str,
    *,
    timeout: float = DEFAULT_TIMEOUT,
    bearer_token: str | None = None,
    basic_auth: tuple[str, str] | None = None,
) -> MetricSource:
    """A connector of ``kind`` ("prometheus") at ``url``.

    Raises ``ValueError`` for an unknown kind or impossible options and ``MetricsSourceError``
    (kind ``invalid_url``) for a URL that cannot be the store's, each with a message fit to show.
    """
    if kind not in SOURCES:
        raise ValueError(f"unknown metric store {kind!r}: choose one of {', '.join(SOURCES)}")
    return SOURCES[kind](url, timeout=timeout, bearer_token=bearer_token, basic_auth=basic_auth)


def source_from_settings(saved: object) -> tuple[MetricSource, DcgmLabels] | None:
    """The store and DCGM label mapping a cluster's ``metric_source`` settings name, or None.

    None when the settings name no store of a known kind; raises ``MetricsSourceError`` or
    ``ValueError`` when they name one that cannot be used.
    """
    if not isinstance(saved, dict) or saved.get("kind") not in SOURCES:
        return None
    source = build_source(str(saved["kind"]), str(saved.get("url", "")), timeout=DEFAULT_TIMEOUT)
    labels = DcgmLabels(node=str(saved.get("node_label") or DEFAULT_NODE_LABEL))
    return source, labels


__all__ = (
    "DETECTOR_METRICS",
    "ESSENTIAL_METRICS",
    "SOURCES",
    "DcgmLabels",
    "ErrorKind",
    "GpuHealth",
    "MetricSource",
    "MetricsSourceError",
    "Point",
    "PrometheusSource",
    "Sample",
    "Series",
    "build_source",
    "gpu_health",
    "source_from_settings",
)
