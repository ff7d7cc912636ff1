"""Celery tasks. Each task is thin: it takes primary keys and calls one function in ``recovery``."""

from tasks.celery import app

__all__ = ["app"]
