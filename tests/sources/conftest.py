"""A real Prometheus (Debian's /usr/bin/prometheus) scraping fake DCGM exporters, and canned
HTTP servers for the error paths.

One Prometheus per test module: it scrapes every second, keeps its storage in a tmp dir and
listens on a free port of 127.0.0.1. The exporters are plain HTTP servers whose values a test
changes; Prometheus sees a change at its next scrape.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import threading
import time
import urllib.request
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
INSTALL_SCRIPT = REPO / "deploy" / "dev" / "prometheus-packages.sh"
SCRAPE_INTERVAL = "1s"
START_TIMEOUT = 30.0

# dcgm-exporter's metric types (its default counters CSV): the ECC and NVLink totals are
# counters, the rest gauges.
METRIC_TYPES = {
    "DCGM_FI_DEV_XID_ERRORS": "gauge",
    "DCGM_FI_DEV_GPU_TEMP": "gauge",
    "DCGM_FI_DEV_POWER_USAGE": "gauge",
    "DCGM_FI_DEV_GPU_UTIL": "gauge",
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": "gauge",
    "DCGM_FI_DEV_ROW_REMAP_FAILURE": "gauge",
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": "counter",
    "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL": "counter",
    "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL": "counter",
    "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL": "counter",
}
HEALTHY_BUSY_GPU = {
    "DCGM_FI_DEV_XID_ERRORS": 0.0,
    "DCGM_FI_DEV_GPU_TEMP": 61.0,
    "DCGM_FI_DEV_POWER_USAGE": 612.5,
    "DCGM_FI_DEV_GPU_UTIL": 97.0,
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": 0.42,
    "DCGM_FI_DEV_ROW_REMAP_FAILURE": 0.0,
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": 0.0,
    "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL": 3.0,
    "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL": 7.0,
    "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL": 0.0,
}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_for(check: Callable[[], Any], what: str, timeout: float = 15.0) -> Any:
    """Poll ``check`` until it returns something truthy; fail naming ``what`` otherwise."""
    deadline = time.monotonic() + timeout
    last_error: Exception | None = None
    while time.monotonic() < deadline:
        try:
            result = check()
        except Exception as error:  # the server may not be up yet; keep the last reason
            last_error = error
        else:
            if result:
                return result
        time.sleep(0.2)
    pytest.fail(f"timed out after {timeout:g}s waiting for {what} (last error: {last_error})")


# -- the fake DCGM exporter -------------------------------------------------------------------


@dataclass
class FakeDcgmExporter:
    """One node's dcgm-exporter: ``/metrics`` in the exposition format, values set by tests."""

    hostname: str
    gpus: int = 2
    values: dict[tuple[str, int], float] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)
    server: ThreadingHTTPServer | None = None

    def __post_init__(self) -> None:
        for gpu in range(self.gpus):
            for metric, value in HEALTHY_BUSY_GPU.items():
                self.values[(metric, gpu)] = value

    @property
    def address(self) -> str:
        assert self.server is not None
        return f"127.0.0.1:{self.server.server_address[1]}"

    def set(self, metric: str, gpu: int, value: float) -> None:
        with self.lock:
            self.values[(metric, gpu)] = value

    def add(self, metric: str, gpu: int, amount: float) -> None:
        with self.lock:
            self.values[(metric, gpu)] += amount

    def uuid(self, gpu: int) -> str:
        return f"GPU-{zlib.crc32(self.hostname.encode()):08x}-0000-0000-0000-{gpu:012d}"

    def render(self) -> str:
        with self.lock:
            values = dict(self.values)
        lines = []
        for metric, kind in METRIC_TYPES.items():
            lines.append(f"# HELP {metric} {metric} as dcgm-exporter reports it.")
            lines.append(f"# TYPE {metric} {kind}")
            for gpu in range(self.gpus):
                labels = (
                    f'gpu="{gpu}",UUID="{self.uuid(gpu)}",device="nvidia{gpu}",'
                    f'modelName="NVIDIA H100 80GB HBM3",Hostname="{self.hostname}",'
                    'DCGM_FI_DRIVER_VERSION="550.54.15"'
                )
                lines.append(f"{metric}{{{labels}}} {values[(metric, gpu)]:g}")
        return "\n".join(lines) + "\n"

    def start(self) -> None:
        exporter = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body = exporter.render().encode()
                self.send_response(200 if self.path == "/metrics" else 404)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True).start()

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()


@pytest.fixture(scope="module")
def dcgm_exporters() -> Iterator[dict[str, FakeDcgmExporter]]:
    # node-b's exporter reports its fully qualified name, as many do: Slurm says "node-b".
    exporters = {
        "node-a": FakeDcgmExporter("node-a"),
        "node-b": FakeDcgmExporter("node-b.cluster.local"),
    }
    for exporter in exporters.values():
        exporter.start()
    yield exporters
    for exporter in exporters.values():
        exporter.stop()


# -- the real Prometheus ----------------------------------------------------------------------


def prometheus_binary() -> str:
    """Debian's prometheus; installed by deploy/dev/prometheus-packages.sh when root can."""
    found = shutil.which("prometheus")
    if found:
        return found
    if os.geteuid() != 0:
        pytest.skip(
            "Debian's prometheus is not installed and this user cannot install it: run "
            "deploy/dev/prometheus-packages.sh as root (apt-get install prometheus)"
        )
    result = subprocess.run(
        [str(INSTALL_SCRIPT)], capture_output=True, text=True, timeout=900, check=False
    )
    found = shutil.which("prometheus")
    if not found:
        pytest.fail(f"{INSTALL_SCRIPT} could not install prometheus: {result.stderr[-500:]}")
    return found


@dataclass
class PrometheusProcess:
    url: str
    process: subprocess.Popen[bytes]
    log: Path

    def api(self, path: str) -> Any:
        with urllib.request.urlopen(self.url + path, timeout=5) as response:
            return json.load(response)

    def log_tail(self) -> str:
        return self.log.read_text(errors="replace")[-2000:]


@pytest.fixture(scope="module")
def prometheus(
    dcgm_exporters: dict[str, FakeDcgmExporter], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[PrometheusProcess]:
    """A real Prometheus scraping every exporter each second, up once every target is."""
    binary = prometheus_binary()
    directory = tmp_path_factory.mktemp("prometheus")
    config = {
        "global": {"scrape_interval": SCRAPE_INTERVAL, "scrape_timeout": SCRAPE_INTERVAL},
        "scrape_configs": [
            {
                "job_name": "dcgm",
                "static_configs": [
                    {"targets": [exporter.address for exporter in dcgm_exporters.values()]}
                ],
            }
        ],
    }
    # JSON is YAML: no YAML library needed.
    (directory / "prometheus.yml").write_text(json.dumps(config))
    port = free_port()
    log = directory / "prometheus.log"
    with log.open("wb") as output:
        process = subprocess.Popen(
            [
                binary,
                f"--config.file={directory / 'prometheus.yml'}",
                f"--storage.tsdb.path={directory / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}",
                "--log.level=warn",
            ],
            stdout=output,
            stderr=subprocess.STDOUT,
            cwd=directory,
        )
    running = PrometheusProcess(url=f"http://127.0.0.1:{port}", process=process, log=log)
    try:

        def all_targets_up() -> bool:
            if process.poll() is not None:
                pytest.fail(f"prometheus exited {process.returncode}: {running.log_tail()}")
            targets = running.api("/api/v1/targets")["data"]["activeTargets"]
            return len(targets) == len(dcgm_exporters) and all(
                target["health"] == "up" for target in targets
            )

        wait_for(all_targets_up, "prometheus to scrape every exporter", START_TIMEOUT)
        yield running
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


# -- canned HTTP answers for the error paths --------------------------------------------------


@dataclass
class CannedAnswer:
    status: int = 200
    body: bytes | str | dict[str, Any] = b""
    headers: dict[str, str] = field(default_factory=dict)
    delay: float = 0.0


@dataclass
class CannedServer:
    """An HTTP server on 127.0.0.1 whose ``answer`` (a function of the request) tests set."""

    server: ThreadingHTTPServer
    answer: Callable[[CannedRequest], CannedAnswer]
    requests: list[CannedRequest] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"


@dataclass
class CannedRequest:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes


@pytest.fixture
def canned_server() -> Iterator[CannedServer]:
    canned = CannedServer(server=None, answer=lambda request: CannedAnswer())  # type: ignore[arg-type]

    class Handler(BaseHTTPRequestHandler):
        def _serve(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            request = CannedRequest(
                method=self.command,
                path=self.path,
                headers=dict(self.headers.items()),
                body=self.rfile.read(length) if length else b"",
            )
            canned.requests.append(request)
            answer = canned.answer(request)
            if answer.delay:
                time.sleep(answer.delay)
            body = answer.body
            if isinstance(body, dict):
                body = json.dumps(body).encode()
                answer.headers.setdefault("Content-Type", "application/json")
            elif isinstance(body, str):
                body = body.encode()
            self.send_response(answer.status)
            for name, value in answer.headers.items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                self.wfile.write(body)

        do_GET = _serve
        do_POST = _serve

        def log_message(self, format: str, *args: Any) -> None:
            pass

    canned.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    canned.server.daemon_threads = True
    threading.Thread(target=canned.server.serve_forever, args=(0.05,), daemon=True).start()
    yield canned
    canned.server.shutdown()
    canned.server.server_close()
