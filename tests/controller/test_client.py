"""The Advisor API client names its controller process in every call (Django-free: it runs in
the controller's own distribution, on Python 3.9 and newer)."""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from recovery.controller.client import INSTANCE_HEADER, AdvisorAPIError, AdvisorClient

IDENTITY = {"cluster": "lab", "scheduler_cluster_name": "lab", "actor": "controller:c1"}
RECOMMENDATION = {"id": 7, "job_id": "4242", "action": "restart", "status": "claimed"}


class Recorder(BaseHTTPRequestHandler):
    """Answers every call as the Advisor API would, and keeps the headers it was sent."""

    seen: list[dict[str, str]] = []

    def do_GET(self) -> None:
        self._answer()

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self._answer()

    def _answer(self) -> None:
        Recorder.seen.append(dict(self.headers.items()))
        instance = self.headers.get(INSTANCE_HEADER)
        if not instance:
            body: dict[str, Any] = {"error": "send X-Controller-Instance"}
            self._send(400, body)
        elif self.path.endswith("/identity/"):
            self._send(200, {**IDENTITY, "instance": instance})
        elif self.path.endswith("/recommendations/"):
            self._send(200, {"results": []})
        elif self.path.endswith(("/claim/", "/renew/")):
            self._send(200, RECOMMENDATION)
        else:
            self._send(200, {"event": 1})

    def _send(self, status: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def advisor_url() -> Iterator[str]:
    Recorder.seen = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), Recorder)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_every_call_sends_the_same_instance_id_of_this_process(advisor_url: str) -> None:
    client = AdvisorClient(advisor_url, "wrc_test")
    uuid.UUID(client.instance)  # a UUID the control plane accepts
    assert client.identity().instance == client.instance
    client.ready()
    client.claim(7, 120)
    client.renew(7, 120)
    client.dispatch(7, ["scontrol", "hold", "1"], 1)
    client.report(7, {"outcome": "skipped"})
    sent = [headers.get(INSTANCE_HEADER) for headers in Recorder.seen]
    assert sent == [client.instance] * 6
    assert all(headers["Authorization"] == "Bearer wrc_test" for headers in Recorder.seen)


def test_each_process_and_each_restart_is_another_holder() -> None:
    # Nothing is written down: a client made again (a restarted controller) has a new id.
    first, second = AdvisorClient("http://x", "wrc_t"), AdvisorClient("http://x", "wrc_t")
    assert first.instance != second.instance


def test_a_control_plane_refusal_for_the_instance_id_is_an_error_not_a_pass(
    advisor_url: str,
) -> None:
    class NoInstance(AdvisorClient):
        def headers(self) -> dict[str, str]:
            return {k: v for k, v in super().headers().items() if k != INSTANCE_HEADER}

    with pytest.raises(AdvisorAPIError) as refused:
        NoInstance(advisor_url, "wrc_test").identity()
    assert refused.value.status == 400
    assert "X-Controller-Instance" in str(refused.value)


class CutShort(BaseHTTPRequestHandler):
    """A web process killed while it answers: the status and headers go out, then part of the
    body (``how``: a JSON answer, an error's body, or a body with no length that stops early)."""

    how = "ok"

    def do_GET(self) -> None:
        data = b'{"cluster": "lab", "scheduler_cluster_name": "lab", "actor": "c"}'
        self.send_response(503 if CutShort.how == "error" else 200)
        self.send_header("Content-Type", "application/json")
        if CutShort.how != "no-length":
            self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data[:20])
        self.wfile.flush()
        self.close_connection = True

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.mark.parametrize("how", ["ok", "error", "no-length"])
def test_an_answer_cut_short_is_a_failed_call_not_a_crash(how: str) -> None:
    """
    GIVEN an Advisor API whose process dies while it sends an answer
    WHEN the controller's client makes a call
    THEN the call fails with AdvisorAPIError, which the controller retries, instead of an
         IncompleteRead or a JSON error that ended the controller's process (found by make chaos)
    """
    CutShort.how = how
    server = ThreadingHTTPServer(("127.0.0.1", 0), CutShort)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        with pytest.raises(AdvisorAPIError) as failed:
            AdvisorClient(f"http://127.0.0.1:{server.server_address[1]}", "wrc_t").identity()
    finally:
        server.shutdown()
        server.server_close()
    if how == "error":
        assert failed.value.status == 503
