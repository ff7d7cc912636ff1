"""Read-only resources under /api/v1/: what the Console shows, for integrations.

Every list is a cursor page, newest first, filtered by validated query parameters: the list's
FilterSet (``recovery.read.filters``, which the Console's pages read too) through
``filters.ListFilterBackend``. Reading needs the model's view permission, which every Console
role has; a person authenticates with a session (the Console) or a personal token
(``Bearer wrp_…``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.db.models import Count, Prefetch, QuerySet
from django.http import Http404
from drf_spectacular.utils import (
    OpenApiExample,
    OpenApiParameter,
    OpenApiResponse,
    extend_schema,
    extend_schema_view,
)
from rest_framework import serializers, viewsets
from rest_framework.authentication import SessionAuthentication
from rest_framework.permissions import BasePermission
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from api.errors import ERROR_SCHEMA
from api.resources import examples
from api.resources.filters import ListFilterBackend, validated
from api.resources.pagination import AuditEventPagination, ResourcePagination
from api.resources.serializers import (
    AnomalySerializer,
    AttemptSerializer,
    AuditEventSerializer,
    ClusterSerializer,
    NodeSerializer,
    RecommendationSerializer,
    VerdictSerializer,
    WorkflowDetailSerializer,
    WorkflowSerializer,
    WorkloadSerializer,
)
from api.tokens import PersonalTokenAuthentication
from recovery.audit import trail as audit_trail
from recovery.models import (
    Anomaly,
    Attempt,
    AuditEvent,
    Cluster,
    Node,
    Recommendation,
    Verdict,
    Workflow,
    Workload,
)
from recovery.read.filters import (
    AnomalyFilterSet,
    AttemptFilterSet,
    AuditEventFilterSet,
    ClusterFilterSet,
    ListFilterSet,
    NodeFilterSet,
    RecommendationFilterSet,
    VerdictFilterSet,
    WorkflowFilterSet,
    WorkloadFilterSet,
)


class CanViewModel(BasePermission):
    """The Console's read access: the model's ``view_`` permission (viewer, operator, admin)."""

    message = "Needs a Console role (viewer, operator or admin) to read this."

    def has_permission(self, request: Request, view: APIView) -> bool:
        user = request.user
        if not (user and user.is_authenticated):
            return False
        model = view.queryset.model  # type: ignore[attr-defined]
        return bool(user.has_perm(f"{model._meta.app_label}.view_{model._meta.model_name}"))


_ERRORS = {
    401: OpenApiResponse(ERROR_SCHEMA, description="No credentials, or a bad or revoked token."),
    403: OpenApiResponse(ERROR_SCHEMA, description="Logged in, but without a Console role."),
    429: OpenApiResponse(ERROR_SCHEMA, description="Too many requests; see Retry-After."),
}
_LIST_ERRORS = {
    400: OpenApiResponse(ERROR_SCHEMA, description="A filter, page size or cursor is invalid."),
    **_ERRORS,
}
_ID_PARAMETER = OpenApiParameter(
    "id",
    {"type": "integer", "minimum": 1, "maximum": 2**63 - 1},
    OpenApiParameter.PATH,
    description="The id, as in the list.",
)
_DETAIL_ERRORS = {404: OpenApiResponse(ERROR_SCHEMA, description="No such id."), **_ERRORS}


def _documented(
    tag: str,
    noun: str,
    serializer: type[serializers.Serializer[Any]],
    example: dict[str, Any],
    *,
    detail: tuple[type[serializers.Serializer[Any]], dict[str, Any]] | None = None,
) -> Callable[[type], type]:
    """List and detail in the schema: tag, summaries, errors and an example (the filters come
    from the view's FilterSet). ``detail``: the serializer and example of a detail that shows
    more than the list."""
    sample = OpenApiExample(noun, value=example, response_only=True, status_codes=["200"])
    detail_serializer, detail_sample = serializer, sample
    if detail is not None:
        detail_serializer = detail[0]
        detail_sample = OpenApiExample(
            noun, value=detail[1], response_only=True, status_codes=["200"]
        )
    return extend_schema_view(
        list=extend_schema(
            tags=[tag],
            summary=f"List {noun}s, newest first",
            responses={200: serializer(many=True), **_LIST_ERRORS},
            examples=[sample],
        ),
        retrieve=extend_schema(
            tags=[tag],
            summary=f"One {noun}",
            parameters=[_ID_PARAMETER],
            responses={200: detail_serializer, **_DETAIL_ERRORS},
            examples=[detail_sample],
        ),
    )


class ResourceViewSet(viewsets.ReadOnlyModelViewSet[Any]):
    # The token comes first so that a caller without credentials gets 401 and the
    # WWW-Authenticate header saying how to authenticate, rather than a bare 403.
    authentication_classes = [PersonalTokenAuthentication, SessionAuthentication]
    permission_classes = [CanViewModel]
    pagination_class = ResourcePagination
    lookup_value_regex = r"[0-9]{1,19}"
    filter_backends = [ListFilterBackend]
    filterset_class: type[ListFilterSet]
    cursor_ordering: tuple[str, ...] = ("-id",)

    def filter_queryset(self, queryset: QuerySet[Any]) -> QuerySet[Any]:
        # A detail is found by its id alone: list parameters sent along are not checked.
        if self.action != "list":
            return queryset
        return super().filter_queryset(queryset)


@_documented("clusters", "cluster", ClusterSerializer, examples.CLUSTER)
class ClusterViewSet(ResourceViewSet):
    queryset = Cluster.objects.all()
    serializer_class = ClusterSerializer
    filterset_class = ClusterFilterSet


@_documented("nodes", "node", NodeSerializer, examples.NODE)
class NodeViewSet(ResourceViewSet):
    queryset = Node.objects.select_related("cluster")
    serializer_class = NodeSerializer
    filterset_class = NodeFilterSet


@_documented("workloads", "workload", WorkloadSerializer, examples.WORKLOAD)
class WorkloadViewSet(ResourceViewSet):
    queryset = Workload.objects.select_related("cluster")
    serializer_class = WorkloadSerializer
    filterset_class = WorkloadFilterSet
    cursor_ordering = ("-submit_time", "-id")


@_documented(
    "workloads",
    "workflow",
    WorkflowSerializer,
    examples.WORKFLOW,
    detail=(WorkflowDetailSerializer, examples.WORKFLOW_DETAIL),
)
class WorkflowViewSet(ResourceViewSet):
    """Jobs of one user that share a retry budget and their excluded nodes.

    The detail counts the budget as the policy does for the workflow's newest job.
    """

    queryset = Workflow.objects.select_related("cluster").annotate(jobs_count=Count("workloads"))
    serializer_class = WorkflowSerializer
    filterset_class = WorkflowFilterSet

    def get_serializer_class(self) -> type[serializers.Serializer[Any]]:
        return WorkflowDetailSerializer if self.action == "retrieve" else WorkflowSerializer


@_documented("workloads", "attempt", AttemptSerializer, examples.ATTEMPT)
class AttemptViewSet(ResourceViewSet):
    queryset = Attempt.objects.all()
    serializer_class = AttemptSerializer
    filterset_class = AttemptFilterSet


@_documented("anomalies", "anomaly", AnomalySerializer, examples.ANOMALY)
class AnomalyViewSet(ResourceViewSet):
    queryset = Anomaly.objects.select_related("workload", "attempt").prefetch_related(
        Prefetch("verdicts", queryset=Verdict.objects.order_by("-created_at", "-id"))
    )
    serializer_class = AnomalySerializer
    filterset_class = AnomalyFilterSet
    cursor_ordering = ("-detected_at", "-id")


@_documented("anomalies", "verdict", VerdictSerializer, examples.VERDICT)
class VerdictViewSet(ResourceViewSet):
    queryset = Verdict.objects.all()
    serializer_class = VerdictSerializer
    filterset_class = VerdictFilterSet
    cursor_ordering = ("-created_at", "-id")


@_documented("recommendations", "recommendation", RecommendationSerializer, examples.RECOMMENDATION)
class RecommendationViewSet(ResourceViewSet):
    queryset = Recommendation.objects.select_related("workload", "attempt", "node")
    serializer_class = RecommendationSerializer
    filterset_class = RecommendationFilterSet
    cursor_ordering = ("-created_at", "-id")


@_documented("audit", "audit event", AuditEventSerializer, examples.AUDIT_EVENT)
class AuditEventViewSet(ResourceViewSet):
    """The append-only audit trail, newest first (by occurred_at, then id).

    Read through the Console's audit-trail query (recovery/audit/trail.py), so pages stay fast
    over millions of events: names become ids first and the query names its filter's index.
    """

    queryset = AuditEvent.objects.all()
    serializer_class = AuditEventSerializer
    pagination_class = AuditEventPagination
    cursor_ordering = audit_trail.NEWEST_FIRST
    filterset_class = AuditEventFilterSet

    def list(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        filterset = validated(self.filterset_class(request.query_params, request=request))
        self.audit_filters = filterset.audit_filters()
        page = self.paginate_queryset(self.get_queryset())
        assert page is not None
        return self.get_paginated_response(self.get_serializer(page, many=True).data)

    def get_object(self) -> AuditEvent:
        event = audit_trail.find_event(int(self.kwargs["pk"]))
        if event is None:
            raise Http404
        return event
