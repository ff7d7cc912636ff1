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
