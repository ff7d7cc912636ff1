"""The configurator is tried against the same Prometheus and DCGM exporters as the metric
sources: their fixtures, shared."""

from tests.sources.conftest import dcgm_exporters, prometheus

__all__ = ["dcgm_exporters", "prometheus"]
