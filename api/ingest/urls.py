"""Ingestion endpoints under /api/v1/ingest/: job heartbeats and logs, scheduler hooks."""

from django.urls import URLPattern, URLResolver, path

from api.ingest import hooks, views

urlpatterns: list[URLPattern | URLResolver] = [
    path("heartbeats/", views.heartbeats, name="ingest-heartbeats"),
    path("logs/", views.logs, name="ingest-logs"),
    path("scheduler/job-ended/", hooks.job_ended, name="ingest-job-ended"),
    path("scheduler/node-down/", hooks.node_down, name="ingest-node-down"),
]
