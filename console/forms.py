from __future__ import annotations

from django import forms
from django.contrib.auth.forms import AuthenticationForm

from recovery.choices import SIGNATURE_CATEGORIES, Attribution
from recovery.detection.linear_regex import MAX_PATTERN_LENGTH

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
    )


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
