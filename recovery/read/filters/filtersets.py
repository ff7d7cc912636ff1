"""One FilterSet per list, read by the API and by the Console's list pages.

Each list's FilterSet names the query parameters the API documents and validates them; the API
answers a bad value with a 400 naming it (``api.resources.filters``). A Console page reads the
same list through a subclass that adds what only the page offers (a search, a sort, quick
ranges), words its messages for the operator and, instead of refusing the request, shows each
bad value as a problem and applies the others (``ListFilterSet.problems``).

Clusters are named by name everywhere, as in the Console; workloads, anomalies and attempts by
id. In the API an unknown name or id simply matches nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

import django_filters
from django import forms
from django.core.exceptions import ValidationError
from django.db.models import Case, Exists, F, IntegerField, OuterRef, Q, QuerySet, Value, When
from django.utils import timezone

from recovery.audit.trail import QUICK_RANGES, AuditFilters, WorkloadRef, audit_events
from recovery.choices import (
    NODE_ACTIONS,
    OPEN_RECOMMENDATION_STATUSES,
    AnomalyKind,
    Attribution,
    AuditKind,
    ClusterMode,
    Confirmation,
    Disposition,
    FailureCategory,
    NodeHealth,
    RecommendationAction,
    RecommendationStatus,
    WorkloadState,
)
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
from recovery.read.filters.fields import (
    ClippedTextFilter,
    ClusterFilter,
    EnumFilter,
    EnumListFilter,
    FlagFilter,
    IdFilter,
    InstantFilter,
    KindsField,
    KindsFilter,
    PlainTextFilter,
    QuickRangeFilter,
    TextFilter,
    TrimmedChoiceFilter,
    TypedInstantFilter,
    WorkloadRefFilter,
)
from recovery.read.nodes import SUSPECT
from recovery.read.queries import (
    ANY_ANOMALY,
    FLEET_SORTS,
    NO_ANOMALY,
    fleet_ordering,
)

CLUSTER_NAME_MAX_LENGTH = 63


@dataclass(frozen=True)
class FilterProblem:
    """A filter value that was ignored, and why, in words for the operator."""

    field: str
    message: str


class ListFilterSet(django_filters.FilterSet):
    """A list's query parameters. ``now`` is the instant that time filters count from."""

    def __init__(
        self,
        data: Any = None,
        queryset: QuerySet[Any] | None = None,
        *,
        request: Any = None,
        prefix: str | None = None,
        now: datetime | None = None,
    ) -> None:
        super().__init__(data, queryset, request=request, prefix=prefix)
        self.now = now or timezone.now()

    @property
    def problems(self) -> list[FilterProblem]:
        """Every bad value, in the order they were found; a page ignores them and applies the
        rest."""
        return [
            FilterProblem(name, message)
            for name, messages in self.errors.items()
            for message in messages
        ]

    @property
    def invalid_fields(self) -> set[str]:
        return set(self.errors)

    def value(self, name: str) -> Any:
        """A parameter's valid value; empty (``None``, ``""``, ``()``) when it was not given or
        was ignored."""
        self.is_valid()
        return getattr(self.form, "cleaned_data", {}).get(name)


def _cluster_name(field_name: str) -> TextFilter:
    return TextFilter(
        field_name=field_name, max_length=CLUSTER_NAME_MAX_LENGTH, help_text="Cluster name."
    )


def _workload() -> IdFilter:
    return IdFilter(field_name="workload_id", help_text="Workload id.")


class TimeRangeForm(forms.Form):
    """``until`` may not be before ``since``; checked once every parameter is valid."""

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean() or {}
        since, until = cleaned.get("since"), cleaned.get("until")
        if not self.errors and since and until and until < since:
            self.add_error("until", ValidationError("Is before since.", code="invalid_range"))
        return cleaned


def _since(field_name: str) -> InstantFilter:
    return InstantFilter(
        field_name=field_name,
        lookup_expr="gte",
        help_text="ISO 8601, inclusive; without an offset it is read as UTC.",
    )


def _until(field_name: str) -> InstantFilter:
    return InstantFilter(field_name=field_name, lookup_expr="lte", help_text="ISO 8601, inclusive.")


# ---------- the lists ----------


class ClusterFilterSet(ListFilterSet):
    name = TextFilter(max_length=CLUSTER_NAME_MAX_LENGTH)
    mode = EnumFilter(choices=ClusterMode.choices)

    class Meta:
        model = Cluster
        fields: tuple[str, ...] = ()


class NodeFilterSet(ListFilterSet):
    # Typed as any filter: the nodes page's filter set below replaces it.
    cluster: django_filters.Filter = _cluster_name("cluster__name")
    health = EnumFilter(choices=NodeHealth.choices)
    suspect = FlagFilter(
        method="filter_suspect", help_text="Only nodes flagged as suspect (true) or not (false)."
    )
    excluded = FlagFilter(
        method="filter_excluded",
        help_text="Only nodes recovery currently keeps restarts off (true) or not (false).",
    )

    class Meta:
        model = Node
        fields: tuple[str, ...] = ()

    def filter_suspect(self, nodes: QuerySet[Node], name: str, value: bool) -> QuerySet[Node]:
        return nodes.filter(SUSPECT if value else ~SUSPECT)

    def filter_excluded(self, nodes: QuerySet[Node], name: str, value: bool) -> QuerySet[Node]:
        excluded = Node.excluded_at(self.now)
        return nodes.filter(excluded if value else ~excluded)


class WorkloadFilterSet(ListFilterSet):
    # Typed as any filter (or none): the fleet page's filter set below replaces or drops them.
    cluster: django_filters.Filter = _cluster_name("cluster__name")
    state: django_filters.Filter = EnumFilter(choices=WorkloadState.choices)
    user: django_filters.Filter = TextFilter(max_length=64)
    job_id: django_filters.Filter | None = TextFilter(max_length=64)
    workflow: django_filters.Filter | None = IdFilter(
        field_name="workflow_id", help_text="Workflow id."
    )

    class Meta:
        model = Workload
        fields: tuple[str, ...] = ()


class WorkflowFilterSet(ListFilterSet):
    cluster = _cluster_name("cluster__name")
    user = TextFilter(max_length=64)
    name = TextFilter(max_length=128)

    class Meta:
        model = Workflow
        fields: tuple[str, ...] = ()


class AttemptFilterSet(ListFilterSet):
    workload = _workload()

    class Meta:
        model = Attempt
        fields: tuple[str, ...] = ()


class AnomalyFilterSet(ListFilterSet):
    since = _since("detected_at")
    until = _until("detected_at")
    cluster = _cluster_name("workload__cluster__name")
    workload = _workload()
    category = EnumFilter(choices=FailureCategory.choices)
    kind = EnumFilter(choices=AnomalyKind.choices)
    attribution = EnumFilter(choices=Attribution.choices)
    confirmation = EnumFilter(
        choices=Confirmation.choices,
        help_text="Crashes in this state; anomalies that need no confirmation have none.",
    )

    class Meta:
        model = Anomaly
        fields: tuple[str, ...] = ()
        form: type[forms.Form] = TimeRangeForm


class VerdictFilterSet(ListFilterSet):
    anomaly = IdFilter(field_name="anomaly_id", help_text="Anomaly id.")
    attribution = EnumFilter(choices=Attribution.choices)
    provider = TextFilter(max_length=64)

    class Meta:
        model = Verdict
        fields: tuple[str, ...] = ()


class RecommendationFilterSet(ListFilterSet):
    # Typed as any filter (or none): the approval queue's filter set below drops or replaces them.
    status: django_filters.Filter | None = EnumFilter(choices=RecommendationStatus.choices)
    disposition: django_filters.Filter | None = EnumFilter(choices=Disposition.choices)
    unacknowledged: django_filters.Filter | None = FlagFilter(
        method="filter_unacknowledged",
        help_text="true: only abandoned actions no operator has acknowledged yet.",
    )
    action: django_filters.Filter | None = EnumFilter(choices=RecommendationAction.choices)
    node: django_filters.Filter | None = PlainTextFilter(
        field_name="node__name", strip=False, help_text="Drains and resumes of this node."
    )
    cluster: django_filters.Filter = _cluster_name("workload__cluster__name")
    workload = _workload()

    class Meta:
        model = Recommendation
        fields: tuple[str, ...] = ()

    def filter_unacknowledged(
        self, queryset: QuerySet[Recommendation], name: str, value: bool | None
    ) -> QuerySet[Recommendation]:
        if not value:
            return queryset
        return queryset.filter(disposition=Disposition.ABANDONED, acknowledged_at__isnull=True)


class AuditEventFilterSet(ListFilterSet):
    """The audit trail's filters. They are read as ``AuditFilters`` by the trail's own query
    (``recovery.audit.trail``), which picks the index that serves them."""

    # Typed as any filter (or none): the audit page's filter set below replaces or drops them.
    since: django_filters.Filter | None = _since("occurred_at")
    until: django_filters.Filter | None = _until("occurred_at")
    cluster: django_filters.Filter = _cluster_name("cluster__name")
    workload: django_filters.Filter = _workload()
    kind: django_filters.Filter = EnumListFilter(
        choices=AuditKind.choices, help_text="Repeat the parameter for several kinds."
    )
    actor: django_filters.Filter = TextFilter(
        max_length=150, help_text="Exact: policy, watchdog, a user name, …"
    )

    class Meta:
        model = AuditEvent
        fields: tuple[str, ...] = ()
        form: type[forms.Form] = TimeRangeForm

    def audit_filters(self) -> AuditFilters:
        workload = self.value("workload")
        kinds = self.value("kind") or ()
        return AuditFilters(
            cluster=self.value("cluster") or "",
            workload=WorkloadRef(workload_id=workload) if workload else None,
            # In AuditKind order, so the same filters give the same query.
            kinds=tuple(kind for kind in AuditKind.values if kind in kinds),
            actor=self.value("actor") or "",
            since=self.value("since"),
            until=self.value("until"),
        )

    def filter_queryset(self, queryset: QuerySet[AuditEvent]) -> QuerySet[AuditEvent]:
        return audit_events(self.audit_filters())


# ---------- the Console's pages ----------

ANOMALY_CHOICES = [
    (ANY_ANOMALY, "Any anomaly"),
    (NO_ANOMALY, "No anomaly"),
    *FailureCategory.choices,
]

# The fleet's default order: what needs a person first (``attention_ordered``).
ATTENTION_SORT = "attention"
FLEET_SORT_CHOICES = [
    (ATTENTION_SORT, ATTENTION_SORT),
    *((key, key) for name in FLEET_SORTS for key in (name, f"-{name}")),
]

# The attention groups, in the order the fleet shows them.
AWAITING_APPROVAL, TROUBLED, ACTIVE, ENDED = range(4)
# Something went wrong or recovery is under way: failed, held (by recovery or an
# administrator), requeued for another attempt, or no longer listed by the scheduler.
TROUBLED_STATES = (
    WorkloadState.FAILED,
    WorkloadState.HELD,
    WorkloadState.REQUEUED,
    WorkloadState.UNKNOWN,
)
# A recommendation in one of these is approved, or decided by the policy, and being carried out.
UNDER_WAY_STATUSES = (RecommendationStatus.READY, RecommendationStatus.CLAIMED)
# Running, or queued for a first attempt (a queued restart is requeued, hence troubled).
ACTIVE_STATES = (WorkloadState.RUNNING, WorkloadState.PENDING)
# The rest has ended: completed, cancelled by its owner, stopped by recovery.


def attention_ordered(workloads: QuerySet[Workload]) -> QuerySet[Workload]:
    """``workloads`` with those awaiting an approval first, then those failing or being
    recovered, then running or queued ones, then ended ones; in each group the latest activity
    (``updated_at``: a state, progress or checkpoint recorded) first.

    One ORDER BY in the database (a CASE over two EXISTS on the recommendations' (workload,
    status) index), so a page of 50 is read from any number of workloads.
    """
    recommendations = Recommendation.objects.filter(workload=OuterRef("pk"))
    awaiting = recommendations.filter(status=RecommendationStatus.AWAITING_APPROVAL)
    under_way = recommendations.filter(status__in=UNDER_WAY_STATUSES)
    group = Case(
        When(Exists(awaiting), then=Value(AWAITING_APPROVAL)),
        When(Q(state__in=TROUBLED_STATES) | Exists(under_way), then=Value(TROUBLED)),
        When(state__in=ACTIVE_STATES, then=Value(ACTIVE)),
        default=Value(ENDED),
        output_field=IntegerField(),
    )
    return workloads.alias(attention=group).order_by("attention", "-updated_at", "-id")


class FleetFilterSet(WorkloadFilterSet):
    """The fleet page: the workloads' filters plus a search (``q``: a job id, or part of a
    name), the anomalies a workload had (``anomaly``: a category, ``any`` or ``none``) and a
    sort (``attention``, the default, or a key of ``FLEET_SORTS``, ``-`` for descending). A
    cluster that does not exist matches nothing."""

    cluster = PlainTextFilter(field_name="cluster__name")
    state = TrimmedChoiceFilter(
        choices=WorkloadState.choices,
        error_messages={"invalid_choice": "Unknown state “%(value)s”: showing every state."},
    )
    user = ClippedTextFilter(max_length=64)
    job_id = None  # the search finds job ids
    workflow = None  # a workflow's page lists its jobs
    q = ClippedTextFilter(max_length=200, method="filter_search")
    anomaly = TrimmedChoiceFilter(
        choices=ANOMALY_CHOICES,
        method="filter_anomaly",
        error_messages={
            "invalid_choice": "Unknown anomaly category “%(value)s”: not filtering on it."
        },
    )
    sort = TrimmedChoiceFilter(
        choices=FLEET_SORT_CHOICES,
        method="filter_sorted_later",
        error_messages={
            "invalid_choice": "Cannot sort by “%(value)s”: needing attention first instead."
        },
    )

    @property
    def sort_key(self) -> str:
        return self.value("sort") or ATTENTION_SORT

    def filter_queryset(self, queryset: QuerySet[Workload]) -> QuerySet[Workload]:
        workloads: QuerySet[Workload] = super().filter_queryset(queryset)
        if self.sort_key == ATTENTION_SORT:
            return attention_ordered(workloads)
        return workloads.order_by(*fleet_ordering(self.sort_key))

    def filter_search(
        self, workloads: QuerySet[Workload], name: str, term: str
    ) -> QuerySet[Workload]:
        return workloads.filter(Q(job_id=term) | Q(name__icontains=term))

    def filter_anomaly(
        self, workloads: QuerySet[Workload], name: str, anomaly: str
    ) -> QuerySet[Workload]:
        any_anomaly = Anomaly.objects.filter(workload=OuterRef("pk"))
        if anomaly == NO_ANOMALY:
            return workloads.filter(~Exists(any_anomaly))
        if anomaly == ANY_ANOMALY:
            return workloads.filter(Exists(any_anomaly))
        return workloads.filter(Exists(any_anomaly.filter(category=anomaly)))

    def filter_sorted_later(
        self, workloads: QuerySet[Workload], name: str, sort: str
    ) -> QuerySet[Workload]:
        return workloads  # ordered once every filter applies (filter_queryset)


NODE_FLAGS = [
    ("suspect", "Suspect"),
    ("unhealthy", "Unhealthy"),
    ("implicated", "Implicated"),
    ("excluded", "Excluded now"),
    ("drain", "Drained or to drain by recovery"),
]


class FlaggedNodeFilterSet(NodeFilterSet):
    """The nodes page: nodes that need a look (``show``: one flag, any flag when not given),
    suspect ones leading each cluster. An unknown flag shows every flagged node."""

    cluster = PlainTextFilter(field_name="cluster__name", strip=False)
    show = django_filters.ChoiceFilter(choices=NODE_FLAGS, method="filter_flag")

    def flag_conditions(self) -> dict[str, Q]:
        return {
            "suspect": SUSPECT,
            "unhealthy": Q(health__in=[NodeHealth.UNHEALTHY, NodeHealth.SUSPECT]),
            "implicated": Q(times_implicated__gt=0),
            "excluded": Node.excluded_at(self.now),
            "drain": Node.drained_by_recovery_condition()
            | Q(
                Exists(
                    Recommendation.objects.filter(
                        node=OuterRef("pk"),
                        action__in=NODE_ACTIONS,
                        status__in=OPEN_RECOMMENDATION_STATUSES,
                    )
                )
            ),
        }

    def filter_flag(self, nodes: QuerySet[Node], name: str, flag: str) -> QuerySet[Node]:
        return nodes.filter(self.flag_conditions()[flag])

    def filter_queryset(self, queryset: QuerySet[Node]) -> QuerySet[Node]:
        nodes: QuerySet[Node] = super().filter_queryset(queryset)
        if not self.value("show"):
            flagged = Q()
            for condition in self.flag_conditions().values():
                flagged |= condition
            nodes = nodes.filter(flagged)
        # Suspect nodes (by either record, as the health column says) lead each cluster's list,
        # most recently flagged first.
        return nodes.order_by(
            "cluster__name",
            Case(When(SUSPECT, then=Value(0)), default=Value(1), output_field=IntegerField()),
            F("suspect_since").desc(nulls_last=True),
            "-times_implicated",
            "name",
        )


class ApprovalQueueFilterSet(RecommendationFilterSet):
    """The approval queue: the recommendations' filters, with a cluster that must exist. The
    queue holds only recommendations awaiting approval, so it takes no status."""

    status = None
    disposition = None
    unacknowledged = None
    action = None
    node = None
    cluster = ClusterFilter(
        field_name="workload__cluster",
        error_messages={
            "invalid_choice": "No cluster is called “%(value)s”: showing every cluster."
        },
    )


class AuditTrailForm(forms.Form):
    """A quick range replaces From and To (and says so); To may not be before From."""

    notes: list[str]

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean() or {}
        self.notes = []
        start, end, quick_range = cleaned.get("from"), cleaned.get("to"), cleaned.get("range")
        if quick_range:
            if start or end:
                label, _span = QUICK_RANGES[quick_range]
                self.notes.append(f"“{label}” replaces the From and To dates.")
        elif start and end and end < start:
            self.add_error(
                "to",
                ValidationError(
                    "“To” is before “From”, so the time range is ignored.", code="invalid_range"
                ),
            )
            cleaned.pop("from", None)
        return cleaned


class AuditTrailFilterSet(AuditEventFilterSet):
    """The audit page: the trail's filters as the operator types them.

    ``cluster`` must name a cluster; ``workload`` is an id or ``cluster:job id``; ``kind`` is
    repeated or comma-separated, and an unknown kind leaves the others applied; ``from`` and
    ``to`` are what a datetime-local input sends (UTC); ``range``, a key of ``QUICK_RANGES``,
    counts back from ``now`` and replaces them.
    """

    cluster = ClusterFilter(
        match_case=True,
        error_messages={
            "invalid_choice": "No cluster is named “%(value)s”; showing every cluster."
        },
    )
    workload = WorkloadRefFilter()
    kind = KindsFilter()
    actor = PlainTextFilter(
        max_length=150,
        error_messages={
            "max_length": "An actor is at most %(limit_value)s characters; the actor filter is "
            "ignored."
        },
    )
    since = None
    until = None
    # "from" is a Python keyword, so both bounds are declared through the class namespace.
    vars()["from"] = TypedInstantFilter(label="From")
    vars()["to"] = TypedInstantFilter(label="To")
    range = QuickRangeFilter()

    class Meta(AuditEventFilterSet.Meta):
        form = AuditTrailForm

    @property
    def notes(self) -> list[str]:
        self.is_valid()
        return list(getattr(self.form, "notes", []))

    def audit_filters(self) -> AuditFilters:
        cluster: Cluster | None = self.value("cluster")
        quick_range = self.value("range") or ""
        since, until = self.value("from"), self.value("to")
        if quick_range:
            since, until = self.now - QUICK_RANGES[quick_range][1], None
        kinds = self.form.fields["kind"]
        assert isinstance(kinds, KindsField)
        return AuditFilters(
            cluster=cluster.name if cluster else "",
            workload=self.value("workload"),
            kinds=kinds.known,  # with an unknown kind among them, the known ones still apply
            actor=self.value("actor") or "",
            quick_range=quick_range,
            since=since,
            until=until,
        )


class WorkflowListFilterSet(ListFilterSet):
    """The workflows page: a cluster, a user, and a part of the name (``q``). A bad value is
    ignored and named on the page."""

    cluster = PlainTextFilter(field_name="cluster__name")
    user = ClippedTextFilter(max_length=64)
    q = ClippedTextFilter(max_length=128, field_name="name", lookup_expr="icontains")

    class Meta:
        model = Workflow
        fields: tuple[str, ...] = ()
