"""Metric stores: the Prometheus HTTP API, and the DCGM exporter's GPU metrics read through it.

``PrometheusSource`` queries and discovers (series, label names and values, for the
configurator); ``gpu_health`` turns a window of DCGM metrics into per node/GPU findings.
"""

from __future__ import annotations

from recovery.sources.metrics.dcgm import (
    DETECTOR_METRICS,
    ESSENTIAL_METRICS,
    DcgmLabels,
    GpuHealth,
    gpu_health,
)
from recovery.sources.metrics.prometheus import (
    ErrorKind,
    MetricsSourceError,
    Point,
    PrometheusSource,
    Sample,
    Series,
)

__all__ = (
    "DETECTOR_METRICS",
    "ESSENTIAL_METRICS",
    "DcgmLabels",
    "ErrorKind",
    "GpuHealth",
    "MetricsSourceError",
    "Point",
    "PrometheusSource",
    "Sample",
    "Series",
    "gpu_health",
)
