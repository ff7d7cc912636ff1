"""A cluster's log and metric stores: inspect them (admins), then save what was found
(superusers: the stores are part of the cluster's connection settings, which tell the server
where to connect and with which credentials)."""

from __future__ import annotations

from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render

from console.access import console_view
from console.forms import SignalStoresForm
from recovery.clusters.configurator import inspect_logs, inspect_metrics, save_signals
from recovery.models import Cluster

SAVE_NEEDS_SUPERUSER = (
    "Nothing saved: the stores are part of the cluster's connection settings, which only a "
    "superuser may change."
)


@console_view("recovery.change_cluster", "Configuring a cluster's log and metric stores")
def cluster_signals(request: HttpRequest, cluster_id: int) -> HttpResponse:
    """GET shows the saved stores; POST inspects what the form names, and saves with "save"."""
    cluster = get_object_or_404(Cluster, pk=cluster_id)
    saved = cluster.connection_settings or {}
    logs = metrics = None
    if request.method == "POST":
        form = SignalStoresForm(request.POST)
        if form.is_valid():
            data = form.cleaned_data
            # Inspected again on save: what is stored is what the server saw, not the page.
            if data["logs"]:
                logs = inspect_logs(data["logs"], job_id=data["job"] or "")
            if data["metrics"]:
                metrics = inspect_metrics(data["metrics"])
            if "save" in request.POST and not request.user.is_superuser:
                messages.error(request, SAVE_NEEDS_SUPERUSER)
            elif "save" in request.POST:
                usable = [r for r in (logs, metrics) if r is not None and r.ok]
                if usable:
                    save_signals(cluster, logs=logs, metrics=metrics)
                    messages.success(request, f"Saved the stores to cluster {cluster.name}.")
                    return redirect("console:cluster_signals", cluster_id=cluster.pk)
                messages.error(request, "Nothing saved: no store could be read.")
    else:
        form = SignalStoresForm(
            initial={
                "logs": (saved.get("log_source") or {}).get("url", ""),
                "metrics": (saved.get("metric_source") or {}).get("url", ""),
            }
        )
    return render(
        request,
        "console/cluster_signals.html",
        {
            "cluster": cluster,
            "form": form,
            "logs": logs,
            "metrics": metrics,
            "saved_logs": saved.get("log_source"),
            "saved_metrics": saved.get("metric_source"),
            "may_save": request.user.is_superuser,
        },
    )
