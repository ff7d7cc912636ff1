"""What each resource shows. Read-only: changes go through the Console, the Advisor API or the
approve/reject endpoints, so that every one of them lands in the audit trail."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from recovery.loop.policy import policies_read_once, policy_for, site_policy
from recovery.loop.workflows import workflow_budget
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


def _node_names(help_text: str = "") -> serializers.ListField:
    return serializers.ListField(child=serializers.CharField(), read_only=True, help_text=help_text)


class ClusterSerializer(serializers.ModelSerializer[Cluster]):
    acts_automatically = serializers.BooleanField(
        read_only=True,
        help_text="Recommendations reach the scheduler without an operator's approval, for "
        "the jobs in the canary (action_partitions, action_share_percent).",
    )
    action_partitions = serializers.ListField(
        child=serializers.CharField(),
        read_only=True,
        help_text="The canary: action mode reaches only jobs in these partitions (empty: all).",
    )

    class Meta:
        model = Cluster
        # connection_settings stay out: hosts, users and key paths are not for every viewer.
        fields = [
            "id",
            "name",
            "scheduler_kind",
            "connection",
            "mode",
            "acknowledge_scheduler_actions",
            "acts_automatically",
            "action_partitions",
            "action_share_percent",
            "environment",
            "last_polled_at",
            "last_poll_error",
            "last_poll_error_at",
            "created_at",
            "updated_at",
        ]


class NodeSerializer(serializers.ModelSerializer[Node]):
    cluster_name = serializers.CharField(source="cluster.name", read_only=True)
    excluded = serializers.SerializerMethodField(
        help_text="Recovery keeps restarts off this node until excluded_until."
    )
    suspect = serializers.SerializerMethodField(
        help_text="Implicated in several workloads: the health layer should drain and test it."
    )

    class Meta:
        model = Node
        fields = [
            "id",
            "cluster",
            "cluster_name",
            "name",
            "scheduler_state",
            "state_reason",
            "health",
            "times_implicated",
            "last_implicated_at",
            "excluded",
            "excluded_until",
            "suspect",
            "suspect_since",
            "suspect_reason",
            "updated_at",
        ]

    def get_excluded(self, node: Node) -> bool:
        return node.is_excluded()

    def get_suspect(self, node: Node) -> bool:
        return node.suspect_since is not None


class _WorkloadListSerializer(serializers.ListSerializer[Workload]):
    def to_representation(self, data: Any) -> list[Any]:
        # One reading of the policies and bindings for the page, not two per row.
        with policies_read_once():
            return super().to_representation(data)


class WorkloadSerializer(serializers.ModelSerializer[Workload]):
    cluster_name = serializers.CharField(source="cluster.name", read_only=True)
    acts_automatically = serializers.BooleanField(
        read_only=True,
        help_text="This job's recommendations reach the scheduler without an operator's "
        'approval: the cluster acts automatically and the job opted in with "mode": "act".',
    )
    workflow_name = serializers.CharField(
        source="workflow.name",
        read_only=True,
        allow_null=True,
        default=None,
        help_text="The name of the workflow (its owner's, on this cluster); null for none.",
    )
    depends_on = serializers.ListField(
        child=serializers.CharField(),
        read_only=True,
        help_text="Job ids this job waited for (afterany, afternotok) while it was pending.",
    )
    policy = serializers.SerializerMethodField(
        help_text="The policy of this job's own recovery (restarts, retry budget, hangs, "
        "stragglers), chosen with the environment it names."
    )
    site_policy = serializers.SerializerMethodField(
        help_text="The policy for its effects on nodes and other jobs (exclusions on the "
        "cluster, suspects, drains, blast radius): the cluster's, or the named environment's "
        "where an operator bound it to the job's partition or account."
    )
    environment_refused = serializers.SerializerMethodField(
        help_text="Why the environment the job named does not govern its effects on nodes and "
        'other jobs; "" when it does, or the job named none of its own.'
    )

    class Meta:
        model = Workload
        list_serializer_class = _WorkloadListSerializer
        fields = [
            "id",
            "cluster",
            "cluster_name",
            "job_id",
            "submit_time",
            "name",
            "user",
            "partition",
            "account",
            "workflow",
            "workflow_name",
            "workflow_ignored",
            "depends_on",
            "environment",
            "policy",
            "site_policy",
            "environment_refused",
            "opted_in",
            "opt_in_mode",
            "acts_automatically",
            "opt_in_error",
            "state",
            "state_reason",
            "current_attempt",
            "last_progress_step",
            "last_progress_at",
            "last_checkpoint_step",
            "last_checkpoint_at",
            "created_at",
            "updated_at",
        ]

    def to_representation(self, instance: Workload) -> dict[str, Any]:
        # The policy fields choose among policies read once (inside a page: once for it).
        with policies_read_once():
            return super().to_representation(instance)

    def get_policy(self, workload: Workload) -> str:
        return policy_for(workload).name

    def get_site_policy(self, workload: Workload) -> str:
        return site_policy(workload).policy.name

    def get_environment_refused(self, workload: Workload) -> str:
        return site_policy(workload).refused


class AttemptSerializer(serializers.ModelSerializer[Attempt]):
    nodes = _node_names("Node names, expanded.")
    excluded_nodes = _node_names("Nodes this attempt was asked to avoid.")

    class Meta:
        model = Attempt
        fields = [
            "id",
            "workload",
            "number",
            "nodes",
            "excluded_nodes",
            "started_at",
            "ended_at",
            "exit_state",
            "exit_code",
            "produced_checkpoint",
        ]


class VerdictSerializer(serializers.ModelSerializer[Verdict]):
    implicated_nodes = _node_names()
    detail = serializers.DictField(read_only=True)

    class Meta:
        model = Verdict
        fields = [
            "id",
            "anomaly",
            "provider",
            "attribution",
            "confidence",
            "implicated_nodes",
            "detail",
            "created_at",
        ]


class AnomalySerializer(serializers.ModelSerializer[Anomaly]):
    cluster = serializers.IntegerField(source="workload.cluster_id", read_only=True)
    attempt_number = serializers.IntegerField(
        source="attempt.number", read_only=True, allow_null=True, default=None
    )
    implicated_nodes = _node_names()
    implicated_ranks = serializers.ListField(child=serializers.IntegerField(), read_only=True)
    details = serializers.DictField(read_only=True, help_text="Secondary findings.")
    detection_latency_seconds = serializers.FloatField(
        read_only=True, help_text="From the evidence being written to the anomaly being recorded."
    )
    confirmation_latency_seconds = serializers.FloatField(
        read_only=True,
        allow_null=True,
        help_text="From the evidence being written to the crash being confirmed; null unless "
        "confirmed.",
    )
    verdicts = VerdictSerializer(many=True, read_only=True)

    class Meta:
        model = Anomaly
        fields = [
            "id",
            "cluster",
            "workload",
            "attempt",
            "attempt_number",
            "kind",
            "category",
            "attribution",
            "severity",
            "signature",
            "evidence_line",
            "evidence_excerpt",
            "implicated_nodes",
            "implicated_ranks",
            "occurrences",
            "folded_findings",
            "evidence_source",
            "evidence_trust",
            "details",
            "evidence_at",
            "last_seen_at",
            "detected_at",
            "confirmation",
            "confirmation_at",
            "confirmation_reason",
            "confirmation_latency_seconds",
            "decided_at",
            "detection_latency_seconds",
            "verdicts",
        ]


class RecommendationSerializer(serializers.ModelSerializer[Recommendation]):
    cluster = serializers.IntegerField(source="workload.cluster_id", read_only=True)
    attempt_number = serializers.IntegerField(
        source="attempt.number", read_only=True, allow_null=True, default=None
    )
    excluded_nodes = _node_names()
    node = serializers.CharField(
        source="node.name",
        read_only=True,
        allow_null=True,
        default=None,
        help_text="The node a drain or resume is for; null for a job's restart or stop.",
    )
    result = serializers.DictField(
        read_only=True, help_text="What the controller reported: state before, commands run."
    )

    class Meta:
        model = Recommendation
        fields = [
            "id",
            "cluster",
            "workload",
            "attempt_number",
            "anomaly",
            "action",
            "node",
            "excluded_nodes",
            "exclusion_sources",
            "stop_reason",
            "reason",
            "status",
            "disposition",
            "disposition_reason",
            "acknowledged_by",
            "acknowledged_at",
            "decided_by",
            "approved_by",
            "decided_at",
            "decision_note",
            "idempotency_key",
            "lease_owner",
            "lease_expires_at",
            "expires_at",
            "result",
            "superseded_by",
            "created_at",
            "updated_at",
        ]


class AuditEventSerializer(serializers.ModelSerializer[AuditEvent]):
    cluster_name = serializers.CharField(source="cluster.name", read_only=True)
    job_id = serializers.CharField(
        source="workload.job_id", read_only=True, allow_null=True, default=None
    )
    payload = serializers.JSONField(read_only=True)

    class Meta:
        model = AuditEvent
        fields = [
            "id",
            "occurred_at",
            "cluster",
            "cluster_name",
            "workload",
            "job_id",
            "attempt",
            "kind",
            "actor",
            "payload",
        ]


# The jobs a workflow's detail lists, newest first; ``jobs_count`` says how many it has.
WORKFLOW_JOBS_SHOWN = 100


class WorkflowSerializer(serializers.ModelSerializer[Workflow]):
    cluster_name = serializers.CharField(source="cluster.name", read_only=True)
    jobs_count = serializers.IntegerField(read_only=True, help_text="Jobs in the workflow.")

    class Meta:
        model = Workflow
        fields = ["id", "cluster", "cluster_name", "user", "name", "jobs_count", "created_at"]


class WorkflowJobSerializer(serializers.ModelSerializer[Workload]):
    depends_on = serializers.ListField(child=serializers.CharField(), read_only=True)

    class Meta:
        model = Workload
        fields = [
            "id",
            "job_id",
            "name",
            "state",
            "submit_time",
            "current_attempt",
            "depends_on",
        ]


class WorkflowBudgetSerializer(serializers.Serializer[Any]):
    """The retry budget as the policy counts it for the workflow's newest job."""

    policy = serializers.CharField(help_text="The policy that applies to the newest job.")
    attempts = serializers.IntegerField(help_text="Attempts of all the workflow's jobs.")
    max_attempts = serializers.IntegerField()
    attempts_left = serializers.IntegerField()
    attempts_without_checkpoint = serializers.IntegerField(
        help_text="The latest attempts in a row, across jobs, that saved no checkpoint."
    )
    max_attempts_without_checkpoint = serializers.IntegerField()
    attempts_without_checkpoint_left = serializers.IntegerField()
    excluded_nodes = _node_names(
        "Nodes the workflow's next restart keeps out: excluded by an earlier attempt, or "
        "implicated by a failure of its jobs within the policy's exclusion time."
    )


class WorkflowDetailSerializer(WorkflowSerializer):
    jobs = serializers.SerializerMethodField(help_text="Its jobs, newest first (at most 100).")
    budget = serializers.SerializerMethodField(
        help_text="The budget used and left; null while the workflow has no job."
    )

    class Meta(WorkflowSerializer.Meta):
        fields = [*WorkflowSerializer.Meta.fields, "jobs", "budget"]

    @extend_schema_field(WorkflowJobSerializer(many=True))
    def get_jobs(self, workflow: Workflow) -> list[dict[str, Any]]:
        jobs = workflow.workloads.order_by("-submit_time", "-id")[:WORKFLOW_JOBS_SHOWN]
        return list(WorkflowJobSerializer(jobs, many=True).data)

    @extend_schema_field(WorkflowBudgetSerializer(allow_null=True))
    def get_budget(self, workflow: Workflow) -> dict[str, Any] | None:
        budget = workflow_budget(workflow)
        if budget is None:
            return None
        return dict(WorkflowBudgetSerializer(budget).data)
