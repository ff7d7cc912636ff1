"""The Advisor API: how a scheduler-side controller learns what to do and says what it did.

A controller's token belongs to one cluster; it sees and claims only that cluster's
recommendations. Anything of another cluster answers 404, as if it did not exist.

A lease is held by one controller process, not by its token: every process makes an instance
id at start and sends it in the ``X-Controller-Instance`` header. Claims, renewals, dispatches
and reports are checked against it, so that two controllers sharing one token (or one restarted
while its lease runs) never act on each other's leases; the audit trail's actor stays the
token's name, and the instance id is in each event's payload. A call without it (a controller
of an earlier release) is refused with 400, saying to upgrade: acting on a lease nobody can
tell apart from another's is what the instance id is there to prevent.

The request and answer bodies are in ``api.advisor_serializers``.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

from django.shortcuts import get_object_or_404
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import (
    OpenApiExample,
    OpenApiParameter,
    OpenApiResponse,
    extend_schema,
    inline_serializer,
)
from rest_framework import exceptions, serializers, status
from rest_framework.decorators import api_view, authentication_classes, permission_classes
from rest_framework.request import Request
from rest_framework.response import Response

from api.advisor_serializers import (
    ClaimRequest,
    DispatchRequest,
    RecommendationForController,
    ReportRequest,
)
from api.authentication import ControllerPrincipal, ControllerTokenAuthentication, IsController
from api.errors import error_body
from recovery.loop import leases, recommendations
from recovery.models import Recommendation
from recovery.models.cluster import scheduler_cluster_name
from recovery.models.recommendation import InvalidTransition

INSTANCE_HEADER = "X-Controller-Instance"
OLD_CONTROLLER = (
    f"This Advisor API call needs the controller's instance id in the {INSTANCE_HEADER} header, "
    "which Advisor Controllers of earlier releases do not send: upgrade the controller (its "
    "wheel, or manage.py advisor_controller of this release). Each controller process makes "
    "its own at start, so that two controllers sharing one token never act on each other's "
    "leases."
)
INSTANCE_PARAMETER = OpenApiParameter(
    INSTANCE_HEADER,
    OpenApiTypes.UUID,
    OpenApiParameter.HEADER,
    required=True,
    description="The calling controller process's instance id, a UUID it made at start; the "
    "lease it claims is held by it, not by the token.",
)


class ControllerInstanceRequired(exceptions.APIException):
    status_code = status.HTTP_400_BAD_REQUEST
    default_detail = OLD_CONTROLLER
    default_code = "controller_instance_required"


def _instance(request: Request) -> str:
    """The calling controller process's instance id, from its header (canonical UUID form)."""
    raw = request.headers.get(INSTANCE_HEADER, "")
    if not raw:
        raise ControllerInstanceRequired()
    try:
        return str(uuid.UUID(raw))
    except ValueError:
        raise ControllerInstanceRequired(
            f"{INSTANCE_HEADER} must be a UUID, the one the controller process made at start, "
            f"not {raw[:64]!r}."
        ) from None


ERROR = inline_serializer("Error", {"error": serializers.CharField()})
# Claim and renew: the same request, the same answers but for why a 409.
LEASE_RESPONSES = {
    200: RecommendationForController,
    400: OpenApiResponse(
        ERROR, description="The lease is out of range, or no controller instance id was sent."
    ),
    401: OpenApiResponse(ERROR, description="No controller token, or a revoked one."),
    404: OpenApiResponse(description="Not a recommendation of this token's cluster."),
}
RECOMMENDATION_EXAMPLE = {
    "id": 812,
    "idempotency_key": "policy:lab:48213:2:gpu_hardware",
    "job_id": "48213",
    "submit_time": "2026-11-29T01:12:09Z",
    "job_name": "llama-70b-pretrain",
    "user": "mlresearch",
    "partition": "gpu",
    "attempt": 2,
    "attempt_started_at": "2026-11-29T02:40:31Z",
    "action": "restart_excluding",
    "node": "",
    "excluded_nodes": ["gpu-a100-007"],
    "reason": "Xid 79 (GPU fell off the bus) on gpu-a100-007",
    "status": "ready",
    "approved_by": "",
    "lease_owner": "",
    "lease_instance": "",
    "lease_expires_at": None,
    "expires_at": "2026-11-29T03:44:15Z",
    "created_at": "2026-11-29T03:14:17Z",
}


def _principal(request: Request) -> ControllerPrincipal:
    principal = request.user
    assert isinstance(principal, ControllerPrincipal)
    return principal


def _own(request: Request, recommendation_id: int) -> Recommendation:
    return get_object_or_404(
        Recommendation, pk=recommendation_id, workload__cluster=_principal(request).cluster
    )


def _lease(
    request: Request, recommendation_id: int, take: Callable[..., Recommendation]
) -> Response:
    """Claim or renew: the same body, the same answers."""
    instance = _instance(request)
    _own(request, recommendation_id)
    body = ClaimRequest(data=request.data)
    if not body.is_valid():
        return _invalid(body.errors)
    try:
        held = take(
            recommendation_id,
            controller=_principal(request).actor,
            instance=instance,
            lease_seconds=body.validated_data["lease_seconds"],
        )
    except InvalidTransition as exc:
        return _conflict(exc)
    return Response(RecommendationForController(held).data)


def _conflict(exc: Exception) -> Response:
    return Response(error_body(str(exc), "conflict"), status=status.HTTP_409_CONFLICT)


def _invalid(errors: Any) -> Response:
    return Response(
        error_body("The request body is not valid.", "invalid", fields=errors),
        status=status.HTTP_400_BAD_REQUEST,
    )


@extend_schema(
    tags=["advisor"],
    responses={
        200: inline_serializer(
            "ReadyRecommendations", {"results": RecommendationForController(many=True)}
        ),
        401: OpenApiResponse(ERROR, description="No controller token, or a revoked one."),
    },
    examples=[
        OpenApiExample(
            "One restart to carry out",
            value={"results": [RECOMMENDATION_EXAMPLE]},
            response_only=True,
        )
    ],
)
@api_view(["GET"])
@authentication_classes([ControllerTokenAuthentication])
@permission_classes([IsController])
def ready(request: Request) -> Response:
    """Recommendations this cluster's controller may claim now, oldest first."""
    claimable = recommendations.claimable_for(_principal(request).cluster)
    return Response({"results": RecommendationForController(claimable[:100], many=True).data})


@extend_schema(
    tags=["advisor"],
    request=ClaimRequest,
    parameters=[INSTANCE_PARAMETER],
    responses={
        **LEASE_RESPONSES,
        409: OpenApiResponse(
            ERROR,
            description="Another controller (another process with the same token included) "
            "holds it, it is done, or past its deadline.",
        ),
    },
    examples=[
        OpenApiExample("Claim for two minutes", value={"lease_seconds": 120}, request_only=True),
        OpenApiExample(
            "Claimed",
            value={
                **RECOMMENDATION_EXAMPLE,
                "status": "claimed",
                "lease_owner": "controller:slurm-advisor-1",
                "lease_instance": "7d0c4f7e-2b1a-4c55-9a51-3f0e8c2d9b14",
                "lease_expires_at": "2026-11-29T03:16:17Z",
            },
            response_only=True,
            status_codes=["200"],
        ),
        OpenApiExample(
            "Held by another controller",
            value={
                "error": "recommendation 812 is claimed, held by controller:slurm-advisor-2 "
                "(instance 0b6a3e52-94d1-4c1e-8f0f-5d7b2a9c6e31)"
            },
            response_only=True,
            status_codes=["409"],
        ),
    ],
)
@api_view(["POST"])
@authentication_classes([ControllerTokenAuthentication])
@permission_classes([IsController])
def claim(request: Request, recommendation_id: int) -> Response:
    """Take one recommendation for a lease; only one controller process can hold it."""
    return _lease(request, recommendation_id, recommendations.claim)


@extend_schema(
    tags=["advisor"],
    request=ReportRequest,
    parameters=[INSTANCE_PARAMETER],
    responses={
        200: RecommendationForController,
        400: OpenApiResponse(
            ERROR,
            description="The body is not valid (fields say why), or no controller instance id "
            "was sent.",
        ),
        401: OpenApiResponse(ERROR, description="No controller token, or a revoked one."),
        404: OpenApiResponse(description="Not a recommendation of this token's cluster."),
        409: OpenApiResponse(
            ERROR,
            description="This controller process does not hold the lease (the refusal is audited).",
        ),
    },
    examples=[
        OpenApiExample(
            "Restart carried out",
            value={
                "outcome": "executed",
                "state_before": {
                    "job_state": "RUNNING",
                    "restart_count": 1,
                    "nodes": ["gpu-a100-005", "gpu-a100-007"],
                    "excluded_nodes": [],
                    "held": False,
                },
                "commands": [
                    {"argv": ["scontrol", "requeuehold", "48213"], "returncode": 0},
                    {
                        "argv": ["scontrol", "update", "JobId=48213", "ExcNodeList=gpu-a100-007"],
                        "returncode": 0,
                    },
                    {"argv": ["scontrol", "release", "48213"], "returncode": 0},
                ],
                "converged": True,
                "detail": "",
            },
            request_only=True,
        ),
        OpenApiExample(
            "Already done by a previous controller",
            value={
                "outcome": "skipped",
                "state_before": {"job_state": "RUNNING", "restart_count": 2, "held": False},
                "commands": [],
                "converged": True,
                "detail": "restart count already 2 with the exclusions set",
            },
            request_only=True,
        ),
    ],
)
@api_view(["POST"])
@authentication_classes([ControllerTokenAuthentication])
@permission_classes([IsController])
def report(request: Request, recommendation_id: int) -> Response:
    """Say what happened: executed, skipped (already done), failed, or retry.

    ``retry`` gives the recommendation back (ready) to be taken up again from the scheduler's
    state: a read failed, a fact the action depends on was unknown, or the action is half done.
    A report from a controller process that does not hold the lease (another one with the same
    token included) is refused (409) and audited.
    """
    instance = _instance(request)
    _own(request, recommendation_id)
    body = ReportRequest(data=request.data)
    if not body.is_valid():
        return _invalid(body.errors)
    data = body.validated_data
    try:
        reported = recommendations.report(
            recommendation_id,
            controller=_principal(request).actor,
            instance=instance,
            result=recommendations.ActionReport(
                outcome=data["outcome"],
                state_before=data["state_before"],
                commands=[dict(command) for command in data["commands"]],
                converged=data["converged"],
                detail=data["detail"],
            ),
        )
    except InvalidTransition as exc:
        return _conflict(exc)
    return Response(RecommendationForController(reported).data)


@extend_schema(
    tags=["advisor"],
    request=DispatchRequest,
    parameters=[INSTANCE_PARAMETER],
    responses={
        200: inline_serializer("Dispatched", {"event": serializers.IntegerField()}),
        400: OpenApiResponse(
            ERROR,
            description="The body is not valid (fields say why), or no controller instance id "
            "was sent.",
        ),
        401: OpenApiResponse(ERROR, description="No controller token, or a revoked one."),
        404: OpenApiResponse(description="Not a recommendation of this token's cluster."),
        409: OpenApiResponse(
            ERROR,
            description="This controller process does not hold the lease (another one with the "
            "same token may), or its lease ran out: run nothing.",
        ),
    },
    examples=[
        OpenApiExample(
            "About to set the exclusions",
            value={
                "argv": ["scontrol", "update", "JobId=48213", "ExcNodeList=gpu-a100-007"],
                "sequence": 2,
            },
            request_only=True,
        ),
        OpenApiExample("Recorded", value={"event": 90412}, response_only=True),
        OpenApiExample(
            "The lease ran out",
            value={
                "error": "the lease of controller:slurm-advisor-1 on recommendation 812 ran out "
                "at 2026-11-29T03:16:17+00:00: the next claimant acts on it, not "
                "controller:slurm-advisor-1"
            },
            response_only=True,
            status_codes=["409"],
        ),
    ],
)
@api_view(["POST"])
@authentication_classes([ControllerTokenAuthentication])
@permission_classes([IsController])
def dispatch(request: Request, recommendation_id: int) -> Response:
    """Record the scheduler command this controller is about to run, before it runs it.

    Called once before every command that changes something, with its exact argv: a command
    the scheduler carried out is then in the trail (a ``dispatched`` event) even when its
    controller dies before it reports. Also the last check of the lease before the command:
    answered 409 (the lease is another's, or has run out even if nobody took over yet), the
    controller runs nothing and stops.
    """
    instance = _instance(request)
    _own(request, recommendation_id)
    body = DispatchRequest(data=request.data)
    if not body.is_valid():
        return _invalid(body.errors)
    try:
        event = leases.record_dispatch(
            recommendation_id,
            controller=_principal(request).actor,
            instance=instance,
            argv=list(body.validated_data["argv"]),
            sequence=body.validated_data["sequence"],
        )
    except InvalidTransition as exc:
        return _conflict(exc)
    return Response({"event": event.pk})


@extend_schema(
    tags=["advisor"],
    request=ClaimRequest,
    parameters=[INSTANCE_PARAMETER],
    responses={
        **LEASE_RESPONSES,
        409: OpenApiResponse(
            ERROR, description="This controller process does not hold it (any more)."
        ),
    },
    examples=[
        OpenApiExample("Two more minutes", value={"lease_seconds": 120}, request_only=True),
    ],
)
@api_view(["POST"])
@authentication_classes([ControllerTokenAuthentication])
@permission_classes([IsController])
def renew(request: Request, recommendation_id: int) -> Response:
    """Extend this controller process's lease during a long action (slow scheduler commands)."""
    return _lease(request, recommendation_id, leases.renew_lease)


@extend_schema(
    tags=["advisor"],
    parameters=[INSTANCE_PARAMETER],
    responses={
        200: inline_serializer(
            "ControllerIdentity",
            {
                "cluster": serializers.CharField(),
                "scheduler_cluster_name": serializers.CharField(),
                "actor": serializers.CharField(),
                "instance": serializers.CharField(
                    help_text="The instance id this controller process sent, as recorded."
                ),
                "acts_without_approval": serializers.CharField(
                    help_text="What the cluster lets the policy's recommendations do without an "
                    "approval, e.g. 'nothing (monitor mode)' or 'jobs in partition canary': "
                    "the ready list offers only those, and approved ones."
                ),
            },
        ),
        400: OpenApiResponse(
            ERROR,
            description="No controller instance id: a controller of an earlier release, to be "
            "upgraded.",
        ),
        401: OpenApiResponse(ERROR, description="No controller token, or a revoked one."),
    },
    examples=[
        OpenApiExample(
            "A controller of lab-a100",
            value={
                "cluster": "lab-a100",
                "scheduler_cluster_name": "a100",
                "actor": "controller:slurm-advisor-1",
                "instance": "7d0c4f7e-2b1a-4c55-9a51-3f0e8c2d9b14",
                "acts_without_approval": "jobs in partition canary",
            },
            response_only=True,
        )
    ],
)
@api_view(["GET"])
@authentication_classes([ControllerTokenAuthentication])
@permission_classes([IsController])
def identity(request: Request) -> Response:
    """The cluster this token belongs to, and the ``ClusterName`` its Slurm must report.

    A controller checks both at start, so that a token, a ``--cluster`` flag and a login node
    that do not belong together never act; a controller that sends no instance id (an earlier
    release) is told here, at start, to upgrade.
    """
    instance = _instance(request)
    principal = _principal(request)
    return Response(
        {
            "cluster": principal.cluster.name,
            "scheduler_cluster_name": scheduler_cluster_name(principal.cluster),
            "actor": principal.actor,
            "instance": instance,
            "acts_without_approval": principal.cluster.acts_without_approval(),
        }
    )
