"""Ingestion endpoints under /api/v1/ingest/: job heartbeats and logs, scheduler hooks."""

from django.urls import URLPattern, URLResolver

urlpatterns: list[URLPattern | URLResolver] = []
