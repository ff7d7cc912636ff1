"""Ingestion endpoints for scheduler hooks: a job ended, nodes went down.

Hooks authenticate with a hook token (``wrh_…``) and push events, not evidence: each is recorded
and queues a poll of the cluster, which reads the scheduler's own state. They are apart from the
jobs' endpoints (``api.ingest.views``, whose docstring lists the answers of both) because nothing
of a job token's budget or scope applies to them.
"""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import OpenApiExample, OpenApiResponse, extend_schema, inline_serializer
from rest_framework import serializers, status
from rest_framework.decorators import (
    api_view,
    authentication_classes,
    parser_classes,
    permission_classes,
)
from rest_framework.request import Request
from rest_framework.response import Response

from api.authentication import IngestTokenAuthentication, IsHookToken
from api.ingest.common import (
    COMMON_RESPONSES,
    INVALID_EXAMPLE,
    TAGS,
    _cluster,
    _declared_length,
    _invalid,
    _principal,
    _too_large,
)
from api.ingest.serializers import JobEndedRequest, NodeDownRequest
from api.parsers import BoundedJSONParser
from recovery.loop import scheduler_hooks
from tasks.polling import queue_poll

MAX_HOOK_BYTES = 256 * 1024


def _actor(request: Request) -> str:
    return _principal(request).actor


def _hook_result_fields() -> dict[str, serializers.Field[Any, Any, Any, Any]]:
    return {
        "status": serializers.CharField(help_text="`recorded`, `duplicate` or `ignored`."),
        "reason": serializers.CharField(),
        "poll_requested": serializers.BooleanField(
            help_text="A poll of the cluster is queued, which reads the scheduler's own state."
        ),
        "event": serializers.IntegerField(allow_null=True, help_text="The audit event written."),
    }


HOOK_RESULT = inline_serializer("HookResult", _hook_result_fields())
NODE_DOWN_RESULT = inline_serializer(
    "NodeDownResult",
    {
        "results": inline_serializer(
            "NodeDownOne", {"node": serializers.CharField(), **_hook_result_fields()}, many=True
        )
    },
)


def _hook_response(outcome: scheduler_hooks.HookOutcome) -> Response:
    return Response(
        {
            "status": outcome.status,
            "reason": outcome.reason,
            "poll_requested": outcome.poll_requested,
            "event": outcome.event.pk if outcome.event else None,
        },
        status=status.HTTP_202_ACCEPTED
        if outcome.status == scheduler_hooks.HookStatus.IGNORED
        else status.HTTP_200_OK,
    )


@extend_schema(
    tags=TAGS,
    summary="A scheduler hook says a job ended (EpilogSlurmctld)",
    request=JobEndedRequest,
    responses={
        200: OpenApiResponse(HOOK_RESULT, description="Recorded, or recorded before."),
        202: OpenApiResponse(HOOK_RESULT, description="Ignored: unknown or not opted-in job."),
        **COMMON_RESPONSES,
    },
    examples=[
        OpenApiExample(
            "A job that failed",
            value={
                "job_id": "48213",
                "state": "NODE_FAIL",
                "exit_code": 0,
                "exit_code_text": "0:0",
                "nodes": "gpu-a100-[005,007]",
                "restart_count": 1,
            },
            request_only=True,
        ),
        OpenApiExample(
            "Recorded",
            value={
                "status": "recorded",
                "reason": "job end recorded",
                "poll_requested": True,
                "event": 90211,
            },
            response_only=True,
            status_codes=["200"],
        ),
        OpenApiExample(
            "Not one of ours",
            value={
                "status": "ignored",
                "reason": "job 48299 is not known on cluster lab",
                "poll_requested": True,
                "event": None,
            },
            response_only=True,
            status_codes=["202"],
        ),
        INVALID_EXAMPLE,
    ],
)
@api_view(["POST"])
@authentication_classes([IngestTokenAuthentication])
@permission_classes([IsHookToken])
@parser_classes([BoundedJSONParser])
def job_ended(request: Request) -> Response:
    """Record that a job ended and queue an immediate poll of its cluster.

    The pushed state is recorded, not acted on: the poll reads the job's state from the
    scheduler, so a repeated or late hook is harmless.
    """
    if _declared_length(request) > MAX_HOOK_BYTES:
        return _too_large(f"at most {MAX_HOOK_BYTES} bytes per request")
    cluster = _cluster(request)
    body = JobEndedRequest(data=request.data, context={"cluster": cluster})
    if not body.is_valid():
        return _invalid(body.errors)
    valid = body.validated_data
    outcome = scheduler_hooks.record_job_ended(
        cluster,
        scheduler_hooks.JobEnded(
            job_id=valid["job_id"],
            state=valid["state"],
            exit_code=valid["exit_code"],
            exit_code_text=valid["exit_code_text"],
            nodes=valid["nodes"],
            restart_count=valid["restart_count"],
        ),
        actor=_actor(request),
        queue_poll=queue_poll,
    )
    return _hook_response(outcome)


@extend_schema(
    tags=TAGS,
    summary="A scheduler hook says nodes went down (strigger --node --down)",
    request=NodeDownRequest,
    responses={200: NODE_DOWN_RESULT, **COMMON_RESPONSES},
    examples=[
        OpenApiExample(
            "Two nodes down",
            value={"node": "gpu-a100-[005,007]", "state": "DOWN", "reason": "Not responding"},
            request_only=True,
        ),
        OpenApiExample(
            "Recorded",
            value={
                "results": [
                    {
                        "node": "gpu-a100-005",
                        "status": "recorded",
                        "reason": "node state recorded",
                        "poll_requested": True,
                        "event": 90212,
                    }
                ]
            },
            response_only=True,
            status_codes=["200"],
        ),
        INVALID_EXAMPLE,
    ],
)
@api_view(["POST"])
@authentication_classes([IngestTokenAuthentication])
@permission_classes([IsHookToken])
@parser_classes([BoundedJSONParser])
def node_down(request: Request) -> Response:
    """Record that nodes went down and queue an immediate poll of their cluster.

    Each node gets its own result: `recorded`, `duplicate` (the same state within ten
    minutes) or `ignored` (a node the cluster does not know).
    """
    if _declared_length(request) > MAX_HOOK_BYTES:
        return _too_large(f"at most {MAX_HOOK_BYTES} bytes per request")
    cluster = _cluster(request)
    body = NodeDownRequest(data=request.data, context={"cluster": cluster})
    if not body.is_valid():
        return _invalid(body.errors)
    valid = body.validated_data
    results = []
    for name in valid["node"]:
        outcome = scheduler_hooks.record_node_down(
            cluster,
            scheduler_hooks.NodeDown(node=name, state=valid["state"], reason=valid["reason"]),
            actor=_actor(request),
            queue_poll=queue_poll,
        )
        results.append(
            {
                "node": name,
                "status": outcome.status,
                "reason": outcome.reason,
                "poll_requested": outcome.poll_requested,
                "event": outcome.event.pk if outcome.event else None,
            }
        )
    return Response({"results": results})
