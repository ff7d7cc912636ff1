"""The Loki connector, over real HTTP against a recorded-format Loki on loopback."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.utils import timezone

from recovery.choices import AuditKind
from recovery.loop.log_stores import ingest_from_source
from recovery.models import Anomaly, AuditEvent, LogCursor
from recovery.sources.logs import (
    ErrorKind,
    HttpSettings,
    LabelMapping,
    LogSourceError,
    LokiSource,
    MappingError,
    build_source,
)
from recovery.sources.logs.base import MAX_LINE_CHARS, TRUNCATION_MARK, to_ns
from tests.factories import AttemptFactory, WorkloadFactory
from tests.sources.recorded_servers import (
    Fault,
    LokiEntry,
    RecordedServer,
    closed_port_url,
    loki,
    serving,
)

T0 = 1_717_000_000_000_000_000
QUERY_RANGE = "/loki/api/v1/query_range"
MAPPING = LabelMapping(job="slurm_job_id", node="host", rank="rank", static_selectors={})
NCCL_ERROR = (
    "torch.distributed.DistBackendError: NCCL error in: /opt/pytorch/torch/csrc/distributed/"
    "c10d/ProcessGroupNCCL.cpp:3763, unhandled system error (run with NCCL_DEBUG=INFO for "
    "details), NCCL version 2.28.8"
)


def entry(
    ts: int, line: str, job: str = "4242", host: str = "gpu-001", rank: str = "0"
) -> LokiEntry:
    return LokiEntry({"slurm_job_id": job, "host": host, "rank": rank}, ts, line)


@pytest.fixture
def entries() -> list[LokiEntry]:
    return []


@pytest.fixture
def server(entries: list[LokiEntry]) -> Iterator[RecordedServer]:
    with serving(loki(entries)) as running:
        yield running


def source(server: RecordedServer, mapping: LabelMapping = MAPPING, **options: Any) -> LokiSource:
    http_options = {k: options.pop(k) for k in list(options) if k in ("timeout", "headers")}
    http_options.update({k: options.pop(k) for k in list(options) if k.startswith("max_resp")})
    return LokiSource(HttpSettings(server.url, **http_options), mapping, **options)


# ---------------------------------------------------------------- queries


def test_the_stream_selector_quotes_every_value() -> None:
    mapping = LabelMapping(job="slurm_job_id", static_selectors={"cluster": 'a"b\\c}, x="y'})
    loki_source = LokiSource(HttpSettings("http://127.0.0.1:9"), mapping)
    assert loki_source.query_for("4242") == ('{slurm_job_id="4242",cluster="a\\"b\\\\c}, x=\\"y"}')


def test_a_quoted_selector_matches_exactly_its_value_on_the_server(
    server: RecordedServer, entries: list[LokiEntry]
) -> None:
    hostile = 'a"b\\c}, x="y'
    entries.append(LokiEntry({"slurm_job_id": "4242", "cluster": hostile}, T0, "mine"))
    entries.append(LokiEntry({"slurm_job_id": "4242", "cluster": "a"}, T0, "not mine"))
    mapping = LabelMapping(job="slurm_job_id", static_selectors={"cluster": hostile})
    records = source(server, mapping).fetch("4242", T0, T0 + 1)
    assert [r.line for r in records] == ["mine"]
    sent = server.queries(QUERY_RANGE)[0]
    assert sent["direction"] == "forward"
    assert (sent["start"], sent["end"]) == (str(T0), str(T0 + 1))


@pytest.mark.parametrize(
    "mapping",
    [
        LabelMapping(job="job-id"),
        LabelMapping(job="job", node="host name"),
        LabelMapping(job=""),
        LabelMapping(job="job", static_selectors={"cluster": ""}),
        LabelMapping(job="job", static_selectors={"cluster": "a\nb"}),
    ],
)
def test_a_mapping_loki_cannot_express_is_refused(mapping: LabelMapping) -> None:
    with pytest.raises(MappingError):
        LokiSource(HttpSettings("http://127.0.0.1:9"), mapping)


def test_a_job_id_with_control_characters_never_reaches_the_server(
    server: RecordedServer,
) -> None:
    with pytest.raises(MappingError):
        source(server).fetch('42\n} or {x=~".*"', T0, T0 + 10)
    assert server.requests == []


def test_a_saved_mapping_round_trips_and_bad_shapes_are_refused() -> None:
    mapping = LabelMapping(job="jobid", node="host", static_selectors={"cluster": "a100"})
    assert LabelMapping.from_dict(mapping.to_dict()) == mapping
    for bad in ({"job": 3}, {"job": "j", "colour": "x"}, {"job": "j", "static_selectors": []}):
        with pytest.raises(MappingError):
            LabelMapping.from_dict(bad)


# ---------------------------------------------------------------- paging


def test_pages_restart_at_the_boundary_timestamp_and_lose_or_repeat_nothing(
    server: RecordedServer, entries: list[LokiEntry]
) -> None:
    """
    GIVEN lines of two ranks where several share a timestamp across page boundaries
    WHEN the job's lines are fetched three at a time
    THEN every line comes back once, in time order, and each page starts at the last
         timestamp of the one before
    """
    stamps = [1, 2, 2, 2, 3, 3, 4, 5, 5, 5, 6]
    for number, offset in enumerate(stamps):
        entries.append(entry(T0 + offset, f"line {number}", rank=str(number % 2)))
    entries.append(entry(T0 + 3, "another job", job="4243"))

    records = source(server, page_size=3).fetch("4242", T0, T0 + 100)

    assert sorted(r.line for r in records) == sorted(f"line {n}" for n in range(len(stamps)))
    assert [r.timestamp_ns - T0 for r in records] == stamps
    starts = [int(q["start"]) - T0 for q in server.queries(QUERY_RANGE)]
    assert starts[0] == 0
    assert starts[1:] == sorted(starts[1:]) and len(starts) >= 4


def test_a_capped_fetch_ends_on_a_whole_timestamp_so_the_next_one_resumes_cleanly(
    server: RecordedServer, entries: list[LokiEntry]
) -> None:
    stamps = [1, 2, 2, 2, 3, 3, 4]
    for number, offset in enumerate(stamps):
        entries.append(entry(T0 + offset, f"line {number}", rank=str(number)))
    loki_source = source(server, page_size=2)

    first = loki_source.fetch("4242", T0, T0 + 100, limit=5)
    second = loki_source.fetch("4242", first[-1].timestamp_ns + 1, T0 + 100, limit=5)

    assert [r.timestamp_ns - T0 for r in first] == [1, 2, 2, 2]
    both = first + second
    assert sorted(r.line for r in both) == sorted(f"line {n}" for n in range(len(stamps)))
    assert [r.timestamp_ns - T0 for r in both] == stamps


def test_more_lines_at_one_instant_than_a_page_holds_are_read_with_a_larger_page(
    server: RecordedServer, entries: list[LokiEntry]
) -> None:
    for number in range(5):
        entries.append(entry(T0 + 7, f"same instant {number}", rank=str(number)))
    entries.append(entry(T0 + 9, "after"))
    records = source(server, page_size=2).fetch("4242", T0, T0 + 100)
    assert sorted(r.line for r in records[:5]) == [f"same instant {n}" for n in range(5)]
    assert records[-1].line == "after"
    assert {q["limit"] for q in server.queries(QUERY_RANGE)} >= {"2", "4", "8"}


def test_past_the_largest_page_an_instant_is_skipped_with_a_warning_not_a_loop(
    server: RecordedServer, entries: list[LokiEntry], caplog: pytest.LogCaptureFixture
) -> None:
    for number in range(9):
        entries.append(entry(T0 + 7, f"same instant {number}", rank=str(number)))
    entries.append(entry(T0 + 9, "after"))
    loki_source = source(server, page_size=2)
    loki_source.max_page_size = 4
    with caplog.at_level(logging.WARNING):
        records = loki_source.fetch("4242", T0, T0 + 100)
    assert len(records) == 5 and records[-1].line == "after"
    assert len(server.requests) < 10
    assert "skipping past that instant" in caplog.text


def test_labels_become_node_and_rank_through_the_mapping(
    server: RecordedServer, entries: list[LokiEntry]
) -> None:
    entries.append(entry(T0 + 1, "a", host="gpu-007", rank="12"))
    entries.append(entry(T0 + 2, "b", host="gpu-008", rank="not-a-rank"))
    records = source(server).fetch("4242", T0, T0 + 10)
    assert [(r.node, r.rank) for r in records] == [("gpu-007", 12), ("gpu-008", None)]
    assert records[0].labels["slurm_job_id"] == "4242"
    assert records[0].at.year == 2024


def test_binary_and_huge_lines_are_kept_bounded_and_printable(
    server: RecordedServer, entries: list[LokiEntry]
) -> None:
    entries.append(entry(T0 + 1, "\x00\x01 bin \ud800 \udfff tail"))
    entries.append(entry(T0 + 2, "x" * 300_000))
    records = source(server).fetch("4242", T0, T0 + 10)
    assert "\x00" not in records[0].line and "tail" in records[0].line
    records[0].line.encode("utf-8")  # no lone surrogates left
    assert len(records[1].line) == MAX_LINE_CHARS + len(TRUNCATION_MARK)


def test_invalid_utf8_in_the_body_is_replaced_not_fatal(server: RecordedServer) -> None:
    body = (
        b'{"status":"success","data":{"resultType":"streams","result":[{"stream":'
        b'{"slurm_job_id":"4242"},"values":[["' + str(T0).encode() + b'","ok \xff\xfe end"]]}]}}'
    )
    server.fail(QUERY_RANGE, Fault(200, body, content_type="application/json"))
    (record,) = source(server).fetch("4242", T0, T0 + 10)
    assert record.line == "ok \ufffd\ufffd end"


# ---------------------------------------------------------------- discovery and auth


def test_discovery_lists_labels_with_a_few_values_and_suggests_a_mapping(
    server: RecordedServer, entries: list[LokiEntry]
) -> None:
    for number in range(8):
        entries.append(entry(T0 + number, "x", job=str(4000 + number), host=f"gpu-{number:03}"))
    found = build_source("loki", server.url, {"job": "slurm_job_id"}).discover_labels()
    assert set(found.labels) == {"slurm_job_id", "host", "rank"}
    assert found.labels["host"] == ["gpu-000", "gpu-001", "gpu-002", "gpu-003", "gpu-004"]
    assert found.suggested == {"job": "slurm_job_id", "node": "host", "rank": "rank"}


def test_credentials_and_the_tenant_are_sent_as_headers(server: RecordedServer) -> None:
    build_source(
        "loki", server.url, MAPPING.to_dict(), bearer_token="s3cret", tenant="team-a"
    ).fetch("4242", T0, T0 + 1)
    build_source("loki", server.url, MAPPING, username="u", password="p").fetch("4242", T0, T0 + 1)
    first, second = (r.headers for r in server.requests)
    assert first["authorization"] == "Bearer s3cret"
    assert first["x-scope-orgid"] == "team-a"
    assert second["authorization"] == "Basic dTpw"
    assert "s3cret" not in repr(build_source("loki", server.url, MAPPING, bearer_token="s3cret"))


# ---------------------------------------------------------------- diagnoses


@pytest.mark.parametrize(
    ("fault", "kind", "said"),
    [
        (Fault(401, b"no org id\n"), ErrorKind.AUTH, "refused the credentials"),
        (Fault(403, b""), ErrorKind.AUTH, "denied access"),
        (
            Fault(400, b"parse error at line 1, col 13: syntax error: unexpected IDENTIFIER\n"),
            ErrorKind.BAD_QUERY,
            "parse error at line 1, col 13: syntax error: unexpected IDENTIFIER",
        ),
        (Fault(404, b"404 page not found\n"), ErrorKind.NOT_FOUND, "not a Loki server?"),
        (Fault(500, b"rpc error: code = Unavailable"), ErrorKind.SERVER, "HTTP 500"),
        (Fault(502, b"<html>bad gateway</html>"), ErrorKind.SERVER, "HTTP 502"),
        (Fault(200, b"<html>login</html>"), ErrorKind.MALFORMED, "not JSON"),
        (
            Fault(200, json.dumps({"status": "success", "data": {"result": 3}}).encode()),
            ErrorKind.MALFORMED,
            "wrong shape",
        ),
        (Fault(200, b'{"status":"error","data":null}'), ErrorKind.MALFORMED, "wrong shape"),
        (Fault(302, b""), ErrorKind.HTTP, "redirects"),
    ],
)
def test_each_failure_has_a_one_line_diagnosis(
    server: RecordedServer, fault: Fault, kind: str, said: str
) -> None:
    server.fail(QUERY_RANGE, fault)
    with pytest.raises(LogSourceError) as raised:
        source(server).fetch("4242", T0, T0 + 1)
    assert raised.value.kind == kind
    assert said in str(raised.value)
    assert "\n" not in str(raised.value)


def test_a_closed_port_is_reported_as_unreachable() -> None:
    with pytest.raises(LogSourceError) as raised:
        build_source("loki", closed_port_url(), MAPPING).fetch("4242", T0, T0 + 1)
    assert raised.value.kind == ErrorKind.UNREACHABLE
    assert "refused the connection" in str(raised.value)


def test_a_slow_server_times_out(server: RecordedServer) -> None:
    server.fail(QUERY_RANGE, Fault(200, b"{}", delay=1.5))
    with pytest.raises(LogSourceError) as raised:
        source(server, timeout=0.3).fetch("4242", T0, T0 + 1)
    assert raised.value.kind == ErrorKind.TIMEOUT
    assert "within 0.3s" in str(raised.value)


def test_an_oversized_answer_is_refused(server: RecordedServer) -> None:
    server.fail(QUERY_RANGE, Fault(200, b"{" + b" " * 5000 + b"}"))
    with pytest.raises(LogSourceError) as raised:
        source(server, max_response_bytes=1000).fetch("4242", T0, T0 + 1)
    assert raised.value.kind == ErrorKind.OVERSIZED


def test_discovery_failures_are_diagnosed_too(server: RecordedServer) -> None:
    server.fail("/loki/api/v1/labels", Fault(401, b"unauthorized"))
    with pytest.raises(LogSourceError, match="refused the credentials"):
        source(server).discover_labels()


# ---------------------------------------------------------------- ingestion


@pytest.mark.django_db
def test_an_nccl_error_in_loki_becomes_an_anomaly_once(
    server: RecordedServer, entries: list[LokiEntry]
) -> None:
    """
    GIVEN a running workload whose rank 3 on gpu-002 logged an NCCL error to Loki
    WHEN its lines are ingested from Loki twice
    THEN the first run records one anomaly naming that node and rank, the second adds nothing,
         and a line logged later is read on the next run without re-reading the first
    """
    now = timezone.now()
    workload = WorkloadFactory(job_id="4242", submit_time=now - timedelta(hours=1))
    AttemptFactory(workload=workload, number=1, nodes=["gpu-001", "gpu-002"])
    base = to_ns(now - timedelta(minutes=10))
    entries.append(entry(base, " iteration      100/   1000 | lm loss: 2.5 |", host="gpu-001"))
    entries.append(entry(base + 5, NCCL_ERROR, host="gpu-002", rank="3"))
    entries.append(entry(base + 6, "unrelated job line", job="9999"))
    loki_source = build_source("loki", server.url, MAPPING)

    first = ingest_from_source(workload, loki_source, now)
    second = ingest_from_source(workload, loki_source, now + timedelta(seconds=30))

    anomaly = Anomaly.objects.get(workload=workload)
    assert first.anomalies_new == 1 and second.anomalies_new == 0
    assert (anomaly.category, anomaly.signature) == ("nccl_error", "nccl-error-raised")
    assert anomaly.evidence_at == datetime.fromtimestamp((base + 5) // 1000 / 1e6, tz=UTC)
    assert anomaly.implicated_nodes == ["gpu-002"]
    assert anomaly.implicated_ranks == [3]
    assert anomaly.occurrences == 1
    assert AuditEvent.objects.filter(workload=workload, kind=AuditKind.DETECTED).count() == 1
    cursor = LogCursor.objects.get(workload=workload)
    assert cursor.path == 'loki:{slurm_job_id="4242"}'
    assert cursor.offset == base + 5
    workload.refresh_from_db()
    assert workload.last_progress_step == 100

    entries.append(entry(base + 10, " iteration      101/   1000 | lm loss: 2.4 |"))
    third = ingest_from_source(workload, loki_source, now + timedelta(seconds=60))
    assert third.anomalies_new == 0
    assert third.bytes_read < first.bytes_read
    assert Anomaly.objects.get(workload=workload).occurrences == 1
    last = server.queries(QUERY_RANGE)[-1]
    assert int(last["start"]) == base + 6


@pytest.mark.django_db
def test_a_failed_read_leaves_the_cursor_where_it_was(
    server: RecordedServer, entries: list[LokiEntry]
) -> None:
    now = timezone.now()
    workload = WorkloadFactory(job_id="4242", submit_time=now - timedelta(hours=1))
    entries.append(entry(to_ns(now - timedelta(minutes=5)), "hello"))
    server.fail(QUERY_RANGE, Fault(503, b"too many outstanding requests"))
    with pytest.raises(LogSourceError):
        ingest_from_source(workload, build_source("loki", server.url, MAPPING), now)
    assert not LogCursor.objects.filter(workload=workload, offset__gt=0).exists()
