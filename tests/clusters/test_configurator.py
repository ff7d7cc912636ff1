"""The ingestion configurator against stores that answer: recorded Loki and VictoriaLogs
servers, and Debian's prometheus scraping DCGM exporters the tests serve."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from pytest_django.fixtures import Settings as SettingsWrapper

from recovery.clusters.configurator import inspect_logs, inspect_metrics, save_signals
from recovery.loop.poll import log_store_of
from recovery.sources.logs.base import to_ns
from tests.factories import ClusterFactory
from tests.sources.conftest import PrometheusProcess
from tests.sources.recorded_servers import (
    LokiEntry,
    RecordedServer,
    closed_port_url,
    loki,
    serving,
    victorialogs,
)

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _stores_on_loopback_allowed(settings: SettingsWrapper) -> None:
    # Every store here listens on loopback; tests/security/test_access.py covers refusals.
    settings.CONFIGURATOR_ALLOWED_HOSTS = ["127.0.0.1"]


NOW = datetime.now(UTC).replace(microsecond=0)
NCCL_ERROR = (
    "torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:3763, unhandled "
    "system error (run with NCCL_DEBUG=INFO for details), NCCL version 2.28.8"
)
STEP = " iteration      120/   1000 | lm loss: 2.41 | elapsed time per iteration (ms): 512.3"


def lines_of_job_4242() -> list[tuple[int, str, str, str]]:
    at = to_ns(NOW - timedelta(minutes=10))
    return [(at, STEP, "gpu-001", "0"), (at + 1_000, NCCL_ERROR, "gpu-002", "3")]


@pytest.fixture
def loki_server() -> Iterator[RecordedServer]:
    entries = [
        LokiEntry({"slurm_job_id": "4242", "host": host, "rank": rank}, ts, line)
        for ts, line, host, rank in lines_of_job_4242()
    ]
    with serving(loki(entries)) as running:
        yield running


@pytest.fixture
def victorialogs_server() -> Iterator[RecordedServer]:
    rows = [
        {
            "_time": ts,
            "_msg": line,
            "_stream": f'{{host="{host}",slurm_job_id="4242"}}',
            "slurm_job_id": "4242",
            "host": host,
            "rank": rank,
        }
        for ts, line, host, rank in lines_of_job_4242()
    ]
    with serving(victorialogs(rows)) as running:
        yield running


def test_it_recognises_loki_proposes_a_mapping_and_classifies_a_sample(
    loki_server: RecordedServer,
) -> None:
    report = inspect_logs(loki_server.url, now=NOW)
    assert report.ok, report.diagnosis
    assert report.kind == "loki"
    assert report.mapping == {"job": "slurm_job_id", "node": "host", "rank": "rank"}
    assert report.sample_job == "4242" and report.sample_lines == 2
    assert report.categories == ["nccl_error"]
    present = {s.name: s.present for s in report.signals}
    assert present["training progress"] and present["failures classified"]
    assert not present["checkpoints"]


def test_it_finds_a_victorialogs_store_after_loki_does_not_answer(
    victorialogs_server: RecordedServer,
) -> None:
    report = inspect_logs(victorialogs_server.url, job_id="4242", now=NOW)
    assert report.ok, report.diagnosis
    assert report.kind == "victorialogs"
    assert report.mapping["job"] == "slurm_job_id"
    assert report.categories == ["nccl_error"]


def test_an_unreachable_store_gets_a_one_line_diagnosis() -> None:
    report = inspect_logs(closed_port_url(), kind="loki", timeout=2)
    assert not report.ok
    assert "\n" not in report.diagnosis and report.diagnosis


def test_a_store_without_a_job_label_says_which_labels_it_has() -> None:
    entries = [LokiEntry({"app": "trainer", "pod": "p-1"}, to_ns(NOW), STEP)]
    with serving(loki(entries)) as server:
        report = inspect_logs(server.url, kind="loki", now=NOW)
    assert not report.ok
    assert "no label holds a job id" in report.diagnosis
    assert "app" in report.diagnosis and "pod" in report.diagnosis


def test_dcgm_metrics_and_the_node_label_are_found_in_prometheus(
    prometheus: PrometheusProcess,
) -> None:
    report = inspect_metrics(prometheus.url)
    assert report.ok, report.diagnosis
    assert report.node_label == "Hostname"
    assert "DCGM_FI_DEV_XID_ERRORS" in report.metrics_present
    assert report.nodes


def test_a_url_that_is_not_prometheus_is_diagnosed(loki_server: RecordedServer) -> None:
    report = inspect_metrics(loki_server.url, timeout=2)
    assert not report.ok and report.diagnosis


def test_saved_settings_are_what_the_poller_reads(loki_server: RecordedServer) -> None:
    cluster = ClusterFactory(connection_settings={"slurm_conf": "/etc/slurm/slurm.conf"})
    report = inspect_logs(loki_server.url, now=NOW)
    save_signals(cluster, logs=report)
    cluster.refresh_from_db()
    assert cluster.connection_settings["slurm_conf"] == "/etc/slurm/slurm.conf"
    assert cluster.connection_settings["log_source"]["kind"] == "loki"
    assert log_store_of(cluster) is not None


def test_the_command_saves_on_confirmation(
    loki_server: RecordedServer, prometheus: PrometheusProcess
) -> None:
    cluster = ClusterFactory(name="lab")
    out = StringIO()
    call_command(
        "configure_signals",
        "--logs",
        loki_server.url,
        "--metrics",
        prometheus.url,
        "--job",
        "4242",
        "--cluster",
        "lab",
        "--yes",
        stdout=out,
    )
    text = out.getvalue()
    assert "proposed mapping: job=slurm_job_id, node=host, rank=rank" in text
    assert "Saved to cluster lab." in text
    cluster.refresh_from_db()
    assert set(cluster.connection_settings) >= {"log_source", "metric_source"}


def test_the_command_fails_with_the_diagnosis_and_saves_nothing() -> None:
    cluster = ClusterFactory(name="lab")
    out = StringIO()
    with pytest.raises(CommandError):
        call_command(
            "configure_signals", "--logs", closed_port_url(), "--cluster", "lab", stdout=out
        )
    assert "problem:" in out.getvalue()
    cluster.refresh_from_db()
    assert "log_source" not in cluster.connection_settings
