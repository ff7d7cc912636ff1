from __future__ import annotations

from django import forms
from django.contrib.auth.forms import AuthenticationForm

from recovery.choices import SIGNATURE_CATEGORIES, Attribution, ClusterMode
from recovery.detection.linear_regex import MAX_PATTERN_LENGTH
from recovery.models import Cluster, Recommendation
from recovery.schedulers.validation import InvalidIdentifier, validate_partition

# A failure is blamed on a layer, even if it is "unknown"; "none" is the healthy verdict's.
TAUGHT_ATTRIBUTIONS = [(v, label) for v, label in Attribution.choices if v != Attribution.NONE]


class ConsoleLoginForm(AuthenticationForm):
    username = forms.CharField(
        widget=forms.TextInput(attrs={"autofocus": True, "autocomplete": "username"})
    )


class DecisionForm(forms.Form):
    note = forms.CharField(
        required=False,
        max_length=2000,
        widget=forms.TextInput(attrs={"placeholder": "Reason (optional)"}),
        error_messages={"max_length": "The note is longer than %(limit_value)d characters."},
    )


# One page of the approval queue (console.views.approvals.APPROVALS_PAGE_SIZE) at most: an
# operator decides on what they saw, never on more than one page.
MAX_BULK_DECISIONS = 50
BULK_DECISIONS = [("approve", "Approve"), ("reject", "Reject")]
# A primary key is a signed 64-bit integer (BigAutoField).
MAX_ID = 2**63 - 1


class BulkDecisionForm(DecisionForm):
    """Several recommendations, one decision and one note (the single decision's note field).

    Any problem with the ids (not a number, repeated, unknown, too many) refuses the whole
    submission: nothing is decided on a selection the operator did not mean.
    """

    recommendation = forms.Field(
        widget=forms.MultipleHiddenInput,
        error_messages={"required": "Select at least one recommendation."},
    )
    decision = forms.ChoiceField(
        choices=BULK_DECISIONS,
        error_messages={
            "required": "Choose to approve or to reject the selection.",
            "invalid_choice": "Choose to approve or to reject the selection.",
        },
    )

    def clean_recommendation(self) -> list[int]:
        values = self.cleaned_data["recommendation"]
        given = [str(v).strip() for v in (values if isinstance(values, list) else [values])]
        if len(given) > MAX_BULK_DECISIONS:
            raise forms.ValidationError(
                f"{len(given)} recommendations were selected: at most {MAX_BULK_DECISIONS} "
                "(one page of the queue) are decided at once."
            )
        not_ids = [value for value in given if not _is_id(value)]
        if not_ids:
            raise forms.ValidationError(
                f"Not a recommendation id: {', '.join(repr(v[:20]) for v in not_ids[:5])}."
            )
        ids = [int(value) for value in given]
        repeated = sorted({pk for pk in ids if ids.count(pk) > 1})
        if repeated:
            raise forms.ValidationError(
                f"Selected more than once: recommendation {_listed(repeated)}."
            )
        known = set(Recommendation.objects.filter(pk__in=ids).values_list("pk", flat=True))
        unknown = [pk for pk in ids if pk not in known]
        if unknown:
            raise forms.ValidationError(f"No such recommendation: {_listed(unknown)}.")
        return ids

    def problems(self) -> str:
        """Every error as one sentence for a message."""
        return " ".join(str(error) for errors in self.errors.values() for error in errors)


def _is_id(value: str) -> bool:
    return 0 < len(value) <= 19 and value.isascii() and value.isdigit() and 0 < int(value) <= MAX_ID


def _listed(ids: list[int]) -> str:
    return ", ".join(str(pk) for pk in ids)


class SignalStoresForm(forms.Form):
    logs = forms.URLField(
        required=False,
        label="Log store URL",
        help_text="Loki or VictoriaLogs base URL, e.g. http://loki.example:3100",
        assume_scheme="http",
    )
    metrics = forms.URLField(
        required=False,
        label="Prometheus URL",
        help_text="Prometheus holding dcgm-exporter metrics, e.g. http://prometheus.example:9090",
        assume_scheme="http",
    )
    job = forms.RegexField(
        required=False,
        regex=r"^[0-9A-Za-z_.+-]{1,64}$",
        label="Job to sample",
        help_text="Optional: a Slurm job id whose lines to classify (default: the newest seen)",
    )

    def clean(self) -> dict[str, object]:
        data = super().clean() or {}
        if not data.get("logs") and not data.get("metrics"):
            raise forms.ValidationError("Give a log store URL, a Prometheus URL or both.")
        return data


class TeachPatternForm(forms.Form):
    """A detection pattern taught from a line of an unexplained failure."""

    line = forms.IntegerField(min_value=0, widget=forms.HiddenInput)
    name = forms.CharField(
        max_length=128,
        help_text="Lower-case letters, digits, '.', '_' or '-'; the name findings will carry.",
    )
    pattern = forms.CharField(
        max_length=MAX_PATTERN_LENGTH,
        widget=forms.Textarea(attrs={"rows": 3, "spellcheck": "false", "class": "mono"}),
        help_text="RE2 syntax, no backreferences or lookaround. Derived from the line: its "
        "prefixes dropped, numbers generalised.",
    )
    category = forms.ChoiceField(choices=[("", "Choose the category…"), *SIGNATURE_CATEGORIES])
    attribution = forms.ChoiceField(
        choices=[("", "Choose the layer to blame…"), *TAUGHT_ATTRIBUTIONS],
        help_text="The layer to blame when nothing else decides.",
    )
    description = forms.CharField(max_length=255, required=False)
    printed_by = forms.CharField(
        max_length=255,
        required=False,
        label="Printed by",
        help_text="The program that prints the message (and where known its documentation). "
        "Needed when the pattern matches no other known failure.",
    )
    # What the shown preview was of (``PatternDraft.digest``): saving needs a preview of it.
    previewed = forms.CharField(required=False, widget=forms.HiddenInput)


# The canary's partitions, as typed: a comma-separated list of Slurm partition names.
MAX_CANARY_PARTITIONS = 64
MAX_CONTROL_REASON = 500


class ClusterControlsForm(forms.Form):
    """What a cluster may do on its own: its mode, the acknowledgement, automatic drains and
    the canary (the partitions and share of jobs action mode reaches), with the operator's
    reason, required when anything changes.

    Bound to the cluster as stored: ``changes()`` lists what the submission changes, and
    ``apply`` sets those values on the cluster for ``save_with_audit`` to store and record.
    """

    mode = forms.ChoiceField(choices=ClusterMode.choices)
    acknowledge_scheduler_actions = forms.BooleanField(
        required=False,
        label="Acknowledge scheduler actions",
        help_text="Action mode acts without approval only when this is also set.",
    )
    drain_automatically = forms.BooleanField(
        required=False,
        label="Drain automatically",
        help_text="Off: every drain waits for an operator, even in action mode. Drains always "
        "wait while the cluster has a canary.",
    )
    action_partitions = forms.CharField(
        required=False,
        max_length=2000,
        label="Canary partitions",
        help_text="Comma-separated Slurm partitions action mode reaches; empty: every partition.",
    )
    action_share_percent = forms.IntegerField(
        min_value=1,
        max_value=100,
        widget=forms.TextInput(attrs={"inputmode": "numeric", "size": 4}),
        label="Canary share (%)",
        help_text="The share of opted-in jobs, chosen by job id, action mode reaches.",
    )
    reason = forms.CharField(
        required=False,
        max_length=MAX_CONTROL_REASON,
        widget=forms.TextInput(attrs={"placeholder": "Why (kept in the audit trail)"}),
        error_messages={"max_length": "The reason is longer than %(limit_value)d characters."},
    )

    def __init__(self, *args: object, cluster: Cluster, **kwargs: object) -> None:
        kwargs.setdefault(
            "initial",
            {
                "mode": cluster.mode,
                "acknowledge_scheduler_actions": cluster.acknowledge_scheduler_actions,
                "drain_automatically": cluster.drain_automatically,
                "action_partitions": ", ".join(str(p) for p in cluster.action_partitions or []),
                "action_share_percent": cluster.action_share_percent,
            },
        )
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.cluster = cluster

    def clean_action_partitions(self) -> list[str]:
        text = str(self.cleaned_data.get("action_partitions") or "")
        names = [name.strip() for name in text.split(",") if name.strip()]
        problems = []
        for name in names:
            try:
                validate_partition(name)
            except InvalidIdentifier as exc:
                problems.append(str(exc))
        if problems:
            raise forms.ValidationError(" ".join(problems[:3]))
        unique = list(dict.fromkeys(names))
        if len(unique) > MAX_CANARY_PARTITIONS:
            raise forms.ValidationError(f"At most {MAX_CANARY_PARTITIONS} partitions.")
        return unique

    def clean_reason(self) -> str:
        return str(self.cleaned_data.get("reason") or "").strip()

    def clean(self) -> dict[str, object]:
        data = super().clean() or {}
        if not self.errors and self.changes() and not data.get("reason"):
            self.add_error(
                "reason", "Give a reason: it is kept with the change in the audit trail."
            )
        return data

    def changes(self) -> list[str]:
        """What the submission changes, in words; empty when it changes nothing."""
        data = self.cleaned_data
        cluster = self.cluster
        said = []
        if data.get("mode") is not None and data["mode"] != cluster.mode:
            said.append(f"mode {cluster.mode} to {data['mode']}")
        for field, words in (
            ("acknowledge_scheduler_actions", "acknowledgement of scheduler actions"),
            ("drain_automatically", "automatic drains"),
        ):
            if field in data and bool(data[field]) != bool(getattr(cluster, field)):
                said.append(f"{words} {'on' if data[field] else 'off'}")
        before = [str(p) for p in cluster.action_partitions or []]
        if "action_partitions" in data and data["action_partitions"] != before:
            said.append(
                "canary partitions "
                + (", ".join(data["action_partitions"]) or "none (every partition)")
            )
        share = data.get("action_share_percent")
        if share is not None and share != cluster.action_share_percent:
            said.append(f"canary share {cluster.action_share_percent} % to {share} %")
        return said

    def apply(self, cluster: Cluster) -> None:
        """Set the submitted controls on ``cluster`` (not saved)."""
        data = self.cleaned_data
        cluster.mode = data["mode"]
        cluster.acknowledge_scheduler_actions = bool(data["acknowledge_scheduler_actions"])
        cluster.drain_automatically = bool(data["drain_automatically"])
        cluster.action_partitions = list(data["action_partitions"])
        cluster.action_share_percent = int(data["action_share_percent"])
