from __future__ import annotations

from django import forms
from django.contrib.auth.forms import AuthenticationForm


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
