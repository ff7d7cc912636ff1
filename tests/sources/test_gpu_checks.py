"""A cluster polled with a metric store: DCGM findings from Debian's prometheus become
anomalies of the workload running on the node."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from recovery.choices import FailureCategory
from recovery.loop.gpu_checks import metric_store_of
from recovery.loop.poll import poll_cluster
from recovery.models import Anomaly
from tests.factories import ClusterFactory
from tests.fakes import Scripted, job
from tests.sources.conftest import FakeDcgmExporter, PrometheusProcess
from tests.sources.recorded_servers import closed_port_url
from tests.sources.test_prometheus import XID, wait_until_scraped

pytestmark = pytest.mark.django_db


def test_an_xid_on_a_jobs_node_becomes_its_anomaly_once(
    prometheus: PrometheusProcess, dcgm_exporters: dict[str, FakeDcgmExporter]
) -> None:
    """
    GIVEN a cluster whose settings name the Prometheus scraping node-a's and node-b's exporters
    AND an opted-in job running on both nodes
    WHEN node-b's GPU 1 reports Xid 79 and the cluster is polled twice
    THEN one GPU-hardware anomaly is recorded for the job, on node-b
    """
    cluster = ClusterFactory(
        connection_settings={
            "metric_source": {"kind": "prometheus", "url": prometheus.url, "node_label": "Hostname"}
        }
    )
    source, _ = metric_store_of(cluster) or (None, None)
    assert source is not None
    running = job(nodes=["node-a", "node-b"], submit_time=datetime.now(UTC) - timedelta(minutes=5))
    scheduler = Scripted([running])
    poll_cluster(cluster, scheduler)
    dcgm_exporters["node-b"].set(XID, 1, 79)
    wait_until_scraped(source, f"{XID} == 79", "the Xid scraped")

    poll_cluster(cluster, scheduler)
    poll_cluster(cluster, scheduler)

    anomaly = Anomaly.objects.get(workload__cluster=cluster)
    assert anomaly.category == FailureCategory.GPU_HARDWARE
    assert anomaly.implicated_nodes == ["node-b"]


def test_an_unreachable_metric_store_is_reported_and_the_poll_goes_on() -> None:
    cluster = ClusterFactory(
        connection_settings={"metric_source": {"kind": "prometheus", "url": closed_port_url()}}
    )
    summary = poll_cluster(cluster, Scripted([job()]))
    assert summary.jobs_seen == 1
    assert summary.metric_store_error
