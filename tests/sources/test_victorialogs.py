"""The VictoriaLogs connector, over real HTTP against a recorded-format VictoriaLogs."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from recovery.loop.log_stores import ingest_from_source
from recovery.models import Anomaly, LogCursor
from recovery.sources.logs import (
    ErrorKind,
    HttpSettings,
    LabelMapping,
    LogSourceError,
    MappingError,
    VictoriaLogsSource,
    build_source,
)
from recovery.sources.logs.base import to_ns
from recovery.sources.logs.victorialogs import format_ns, parse_rfc3339_ns, parse_stream
from tests.factories import AttemptFactory, WorkloadFactory
from tests.sources.recorded_servers import (
    Fault,
    RecordedServer,
    closed_port_url,
    serving,
    victorialogs,
)

T0 = 1_717_000_000_123_456_789
QUERY = "/select/logsql/query"
MAPPING = LabelMapping(job="slurm_job_id", node="host", rank="rank")
NCCL_ERROR = (
    "torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:3763, unhandled "
    "system error (run with NCCL_DEBUG=INFO for details), NCCL version 2.28.8"
)


def row(
    ts: int, msg: str, job: str = "4242", host: str = "gpu-001", rank: str = "0"
) -> dict[str, Any]:
    return {
        "_time": ts,
        "_msg": msg,
        "_stream": f'{{host="{host}",slurm_job_id="{job}"}}',
        "slurm_job_id": job,
        "host": host,
        "rank": rank,
    }


@pytest.fixture
def rows() -> list[dict[str, Any]]:
    return []


@pytest.fixture
def server(rows: list[dict[str, Any]]) -> Iterator[RecordedServer]:
    with serving(victorialogs(rows)) as running:
        yield running


def source(
    server: RecordedServer, mapping: LabelMapping = MAPPING, **options: Any
) -> VictoriaLogsSource:
    timeout = options.pop("timeout", 10.0)
    return VictoriaLogsSource(HttpSettings(server.url, timeout=timeout), mapping, **options)


def test_the_query_quotes_names_and_values_and_bounds_time_with_pipes(
    server: RecordedServer, rows: list[dict[str, Any]]
) -> None:
    hostile = 'a" | delete | "b\\'
    rows.append({**row(T0, "mine"), "cluster": hostile})
    rows.append({**row(T0, "not mine"), "cluster": "a"})
    mapping = LabelMapping(job="slurm_job_id", node="host", static_selectors={"cluster": hostile})
    records = source(server, mapping, page_size=7).fetch("4242", T0, T0 + 1)
    assert [r.line for r in records] == ["mine"]
    (sent,) = server.queries(QUERY)
    assert sent["query"] == (
        '"slurm_job_id":="4242" "cluster":="a\\" | delete | \\"b\\\\" '
        "_time:[2024-05-29T16:26:40.123456789Z, 2024-05-29T16:26:40.123456790Z)"
        ' | sort by (_time) | limit 7 | fields "_time", "_msg", "_stream", "host"'
    )


def test_field_names_that_could_break_the_query_are_refused() -> None:
    for mapping in (
        LabelMapping(job='job"'),
        LabelMapping(job="job", node="host name"),
        LabelMapping(job="job", rank="rank|x"),
    ):
        with pytest.raises(MappingError):
            VictoriaLogsSource(HttpSettings("http://127.0.0.1:9"), mapping)
    VictoriaLogsSource(HttpSettings("http://127.0.0.1:9"), LabelMapping(job="kubernetes.pod-id"))


def test_times_keep_their_nanoseconds_both_ways() -> None:
    assert format_ns(T0) == "2024-05-29T16:26:40.123456789Z"
    assert parse_rfc3339_ns(format_ns(T0)) == T0
    assert parse_rfc3339_ns("2024-05-29T18:26:40.5+02:00") == 1_717_000_000_500_000_000
    assert parse_rfc3339_ns("yesterday") is None


def test_stream_fields_are_read_when_the_field_is_not_returned_separately() -> None:
    assert parse_stream('{host="gpu-1",note="a\\"b"}') == {"host": "gpu-1", "note": 'a"b'}


def test_pages_restart_at_the_boundary_timestamp_and_lose_or_repeat_nothing(
    server: RecordedServer, rows: list[dict[str, Any]]
) -> None:
    stamps = [1, 2, 2, 2, 3, 3, 4, 5, 5, 5, 6]
    for number, offset in enumerate(stamps):
        rows.append(row(T0 + offset, f"line {number}", host=f"gpu-{number % 3:03}"))
    rows.append(row(T0 + 3, "another job", job="4243"))

    records = source(server, page_size=3).fetch("4242", T0, T0 + 100)

    assert sorted(r.line for r in records) == sorted(f"line {n}" for n in range(len(stamps)))
    assert [r.timestamp_ns - T0 for r in records] == stamps
    assert len(server.queries(QUERY)) >= 4


def test_fields_become_node_and_rank_through_the_mapping(
    server: RecordedServer, rows: list[dict[str, Any]]
) -> None:
    rows.append(row(T0, "a", host="gpu-007", rank="12"))
    stream_only = row(T0 + 1, "b", host="gpu-008")
    del stream_only["host"]  # only in _stream
    rows.append(stream_only)
    records = source(server).fetch("4242", T0, T0 + 10)
    assert [(r.node, r.rank) for r in records] == [("gpu-007", 12), ("gpu-008", 0)]


def test_binary_and_huge_messages_are_kept_bounded_and_printable(
    server: RecordedServer, rows: list[dict[str, Any]]
) -> None:
    rows.append(row(T0, "\x00bin\ud800ary"))
    rows.append(row(T0 + 1, "y" * 200_000))
    first, second = source(server).fetch("4242", T0, T0 + 10)
    first.line.encode("utf-8")
    assert "\x00" not in first.line
    assert len(second.line) < 20_000


def test_discovery_lists_fields_with_a_few_values_and_suggests_a_mapping(
    server: RecordedServer, rows: list[dict[str, Any]]
) -> None:
    for number in range(7):
        rows.append(row(T0 + number, "x", job=str(5000 + number), rank=str(number)))
    found = build_source("victorialogs", server.url, {"job": "slurm_job_id"}).discover_labels()
    assert set(found.labels) == {"slurm_job_id", "host", "rank"}
    assert found.labels["slurm_job_id"] == ["5000", "5001", "5002", "5003", "5004"]
    assert found.suggested == {"job": "slurm_job_id", "node": "host", "rank": "rank"}
    names = server.queries("/select/logsql/field_names")[0]
    assert names["query"] == "*" and names["start"] < names["end"]


@pytest.mark.parametrize(
    ("fault", "kind", "said"),
    [
        (Fault(401, b"Unauthorized"), ErrorKind.AUTH, "refused the credentials"),
        (
            Fault(400, b"cannot parse query [foo |]: missing pipe name; context: [foo |]"),
            ErrorKind.BAD_QUERY,
            "cannot parse query [foo |]: missing pipe name",
        ),
        (Fault(404, b"missing route"), ErrorKind.NOT_FOUND, "not a VictoriaLogs server?"),
        (Fault(500, b"internal error"), ErrorKind.SERVER, "(HTTP 500): internal error"),
        (Fault(200, b'{"_msg":"ok"}\n<html>'), ErrorKind.MALFORMED, "line 1 has no _time"),
        (Fault(200, b"<html>proxy login</html>\n"), ErrorKind.MALFORMED, "not JSON"),
        (
            Fault(200, json.dumps({"_time": "soon", "_msg": "x"}).encode()),
            ErrorKind.MALFORMED,
            "_time 'soon'",
        ),
    ],
)
def test_each_failure_has_a_one_line_diagnosis(
    server: RecordedServer, fault: Fault, kind: str, said: str
) -> None:
    server.fail(QUERY, fault)
    with pytest.raises(LogSourceError) as raised:
        source(server).fetch("4242", T0, T0 + 1)
    assert raised.value.kind == kind
    assert said in str(raised.value)
    assert "\n" not in str(raised.value)


def test_a_closed_port_and_a_slow_server_are_told_apart(server: RecordedServer) -> None:
    with pytest.raises(LogSourceError) as refused:
        build_source("victorialogs", closed_port_url(), MAPPING).fetch("4242", T0, T0 + 1)
    server.fail(QUERY, Fault(200, b"", delay=1.5))
    with pytest.raises(LogSourceError) as slow:
        source(server, timeout=0.3).fetch("4242", T0, T0 + 1)
    assert (refused.value.kind, slow.value.kind) == (ErrorKind.UNREACHABLE, ErrorKind.TIMEOUT)


def test_discovery_with_a_wrong_shape_is_diagnosed(server: RecordedServer) -> None:
    server.fail("/select/logsql/field_names", Fault(200, b'{"data": []}'))
    with pytest.raises(LogSourceError, match='no "values" list'):
        source(server).discover_labels()


@pytest.mark.django_db
def test_an_nccl_error_in_victorialogs_becomes_an_anomaly_once(
    server: RecordedServer, rows: list[dict[str, Any]]
) -> None:
    now = timezone.now()
    workload = WorkloadFactory(job_id="4242", submit_time=now - timedelta(hours=1))
    AttemptFactory(workload=workload, number=1, nodes=["gpu-001", "gpu-002"])
    base = to_ns(now - timedelta(minutes=3))
    rows.append(row(base, NCCL_ERROR, host="GPU-Host-B", rank="5"))
    vl_source = build_source("victorialogs", server.url, MAPPING)

    first = ingest_from_source(workload, vl_source, now)
    second = ingest_from_source(workload, vl_source, now + timedelta(seconds=30))

    assert (first.anomalies_new, second.anomalies_new) == (1, 0)
    anomaly = Anomaly.objects.get(workload=workload)
    assert "GPU-Host-B" in anomaly.implicated_nodes
    assert anomaly.implicated_ranks == [5]
    cursor = LogCursor.objects.get(workload=workload)
    assert cursor.path.startswith('victorialogs:"slurm_job_id":="4242"')
    assert cursor.offset == base
