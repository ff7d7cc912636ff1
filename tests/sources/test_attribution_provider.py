"""The external attribution provider: a real HTTP server on loopback answers well or badly.

Whatever it does, attribution never raises: a bad answer leaves the built-in verdict standing
and says why, in the ATTRIBUTED event, in the health status and (once) in the audit trail.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core.cache import cache
from django.test import Client
from django.urls import reverse
from pytest_django.fixtures import Settings as SettingsWrapper

from recovery.choices import AuditKind, NodeHealth
from recovery.loop.attribution import EXTERNAL_PROVIDER, attribute
from recovery.loop.logs import ingest_workload_logs
from recovery.models import Anomaly, AuditEvent, Node, Verdict
from recovery.schedulers.transport import LocalTransport
from recovery.sources.provider_status import attribution_status
from tests.conftest import TEST_PASSWORD
from tests.factories import AnomalyFactory, AttemptFactory, WorkloadFactory

pytestmark = pytest.mark.django_db

GOOD = {
    "attribution": "application",
    "confidence": 0.95,
    "implicated_nodes": [],
    "explanation": "the same Xid follows the job to healthy nodes: a driver call it makes",
}


class ProviderHandler(BaseHTTPRequestHandler):
    """Behaves according to the path: /good, /slow, /error, /garbage and so on."""

    server: ProviderServer

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        self.server.received.append(
            {"path": self.path, "headers": dict(self.headers), "body": json.loads(body)}
        )
        behaviour = self.path.strip("/")
        if behaviour == "slow":
            time.sleep(1.0)
            self._reply(200, json.dumps(GOOD).encode())
        elif behaviour == "trickle":
            self.wfile.write(b"HTTP/1.1 200 OK\r\n")
            for _ in range(40):
                self.wfile.write(b"X-Slow: 1\r\n")
                self.wfile.flush()
                time.sleep(0.05)
        elif behaviour == "error":
            self._reply(500, b'{"error": "model not loaded"}')
        elif behaviour == "redirect":
            self.send_response(302)
            self.send_header("Location", "/good")
            self.send_header("Content-Length", "0")
            self.end_headers()
        elif behaviour == "garbage":
            self._reply(200, b"<html>not json{")
        elif behaviour == "overconfident":
            self._reply(200, json.dumps({**GOOD, "confidence": 1.7}).encode())
        elif behaviour == "nan":
            self._reply(200, b'{"attribution": "hardware", "confidence": NaN}')
        elif behaviour == "bad-attribution":
            self._reply(200, json.dumps({**GOOD, "attribution": "cosmic rays"}).encode())
        elif behaviour == "foreign-node":
            reply = {**GOOD, "attribution": "hardware", "implicated_nodes": ["gpu-999"]}
            self._reply(200, json.dumps(reply).encode())
        elif behaviour == "odd-node":
            reply = {**GOOD, "attribution": "hardware", "implicated_nodes": ["gpu-001; rm -rf"]}
            self._reply(200, json.dumps(reply).encode())
        elif behaviour == "huge":
            self._reply(200, json.dumps({**GOOD, "padding": "x" * 70_000}).encode())
        elif behaviour == "narrow":
            reply = {"attribution": "hardware", "confidence": 0.97, "implicated_nodes": ["gpu-001"]}
            self._reply(200, json.dumps(reply).encode())
        elif behaviour == "unsure":
            self._reply(200, json.dumps({**GOOD, "confidence": 0.3}).encode())
        else:
            self._reply(200, json.dumps(GOOD).encode())

    def _reply(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


class ProviderServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), ProviderHandler)
        self.received: list[dict[str, Any]] = []

    def url(self, behaviour: str) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/{behaviour}"

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self.server_address[1]}"


@pytest.fixture
def provider() -> Iterator[ProviderServer]:
    server = ProviderServer()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


@pytest.fixture(autouse=True)
def _fresh_cache(settings: SettingsWrapper) -> Iterator[None]:
    settings.ATTRIBUTION_PROVIDER_URL = ""
    settings.ATTRIBUTION_PROVIDER_TOKEN = ""
    settings.ATTRIBUTION_PROVIDER_TIMEOUT = 2.0
    cache.clear()
    yield
    cache.clear()


def use(settings: SettingsWrapper, url: str, *, timeout: float = 2.0) -> None:
    settings.ATTRIBUTION_PROVIDER_URL = url
    settings.ATTRIBUTION_PROVIDER_TIMEOUT = timeout


def gpu_anomaly() -> Anomaly:
    """An Xid on gpu-002 of a two-node attempt: the built-in rules say hardware, 90 %."""
    attempt = AttemptFactory(nodes=["gpu-001", "gpu-002"])
    for name in ("gpu-001", "gpu-002"):
        Node.objects.create(
            cluster=attempt.workload.cluster,
            name=name,
            scheduler_state="DRAIN" if name == "gpu-002" else "ALLOCATED",
            state_reason="Xid 79" if name == "gpu-002" else "",
            health=NodeHealth.UNHEALTHY if name == "gpu-002" else NodeHealth.HEALTHY,
        )
    return AnomalyFactory(
        workload=attempt.workload,
        attempt=attempt,
        signature="xid-79",
        implicated_ranks=[3],
        evidence_excerpt="line before\n" + "x" * 20_000,
    )


def attributed_event() -> AuditEvent:
    return AuditEvent.objects.get(kind=AuditKind.ATTRIBUTED)


def test_without_a_provider_the_builtin_verdict_stands_and_says_so() -> None:
    """
    GIVEN no provider URL
    WHEN an anomaly is attributed
    THEN the built-in verdict decides and the event and the status say attribution is degraded.
    """
    anomaly = gpu_anomaly()
    verdict = attribute(anomaly)
    assert verdict.provider == Verdict.BUILTIN_PROVIDER
    assert verdict.confidence == 0.9
    payload = attributed_event().payload
    assert payload["degraded"] is True
    assert payload["degraded_reason"] == "no provider configured"
    assert "provider_host" not in payload
    status = attribution_status()
    assert (status.provider, status.degraded, status.reason) == (
        None,
        True,
        "no provider configured",
    )
    # Not configured is a setting, not a failure: no outage is announced.
    assert not AuditEvent.objects.filter(kind=AuditKind.ATTRIBUTION_DEGRADED).exists()


def test_a_confident_provider_decides(settings: SettingsWrapper, provider: ProviderServer) -> None:
    """
    GIVEN a provider that answers "application" at 95 %
    WHEN a hardware anomaly (built-in 90 %) is attributed
    THEN both verdicts are kept, the provider's decides and the anomaly follows it.
    """
    use(settings, provider.url("good"))
    anomaly = gpu_anomaly()
    verdict = attribute(anomaly)
    assert verdict.provider == EXTERNAL_PROVIDER
    assert (verdict.attribution, verdict.confidence) == ("application", 0.95)
    assert verdict.detail["decided"] is True
    assert verdict.detail["provider_host"] == provider.host
    assert set(anomaly.verdicts.values_list("provider", flat=True)) == {"builtin", "external"}
    anomaly.refresh_from_db()
    assert anomaly.attribution == "application"
    assert anomaly.implicated_nodes == []
    event = attributed_event()
    assert event.actor == "attribution:external"
    assert event.payload["degraded"] is False
    assert "degraded_reason" not in event.payload
    assert event.payload["builtin"] == {"attribution": "hardware", "confidence": 0.9}
    assert event.payload["external"]["explanation"] == GOOD["explanation"]
    status = attribution_status()
    assert (status.provider, status.degraded) == (provider.host, False)


def test_an_unsure_provider_is_recorded_but_does_not_decide(
    settings: SettingsWrapper, provider: ProviderServer
) -> None:
    use(settings, provider.url("unsure"))
    anomaly = gpu_anomaly()
    verdict = attribute(anomaly)
    assert verdict.provider == Verdict.BUILTIN_PROVIDER
    external = anomaly.verdicts.get(provider=EXTERNAL_PROVIDER)
    assert (external.confidence, external.detail["decided"]) == (0.3, False)
    anomaly.refresh_from_db()
    assert anomaly.attribution == "hardware"
    assert anomaly.implicated_nodes == ["gpu-002"]
    assert attributed_event().payload["degraded"] is False


def test_the_provider_may_narrow_the_blame_to_another_node_of_the_job(
    settings: SettingsWrapper, provider: ProviderServer
) -> None:
    use(settings, provider.url("narrow"))
    anomaly = gpu_anomaly()
    assert attribute(anomaly).implicated_nodes == ["gpu-001"]
    anomaly.refresh_from_db()
    assert anomaly.implicated_nodes == ["gpu-001"]


def test_the_request_follows_the_documented_contract(
    settings: SettingsWrapper, provider: ProviderServer
) -> None:
    use(settings, provider.url("good"))
    settings.ATTRIBUTION_PROVIDER_TOKEN = "s3cret-token"
    anomaly = gpu_anomaly()
    attribute(anomaly)
    (request,) = provider.received
    assert request["headers"]["Authorization"] == "Bearer s3cret-token"
    assert request["headers"]["Content-Type"] == "application/json"
    body = request["body"]
    assert set(body) == {"anomaly", "workload", "builtin_verdict", "node_states"}
    assert body["anomaly"]["id"] == anomaly.pk
    assert body["anomaly"]["signature"] == "xid-79"
    assert body["anomaly"]["implicated_ranks"] == [3]
    assert len(body["anomaly"]["evidence_excerpt"]) == 8192
    assert body["workload"]["job_id"] == anomaly.workload.job_id
    assert body["workload"]["cluster"] == anomaly.workload.cluster.name
    assert body["workload"]["attempt"] == 1
    assert body["workload"]["nodes"] == ["gpu-001", "gpu-002"]
    assert body["builtin_verdict"] == {
        "attribution": "hardware",
        "confidence": 0.9,
        "implicated_nodes": ["gpu-002"],
    }
    assert body["node_states"]["gpu-002"] == {
        "scheduler_state": "DRAIN",
        "state_reason": "Xid 79",
        "health": "unhealthy",
    }


@pytest.mark.parametrize(
    ("behaviour", "reason"),
    [
        ("error", "provider answered 500"),
        ("redirect", "provider answered 302"),
        ("garbage", "invalid reply: not JSON"),
        ("overconfident", "invalid reply: confidence must be a number from 0 to 1"),
        ("nan", "invalid reply: not JSON"),
        ("bad-attribution", "invalid reply: attribution must be one of hardware, system_software"),
        ("foreign-node", "invalid reply: node 'gpu-999' is not one of the job's nodes"),
        ("odd-node", "invalid reply: implicated_nodes holds a malformed node name"),
        ("huge", "invalid reply: body larger than 65536 bytes"),
    ],
)
def test_a_bad_answer_leaves_the_builtin_verdict_standing(
    settings: SettingsWrapper, provider: ProviderServer, behaviour: str, reason: str
) -> None:
    use(settings, provider.url(behaviour))
    anomaly = gpu_anomaly()
    verdict = attribute(anomaly)
    assert verdict.provider == Verdict.BUILTIN_PROVIDER
    assert not anomaly.verdicts.filter(provider=EXTERNAL_PROVIDER).exists()
    anomaly.refresh_from_db()
    assert (anomaly.attribution, anomaly.implicated_nodes) == ("hardware", ["gpu-002"])
    payload = attributed_event().payload
    assert payload["degraded"] is True
    assert payload["degraded_reason"].startswith(reason)
    assert payload["provider_host"] == provider.host
    status = attribution_status()
    assert status.degraded is True
    assert status.reason.startswith(reason)


def test_a_slow_provider_times_out(settings: SettingsWrapper, provider: ProviderServer) -> None:
    use(settings, provider.url("slow"), timeout=0.2)
    anomaly = gpu_anomaly()
    started = time.monotonic()
    verdict = attribute(anomaly)
    assert time.monotonic() - started < 0.9
    assert verdict.provider == Verdict.BUILTIN_PROVIDER
    assert attributed_event().payload["degraded_reason"] == "provider timed out after 0.2 s"


def test_a_trickling_reply_cannot_stretch_the_deadline(
    settings: SettingsWrapper, provider: ProviderServer
) -> None:
    """Each header arrives within the socket timeout, yet the whole exchange is cut at 0.3 s."""
    use(settings, provider.url("trickle"), timeout=0.3)
    started = time.monotonic()
    attribute(gpu_anomaly())
    assert time.monotonic() - started < 1.0
    assert attributed_event().payload["degraded_reason"] == "provider timed out after 0.3 s"


def test_an_unreachable_provider_is_a_failure(settings: SettingsWrapper) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    use(settings, f"http://127.0.0.1:{port}/verdict")
    verdict = attribute(gpu_anomaly())
    assert verdict.provider == Verdict.BUILTIN_PROVIDER
    assert attributed_event().payload["degraded_reason"].startswith("provider unreachable")


def test_a_url_other_than_http_is_refused(settings: SettingsWrapper, tmp_path: Path) -> None:
    secret = tmp_path / "reply.json"
    secret.write_text(json.dumps(GOOD))
    use(settings, secret.as_uri())
    assert attribute(gpu_anomaly()).provider == Verdict.BUILTIN_PROVIDER
    assert "http" in attributed_event().payload["degraded_reason"]


def test_a_lasting_outage_is_announced_once_per_episode(
    settings: SettingsWrapper, provider: ProviderServer
) -> None:
    """
    GIVEN a provider that fails twice, recovers, then fails again
    WHEN four anomalies are attributed
    THEN two ATTRIBUTION_DEGRADED events are recorded: one per change from healthy to failing.
    """
    for behaviour in ("error", "garbage", "good", "error"):
        use(settings, provider.url(behaviour))
        attribute(gpu_anomaly())
    announced = AuditEvent.objects.filter(kind=AuditKind.ATTRIBUTION_DEGRADED)
    assert [e.payload["reason"] for e in announced] == [
        "provider answered 500",
        "provider answered 500",
    ]
    first = announced.first()
    assert first is not None
    assert first.payload["provider_host"] == provider.host


def test_attributing_again_returns_the_deciding_verdict_without_calling_again(
    settings: SettingsWrapper, provider: ProviderServer
) -> None:
    use(settings, provider.url("good"))
    anomaly = gpu_anomaly()
    first = attribute(anomaly)
    assert attribute(anomaly) == first
    assert len(provider.received) == 1
    assert AuditEvent.objects.filter(kind=AuditKind.ATTRIBUTED).count() == 1


def test_another_process_learns_the_last_outcome_from_the_audit_trail(
    settings: SettingsWrapper, provider: ProviderServer
) -> None:
    use(settings, provider.url("error"))
    attribute(gpu_anomaly())
    cache.clear()  # as in a web process that never called the provider
    status = attribution_status()
    assert (status.provider, status.degraded, status.reason) == (
        provider.host,
        True,
        "provider answered 500",
    )


def test_ingestion_goes_on_when_the_provider_fails(
    settings: SettingsWrapper,
    provider: ProviderServer,
    tmp_path: Path,
    django_capture_on_commit_callbacks: Any,
) -> None:
    """
    GIVEN a provider that answers 500
    WHEN a read finds an Xid and the read commits
    THEN the provider is asked after the commit, its failure leaves the built-in verdict
    standing, and the policy decides on it.
    """
    use(settings, provider.url("error"))
    workload = WorkloadFactory(
        stdout_path=str(tmp_path / "job.out"), work_dir=str(tmp_path), user_uid=os.getuid()
    )
    AttemptFactory(workload=workload, nodes=["node002"])
    Path(workload.stdout_path).write_text(
        "Nov 29 03:14:15 node002 kernel: NVRM: Xid (PCI:0000:3b:00): 79, pid=1, "
        "GPU has fallen off the bus.\n"
        "srun: error: node002: task 1: Exited with exit code 1\n"
    )
    with django_capture_on_commit_callbacks(execute=True):
        summary = ingest_workload_logs(workload, LocalTransport())
    assert summary.anomalies_new == 1
    assert attributed_event().payload["degraded_reason"] == "provider answered 500"
    assert workload.recommendations.exists()


def test_the_health_endpoint_reports_attribution(
    settings: SettingsWrapper, provider: ProviderServer, viewer: User
) -> None:
    use(settings, provider.url("error"))
    attribute(gpu_anomaly())
    client = Client()
    anonymous = client.get(reverse("api:health")).json()
    assert anonymous["attribution"] == {"degraded": True}
    assert client.login(username=viewer.username, password=TEST_PASSWORD)
    response = client.get(reverse("api:health"))
    assert response.status_code == 200  # a failing provider degrades, it does not take us down
    assert response.json()["attribution"] == {
        "provider": provider.host,
        "degraded": True,
        "reason": "provider answered 500",
    }


def test_the_console_warns_while_attribution_is_degraded(
    settings: SettingsWrapper, provider: ProviderServer, viewer: User
) -> None:
    client = Client()
    assert client.login(username=viewer.username, password=TEST_PASSWORD)
    body = client.get(reverse("console:fleet")).content.decode()
    assert "built-in rules only — no external provider configured" in body

    use(settings, provider.url("error"))
    attribute(gpu_anomaly())
    body = client.get(reverse("console:approvals")).content.decode()
    assert "provider failing: provider answered 500" in body

    use(settings, provider.url("good"))
    attribute(gpu_anomaly())
    assert "built-in rules only" not in client.get(reverse("console:fleet")).content.decode()


def test_credentials_in_the_url_never_reach_the_status(
    settings: SettingsWrapper, provider: ProviderServer
) -> None:
    use(settings, provider.url("error").replace("http://", "http://user:hunter2@"))
    attribute(gpu_anomaly())
    assert attribution_status().provider == provider.host
    assert "hunter2" not in json.dumps(attributed_event().payload)
