"""The Prometheus HTTP API (``/api/v1``) over the shared HTTP client: bounded, timed, explained.

Anything that speaks this API works: Prometheus itself, Thanos Query, Mimir/Cortex (with their
path prefix in the URL), VictoriaMetrics. Queries go as POST forms, so a long node selector
never meets a URL length limit; a server that refuses POST (HTTP 405) is asked again with GET.

Every failure becomes one ``MetricsSourceError`` whose message is a one-line diagnosis an
operator can act on (the configurator shows it as is); ``kind`` tells the cases apart.
"""

from __future__ import annotations

import json
import math
import re
import urllib.parse
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from recovery.sources.http import (
    MAX_SERVER_MESSAGE,
    ErrorKind,
    Reply,
    Wording,
    authorization,
    exchange,
    parse_json,
    server_message,
    with_query,
)
from recovery.sources.metrics.base import (
    MetricSource,
    MetricsSourceError,
    Point,
    Sample,
    Series,
    StepArg,
    TimeArg,
)

DEFAULT_TIMEOUT = 10.0
DEFAULT_MAX_RESPONSE_BYTES = 64 * 1024 * 1024
USER_AGENT = "workload-recovery-metrics-connector/1"
# Prometheus refuses range queries of more points than this per series.
MAX_POINTS_PER_SERIES = 11_000
LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")

WORDING = Wording(
    refused=" (is Prometheus running, on this port?)",
    not_http_kind=ErrorKind.NOT_PROMETHEUS,
    not_http="is this the Prometheus port?",
    oversized="narrow the query (fewer series, a shorter range or a larger step)",
)


class PrometheusSource(MetricSource):
    """A Prometheus-compatible server at ``url`` (scheme, host, port and any path prefix).

    ``basic_auth`` is a (user, password) pair; give it or ``bearer_token``, not both.
    """

    kind = "prometheus"
    service = "Prometheus"

    def __init__(
        self,
        url: str,
        *,
        timeout: float = DEFAULT_TIMEOUT,
        bearer_token: str | None = None,
        basic_auth: tuple[str, str] | None = None,
        max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES,
    ) -> None:
        parsed = urllib.parse.urlsplit(url.strip())
        if parsed.scheme not in ("http", "https") or not parsed.hostname:
            raise MetricsSourceError(
                ErrorKind.INVALID_URL,
                f"{url[:200]!r} is not an http(s) URL of a Prometheus server "
                "(e.g. http://prometheus:9090)",
            )
        if parsed.query or parsed.fragment:
            raise MetricsSourceError(
                ErrorKind.INVALID_URL, "the Prometheus URL must not carry a query or fragment"
            )
        if parsed.username or parsed.password:
            raise MetricsSourceError(
                ErrorKind.INVALID_URL,
                "put credentials in basic_auth or bearer_token, not in the URL",
            )
        if bearer_token and basic_auth:
            raise ValueError("give a bearer token or basic auth, not both")
        if not 0 < timeout <= 600:
            raise ValueError("the timeout must be between 0 and 600 seconds")
        self.url = urllib.parse.urlunsplit(
            (parsed.scheme, parsed.netloc, parsed.path.rstrip("/"), "", "")
        )
        self.timeout = timeout
        self.max_response_bytes = max_response_bytes
        user, password = basic_auth or ("", "")
        self._authorization = authorization(
            bearer_token=bearer_token or "", username=user, password=password
        )
        self._post_allowed = True

    def __repr__(self) -> str:
        return f"PrometheusSource({self.url!r})"

    # -- queries ------------------------------------------------------------------------------

    def instant(self, query: str, at: TimeArg | None = None) -> list[Sample]:
        """The value of ``query`` at ``at`` (the server's now when None).

        A vector gives one ``Sample`` per series; a scalar gives one ``Sample`` without labels.
        A query that yields a range vector (``metric[5m]``) or a string is refused as a bad
        query: wrap a range vector in a function such as ``last_over_time``.
        """
        params = [("query", query)]
        if at is not None:
            params.append(("time", _timestamp(at)))
        data = self._call("/api/v1/query", params)
        result_type, result = self._result(data, "/api/v1/query")
        if result_type == "vector":
            return [self._sample(item, "/api/v1/query") for item in result]
        if result_type == "scalar":
            at_, value = self._pair(result, "/api/v1/query")
            return [Sample(labels={}, at=at_, value=value)]
        if result_type == "matrix":
            raise MetricsSourceError(
                ErrorKind.BAD_QUERY,
                f"{self._where('/api/v1/query')}: {query[:120]!r} is a range vector; use a "
                "range query, or wrap it in a function such as last_over_time()",
            )
        raise MetricsSourceError(
            ErrorKind.BAD_QUERY,
            f"{self._where('/api/v1/query')}: {query[:120]!r} yields a {result_type}, not numbers",
        )

    def range(self, query: str, start: TimeArg, end: TimeArg, step: StepArg) -> list[Series]:
        """The values of ``query`` every ``step`` from ``start`` to ``end``, per series."""
        step_seconds = _seconds(step)
        if step_seconds <= 0:
            raise ValueError("the step must be positive")
        span = _as_epoch(end) - _as_epoch(start)
        if span < 0:
            raise ValueError("the range ends before it starts")
        if span / step_seconds >= MAX_POINTS_PER_SERIES:
            # Prometheus would refuse it too; say what to change before asking.
            raise MetricsSourceError(
                ErrorKind.BAD_QUERY,
                f"a range of {span:g}s at a {step_seconds:g}s step is more than "
                f"{MAX_POINTS_PER_SERIES:,} points per series: use a step of at least "
                f"{math.ceil(span / (MAX_POINTS_PER_SERIES - 1))}s",
            )
        params = [
            ("query", query),
            ("start", _timestamp(start)),
            ("end", _timestamp(end)),
            ("step", _format_seconds(step_seconds)),
        ]
        path = "/api/v1/query_range"
        data = self._call(path, params)
        result_type, result = self._result(data, path)
        if result_type != "matrix":
            raise self._malformed(path, f"a range query answered a {result_type}, not a matrix")
        series = []
        for item in result:
            if not isinstance(item, dict) or not isinstance(item.get("values", []), list):
                raise self._malformed(path, "a matrix element is not {metric, values}")
            labels = self._labels(item.get("metric"), path)
            points = tuple(self._point(pair, path) for pair in item.get("values", []))
            series.append(Series(labels=labels, points=points))
        return series

    # -- discovery ----------------------------------------------------------------------------

    def series(
        self,
        match: str | Sequence[str],
        start: TimeArg | None = None,
        end: TimeArg | None = None,
    ) -> list[dict[str, str]]:
        """The label sets of the series that ``match`` selects (one selector or several)."""
        selectors = [match] if isinstance(match, str) else list(match)
        if not selectors:
            raise ValueError("series() needs at least one selector")
        params = [("match[]", selector) for selector in selectors]
        params += self._window(start, end)
        path = "/api/v1/series"
        data = self._call(path, params)
        if not isinstance(data, list):
            raise self._malformed(path, "data is not a list of label sets")
        return [self._labels(item, path) for item in data]

    def label_names(
        self,
        match: str | Sequence[str] = (),
        start: TimeArg | None = None,
        end: TimeArg | None = None,
    ) -> list[str]:
        """The label names in use (in the series ``match`` selects, when given)."""
        selectors = [match] if isinstance(match, str) else list(match)
        params = [("match[]", selector) for selector in selectors] + self._window(start, end)
        return self._strings("/api/v1/labels", params)

    def label_values(
        self,
        name: str,
        match: str | Sequence[str] = (),
        start: TimeArg | None = None,
        end: TimeArg | None = None,
    ) -> list[str]:
        """The values label ``name`` takes (in the series ``match`` selects, when given)."""
        if not LABEL_NAME.fullmatch(name):
            raise MetricsSourceError(
                ErrorKind.BAD_QUERY,
                f"{name[:80]!r} is not a Prometheus label name ([a-zA-Z_][a-zA-Z0-9_]*)",
            )
        selectors = [match] if isinstance(match, str) else list(match)
        params = [("match[]", selector) for selector in selectors] + self._window(start, end)
        # The label values endpoint is GET only.
        return self._strings(f"/api/v1/label/{name}/values", params, post=False)

    def build_info(self) -> dict[str, str]:
        """The server's version and build (``/api/v1/status/buildinfo``): proves it answers."""
        path = "/api/v1/status/buildinfo"
        data = self._call(path, [], post=False)
        if not isinstance(data, dict):
            raise self._malformed(path, "data is not an object")
        return {str(key): str(value) for key, value in data.items()}

    # -- HTTP ---------------------------------------------------------------------------------

    def _call(self, path: str, params: list[tuple[str, str]], *, post: bool = True) -> Any:
        """The ``data`` of a successful answer to ``path``, or a ``MetricsSourceError``."""
        if post and self._post_allowed:
            reply = self._exchange(path, params, post=True)
            if reply.status == 405:
                # Some proxies in front of Prometheus allow GET only; remember it.
                self._post_allowed = False
                reply = self._exchange(path, params, post=False)
        else:
            reply = self._exchange(path, params, post=False)
        return self._interpret(path, reply)

    def _exchange(self, path: str, params: list[tuple[str, str]], *, post: bool) -> Reply:
        headers = {"User-Agent": USER_AGENT, "Accept": "application/json"}
        if self._authorization:
            headers["Authorization"] = self._authorization
        url, content = self.url + path, None
        if post:
            content = urllib.parse.urlencode(params).encode()
            headers["Content-Type"] = "application/x-www-form-urlencoded"
        else:
            url = with_query(url, params)
        return exchange(
            "POST" if post else "GET",
            url,
            timeout=self.timeout,
            max_response_bytes=self.max_response_bytes,
            where=self._where(path),
            headers=headers,
            content=content,
            wording=WORDING,
            error=MetricsSourceError,
        )

    def _interpret(self, path: str, reply: Reply) -> Any:
        where = self._where(path)
        status, body, headers = reply.status, reply.body, reply.headers
        payload = _json_object(body)
        if status in (401, 403):
            said = _server_message(body)
            if not self._authorization:
                advice = "it needs credentials: give a bearer token or basic auth"
            elif status == 401:
                advice = "it refused the credentials: check the token or user/password"
            else:
                advice = "the credentials lack access to this API"
            raise MetricsSourceError(
                ErrorKind.AUTH,
                f"{where} answered HTTP {status}: {advice}"
                + (f" (server said: {said})" if said else ""),
                status=status,
            )
        if 300 <= status < 400:
            target = headers.get("Location", "")
            raise MetricsSourceError(
                ErrorKind.HTTP,
                f"{where} redirects (HTTP {status}) to {target[:200] or 'elsewhere'}: a login "
                "page or a moved server; configure the final Prometheus URL directly",
                status=status,
            )
        if payload is None or "status" not in payload:
            raise self._not_prometheus(path, status, body, headers)
        if payload["status"] == "error":
            raise self._refusal(path, status, payload)
        if payload["status"] != "success" or not 200 <= status < 300:
            raise self._malformed(path, f"HTTP {status} with status {payload['status']!r}")
        if "data" not in payload:
            raise self._malformed(path, "a success without data")
        return payload["data"]

    def _not_prometheus(
        self, path: str, status: int, body: bytes, headers: Mapping[str, str]
    ) -> Exception:
        where = self._where(path)
        content_type = headers.get("Content-Type", "").lower()
        text = body.lstrip()[:200].lower()
        if "html" in content_type or text.startswith((b"<!doctype", b"<html", b"<")):
            return MetricsSourceError(
                ErrorKind.NOT_PROMETHEUS,
                f"{where} answered HTTP {status} with an HTML page, not the Prometheus API: "
                "is the URL the Prometheus server itself (not a UI, proxy or login page)?",
                status=status,
            )
        if status == 404:
            return MetricsSourceError(
                ErrorKind.NOT_PROMETHEUS,
                f"{where} has no such path (HTTP 404): not a Prometheus API, or a path prefix "
                "is missing from the URL",
                status=status,
            )
        if status >= 500:
            said = _server_message(body)
            return MetricsSourceError(
                ErrorKind.SERVER,
                f"{where} failed on its side (HTTP {status})" + (f": {said}" if said else ""),
                status=status,
            )
        if status >= 400:
            said = _server_message(body)
            return MetricsSourceError(
                ErrorKind.HTTP,
                f"{where} answered HTTP {status}" + (f": {said}" if said else ""),
                status=status,
            )
        if _json_value(body) is not _NOT_JSON:
            return MetricsSourceError(
                ErrorKind.NOT_PROMETHEUS,
                f"{where} answered JSON without Prometheus' status field: not a Prometheus API",
                status=status,
            )
        return MetricsSourceError(
            ErrorKind.MALFORMED,
            f"{where} answered HTTP {status} with something that is not JSON "
            f"({body[:60].decode('utf-8', errors='replace')!r}): is this Prometheus?",
            status=status,
        )

    def _refusal(self, path: str, status: int, payload: dict[str, Any]) -> MetricsSourceError:
        """Prometheus' own ``{"status": "error", "errorType", "error"}`` as a diagnosis."""
        where = self._where(path)
        error_type = str(payload.get("errorType") or "")
        said = " ".join(str(payload.get("error") or "no reason given").split())
        said = said[:MAX_SERVER_MESSAGE]
        if error_type in ("timeout", "canceled"):
            kind, text = ErrorKind.TIMEOUT, f"the query {error_type} on the server: {said}"
        elif error_type in ("bad_data", "execution", "not_found") or status in (400, 422):
            kind, text = ErrorKind.BAD_QUERY, f"the query was refused ({error_type}): {said}"
        else:
            kind = ErrorKind.SERVER
            text = f"failed on its side ({error_type or f'HTTP {status}'}): {said}"
        return MetricsSourceError(
            kind, f"{where}: {text}", status=status, error_type=error_type, server_message=said
        )

    def _malformed(self, path: str, what: str) -> MetricsSourceError:
        return MetricsSourceError(
            ErrorKind.MALFORMED,
            f"{self._where(path)} answered JSON of the wrong shape ({what}): is this a "
            "Prometheus-compatible API?",
        )

    def _where(self, path: str) -> str:
        return f"{self.service} at {self.url}{path}"

    # -- decoding -----------------------------------------------------------------------------

    def _result(self, data: Any, path: str) -> tuple[str, Any]:
        if not isinstance(data, dict) or "resultType" not in data or "result" not in data:
            raise self._malformed(path, "data has no resultType/result")
        result_type, result = str(data["resultType"]), data["result"]
        if result_type in ("vector", "matrix") and not isinstance(result, list):
            raise self._malformed(path, f"a {result_type} that is not a list")
        return result_type, result

    def _sample(self, item: Any, path: str) -> Sample:
        if not isinstance(item, dict) or "value" not in item:
            # Native histograms come as "histogram" instead of "value"; they carry no single
            # number to compare, so they are refused by name rather than misread.
            if isinstance(item, dict) and "histogram" in item:
                raise MetricsSourceError(
                    ErrorKind.BAD_QUERY,
                    f"{self._where(path)}: the query returns native histograms; query a "
                    "number instead (e.g. histogram_quantile or histogram_count)",
                )
            raise self._malformed(path, "a vector element is not {metric, value}")
        at, value = self._pair(item["value"], path)
        return Sample(labels=self._labels(item.get("metric"), path), at=at, value=value)

    def _point(self, pair: Any, path: str) -> Point:
        at, value = self._pair(pair, path)
        return Point(at, value)

    def _pair(self, pair: Any, path: str) -> tuple[datetime, float]:
        # Prometheus sends [unix seconds, "value"], the value as a string so that NaN and
        # ±Inf survive JSON.
        if not isinstance(pair, list) or len(pair) != 2:
            raise self._malformed(path, "a sample is not a [time, value] pair")
        try:
            at = datetime.fromtimestamp(float(pair[0]), tz=UTC)
            value = float(pair[1])
        except (TypeError, ValueError, OverflowError, OSError):
            raise self._malformed(path, f"a sample {str(pair)[:60]} is not numbers") from None
        return at, value

    def _labels(self, labels: Any, path: str) -> dict[str, str]:
        if labels is None:
            return {}
        if not isinstance(labels, dict) or not all(
            isinstance(key, str) and isinstance(value, str) for key, value in labels.items()
        ):
            raise self._malformed(path, "a label set is not an object of strings")
        return dict(labels)

    def _strings(self, path: str, params: list[tuple[str, str]], *, post: bool = True) -> list[str]:
        data = self._call(path, params, post=post)
        if not isinstance(data, list) or not all(isinstance(item, str) for item in data):
            raise self._malformed(path, "data is not a list of strings")
        return list(data)

    @staticmethod
    def _window(start: TimeArg | None, end: TimeArg | None) -> list[tuple[str, str]]:
        params = []
        if start is not None:
            params.append(("start", _timestamp(start)))
        if end is not None:
            params.append(("end", _timestamp(end)))
        return params


# -- helpers ----------------------------------------------------------------------------------

_NOT_JSON = object()


def _json_value(body: bytes) -> Any:
    try:
        return parse_json(body)
    except ValueError:
        return _NOT_JSON


def _json_object(body: bytes) -> dict[str, Any] | None:
    value = _json_value(body)
    return value if isinstance(value, dict) else None


def _server_message(body: bytes) -> str:
    return server_message(body, skip_html=True)


def _as_epoch(value: TimeArg) -> float:
    if isinstance(value, datetime):
        if value.tzinfo is None:
            raise ValueError("give an aware datetime (a naive one has no defined instant)")
        return value.timestamp()
    return float(value)


def _timestamp(value: TimeArg) -> str:
    return _format_seconds(_as_epoch(value))


def _seconds(step: StepArg) -> float:
    return step.total_seconds() if isinstance(step, timedelta) else float(step)


def _format_seconds(seconds: float) -> str:
    text = f"{seconds:.3f}".rstrip("0").rstrip(".")
    return text or "0"


def promql_string(value: str) -> str:
    """``value`` as a PromQL double-quoted string literal (Go escaping)."""
    return json.dumps(value, ensure_ascii=False)
