"""Maintenance tasks: hand back lapsed claims, run the watchdog, snapshot goodput."""

from __future__ import annotations

from celery import shared_task
from django.utils import timezone

from recovery.loop import leases, watchdog
from recovery.read import insights


@shared_task(name="tasks.maintenance.release_expired_leases")
def release_expired_leases() -> int:
    """Hand recommendations whose controller went silent back to the other controllers."""
    return leases.release_expired_leases()


@shared_task(name="tasks.maintenance.run_watchdog")
def run_watchdog() -> dict[str, object]:
    """Release jobs held past their decision timeout; expire ready advice nobody carried out."""
    summary = watchdog.run_watchdog()
    return {"expired": summary.expired, "released": summary.released, "errors": summary.errors}


@shared_task(name="tasks.maintenance.take_goodput_snapshots")
def take_goodput_snapshots() -> int:
    """Store each cluster's goodput figures for the Insights page; prune old snapshots."""
    return insights.take_goodput_snapshots(timezone.now())
