"""The Advisor API's request and answer bodies: what a controller sends and is sent.

Apart from the views (``api.advisor``) because these are the API's contract with controllers of
the same release: a recommendation as a controller sees it, and the claim, report and dispatch
bodies with the caps that keep what they bring into the audit trail bounded.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rest_framework import serializers

from recovery.audit.limits import (
    MAX_COMMANDS_BYTES,
    MAX_FREE_FORM_BYTES,
    MAX_FREE_FORM_DEPTH,
    free_form_problem,
)
from recovery.choices import RecommendationStatus
from recovery.loop import leases, recommendations
from recovery.models import Recommendation


class RecommendationForController(serializers.ModelSerializer[Recommendation]):
    job_id = serializers.CharField(source="workload.job_id")
    submit_time = serializers.DateTimeField(source="workload.submit_time")
    job_name = serializers.CharField(source="workload.name")
    user = serializers.CharField(source="workload.user")
    partition = serializers.CharField(source="workload.partition")
    attempt = serializers.IntegerField(source="attempt.number", allow_null=True, default=None)
    attempt_started_at = serializers.DateTimeField(
        source="attempt.started_at", allow_null=True, default=None
    )
    node = serializers.CharField(
        source="node.name",
        default="",
        help_text="The node a drain or resume is for; empty for a job's restart or stop. For a "
        "drain, ``reason`` is the scheduler's drain reason, prefixed 'workload-recovery:'.",
    )

    class Meta:
        model = Recommendation
        fields = [
            "id",
            "idempotency_key",
            "job_id",
            "submit_time",
            "job_name",
            "user",
            "partition",
            "attempt",
            "attempt_started_at",
            "action",
            "node",
            "excluded_nodes",
            "reason",
            "status",
            "approved_by",
            "lease_owner",
            "lease_instance",
            "lease_expires_at",
            "expires_at",
            "created_at",
        ]


class ClaimRequest(serializers.Serializer[None]):
    lease_seconds = serializers.IntegerField(min_value=10, max_value=3600, default=120)


# One command line: at most this many arguments, each at most this long.
MAX_ARGV = 64
MAX_ARG_LENGTH = 4096


class CommandRun(serializers.Serializer[None]):
    argv = serializers.ListField(
        child=serializers.CharField(max_length=MAX_ARG_LENGTH), max_length=MAX_ARGV
    )
    returncode = serializers.IntegerField()
    output = serializers.CharField(max_length=8192, allow_blank=True, required=False, default="")


MAX_COMMANDS = 64


def bounded_json(max_bytes: int) -> Callable[[Any], None]:
    """A field validator: free-form JSON kept in the trail, no larger nor deeper than allowed."""

    def validate(value: Any) -> None:
        problem = free_form_problem(value, max_bytes=max_bytes)
        if problem is not None:
            raise serializers.ValidationError(problem, code="too_large")

    return validate


class ReportRequest(serializers.Serializer[None]):
    outcome = serializers.ChoiceField(
        choices=[
            RecommendationStatus.EXECUTED,
            RecommendationStatus.SKIPPED,
            RecommendationStatus.FAILED,
            recommendations.RETRY,
        ]
    )
    state_before = serializers.DictField(
        required=False,
        default=dict,
        validators=[bounded_json(MAX_FREE_FORM_BYTES)],
        help_text=f"The job as the controller read it before acting: at most "
        f"{MAX_FREE_FORM_BYTES} bytes as JSON and {MAX_FREE_FORM_DEPTH} levels deep.",
    )
    commands = CommandRun(many=True, required=False, default=list)
    converged = serializers.BooleanField(required=False, allow_null=True, default=None)
    detail = serializers.CharField(max_length=2000, allow_blank=True, required=False, default="")

    def validate_commands(self, value: list[dict[str, Any]]) -> list[dict[str, Any]]:
        # Each command's argv and output are capped; together they are kept in the trail too.
        if len(value) > MAX_COMMANDS:
            raise serializers.ValidationError(
                f"At most {MAX_COMMANDS} commands per report.", code="too_large"
            )
        bounded_json(MAX_COMMANDS_BYTES)([dict(command) for command in value])
        return value


class DispatchRequest(serializers.Serializer[None]):
    argv = serializers.ListField(
        # Kept as sent: the trail must show the very command line that runs.
        child=serializers.CharField(max_length=MAX_ARG_LENGTH, trim_whitespace=False),
        min_length=1,
        max_length=MAX_ARGV,
        validators=[bounded_json(MAX_COMMANDS_BYTES)],
        help_text="The exact command line about to run, one argument per item.",
    )
    sequence = serializers.IntegerField(
        min_value=1,
        max_value=leases.MAX_DISPATCH_SEQUENCE,
        help_text="Which command this is of this controller's handling of the claim, from 1.",
    )
