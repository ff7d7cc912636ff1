"""Ingestion endpoints: jobs push heartbeats and log lines; scheduler hooks push job and node
events.

Jobs authenticate with a job token (``Authorization: Bearer wrj_…``) that names their job or
their user, scheduler hooks with a hook token (``wrh_…``); both are scoped to one cluster, whose
jobs and nodes alone are looked up. The controller's token is refused here (403). Answers:

- 200: ingested (or a repeat of a batch already ingested: ``"duplicate": true``);
- 202: accepted but ignored, with the reason (a job not opted in, a hook about an unknown job
  or node: the poll it triggers finds them if they are ours);
- 400: the body is not valid, ``fields`` lists why; 401: no or a bad token;
- 403: a token of another kind, or a job token pushing for a job it does not name (or naming a
  job id without its submit time, which covers no job);
- 404: heartbeats or logs for a job this cluster does not know (yet: a job is known once a poll
  has seen it, within a poll interval of its start);
- 413: more than a request may carry (lines, heartbeats or bytes);
- 429: past a cap of the job token for the job (``recovery.loop.push_budget.PushBudget``):
  streams of batches, heartbeats or log lines per minute; nothing of the request is stored, and
  ``Retry-After`` says when to send it again;
- 503: the per-minute counts cannot be read now; nothing is stored.

The jobs' endpoints (heartbeats and logs) are here, the scheduler hooks' in ``api.ingest.hooks``,
and what both share (the caller's token, the error answers and their OpenAPI descriptions) in
``api.ingest.common``.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import (
    OpenApiExample,
    OpenApiParameter,
    OpenApiResponse,
    PolymorphicProxySerializer,
    extend_schema,
    inline_serializer,
)
from rest_framework import serializers, status
from rest_framework.decorators import (
    api_view,
    authentication_classes,
    parser_classes,
    permission_classes,
)
from rest_framework.parsers import BaseParser
from rest_framework.request import Request
from rest_framework.response import Response

from api.authentication import IngestTokenAuthentication, IsJobToken
from api.ingest.common import (
    COMMON_RESPONSES,
    ERROR,
    INVALID_EXAMPLE,
    TAGS,
    _cluster,
    _declared_length,
    _error,
    _invalid,
    _principal,
    _too_large,
)
from api.ingest.serializers import HeartbeatRequest, LogBatchRequest
from api.parsers import BoundedJSONParser
from recovery.loop import push as pushed
from recovery.loop import push_budget
from recovery.models import Cluster, Workload

MAX_HEARTBEAT_BYTES = 1024 * 1024

IGNORED = inline_serializer(
    "IngestIgnored", {"status": serializers.CharField(), "reason": serializers.CharField()}
)
BUDGET_UNKNOWN = OpenApiResponse(
    ERROR,
    description="What the token pushed lately cannot be counted now (Redis does not answer): "
    "nothing is stored; send it again after Retry-After seconds.",
)


class RawLogParser(BaseParser):
    """A log batch sent as the body itself; its fields come in the query string."""

    media_type = "text/plain"

    def parse(self, stream: Any, media_type: str | None = None, parser_context: Any = None) -> Any:
        return {"raw": stream.read(pushed.MAX_LOG_BYTES + 1) if stream else b""}


class RawBinaryLogParser(RawLogParser):
    media_type = "application/octet-stream"


def _refused(exc: push_budget.PushRefused) -> Response:
    """Past a cap of the token: 429 with Retry-After, or 413 when never as sent."""
    if exc.retry_after is None:
        return _error(str(exc), "too_large", status.HTTP_413_REQUEST_ENTITY_TOO_LARGE)
    response = _error(
        str(exc), "throttled", status.HTTP_429_TOO_MANY_REQUESTS, retry_after=exc.retry_after
    )
    response["Retry-After"] = str(exc.retry_after)
    return response


def _budget_unknown() -> Response:
    response = _error(
        "What this token pushed lately cannot be counted right now; nothing was stored. Try "
        "again in a few seconds.",
        "unavailable",
        status.HTTP_503_SERVICE_UNAVAILABLE,
    )
    response["Retry-After"] = str(push_budget.BUDGET_UNKNOWN_RETRY_SECONDS)
    return response


def _budget(request: Request) -> push_budget.PushBudget:
    return push_budget.PushBudget.of_token(_principal(request).token.pk)


def _unbound(request: Request) -> Response | None:
    """403 for a job token that names a job id without its submit time: it covers no job."""
    problem = _principal(request).token.unbound_problem
    if not problem:
        return None
    return _error(problem, "permission_denied", status.HTTP_403_FORBIDDEN)


def _unknown_job(cluster: Cluster, job_id: str) -> Response:
    return _error(
        f"Job {job_id} is not known on cluster {cluster.name!r}. A job is known once a poll "
        "has seen it, within a poll interval of its start.",
        "not_found",
        status.HTTP_404_NOT_FOUND,
    )


def _not_this_tokens_job(request: Request, job_id: str) -> Response:
    token = _principal(request).token
    return _error(
        f"This job token may push for {token.scope} only, not for job {job_id}.",
        "permission_denied",
        status.HTTP_403_FORBIDDEN,
    )


def _covers(request: Request, job_id: str) -> bool:
    """Whether the token may name this job at all, before it is looked up (a token for one
    job learns nothing about the others)."""
    token = _principal(request).token
    return not token.job_id or token.job_id == job_id


def _may_push_for(request: Request, workload: Workload) -> bool:
    return _principal(request).token.may_push_for(
        workload.job_id, workload.submit_time, workload.user
    )


def _ignored(reason: str, **extra: Any) -> Response:
    return Response({"status": "ignored", "reason": reason, **extra}, status.HTTP_202_ACCEPTED)


# --- heartbeats ---------------------------------------------------------------------------


HEARTBEAT_RESULT = inline_serializer(
    "HeartbeatResult",
    {
        "status": serializers.CharField(),
        "heartbeats": serializers.IntegerField(),
        "samples": serializers.IntegerField(help_text="Progress samples stored."),
        "checkpoints": serializers.IntegerField(help_text="New checkpoints recorded."),
    },
)
HEARTBEAT_EXAMPLE = {
    "job_id": "48213",
    "step": 12040,
    "checkpoint_step": 12000,
    "rank": 0,
    "node": "gpu-a100-005",
    "throughput": 412.5,
    "at": "2026-11-29T03:14:17Z",
}


@extend_schema(
    tags=TAGS,
    summary="Push progress and checkpoint heartbeats (one object, or a list of them)",
    request=PolymorphicProxySerializer(
        component_name="HeartbeatOrBatch",
        serializers=[HeartbeatRequest, HeartbeatRequest(many=True)],
        resource_type_field_name=None,
        many=False,
    ),
    responses={
        200: HEARTBEAT_RESULT,
        202: OpenApiResponse(IGNORED, description="The job is not opted in to recovery."),
        404: OpenApiResponse(ERROR, description="The cluster does not know the job (yet)."),
        503: BUDGET_UNKNOWN,
        **COMMON_RESPONSES,
    },
    examples=[
        OpenApiExample("One heartbeat", value=HEARTBEAT_EXAMPLE, request_only=True),
        OpenApiExample(
            "A batch",
            value=[
                {"job_id": "48213", "step": 12039, "rank": 0, "at": "2026-11-29T03:14:16Z"},
                {"job_id": "48213", "step": 12040, "rank": 0, "checkpoint_step": 12000},
            ],
            request_only=True,
        ),
        OpenApiExample(
            "Recorded",
            value={"status": "recorded", "heartbeats": 1, "samples": 1, "checkpoints": 1},
            response_only=True,
            status_codes=["200"],
        ),
        INVALID_EXAMPLE,
    ],
)
@api_view(["POST"])
@authentication_classes([IngestTokenAuthentication])
@permission_classes([IsJobToken])
@parser_classes([BoundedJSONParser])
def heartbeats(request: Request) -> Response:
    """Progress (the step reached) and checkpoints, as the job's progress lines would show them.

    A checkpoint step at or below the last one recorded is not recorded again, so a retry is
    harmless.
    """
    if _declared_length(request) > MAX_HEARTBEAT_BYTES:
        return _too_large(f"at most {MAX_HEARTBEAT_BYTES} bytes per request")
    unbound = _unbound(request)
    if unbound is not None:
        return unbound
    cluster = _cluster(request)
    data = request.data
    many = isinstance(data, list)
    if many and len(data) > pushed.MAX_HEARTBEATS:
        return _too_large(f"at most {pushed.MAX_HEARTBEATS} heartbeats per request")
    if many and not data:
        return _invalid({"non_field_errors": ["Send at least one heartbeat."]})
    body = HeartbeatRequest(data=data, many=many, context={"cluster": cluster})
    if not body.is_valid():
        return _invalid(body.errors)
    items = body.validated_data if many else [body.validated_data]
    by_job: dict[str, list[pushed.Heartbeat]] = defaultdict(list)
    for item in items:
        by_job[item["job_id"]].append(
            pushed.Heartbeat(
                step=item["step"],
                checkpoint_step=item["checkpoint_step"],
                rank=item["rank"],
                node=item["node"],
                throughput=item["throughput"],
                at=item["at"],
            )
        )
    workloads: dict[str, Workload] = {}
    for job_id in by_job:
        if not _covers(request, job_id):
            return _not_this_tokens_job(request, job_id)
        workload = pushed.find_workload(cluster, job_id)
        if workload is None:
            return _unknown_job(cluster, job_id)
        if not _may_push_for(request, workload):
            return _not_this_tokens_job(request, job_id)
        if not workload.opted_in:
            return _ignored(f"job {job_id} is not opted in to recovery")
        workloads[job_id] = workload
    try:
        summary = pushed.record_pushed_heartbeats(
            _budget(request), [(workloads[job_id], beats) for job_id, beats in by_job.items()]
        )
    except push_budget.PushRefused as exc:
        return _refused(exc)
    except push_budget.BudgetUnknown:
        return _budget_unknown()
    return Response(
        {
            "status": "recorded",
            "heartbeats": len(items),
            "samples": summary.samples,
            "checkpoints": summary.checkpoints,
        }
    )


# --- logs ---------------------------------------------------------------------------------


LOG_RESULT = inline_serializer(
    "LogBatchResult",
    {
        "status": serializers.CharField(help_text="`ingested`, or `duplicate` for a repeat."),
        "duplicate": serializers.BooleanField(),
        "lines": serializers.IntegerField(),
        "truncated_lines": serializers.IntegerField(),
        "anomalies_new": serializers.IntegerField(),
        "checkpoints": serializers.IntegerField(),
    },
)
RAW_PARAMETERS = [
    OpenApiParameter(name, type_, description=f"With a text/plain body: the batch's `{name}`.")
    for name, type_ in (
        ("job_id", OpenApiTypes.STR),
        ("node", OpenApiTypes.STR),
        ("rank", OpenApiTypes.INT),
        ("stream", OpenApiTypes.STR),
        ("sequence", OpenApiTypes.INT),
    )
]


@extend_schema(
    tags=TAGS,
    summary="Push a batch of log lines into the detectors",
    request={"application/json": LogBatchRequest, "text/plain": OpenApiTypes.STR},
    parameters=RAW_PARAMETERS,
    responses={
        200: LOG_RESULT,
        202: OpenApiResponse(IGNORED, description="The job is not opted in to recovery."),
        404: OpenApiResponse(ERROR, description="The cluster does not know the job (yet)."),
        503: BUDGET_UNKNOWN,
        **COMMON_RESPONSES,
    },
    examples=[
        OpenApiExample(
            "Lines of rank 3",
            value={
                "job_id": "48213",
                "node": "gpu-a100-007",
                "rank": 3,
                "stream": "gpu-a100-007:3:restart0",
                "sequence": 17,
                "lines": [
                    " iteration    12040/  500000 | consumed samples: 3082240 | elapsed time "
                    "per iteration (ms): 812.4 |",
                    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.",
                ],
            },
            request_only=True,
        ),
        OpenApiExample(
            "Ingested",
            value={
                "status": "ingested",
                "duplicate": False,
                "lines": 2,
                "truncated_lines": 0,
                "anomalies_new": 1,
                "checkpoints": 0,
            },
            response_only=True,
            status_codes=["200"],
        ),
        OpenApiExample(
            "A repeat",
            value={
                "status": "duplicate",
                "duplicate": True,
                "lines": 0,
                "truncated_lines": 0,
                "anomalies_new": 0,
                "checkpoints": 0,
            },
            response_only=True,
            status_codes=["200"],
        ),
        OpenApiExample(
            "Too many lines",
            value={"error": "Too large: at most 5000 lines per request."},
            response_only=True,
            status_codes=["413"],
        ),
        INVALID_EXAMPLE,
    ],
)
@api_view(["POST"])
@authentication_classes([IngestTokenAuthentication])
@permission_classes([IsJobToken])
@parser_classes([BoundedJSONParser, RawLogParser, RawBinaryLogParser])
def logs(request: Request) -> Response:
    """Log lines scanned like the job's output file: crash signatures, progress, checkpoints.

    JSON with `lines` (or `text`), or the text itself as a `text/plain` body with the other
    fields in the query string. Bytes that are not UTF-8 become U+FFFD; a line longer than
    8192 characters is cut. With `sequence`, a batch already ingested is not ingested again.
    """
    if _declared_length(request) > pushed.MAX_LOG_BYTES:
        return _too_large(f"at most {pushed.MAX_LOG_BYTES} bytes per request")
    unbound = _unbound(request)
    if unbound is not None:
        return unbound
    cluster = _cluster(request)
    data: Any = request.data
    if isinstance(data, dict) and isinstance(data.get("raw"), bytes):
        raw: bytes = data["raw"]
        if len(raw) > pushed.MAX_LOG_BYTES:
            return _too_large(f"at most {pushed.MAX_LOG_BYTES} bytes per request")
        data = {key: request.query_params.get(key) for key in request.query_params}
        data["text"] = raw.decode("utf-8", errors="replace")
        data.pop("lines", None)
    if not isinstance(data, dict):
        return _invalid({"non_field_errors": ["Send a JSON object."]})
    lines = data.get("lines")
    if isinstance(lines, list) and len(lines) > pushed.MAX_LOG_LINES:
        return _too_large(f"at most {pushed.MAX_LOG_LINES} lines per request")
    text = data.get("text")
    if isinstance(text, str) and text.count("\n") >= pushed.MAX_LOG_LINES:
        return _too_large(f"at most {pushed.MAX_LOG_LINES} lines per request")
    body = LogBatchRequest(data=data, context={"cluster": cluster})
    if not body.is_valid():
        return _invalid(body.errors)
    valid = body.validated_data
    if not _covers(request, valid["job_id"]):
        return _not_this_tokens_job(request, valid["job_id"])
    workload = pushed.find_workload(cluster, valid["job_id"])
    if workload is None:
        return _unknown_job(cluster, valid["job_id"])
    if not _may_push_for(request, workload):
        return _not_this_tokens_job(request, valid["job_id"])
    if not workload.opted_in:
        return _ignored(f"job {valid['job_id']} is not opted in to recovery")
    try:
        summary = pushed.ingest_log_batch(
            workload,
            pushed.LogBatch(
                lines=valid["lines"] if "lines" in valid else valid["text"].splitlines(),
                node=valid["node"],
                rank=valid["rank"],
                stream=valid["stream"],
                sequence=valid["sequence"],
            ),
            budget=_budget(request),
        )
    except push_budget.PushRefused as exc:
        return _refused(exc)
    except push_budget.BudgetUnknown:
        return _budget_unknown()
    return Response(
        {
            "status": "duplicate" if summary.duplicate else "ingested",
            "duplicate": summary.duplicate,
            "lines": summary.lines,
            "truncated_lines": summary.truncated_lines,
            "anomalies_new": summary.anomalies_new,
            "checkpoints": summary.checkpoints,
        }
    )
