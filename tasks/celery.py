"""The Celery application. Its configuration, beat schedule included, is in settings (CELERY_*)."""

from __future__ import annotations

import os

from celery import Celery
from celery.signals import task_failure

from tasks.failures import record_task_failure

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "workload_recovery.settings")

app = Celery("workload_recovery", include=["tasks.maintenance", "tasks.polling"])
app.config_from_object("django.conf:settings", namespace="CELERY")
# Failed tasks are counted in Redis for /metrics (wr_task_failures_total).
task_failure.connect(record_task_failure, weak=False)
