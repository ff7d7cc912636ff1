"""Loki and VictoriaLogs stand-ins on 127.0.0.1 that answer in the servers' documented formats.

Neither server can be installed on this machine. These answer the endpoints the connectors
call, over real HTTP, with bodies shaped as the Loki HTTP API and VictoriaLogs querying docs
describe them:

- Loki ``GET /loki/api/v1/query_range`` → ``{"status": "success", "data": {"resultType":
  "streams", "result": [{"stream": {labels}, "values": [["<ns>", "<line>"], ...]}],
  "stats": {...}}}``, the first ``limit`` entries of ``[start, end)`` with direction=forward;
  ``/loki/api/v1/labels`` and ``/loki/api/v1/label/<name>/values`` → ``{"status": "success",
  "data": [...]}``; a query it can't parse → 400 with a plain-text ``parse error ...`` body.
- VictoriaLogs ``/select/logsql/query`` → JSON lines, one object per log with ``_msg``,
  ``_time`` (RFC 3339, nanoseconds), ``_stream`` and the other fields;
  ``/select/logsql/field_names`` and ``field_values`` → ``{"values": [{"value": ..., "hits":
  N}]}``; a query it can't parse → 400 with a plain-text ``cannot parse query`` body.

They evaluate only the query forms the connectors send (exact label matchers, a ``_time``
range, ``sort``/``limit``/``fields`` pipes) and record every request, so tests can check
both the query text and the paging. ``fail()`` makes an endpoint answer a fault instead.
"""

from __future__ import annotations

import json
import re
import socket
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

GO_STRING = r'"(?:[^"\\]|\\.)*"'
LOKI_MATCHER = re.compile(rf"\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*({GO_STRING})\s*(?:,|$)")
LOGSQL_EXACT = re.compile(rf"({GO_STRING}):=({GO_STRING})")
LOGSQL_TIME = re.compile(r"_time:\[([^,\]]+), ([^)\]]+)\)")
LOGSQL_LIMIT = re.compile(r"\| limit (\d+)")
LOGSQL_FIELDS = re.compile(r"\| fields (.+)$")


@dataclass
class Recorded:
    path: str
    params: dict[str, str]
    headers: dict[str, str]  # names in lower case


@dataclass
class Fault:
    status: int = 500
    body: bytes = b""
    delay: float = 0.0
    content_type: str = "text/plain; charset=utf-8"


@dataclass
class LokiEntry:
    labels: dict[str, str]
    timestamp_ns: int
    line: str


@dataclass
class RecordedServer:
    """One server; ``handle`` answers (status, content type, body) for a path and params."""

    handle: Callable[[str, dict[str, str]], tuple[int, str, bytes]]
    requests: list[Recorded] = field(default_factory=list)
    faults: dict[str, Fault] = field(default_factory=dict)
    url: str = ""

    def fail(self, path: str, fault: Fault) -> None:
        self.faults[path] = fault

    def queries(self, path: str) -> list[dict[str, str]]:
        return [r.params for r in self.requests if r.path == path]


def _handler_for(server: RecordedServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            parsed = urllib.parse.urlsplit(self.path)
            params = dict(urllib.parse.parse_qsl(parsed.query, keep_blank_values=True))
            headers = {k.lower(): v for k, v in self.headers.items()}
            server.requests.append(Recorded(parsed.path, params, headers))
            fault = server.faults.get(parsed.path)
            if fault is not None:
                time.sleep(fault.delay)
                status, content_type, body = fault.status, fault.content_type, fault.body
            else:
                status, content_type, body = server.handle(parsed.path, params)
            try:
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client gave up (a timeout test)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    return Handler


@contextmanager
def serving(server: RecordedServer) -> Iterator[RecordedServer]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler_for(server))
    httpd.daemon_threads = True
    server.url = f"http://127.0.0.1:{httpd.server_address[1]}"
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        httpd.shutdown()
        httpd.server_close()


def closed_port_url() -> str:
    """A loopback URL where nothing listens (the port was just freed)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    return f"http://127.0.0.1:{port}"


def _json(status: int, data: object) -> tuple[int, str, bytes]:
    return status, "application/json", json.dumps(data).encode()


def _text(status: int, text: str) -> tuple[int, str, bytes]:
    return status, "text/plain; charset=utf-8", text.encode()


def _go_unquote(quoted: str) -> str:
    body = quoted[1:-1]
    body = re.sub(r"\\x([0-9a-fA-F]{2})", lambda m: f"\\u00{m.group(1)}", body)
    unquoted: str = json.loads(f'"{body}"')
    return unquoted


# ---------------------------------------------------------------- Loki


def loki(entries: list[LokiEntry]) -> RecordedServer:
    def handle(path: str, params: dict[str, str]) -> tuple[int, str, bytes]:
        if path == "/loki/api/v1/query_range":
            return _loki_query_range(entries, params)
        if path == "/loki/api/v1/labels":
            names = sorted({name for e in entries for name in e.labels})
            return _json(200, {"status": "success", "data": names})
        found = re.fullmatch(r"/loki/api/v1/label/([^/]+)/values", path)
        if found:
            name = urllib.parse.unquote(found.group(1))
            values = sorted({e.labels[name] for e in entries if name in e.labels})
            return _json(200, {"status": "success", "data": values})
        return _text(404, "404 page not found\n")

    return RecordedServer(handle)


def _loki_query_range(entries: list[LokiEntry], params: dict[str, str]) -> tuple[int, str, bytes]:
    query = params.get("query", "")
    inner = query[1:-1] if query.startswith("{") and query.endswith("}") else None
    matchers: dict[str, str] = {}
    consumed = 0
    while inner is not None and consumed < len(inner):
        found = LOKI_MATCHER.match(inner, consumed)
        if found is None:
            inner = None
            break
        matchers[found.group(1)] = _go_unquote(found.group(2))
        consumed = found.end()
    if not matchers:
        return _text(400, f"parse error at line 1, col 1: syntax error: unexpected {query[:20]}")
    if params.get("direction") != "forward":
        return _text(400, "this recording only serves direction=forward")
    start, end = int(params["start"]), int(params["end"])
    limit = int(params.get("limit", "100"))
    chosen = sorted(
        (
            e
            for e in entries
            if start <= e.timestamp_ns < end
            and all(e.labels.get(k) == v for k, v in matchers.items())
        ),
        key=lambda e: (e.timestamp_ns, sorted(e.labels.items())),
    )[:limit]
    streams: dict[tuple[tuple[str, str], ...], list[list[str]]] = {}
    for entry in chosen:
        key = tuple(sorted(entry.labels.items()))
        streams.setdefault(key, []).append([str(entry.timestamp_ns), entry.line])
    result = [{"stream": dict(key), "values": values} for key, values in streams.items()]
    return _json(
        200,
        {
            "status": "success",
            "data": {
                "resultType": "streams",
                "result": result,
                "stats": {"summary": {"totalEntriesReturned": len(chosen)}},
            },
        },
    )


# ---------------------------------------------------------------- VictoriaLogs


def rfc3339_ns(timestamp_ns: int) -> str:
    seconds, fraction = divmod(timestamp_ns, 1_000_000_000)
    return datetime.fromtimestamp(seconds, tz=UTC).strftime("%Y-%m-%dT%H:%M:%S") + (
        f".{fraction:09d}Z"
    )


def _parse_time(text: str) -> int:
    day, fraction = text.rstrip("Z").split(".")
    moment = datetime.fromisoformat(day).replace(tzinfo=UTC)
    return int(moment.timestamp()) * 1_000_000_000 + int(fraction.ljust(9, "0"))


def victorialogs(rows: list[dict[str, Any]]) -> RecordedServer:
    """``rows`` are stored logs: ``_time`` in ns (an int), ``_msg``, ``_stream``, fields."""

    def handle(path: str, params: dict[str, str]) -> tuple[int, str, bytes]:
        if path == "/select/logsql/query":
            return _vl_query(rows, params.get("query", ""))
        if path == "/select/logsql/field_names":
            counts: dict[str, int] = {}
            for row in rows:
                for name in row:
                    counts[name] = counts.get(name, 0) + 1
            values = [{"value": n, "hits": c} for n, c in sorted(counts.items())]
            return _json(200, {"values": values})
        if path == "/select/logsql/field_values":
            name = params.get("field", "")
            if not name:
                return _text(400, "missing 'field' query arg")
            counts = {}
            for row in rows:
                if name in row:
                    counts[str(row[name])] = counts.get(str(row[name]), 0) + 1
            limit = int(params.get("limit") or 0) or len(counts)
            values = [{"value": v, "hits": c} for v, c in sorted(counts.items())][:limit]
            return _json(200, {"values": values})
        return _text(404, "missing route for " + path)

    return RecordedServer(handle)


def _vl_query(rows: list[dict[str, Any]], query: str) -> tuple[int, str, bytes]:
    # Read the filters left to right, as LogsQL does: a quoted "|" is part of a value.
    exact: dict[str, str] = {}
    position = 0
    while found := LOGSQL_EXACT.match(query, position):
        exact[json.loads(found.group(1))] = json.loads(found.group(2))
        position = found.end() + 1 if query[found.end() : found.end() + 1] == " " else found.end()
    window = LOGSQL_TIME.match(query, position)
    pipes = query[window.end() :] if window else ""
    limit = LOGSQL_LIMIT.search(pipes)
    if not exact or window is None or not pipes.startswith(" | sort by (_time)"):
        return _text(400, f"cannot parse query [{query[:80]}]: unexpected token")
    start, end = _parse_time(window.group(1)), _parse_time(window.group(2))
    chosen = sorted(
        (
            row
            for row in rows
            if start <= row["_time"] < end and all(str(row.get(k)) == v for k, v in exact.items())
        ),
        key=lambda row: (row["_time"], row.get("_stream", "")),
    )
    if limit:
        chosen = chosen[: int(limit.group(1))]
    fields = LOGSQL_FIELDS.search(pipes)
    wanted = [json.loads(n.strip()) for n in fields.group(1).split(",")] if fields else None
    lines = []
    for row in chosen:
        shown = {**row, "_time": rfc3339_ns(row["_time"])}
        if wanted is not None:
            shown = {k: v for k, v in shown.items() if k in wanted}
        lines.append(json.dumps(shown))
    return 200, "application/stream+json", ("\n".join(lines) + "\n").encode()
