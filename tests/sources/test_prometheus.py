"""The Prometheus connector against Debian's real prometheus scraping fake DCGM exporters, and
its diagnoses against closed ports and servers that are not Prometheus."""

from __future__ import annotations

import base64
import itertools
import socket
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest

from recovery.sources.metrics import (
    DcgmLabels,
    ErrorKind,
    MetricSource,
    MetricsSourceError,
    PrometheusSource,
    gpu_health,
)
from recovery.sources.metrics.dcgm import ESSENTIAL_METRICS
from tests.sources.conftest import (
    CannedAnswer,
    CannedRequest,
    CannedServer,
    FakeDcgmExporter,
    PrometheusProcess,
    free_port,
    wait_for,
)

XID = "DCGM_FI_DEV_XID_ERRORS"
UTIL = "DCGM_FI_DEV_GPU_UTIL"
DBE = "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"
REMAP = "DCGM_FI_DEV_ROW_REMAP_FAILURE"
CRC_FLIT = "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL"
NODES = ["node-a", "node-b"]


@pytest.fixture(scope="module")
def source(prometheus: PrometheusProcess) -> PrometheusSource:
    return PrometheusSource(prometheus.url, timeout=5)


def now() -> datetime:
    return datetime.now(tz=UTC)


def wait_until_scraped(source: MetricSource, query: str, what: str) -> None:
    wait_for(lambda: source.instant(query), what, timeout=15)


# -- queries against the real Prometheus ------------------------------------------------------


def test_it_reads_an_instant_vector_as_typed_samples(source: PrometheusSource) -> None:
    samples = source.instant('DCGM_FI_DEV_GPU_TEMP{Hostname="node-a"}')

    assert sorted(sample.labels["gpu"] for sample in samples) == ["0", "1"]
    sample = samples[0]
    assert sample.name == "DCGM_FI_DEV_GPU_TEMP"
    assert sample.labels["job"] == "dcgm"
    assert sample.labels["UUID"].startswith("GPU-")
    assert sample.value == 61.0
    assert sample.at.tzinfo is not None
    assert abs((now() - sample.at).total_seconds()) < 5


def test_it_reads_a_scalar_as_one_unlabelled_sample(source: PrometheusSource) -> None:
    at = now()

    [sample] = source.instant("scalar(count(DCGM_FI_DEV_GPU_TEMP)) * 2", at=at)

    assert sample.labels == {}
    assert sample.value == 8.0
    assert abs((sample.at - at).total_seconds()) < 0.01


def test_it_reads_a_range_query_as_series_of_points_one_step_apart(
    source: PrometheusSource,
) -> None:
    wait_until_scraped(
        source,
        'count_over_time(DCGM_FI_DEV_POWER_USAGE{Hostname="node-a", gpu="0"}[30s]) >= 5',
        "five scrapes of node-a",
    )
    end = now()
    start = end - timedelta(seconds=4)

    series = source.range(
        'DCGM_FI_DEV_POWER_USAGE{Hostname="node-a"}', start, end, timedelta(seconds=1)
    )

    assert len(series) == 2
    points = series[0].points
    assert series[0].name == "DCGM_FI_DEV_POWER_USAGE"
    assert len(points) >= 3
    assert all(point.value == 612.5 for point in points)
    gaps = {(b.at - a.at).total_seconds() for a, b in itertools.pairwise(points)}
    assert gaps == {1.0}


def test_it_discovers_series_label_names_and_values(source: PrometheusSource) -> None:
    end = now()
    start = end - timedelta(minutes=5)

    series = source.series(f'{{__name__="{XID}"}}', start, end)
    hostnames = source.label_values("Hostname")
    gpus_of_node_a = source.label_values("gpu", match='{Hostname="node-a"}', start=start, end=end)
    metric_names = source.label_values("__name__", match='{__name__=~"DCGM_.*"}')
    label_names = source.label_names(match=f"{{__name__={XID!r}}}".replace("'", '"'))

    assert len(series) == 4
    assert {labels["Hostname"] for labels in series} == {"node-a", "node-b.cluster.local"}
    assert {"node-a", "node-b.cluster.local"} <= set(hostnames)
    assert gpus_of_node_a == ["0", "1"]
    assert XID in metric_names and CRC_FLIT in metric_names
    assert {"Hostname", "gpu", "UUID", "instance", "job"} <= set(label_names)


def test_it_tells_which_prometheus_answers(source: PrometheusSource) -> None:
    info = source.build_info()

    assert info["version"].startswith("2.")


def test_it_reports_a_refused_query_with_prometheus_own_message(
    source: PrometheusSource,
) -> None:
    with pytest.raises(MetricsSourceError) as raised:
        source.instant("sum(DCGM_FI_DEV_GPU_UTIL")

    error = raised.value
    assert error.kind == ErrorKind.BAD_QUERY
    assert error.status == 400
    assert error.error_type == "bad_data"
    assert "parse error" in str(error)
    assert "\n" not in str(error)


def test_it_refuses_a_range_vector_in_an_instant_query(source: PrometheusSource) -> None:
    with pytest.raises(MetricsSourceError) as raised:
        source.instant(f"{XID}[10s]")

    assert raised.value.kind == ErrorKind.BAD_QUERY
    assert "range vector" in str(raised.value)


def test_it_refuses_a_range_of_more_points_than_prometheus_allows(
    source: PrometheusSource,
) -> None:
    end = now()

    with pytest.raises(MetricsSourceError) as raised:
        source.range(XID, end - timedelta(days=1), end, timedelta(seconds=1))

    assert raised.value.kind == ErrorKind.BAD_QUERY
    assert "use a step of at least 8s" in str(raised.value)


# -- gpu_health against the real Prometheus ---------------------------------------------------


def test_gpu_health_finds_each_fault_on_the_node_and_gpu_it_happened_on(
    source: PrometheusSource, dcgm_exporters: dict[str, FakeDcgmExporter]
) -> None:
    """GIVEN two nodes whose four GPUs are healthy and busy, scraped by Prometheus
    WHEN node-b's GPU 1 reports Xid 79 and a row remap failure, node-a's GPU 0 two double-bit
    ECC errors and 40 NVLink CRC errors, and node-b's GPU 0 drops to 0 % while the rest work
    THEN gpu_health over the window reports exactly those, each on its node (by the name Slurm
    uses, though node-b's exporter says node-b.cluster.local) and GPU, with the Xid code
    AND a window starting after the Xid does not report it again."""
    node_a, node_b = dcgm_exporters["node-a"], dcgm_exporters["node-b"]
    since = now() - timedelta(seconds=3)

    healthy = gpu_health(source, NODES, since, now(), step=timedelta(seconds=1))
    assert healthy.findings == []
    assert healthy.nodes_without_metrics == []
    assert healthy.gpus == {"node-a": ["0", "1"], "node-b": ["0", "1"]}
    assert set(ESSENTIAL_METRICS) <= set(healthy.metrics_present)
    assert "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL" in healthy.metrics_missing
    assert healthy.readings[("node-b", "1")]["DCGM_FI_DEV_GPU_TEMP"] == 61.0
    assert healthy.readings[("node-a", "0")]["DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"] == 0.42

    node_b.set(XID, 1, 79)
    node_b.set(REMAP, 1, 1)
    node_b.set(UTIL, 0, 0)
    node_a.add(DBE, 0, 2)
    node_a.add(CRC_FLIT, 0, 40)
    faults_at = now()
    wait_until_scraped(
        source,
        f'count_over_time(({UTIL}{{Hostname="node-b.cluster.local", gpu="0"}} == 0)[30s:1s]) > 4',
        "five scrapes of node-b's idle GPU",
    )
    until = now()

    health = gpu_health(source, NODES, since, until, step=timedelta(seconds=1))

    found = {
        (finding.nodes[0], finding.detail["gpu"], finding.signature): finding
        for finding in health.findings
    }
    assert sorted(found) == [
        ("node-a", "0", "ecc-dbe-increase"),
        ("node-a", "0", "nvlink-errors-increase"),
        ("node-b", "0", "gpu-stuck-idle"),
        ("node-b", "1", "row-remap-failure"),
        ("node-b", "1", "xid-79"),
    ]
    xid = found[("node-b", "1", "xid-79")]
    assert xid.detail["xid"] == 79
    assert xid.severity == "fatal"
    assert xid.attribution == "hardware"
    assert xid.detail["uuid"] == node_b.uuid(1)
    assert xid.at is not None and xid.at >= faults_at - timedelta(seconds=2)
    assert found[("node-a", "0", "ecc-dbe-increase")].detail["new_errors"] == 2
    assert found[("node-a", "0", "nvlink-errors-increase")].detail["new_errors"] == 40
    assert "while the job's other GPUs ran" in found[("node-b", "0", "gpu-stuck-idle")].evidence
    assert [f.signature for f in health.by_node()["node-a"]] == [
        "ecc-dbe-increase",
        "nvlink-errors-increase",
    ]

    later = gpu_health(
        source, ["node-b"], until - timedelta(seconds=1), now(), step=timedelta(seconds=1)
    )
    assert "xid-79" not in {finding.signature for finding in later.findings}
    assert later.gpus == {"node-b": ["0", "1"]}

    node_b.set(XID, 1, 0)
    node_b.set(REMAP, 1, 0)
    node_b.set(UTIL, 0, 97)


def test_gpu_health_says_which_nodes_sent_nothing(source: PrometheusSource) -> None:
    health = gpu_health(source, ["node-a", "node-z"], now() - timedelta(seconds=5), now())

    assert health.nodes_without_metrics == ["node-z"]
    assert health.gpus == {"node-a": ["0", "1"]}


def test_gpu_health_follows_the_configured_label_mapping(source: PrometheusSource) -> None:
    since, until = now() - timedelta(seconds=5), now()

    other_cluster = gpu_health(
        source, NODES, since, until, labels=DcgmLabels(static_selectors={"job": "elsewhere"})
    )
    wrong_node_label = gpu_health(source, NODES, since, until, labels=DcgmLabels(node="host"))
    ours = gpu_health(
        source, NODES, since, until, labels=DcgmLabels(static_selectors={"job": "dcgm"})
    )

    assert other_cluster.nodes_without_metrics == NODES
    assert other_cluster.metrics_present == []
    assert wrong_node_label.nodes_without_metrics == NODES
    assert ours.nodes_without_metrics == []
    assert ours.gpus == {"node-a": ["0", "1"], "node-b": ["0", "1"]}


def test_label_mapping_refuses_names_that_are_not_labels() -> None:
    with pytest.raises(ValueError, match="node label"):
        DcgmLabels(node='Hostname"} or vector(1) #')


# -- diagnoses --------------------------------------------------------------------------------


def prometheus_success(data: object) -> CannedAnswer:
    return CannedAnswer(body={"status": "success", "data": data})


def test_a_closed_port_is_unreachable() -> None:
    source = PrometheusSource(f"http://127.0.0.1:{free_port()}", timeout=2)

    with pytest.raises(MetricsSourceError) as raised:
        source.instant("up")

    assert raised.value.kind == ErrorKind.UNREACHABLE
    assert "refused the connection" in str(raised.value)


def test_a_server_that_does_not_answer_in_time_times_out(canned_server: CannedServer) -> None:
    canned_server.answer = lambda request: CannedAnswer(delay=1.5, body={"status": "success"})
    source = PrometheusSource(canned_server.url, timeout=0.3)

    with pytest.raises(MetricsSourceError) as raised:
        source.instant("up")

    assert raised.value.kind == ErrorKind.TIMEOUT
    assert "did not answer within 0.3s" in str(raised.value)


@pytest.mark.parametrize(
    ("answer", "kind", "words"),
    [
        (
            CannedAnswer(200, "<!DOCTYPE html><html><title>Grafana</title></html>"),
            ErrorKind.NOT_PROMETHEUS,
            "HTML page",
        ),
        (CannedAnswer(404, "404 page not found\n"), ErrorKind.NOT_PROMETHEUS, "HTTP 404"),
        (CannedAnswer(200, {"message": "hello"}), ErrorKind.NOT_PROMETHEUS, "status field"),
        (
            CannedAnswer(200, b'{"status": "succ\xff', {"Content-Type": "application/json"}),
            ErrorKind.MALFORMED,
            "not JSON",
        ),
        (
            CannedAnswer(502, "upstream connect error\nor disconnect"),
            ErrorKind.SERVER,
            "(HTTP 502): upstream connect error or disconnect",
        ),
        (
            CannedAnswer(
                503,
                {"status": "error", "errorType": "timeout", "error": "query timed out in eval"},
            ),
            ErrorKind.TIMEOUT,
            "query timed out in eval",
        ),
        (
            CannedAnswer(
                422,
                {"status": "error", "errorType": "execution", "error": "many-to-many matching"},
            ),
            ErrorKind.BAD_QUERY,
            "refused (execution): many-to-many matching",
        ),
        (
            prometheus_success({"resultType": "vector", "result": [{"metric": {}, "value": 3}]}),
            ErrorKind.MALFORMED,
            "not a [time, value] pair",
        ),
        (prometheus_success({"result": []}), ErrorKind.MALFORMED, "no resultType"),
        (
            CannedAnswer(302, "", {"Location": "/login"}),
            ErrorKind.HTTP,
            "redirects (HTTP 302) to /login",
        ),
    ],
    ids=[
        "html",
        "404",
        "json-not-prometheus",
        "broken-json",
        "bad-gateway",
        "server-timeout",
        "execution-error",
        "bad-sample",
        "no-result-type",
        "redirect",
    ],
)
def test_an_answer_that_is_not_a_usable_prometheus_gets_a_one_line_diagnosis(
    canned_server: CannedServer, answer: CannedAnswer, kind: str, words: str
) -> None:
    canned_server.answer = lambda request: answer
    source = PrometheusSource(canned_server.url, timeout=5)

    with pytest.raises(MetricsSourceError) as raised:
        source.instant("up")

    assert raised.value.kind == kind
    assert words in str(raised.value)
    assert str(raised.value).startswith(f"Prometheus at {canned_server.url}/api/v1/query")
    assert "\n" not in str(raised.value)


@pytest.fixture
def not_http_port() -> Iterator[int]:
    """A TCP port that answers every connection with a line of non-HTTP text."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()

    def serve() -> None:
        while True:
            try:
                connection, _ = listener.accept()
            except OSError:
                return
            with connection:
                connection.recv(65536)
                connection.sendall(b"SSH-2.0-OpenSSH_9.2\r\n")

    threading.Thread(target=serve, daemon=True).start()
    yield listener.getsockname()[1]
    listener.close()


def test_a_port_that_does_not_speak_http_is_not_prometheus(not_http_port: int) -> None:
    source = PrometheusSource(f"http://127.0.0.1:{not_http_port}", timeout=2)

    with pytest.raises(MetricsSourceError) as raised:
        source.instant("up")

    assert raised.value.kind == ErrorKind.NOT_PROMETHEUS
    assert "did not answer in HTTP" in str(raised.value)


def guarded(token: str) -> object:
    def answer(request: CannedRequest) -> CannedAnswer:
        if request.headers.get("Authorization") != token:
            return CannedAnswer(401, "Unauthorized\n", {"WWW-Authenticate": "Bearer"})
        return prometheus_success({"resultType": "scalar", "result": [1700000000, "1"]})

    return answer


def test_it_sends_the_bearer_token_and_says_when_it_is_missing_or_refused(
    canned_server: CannedServer,
) -> None:
    canned_server.answer = guarded("Bearer s3cret")  # type: ignore[assignment]

    [sample] = PrometheusSource(canned_server.url, timeout=5, bearer_token="s3cret").instant("1")
    with pytest.raises(MetricsSourceError) as missing:
        PrometheusSource(canned_server.url, timeout=5).instant("1")
    with pytest.raises(MetricsSourceError) as refused:
        PrometheusSource(canned_server.url, timeout=5, bearer_token="wrong").instant("1")

    assert sample.value == 1.0
    assert missing.value.kind == refused.value.kind == ErrorKind.AUTH
    assert "needs credentials" in str(missing.value)
    assert "refused the credentials" in str(refused.value)
    assert "wrong" not in str(refused.value)


def test_it_sends_basic_auth(canned_server: CannedServer) -> None:
    expected = "Basic " + base64.b64encode(b"grafana:pa:ss").decode()
    canned_server.answer = guarded(expected)  # type: ignore[assignment]

    source = PrometheusSource(canned_server.url, timeout=5, basic_auth=("grafana", "pa:ss"))

    assert source.instant("1")[0].value == 1.0


def test_it_posts_queries_and_falls_back_to_get_when_post_is_not_allowed(
    canned_server: CannedServer,
) -> None:
    def get_only(request: CannedRequest) -> CannedAnswer:
        if request.method != "GET":
            return CannedAnswer(405, "method not allowed")
        return prometheus_success({"resultType": "vector", "result": []})

    canned_server.answer = get_only
    source = PrometheusSource(canned_server.url + "/prometheus/", timeout=5)

    assert source.instant('up{job="a b"}') == []
    assert source.instant("up") == []

    methods = [(request.method, request.path.split("?")[0]) for request in canned_server.requests]
    assert methods == [
        ("POST", "/prometheus/api/v1/query"),
        ("GET", "/prometheus/api/v1/query"),
        ("GET", "/prometheus/api/v1/query"),
    ]
    assert canned_server.requests[0].body == b"query=up%7Bjob%3D%22a+b%22%7D"


@pytest.mark.parametrize("url", ["prometheus:9090", "ftp://host/", "http://", "http://u:p@h/"])
def test_a_url_that_is_not_a_prometheus_url_is_refused_before_any_request(url: str) -> None:
    with pytest.raises(MetricsSourceError) as raised:
        PrometheusSource(url, timeout=1)

    assert raised.value.kind == ErrorKind.INVALID_URL
    assert "u:p@" not in str(raised.value)


def test_a_label_name_that_is_not_one_is_refused_before_any_request(
    canned_server: CannedServer,
) -> None:
    source = PrometheusSource(canned_server.url, timeout=1)

    with pytest.raises(MetricsSourceError) as raised:
        source.label_values("../../admin")

    assert raised.value.kind == ErrorKind.BAD_QUERY
    assert canned_server.requests == []
