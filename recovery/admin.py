from __future__ import annotations

import weakref
from functools import partial
from typing import TYPE_CHECKING, Any, Generic, TypeVar, cast

from django import forms
from django.contrib import admin
from django.contrib.auth.models import User
from django.core.exceptions import PermissionDenied
from django.db.models import Model, QuerySet
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.utils.cache import add_never_cache_headers

from recovery.audit.cluster_controls import save_with_audit
from recovery.loop.replay_view import (
    DEFAULT_DAYS,
    MAX_DAYS,
    MIN_DAYS,
    DaysError,
    parse_days,
    preview_unsaved,
)
from recovery.models import (
    Anomaly,
    ApiToken,
    Attempt,
    AuditEvent,
    Cluster,
    ClusterGoodputSnapshot,
    ControllerToken,
    DetectionPattern,
    EnvironmentBinding,
    IngestToken,
    Node,
    Policy,
    Recommendation,
    Verdict,
    Workload,
)
from recovery.models.api_token import web_minting_refusal
from recovery.roles import actor_name

if TYPE_CHECKING:
    from django.contrib.admin import ModelAdmin, TabularInline
    from django.contrib.admin.options import _FieldGroups
    from django.forms import ModelForm
else:

    class _Subscriptable:
        """``ModelAdmin[Cluster]`` is ModelAdmin itself at run time: only the stubs make the admin
        classes generic, and Django's own cannot be subscripted."""

        def __init__(self, admin_class: type) -> None:
            self._admin_class = admin_class

        def __getitem__(self, models: object) -> type:
            return self._admin_class

    ModelAdmin = _Subscriptable(admin.ModelAdmin)
    TabularInline = _Subscriptable(admin.TabularInline)
    ModelForm = _Subscriptable(forms.ModelForm)

ModelT = TypeVar("ModelT", bound=Model)


def _is_superuser(request: HttpRequest) -> bool:
    return bool(getattr(request.user, "is_superuser", False))


class ReadOnlyAdmin(ModelAdmin[ModelT], Generic[ModelT]):
    """Shows rows and changes none: they are written by the system, with an audit trail."""

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(Cluster)
class ClusterAdmin(ModelAdmin[Cluster]):
    list_display = [
        "name",
        "scheduler_kind",
        "connection",
        "mode",
        "acknowledge_scheduler_actions",
        "drain_automatically",
        "action_scope",
        "environment",
        "last_polled_at",
    ]
    list_filter = ["scheduler_kind", "connection", "mode", "environment"]
    search_fields = ["name", "environment"]

    def get_readonly_fields(self, request: HttpRequest, obj: Cluster | None = None) -> list[str]:
        # Where the server connects and with which credentials: superusers only. A read-only
        # field is left out of the form, so a posted value is ignored, not saved.
        fixed = list(super().get_readonly_fields(request, obj))
        return fixed if _is_superuser(request) else [*fixed, "connection_settings"]

    def save_model(self, request: HttpRequest, obj: Cluster, form: Any, change: bool) -> None:
        save = partial(super().save_model, request, obj, form, change)
        save_with_audit(obj, actor_name(request.user), save)

    @admin.display(description="Action mode reaches")
    def action_scope(self, obj: Cluster) -> str:
        return obj.action_scope_words()


@admin.register(Node)
class NodeAdmin(ModelAdmin[Node]):
    list_display = [
        "name",
        "cluster",
        "scheduler_state",
        "health",
        "times_implicated",
        "excluded_until",
    ]
    list_filter = ["cluster", "health"]
    search_fields = ["name", "state_reason"]


class AttemptInline(TabularInline[Attempt, Workload]):
    model = Attempt
    extra = 0
    fields = ["number", "nodes", "excluded_nodes", "started_at", "ended_at", "exit_state"]


@admin.register(Workload)
class WorkloadAdmin(ModelAdmin[Workload]):
    list_display = [
        "job_id",
        "name",
        "cluster",
        "user",
        "partition",
        "state",
        "current_attempt",
        "opted_in",
        "submit_time",
    ]
    list_filter = ["cluster", "state", "opted_in", "partition"]
    search_fields = ["job_id", "name", "user", "workflow__name"]
    date_hierarchy = "submit_time"
    inlines = [AttemptInline]


@admin.register(Anomaly)
class AnomalyAdmin(ModelAdmin[Anomaly]):
    list_display = ["workload", "kind", "category", "attribution", "occurrences", "detected_at"]
    list_filter = ["kind", "category", "attribution"]
    search_fields = ["workload__job_id", "signature", "evidence_line"]
    raw_id_fields = ["workload", "attempt"]


@admin.register(Verdict)
class VerdictAdmin(ModelAdmin[Verdict]):
    list_display = ["anomaly", "provider", "attribution", "confidence", "created_at"]
    list_filter = ["provider", "attribution"]
    raw_id_fields = ["anomaly"]


@admin.register(Recommendation)
class RecommendationAdmin(ReadOnlyAdmin[Recommendation]):
    """Read-only: decisions go through the Console or the API so they are audited."""

    list_display = ["workload", "action", "status", "decided_by", "created_at"]
    list_filter = ["status", "action"]
    search_fields = ["workload__job_id", "reason", "idempotency_key"]


@admin.register(AuditEvent)
class AuditEventAdmin(ReadOnlyAdmin[AuditEvent]):
    """The trail is append-only: admin shows it and changes nothing."""

    list_display = ["occurred_at", "cluster", "workload", "attempt", "kind", "actor"]
    list_filter = ["kind", "cluster"]
    search_fields = ["actor", "workload__job_id"]
    date_hierarchy = "occurred_at"
    actions = None


# The change form's second button, and the number of days it replays.
POLICY_PREVIEW, PREVIEW_DAYS = "_preview", "_preview_days"


class PolicyPreviewForm(ModelForm[Policy]):
    """The policy form, validated as ever, that the admin never saves.

    ``is_valid`` answers False, so the admin takes its path that shows the form again and saves
    nothing (no ``save_model``, no log entry); ``ready_for_preview`` says whether the form
    really is valid, its errors are shown as usual otherwise. Mixed in ahead of the admin's own
    form class by ``PolicyAdmin.get_form`` when "Preview" was pressed.
    """

    ready_for_preview = False

    def is_valid(self) -> bool:
        self.ready_for_preview = super().is_valid()
        return False


@admin.register(Policy)
class PolicyAdmin(ModelAdmin[Policy]):
    """Policies, with "Preview on the last N days" on the form: the edited, unsaved policy
    replayed over the recorded decisions of the clusters its scope covers
    (``recovery.loop.replay_view.preview_unsaved``; template
    admin/recovery/policy/change_form.html).
    """

    list_display = [
        "name",
        "enabled",
        "cluster",
        "environment",
        "partition",
        "crash_action",
        "max_attempts",
        "max_attempts_without_checkpoint",
    ]
    list_filter = ["enabled", "cluster", "crash_action"]
    search_fields = ["name", "environment", "partition"]
    fieldsets = [
        (None, {"fields": ["name", "enabled"]}),
        ("Scope (most specific wins)", {"fields": ["cluster", "environment", "partition"]}),
        (
            "Crashes and exclusions",
            {
                "fields": [
                    "crash_action",
                    "crash_confirmation_seconds",
                    "crash_confirmation_step_factor",
                    "decision_grace_seconds",
                    "exclude_on_attributions",
                    "exclude_on_categories",
                    "exclusion_hours",
                    "keep_out_cluster_nodes",
                    "suspect_node_workloads",
                    "suspect_window_hours",
                ]
            },
        ),
        (
            "When to stop",
            {
                "fields": [
                    "max_attempts",
                    "max_attempts_without_checkpoint",
                    "stop_on_application_fault",
                ]
            },
        ),
        (
            "Hangs, stragglers and divergence",
            {
                "fields": [
                    "hang_timeout_minutes",
                    "hang_step_time_factor",
                    "nonfinite_steps",
                    "loss_spike_factor",
                    "divergence_action",
                    "throughput_collapse_percent",
                    "straggler_threshold_percent",
                    "straggler_window_minutes",
                    "straggler_action",
                ]
            },
        ),
        (
            "Safety",
            {
                "fields": [
                    "blast_radius_percent",
                    "blast_radius_window_minutes",
                    "drain_nodes",
                    "decision_timeout_seconds",
                    "recommendation_ttl_minutes",
                ]
            },
        ),
        ("Progress overrides", {"fields": ["progress_pattern", "checkpoint_pattern"]}),
    ]

    def get_form(
        self, request: HttpRequest, obj: Policy | None = None, change: bool = False, **kwargs: Any
    ) -> Any:
        form = super().get_form(request, obj, change, **kwargs)
        if request.method == "POST" and POLICY_PREVIEW in request.POST:
            return type(f"{form.__name__}Preview", (PolicyPreviewForm, form), {})
        return form

    def render_change_form(
        self,
        request: HttpRequest,
        context: dict[str, Any],
        add: bool = False,
        change: bool = False,
        form_url: str = "",
        obj: Policy | None = None,
    ) -> HttpResponse:
        """The form, with the preview above it when one was asked for and the form is valid."""
        form = context["adminform"].form
        context["preview_days"] = request.POST.get(PREVIEW_DAYS, DEFAULT_DAYS)
        context["preview_min_days"], context["preview_max_days"] = MIN_DAYS, MAX_DAYS
        if isinstance(form, PolicyPreviewForm) and form.ready_for_preview:
            try:
                days = parse_days(context["preview_days"])
            except DaysError as exc:
                context["preview_error"] = str(exc)
            else:
                context["preview_days"] = days
                context["replays"] = preview_unsaved(form.save(commit=False), days)
        return super().render_change_form(request, context, add, change, form_url, obj)


@admin.register(EnvironmentBinding)
class EnvironmentBindingAdmin(ModelAdmin[EnvironmentBinding]):
    """Which jobs may choose an environment's policy for effects beyond their own job."""

    list_display = ["environment", "cluster", "partition", "account", "any_job", "note"]
    list_filter = ["cluster", "any_job"]
    search_fields = ["environment", "partition", "account", "note"]
    fields = ["cluster", "environment", "partition", "account", "any_job", "note"]


@admin.register(DetectionPattern)
class DetectionPatternAdmin(ModelAdmin[DetectionPattern]):
    list_display = ["name", "category", "attribution", "severity", "enabled", "updated_at"]
    list_filter = ["category", "attribution", "severity", "enabled"]
    search_fields = ["name", "description", "pattern"]


@admin.register(ControllerToken)
class ControllerTokenAdmin(ModelAdmin[ControllerToken]):
    """Tokens are issued with `manage.py create_controller_token`; here they can be revoked."""

    list_display = ["name", "cluster", "key_prefix", "created_at", "last_used_at", "revoked_at"]
    list_filter = ["cluster"]
    readonly_fields = ["cluster", "name", "key_prefix", "created_at", "last_used_at"]
    actions = ["revoke"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    @admin.action(description="Revoke the selected tokens")
    def revoke(self, request: HttpRequest, queryset: QuerySet[ControllerToken]) -> None:
        from django.utils import timezone

        queryset.filter(revoked_at__isnull=True).update(revoked_at=timezone.now())


@admin.register(IngestToken)
class IngestTokenAdmin(ModelAdmin[IngestToken]):
    """Job and hook tokens are issued with `manage.py issue_ingest_token` (job tokens also by
    operators over the API); here they are listed and revoked."""

    list_display = [
        "name",
        "kind",
        "cluster",
        "scope",
        "key_prefix",
        "issued_by",
        "created_at",
        "expires_at",
        "last_used_at",
        "revoked_at",
    ]
    list_filter = ["kind", "cluster"]
    search_fields = ["name", "job_id", "user"]
    readonly_fields = [
        "cluster",
        "kind",
        "name",
        "job_id",
        "job_submit_time",
        "user",
        "issued_by",
        "key_prefix",
        "created_at",
        "expires_at",
        "last_used_at",
    ]
    actions = ["revoke"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    @admin.action(description="Revoke the selected tokens")
    def revoke(self, request: HttpRequest, queryset: QuerySet[IngestToken]) -> None:
        from django.utils import timezone

        queryset.filter(revoked_at__isnull=True).update(revoked_at=timezone.now())


@admin.register(ClusterGoodputSnapshot)
class ClusterGoodputSnapshotAdmin(ReadOnlyAdmin[ClusterGoodputSnapshot]):
    """Snapshots are computed by the worker from the audit trail: shown, never edited."""

    list_display = [
        "taken_at",
        "cluster",
        "workloads",
        "failures",
        "ettr",
        "detection_latency_median",
        "action_latency_median",
    ]
    list_filter = ["cluster"]
    date_hierarchy = "taken_at"
    actions = None


class ApiTokenAddForm(ModelForm[ApiToken]):
    """Minting a token: the owner must be one the signed-in person may mint for."""

    minter: User

    class Meta:
        model = ApiToken
        fields = ["user", "name"]

    def clean(self) -> dict[str, Any]:
        super().clean()
        owner = self.cleaned_data.get("user")
        if owner is not None:
            refusal = web_minting_refusal(self.minter, owner)
            if refusal is not None:
                self.add_error("user", refusal)
        return self.cleaned_data


@admin.register(ApiToken)
class ApiTokenAdmin(ModelAdmin[ApiToken]):
    """Personal API tokens: a person adds their own here (the key is shown once, to them, on the
    page that answers the form, and stored nowhere), or `manage.py create_api_token USER` on the
    server; revoked here, for good."""

    list_display = ["name", "user", "key_prefix", "created_at", "last_used_at", "revoked_at"]
    list_filter = ["revoked_at"]
    search_fields = ["name", "user__username"]
    raw_id_fields = ["user"]
    actions = ["revoke"]
    key_template = "admin/recovery/apitoken/key_shown.html"
    # The key of a token added in this request, until the answer shows it.
    _new_keys: weakref.WeakKeyDictionary[HttpRequest, str] = weakref.WeakKeyDictionary()

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:
        fixed = ["key_prefix", "created_at", "last_used_at"]
        # A revoked token stays revoked: its key may have leaked.
        return fixed if obj is None else ["user", "name", *fixed, "revoked_at"]

    def get_fields(self, request: HttpRequest, obj: ApiToken | None = None) -> _FieldGroups:
        return (
            ["user", "name"]
            if obj is None
            else ["user", "name", "key_prefix", "created_at", "last_used_at", "revoked_at"]
        )

    def get_form(
        self, request: HttpRequest, obj: ApiToken | None = None, change: bool = False, **kwargs: Any
    ) -> Any:
        if obj is None:
            minter = request.user
            kwargs["form"] = type("ApiTokenAddForm", (ApiTokenAddForm,), {"minter": minter})
        return super().get_form(request, obj, change, **kwargs)

    def get_changeform_initial_data(self, request: HttpRequest) -> dict[str, Any]:
        return {"user": request.user.pk}

    def save_model(self, request: HttpRequest, obj: Any, form: Any, change: bool) -> None:
        if not change:
            if web_minting_refusal(cast(User, request.user), obj.user) is not None:
                raise PermissionDenied
            key = ApiToken.new_key()
            obj.set_key(key)
            super().save_model(request, obj, form, change)
            self._new_keys[request] = key
            return
        super().save_model(request, obj, form, change)

    def response_add(
        self, request: HttpRequest, obj: ApiToken, post_url_continue: str | None = None
    ) -> HttpResponse:
        key = self._new_keys.pop(request, None)
        if key is None:
            return super().response_add(request, obj, post_url_continue)
        # Shown on this answer only: not as a message, which would keep it in a cookie or the
        # session until the next page, and never cached.
        context = {
            **self.admin_site.each_context(request),
            "opts": self.opts,
            "token": obj,
            "key": key,
            "title": f"The key of {obj}",
        }
        response = TemplateResponse(request, self.key_template, context)
        add_never_cache_headers(response)
        return response

    @admin.action(description="Revoke the selected tokens")
    def revoke(self, request: HttpRequest, queryset: QuerySet[ControllerToken]) -> None:
        from django.utils import timezone

        queryset.filter(revoked_at__isnull=True).update(revoked_at=timezone.now())
