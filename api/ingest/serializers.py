"""Request bodies of the ingestion endpoints. Every field error comes back as a 400 listing it."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.utils import timezone
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from recovery.schedulers.nodelist import NodeListError, expand_nodelist

JOB_ID = r"^[0-9]+(_[0-9]+)?(\+[0-9]+)?$"
NODE_NAME = r"^[A-Za-z0-9][A-Za-z0-9._-]*$"
STREAM = r"^[A-Za-z0-9._:@/-]+$"
# One or more letters: a field that may be blank says so itself (allow_blank), and the schema
# offers "empty" as its own alternative, which a pattern matching "" would make ambiguous.
SLURM_STATE = r"^[A-Za-z_]+$"
EXIT_CODE_TEXT = r"^[0-9]+:[0-9]+$"
# Clocks drift; a heartbeat stamped later than this is refused rather than trusted.
MAX_CLOCK_AHEAD = timedelta(minutes=5)
MAX_STEP = 2**62
# Slurm names OUT_OF_MEMORY "OOM" in its short form (squeue %t, sacct -X -o State%3).
STATE_ALIASES = {"OOM": "OUT_OF_MEMORY", "NF": "NODE_FAIL", "TO": "TIMEOUT", "F": "FAILED"}


class _OnlyStrings:
    """Text fields take JSON strings only, as the schema says: DRF would turn 4242 into "4242"."""

    def to_internal_value(self, data: Any) -> str:
        if not isinstance(data, str):
            raise serializers.ValidationError("Send a string.", code="invalid")
        return super().to_internal_value(data)  # type: ignore[misc, no-any-return]


class StringField(_OnlyStrings, serializers.CharField):
    pass


class StringRegexField(_OnlyStrings, serializers.RegexField):
    pass


class ClusterScoped(serializers.Serializer[None]):
    """``cluster`` may be left out; when sent it must name the token's own cluster."""

    cluster = StringField(
        max_length=100,
        required=False,
        help_text="The cluster's name. Optional: the token already names its cluster.",
    )

    def validate_cluster(self, value: str) -> str:
        own = self.context["cluster"].name
        if value != own:
            raise serializers.ValidationError(
                f"This token belongs to cluster {own!r}; send that name or leave the field out."
            )
        return value


class JobScoped(ClusterScoped):
    job_id = StringRegexField(
        JOB_ID, max_length=64, help_text="The scheduler's job id, e.g. Slurm's SLURM_JOB_ID."
    )


class HeartbeatRequest(JobScoped):
    step = serializers.IntegerField(min_value=0, max_value=MAX_STEP)
    checkpoint_step = serializers.IntegerField(
        min_value=0,
        max_value=MAX_STEP,
        required=False,
        allow_null=True,
        default=None,
        help_text="The step of a checkpoint that was saved completely since the last heartbeat.",
    )
    rank = serializers.IntegerField(
        min_value=0, max_value=10_000_000, required=False, allow_null=True, default=None
    )
    node = StringRegexField(NODE_NAME, max_length=128, required=False, allow_blank=True, default="")
    throughput = serializers.FloatField(
        min_value=0, required=False, allow_null=True, default=None, help_text="Samples per second."
    )
    at = serializers.DateTimeField(
        required=False,
        allow_null=True,
        default=None,
        help_text="When the step was reached; the time of the request when left out.",
    )

    def validate_at(self, value: Any) -> Any:
        if value is not None and value > timezone.now() + MAX_CLOCK_AHEAD:
            raise serializers.ValidationError("This time is in the future.")
        return value


class LogText(StringField):
    """Log text as a job wrote it: NULs and lone surrogates become U+FFFD instead of a 400."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(allow_blank=True, trim_whitespace=False, **kwargs)

    def to_internal_value(self, data: Any) -> str:
        if isinstance(data, str):
            data = data.encode("utf-8", "replace").decode("utf-8").replace("\x00", "\ufffd")
        return str(super().to_internal_value(data))


class LogBatchRequest(JobScoped):
    lines = serializers.ListField(
        child=LogText(),
        required=False,
        help_text="The log lines, oldest first, without their line breaks.",
    )
    text = LogText(
        required=False,
        help_text="The lines as one text, instead of ``lines``.",
    )
    node = StringRegexField(NODE_NAME, max_length=128, required=False, allow_blank=True, default="")
    rank = serializers.IntegerField(
        min_value=0, max_value=10_000_000, required=False, allow_null=True, default=None
    )
    stream = StringRegexField(
        STREAM,
        max_length=200,
        required=False,
        allow_blank=True,
        default="",
        help_text="Names the sender's sequence of batches; ``<node>:<rank>`` when left out.",
    )
    sequence = serializers.IntegerField(
        min_value=1,
        max_value=2**63 - 1,
        required=False,
        allow_null=True,
        default=None,
        help_text=(
            "Increases with every batch of a stream. A batch whose number is not above the last "
            "one ingested is a repeat and is not ingested again. A restarted job starts a new "
            "stream (put SLURM_RESTART_COUNT in it) or keeps counting up."
        ),
    )

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if ("lines" in attrs) == ("text" in attrs):
            raise serializers.ValidationError({"lines": ["Send either 'lines' or 'text'."]})
        return attrs


@extend_schema_field(
    {
        "oneOf": [
            {"type": "string", "example": "node[001-004,007]"},
            {"type": "array", "items": {"type": "string"}, "example": ["node001", "node002"]},
        ]
    }
)
class NodeListField(serializers.Field[list[str], Any, list[str], Any]):
    """A Slurm hostlist expression (``node[001-004]``) or a list of node names."""

    default_error_messages = {"invalid": "Send a hostlist expression or a list of node names."}

    def to_internal_value(self, data: Any) -> list[str]:
        if isinstance(data, list) and all(isinstance(name, str) for name in data):
            data = ",".join(data)
        if not isinstance(data, str) or len(data) > 65536:
            self.fail("invalid")
        try:
            return expand_nodelist(data)
        except NodeListError as exc:
            raise serializers.ValidationError(str(exc)) from None

    def to_representation(self, value: list[str]) -> list[str]:
        return value


class SlurmStateField(StringRegexField):
    def __init__(self, **kwargs: Any) -> None:
        super().__init__(SLURM_STATE, max_length=32, **kwargs)

    def to_internal_value(self, data: Any) -> str:
        state = str(super().to_internal_value(data)).upper()
        return STATE_ALIASES.get(state, state)


class JsonIntegerField(serializers.IntegerField):
    """An integer as JSON writes one: ``300.0``, ``"300"`` and ``true`` are refused, as the
    schema says (DRF's own field would take all three for 300 or 1)."""

    def to_internal_value(self, data: Any) -> int:
        if isinstance(data, bool) or not isinstance(data, int):
            self.fail("invalid")
        return int(super().to_internal_value(data))


class JobEndedRequest(JobScoped):
    state = SlurmStateField(
        required=False,
        allow_blank=True,
        default="",
        help_text="The job's final state as the scheduler names it: FAILED, NODE_FAIL, TIMEOUT, "
        "OUT_OF_MEMORY (or OOM), CANCELLED, COMPLETED, PREEMPTED…",
    )
    exit_code = JsonIntegerField(
        required=False,
        allow_null=True,
        default=None,
        min_value=-(2**31),
        max_value=2**31 - 1,
        help_text="Slurm's SLURM_JOB_EXIT_CODE: the raw wait status (768 is exit 3).",
    )
    exit_code_text = StringRegexField(
        EXIT_CODE_TEXT,
        max_length=24,
        required=False,
        allow_blank=True,
        default="",
        help_text="Slurm's SLURM_JOB_EXIT_CODE2, ``exit:signal``.",
    )
    nodes = NodeListField(required=False, default=list)
    restart_count = JsonIntegerField(
        min_value=0, max_value=100_000, required=False, allow_null=True, default=None
    )


class NodeDownRequest(ClusterScoped):
    node = NodeListField(help_text="A node name, or a hostlist expression as strigger passes it.")
    state = SlurmStateField(required=False, allow_blank=True, default="DOWN")
    reason = StringField(
        max_length=255, required=False, allow_blank=True, default="", trim_whitespace=True
    )

    def validate_node(self, value: list[str]) -> list[str]:
        if not value:
            raise serializers.ValidationError("Name at least one node.")
        if len(value) > 4096:
            raise serializers.ValidationError("At most 4096 nodes per request.")
        return value
