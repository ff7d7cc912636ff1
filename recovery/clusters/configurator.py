"""The ingestion configurator: point it at a site's log and metric stores, learn what they hold.

``inspect_logs`` finds which kind of store answers (Loki or VictoriaLogs), lists its labels,
proposes which label holds the job id, the node and the rank, pulls a sample of one job's lines
and classifies it with the real detectors; ``inspect_metrics`` does the same for a Prometheus
holding DCGM exporter metrics. Each reports the signals present and missing against what the
detectors need, and every failure as one line. ``save_signals`` stores the result in the
cluster's settings, where the poller reads it (``recovery.loop.poll.log_store_of``).

Whoever runs it makes this server open connections, so both inspections first check the URL's
host against ``CONFIGURATOR_ALLOWED_HOSTS`` (``WR_CONFIGURATOR_ALLOWED_HOSTS``) and connect to
nothing else: an exact host name or address, never a prefix, and never resolved here.
"""

from __future__ import annotations

import ipaddress
import urllib.parse
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import httpx
from django.conf import settings as django_settings
from django.db import transaction
from django.utils import timezone

from recovery.loop.logs import scan
from recovery.models import Cluster
from recovery.sources.http import ErrorKind
from recovery.sources.logs import (
    SOURCES,
    LabelMapping,
    LogSourceError,
    build_source,
)
from recovery.sources.logs.base import render
from recovery.sources.metrics import (
    DETECTOR_METRICS,
    ESSENTIAL_METRICS,
    MetricsSourceError,
    PrometheusSource,
)
from recovery.sources.metrics import build_source as build_metric_source

SAMPLE_WINDOW = timedelta(hours=24)
SAMPLE_LINES = 2000
# Labels a DCGM exporter's series name their node by, most specific first.
NODE_LABEL_CANDIDATES = ("Hostname", "hostname", "node", "host", "instance")
# A store answering these with "not found" or nonsense is not of that kind: try the next one.
_WRONG_KIND = {ErrorKind.NOT_FOUND, ErrorKind.MALFORMED}


@dataclass(frozen=True)
class Signal:
    """One thing the detectors need, and whether the store gives it."""

    name: str
    present: bool
    detail: str


@dataclass
class LogsInspection:
    url: str
    kind: str = ""
    diagnosis: str = ""
    labels: dict[str, list[str]] = field(default_factory=dict)
    mapping: dict[str, str] = field(default_factory=dict)
    sample_job: str = ""
    sample_lines: int = 0
    categories: list[str] = field(default_factory=list)
    signals: list[Signal] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.diagnosis

    def settings(self) -> dict[str, Any]:
        """What ``save_signals`` stores as the cluster's ``log_source``."""
        return {"kind": self.kind, "url": self.url, "mapping": self.mapping}


@dataclass
class MetricsInspection:
    url: str
    diagnosis: str = ""
    node_label: str = ""
    nodes: list[str] = field(default_factory=list)
    metrics_present: list[str] = field(default_factory=list)
    metrics_missing: list[str] = field(default_factory=list)
    signals: list[Signal] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.diagnosis

    def settings(self) -> dict[str, Any]:
        """What ``save_signals`` stores as the cluster's ``metric_source``."""
        return {"kind": "prometheus", "url": self.url, "node_label": self.node_label}


ALLOWED_HOSTS_SETTING = "WR_CONFIGURATOR_ALLOWED_HOSTS"


def refused_target(url: str, allowed_hosts: Iterable[str]) -> str:
    """Why the configurator must not connect to ``url``; empty when its host is allowed.

    The host is read as the HTTP client will read it, and must read the same with the standard
    library, so that no oddly written URL (user info, backslashes) names one host to this check
    and another to the connection.
    """
    try:
        host = _host_key(httpx.URL(url).host)
        other = _host_key(urllib.parse.urlsplit(url).hostname or "")
    except (httpx.InvalidURL, ValueError):
        return f"{url!r} is not a URL the configurator can read"
    if not host or host != other:
        return f"{url!r} does not name one host clearly; write it as http(s)://host:port/"
    allowed = {_host_key(entry) for entry in allowed_hosts if entry.strip()}
    if host in allowed:
        return ""
    if not allowed:
        return (
            f"{host} is not an allowed store host: {ALLOWED_HOSTS_SETTING} is empty, so the "
            "configurator connects to no host; the server's administrator lists the log and "
            "metric store hosts there"
        )
    return (
        f"{host} is not an allowed store host (allowed: {', '.join(sorted(allowed))}); the "
        f"server's administrator can add it to {ALLOWED_HOSTS_SETTING}"
    )


def _host_key(host: str) -> str:
    """A host as compared: lower case, an IP address in its canonical form, no brackets."""
    host = host.strip().strip("[]").lower()
    try:
        return str(ipaddress.ip_address(host))
    except ValueError:
        return host


def _allowed_hosts() -> list[str]:
    return list(getattr(django_settings, "CONFIGURATOR_ALLOWED_HOSTS", []) or [])


def inspect_logs(
    url: str,
    *,
    kind: str = "",
    job_id: str = "",
    timeout: float = 10.0,
    now: datetime | None = None,
) -> LogsInspection:
    """Connect to the log store at ``url``, discover its labels and classify one job's sample."""
    now = now or timezone.now()
    report = LogsInspection(url=url)
    if refusal := refused_target(url, _allowed_hosts()):
        report.diagnosis = refusal
        return report
    kinds = [kind] if kind else list(SOURCES)
    if kind and kind not in SOURCES:
        report.diagnosis = f"unknown log store kind {kind!r}: choose one of {', '.join(SOURCES)}"
        return report
    discovery = None
    for candidate in kinds:
        try:
            # The placeholder mapping only lets discovery run; the proposal replaces it.
            source = build_source(candidate, url, {"job": "job"}, timeout=timeout)
            discovery = source.discover_labels(since=now - SAMPLE_WINDOW)
        except LogSourceError as error:
            report.diagnosis = str(error)
            if error.kind in _WRONG_KIND and candidate != kinds[-1]:
                continue
            return report
        except ValueError as error:
            report.diagnosis = f"{url}: {error}"
            return report
        report.kind, report.diagnosis = candidate, ""
        break
    assert discovery is not None
    report.labels = discovery.labels
    report.mapping = {role: name for role, name in discovery.suggested.items() if name}
    if "job" not in report.mapping:
        names = ", ".join(sorted(report.labels)) or "none"
        report.diagnosis = (
            f"no label holds a job id (labels seen in the last 24 h: {names}); "
            "ship the Slurm job id as a label, e.g. slurm_job_id"
        )
        report.signals = _label_signals(report.mapping)
        return report
    report.sample_job = job_id or next(iter(report.labels.get(report.mapping["job"], [])), "")
    report.signals = _label_signals(report.mapping)
    if not report.sample_job:
        report.diagnosis = f"label {report.mapping['job']!r} has no values in the last 24 h"
        return report
    try:
        source = build_source(report.kind, url, report.mapping, timeout=timeout)
        records = source.fetch(report.sample_job, now - SAMPLE_WINDOW, now, limit=SAMPLE_LINES)
    except (LogSourceError, ValueError) as error:
        report.diagnosis = str(error)
        return report
    report.sample_lines = len(records)
    if not records:
        report.diagnosis = f"no lines for job {report.sample_job} in the last 24 h"
        return report
    result = scan(render(records)[0])
    report.categories = sorted({f.category for f in result.findings if f.category})
    report.signals += [
        Signal(
            "training progress",
            bool(result.progress_lines),
            f"{result.progress_lines} step lines in the sample"
            if result.progress_lines
            else "no step/iteration lines: hangs and stragglers cannot be detected from logs",
        ),
        Signal(
            "checkpoints",
            bool(result.checkpoint_lines),
            f"{result.checkpoint_lines} checkpoint lines"
            if result.checkpoint_lines
            else "no checkpoint lines: lost work cannot be measured",
        ),
        Signal(
            "failures classified",
            bool(report.categories),
            ", ".join(report.categories) or "no failure in this sample (fine for a healthy job)",
        ),
    ]
    return report


def _label_signals(mapping: dict[str, str]) -> list[Signal]:
    needs = {
        "job": "lines cannot be tied to a job",
        "node": "failures cannot name a node to exclude",
        "rank": "hangs and stragglers cannot name a rank",
    }
    return [
        Signal(
            f"{role} label",
            role in mapping,
            f"label {mapping[role]!r}" if role in mapping else f"missing: {why}",
        )
        for role, why in needs.items()
    ]


def inspect_metrics(url: str, *, timeout: float = 10.0) -> MetricsInspection:
    """Connect to Prometheus at ``url`` and see which DCGM metrics and node labels it holds."""
    report = MetricsInspection(url=url)
    if refusal := refused_target(url, _allowed_hosts()):
        report.diagnosis = refusal
        return report
    try:
        source = build_metric_source(PrometheusSource.kind, url, timeout=timeout)
        names = set(source.label_values("__name__"))
    except MetricsSourceError as error:
        report.diagnosis = str(error)
        return report
    report.metrics_present = [m for m in DETECTOR_METRICS if m in names]
    report.metrics_missing = [m for m in DETECTOR_METRICS if m not in names]
    if not report.metrics_present:
        report.diagnosis = (
            "no DCGM exporter metrics (DCGM_FI_*) in this Prometheus: is dcgm-exporter scraped?"
        )
        return report
    try:
        labels = set(source.label_names(match=[report.metrics_present[0]]))
        report.node_label = next((c for c in NODE_LABEL_CANDIDATES if c in labels), "")
        if report.node_label:
            report.nodes = source.label_values(report.node_label, match=[report.metrics_present[0]])
    except MetricsSourceError as error:
        report.diagnosis = str(error)
        return report
    if not report.node_label:
        report.diagnosis = f"no label names the node on {report.metrics_present[0]}"
    report.signals = [
        Signal(
            metric,
            metric in report.metrics_present,
            "present" if metric in report.metrics_present else "missing",
        )
        for metric in ESSENTIAL_METRICS
    ]
    return report


def save_signals(
    cluster: Cluster,
    *,
    logs: LogsInspection | None = None,
    metrics: MetricsInspection | None = None,
) -> dict[str, Any]:
    """Store what the inspections found in the cluster's settings; return the new settings.

    Only a successful inspection is saved: a failed one would make the poller read nothing.
    """
    with transaction.atomic():
        locked = Cluster.objects.select_for_update().get(pk=cluster.pk)
        settings = dict(locked.connection_settings or {})
        if logs is not None and logs.ok:
            LabelMapping.from_dict(logs.mapping)  # refuses a mapping the poller could not use
            settings["log_source"] = logs.settings()
        if metrics is not None and metrics.ok:
            settings["metric_source"] = metrics.settings()
        locked.connection_settings = settings
        locked.save(update_fields=["connection_settings", "updated_at"])
    cluster.connection_settings = settings
    return settings


__all__ = [
    "LogsInspection",
    "MetricsInspection",
    "Signal",
    "inspect_logs",
    "inspect_metrics",
    "save_signals",
]
