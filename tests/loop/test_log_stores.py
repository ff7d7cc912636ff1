"""A cluster whose jobs log to Loki: every poll reads the new lines of each job from the store."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

import pytest

from recovery.choices import FailureCategory
from recovery.loop.poll import log_store_of, poll_cluster
from recovery.models import Anomaly
from recovery.sources.logs.base import to_ns
from tests.factories import ClusterFactory
from tests.fakes import SUBMITTED, Scripted, job
from tests.sources.recorded_servers import (
    LokiEntry,
    RecordedServer,
    closed_port_url,
    loki,
    serving,
)

pytestmark = pytest.mark.django_db

NCCL_ERROR = (
    "torch.distributed.DistBackendError: NCCL error in: /opt/pytorch/torch/csrc/distributed/"
    "c10d/ProcessGroupNCCL.cpp:3763, unhandled system error (run with NCCL_DEBUG=INFO for "
    "details), NCCL version 2.28.8"
)
MAPPING = {"job": "slurm_job_id", "node": "host", "rank": "rank"}


@pytest.fixture
def entries() -> list[LokiEntry]:
    return []


@pytest.fixture
def server(entries: list[LokiEntry]) -> Iterator[RecordedServer]:
    with serving(loki(entries)) as running:
        yield running


def test_a_poll_reads_each_jobs_new_lines_from_the_store_once(
    server: RecordedServer, entries: list[LokiEntry]
) -> None:
    """
    GIVEN a cluster whose settings name a Loki store and a running opted-in job
    WHEN the job's rank logs an NCCL error to Loki and the cluster is polled twice
    THEN one anomaly is recorded for the job, on the node the labels name
    """
    cluster = ClusterFactory(
        connection_settings={"log_source": {"kind": "loki", "url": server.url, "mapping": MAPPING}}
    )
    at = to_ns(SUBMITTED + timedelta(seconds=30))
    entries.append(
        LokiEntry({"slurm_job_id": "4242", "host": "node002", "rank": "3"}, at, NCCL_ERROR)
    )
    scheduler = Scripted([job()])
    now = SUBMITTED + timedelta(minutes=2)

    first = poll_cluster(cluster, scheduler, now=now)
    second = poll_cluster(cluster, scheduler, now=now + timedelta(seconds=10))

    anomaly = Anomaly.objects.get(workload__cluster=cluster)
    assert anomaly.category == FailureCategory.NCCL_ERROR
    assert anomaly.implicated_nodes == ["node002"]
    assert first.anomalies_new >= 1
    assert second.log_store_error == ""
    assert Anomaly.objects.filter(workload__cluster=cluster).count() == 1


def test_an_unreachable_store_is_reported_and_the_poll_goes_on() -> None:
    cluster = ClusterFactory(
        connection_settings={
            "log_source": {"kind": "loki", "url": closed_port_url(), "mapping": MAPPING}
        }
    )
    summary = poll_cluster(cluster, Scripted([job()]), now=SUBMITTED + timedelta(minutes=2))
    assert summary.jobs_seen == 1
    assert summary.log_store_error
    cluster.refresh_from_db()
    assert cluster.last_poll_error == ""


def test_unusable_store_settings_are_ignored() -> None:
    cluster = ClusterFactory(
        connection_settings={"log_source": {"kind": "splunk", "url": "http://x", "mapping": {}}}
    )
    assert log_store_of(cluster) is None
    assert log_store_of(ClusterFactory()) is None


def test_a_peer_reported_failure_names_no_node_whatever_the_labels_say(
    server: RecordedServer, entries: list[LokiEntry]
) -> None:
    """
    GIVEN a job whose rank on node002 logs to Loki that its peer closed the connection
    WHEN the cluster is polled
    THEN the interconnect anomaly implicates no node: node002 is where it was seen, kept apart
    """
    cluster = ClusterFactory(
        connection_settings={"log_source": {"kind": "loki", "url": server.url, "mapping": MAPPING}}
    )
    at = to_ns(SUBMITTED + timedelta(seconds=30))
    line = "misc/socket.cc:538 NCCL WARN Net : Connection closed by remote peer gpu-a100-022<47861>"
    entries.append(LokiEntry({"slurm_job_id": "4242", "host": "node002", "rank": "3"}, at, line))
    poll_cluster(cluster, Scripted([job()]), now=SUBMITTED + timedelta(minutes=2))

    anomaly = Anomaly.objects.get(workload__cluster=cluster)
    assert (anomaly.category, anomaly.signature) == ("interconnect", "nccl-socket-peer-lost")
    assert anomaly.implicated_nodes == [] and anomaly.implicated_ranks == []
    assert anomaly.details["reported_by_nodes"] == ["node002"]
