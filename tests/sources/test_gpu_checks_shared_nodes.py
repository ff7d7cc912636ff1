"""DCGM findings on a node two jobs share, through Debian's prometheus: a fact about the GPU's
hardware reaches both jobs; what the program on a GPU did (an Xid that is the application's
fault, its utilisation) blames neither, since nothing says whose GPU it is."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest

from recovery.detection.facts import MetricSample, findings_from_gpu_metrics
from recovery.loop.gpu_checks import check_gpu_metrics, is_node_fact, metric_store_of
from recovery.loop.poll import poll_cluster
from recovery.models import Anomaly, Cluster
from tests.factories import ClusterFactory
from tests.fakes import Scripted, job
from tests.sources.conftest import HEALTHY_BUSY_GPU, FakeDcgmExporter, PrometheusProcess
from tests.sources.test_prometheus import UTIL, XID, wait_until_scraped

pytestmark = pytest.mark.django_db


@pytest.fixture
def exporters(dcgm_exporters: dict[str, FakeDcgmExporter]) -> Iterator[dict[str, FakeDcgmExporter]]:
    yield dcgm_exporters
    for exporter in dcgm_exporters.values():
        for gpu in range(exporter.gpus):
            for metric, value in HEALTHY_BUSY_GPU.items():
                exporter.set(metric, gpu, value)


def shared_node(prometheus: PrometheusProcess) -> tuple[Cluster, Scripted]:
    """Alice's job and Mallory's on node-b, Bob's on node-a."""
    cluster = ClusterFactory(
        connection_settings={
            "metric_source": {"kind": "prometheus", "url": prometheus.url, "node_label": "Hostname"}
        }
    )
    started = datetime.now(UTC) - timedelta(minutes=5)
    scheduler = Scripted(
        [
            job(job_id="801", user="alice", nodes=["node-b"], submit_time=started),
            job(job_id="802", user="mallory", nodes=["node-b"], submit_time=started),
            job(job_id="803", user="bob", nodes=["node-a"], submit_time=started),
        ]
    )
    poll_cluster(cluster, scheduler)
    return cluster, scheduler


def check(cluster: Cluster) -> int:
    store = metric_store_of(cluster)
    assert store is not None
    return check_gpu_metrics(cluster, *store, datetime.now(UTC)).ignored


def test_an_xid_that_is_no_hardware_fault_blames_no_job_on_a_shared_node(
    prometheus: PrometheusProcess, exporters: dict[str, FakeDcgmExporter]
) -> None:
    """
    GIVEN Alice's and Mallory's jobs on node-b
    WHEN Mallory's program makes GPU 0 report Xid 13 (an out-of-range access) and GPU 1 Xid 45
         (the cleanup after a killed process)
    THEN neither becomes an anomaly of any job: neither says whose GPU it was
    """
    cluster, _ = shared_node(prometheus)
    store = metric_store_of(cluster)
    assert store is not None
    exporters["node-b"].set(XID, 0, 13)
    exporters["node-b"].set(XID, 1, 45)
    wait_until_scraped(store[0], f"{XID} == 45", "the Xids scraped")
    wait_until_scraped(store[0], f"{XID} == 13", "the Xids scraped")
    ignored = check(cluster)
    assert not Anomaly.objects.filter(workload__cluster=cluster).exists()
    assert ignored == 2


def test_an_idle_gpu_is_what_its_program_does_and_no_fact_about_the_node() -> None:
    """A GPU's utilisation is its program's doing: on a shared node, whose program is unknown."""
    at = datetime.now(UTC)
    samples = [
        MetricSample(at=at + timedelta(seconds=15 * n), node="node-b", gpu=gpu, name=UTIL, value=v)
        for n in range(4)
        for gpu, v in (("0", 97.0), ("1", 0.0))
    ]
    (idle,) = findings_from_gpu_metrics(samples)
    assert idle.signature == "gpu-stuck-idle"
    assert not is_node_fact(idle)


def test_a_hardware_xid_on_a_shared_node_reaches_every_job_there(
    prometheus: PrometheusProcess, exporters: dict[str, FakeDcgmExporter]
) -> None:
    cluster, _ = shared_node(prometheus)
    store = metric_store_of(cluster)
    assert store is not None
    exporters["node-b"].set(XID, 1, 79)
    wait_until_scraped(store[0], f"{XID} == 79", "the Xid scraped")
    check(cluster)
    anomalies = Anomaly.objects.filter(workload__cluster=cluster)
    assert sorted(a.workload.job_id for a in anomalies) == ["801", "802"]
    assert {(a.category, tuple(a.implicated_nodes)) for a in anomalies} == {
        ("gpu_hardware", ("node-b",))
    }
