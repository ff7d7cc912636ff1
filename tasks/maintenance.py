from __future__ import annotations

from celery import shared_task

from recovery import recommendations


@shared_task(name="tasks.maintenance.release_expired_leases")
def release_expired_leases() -> int:
    """Hand recommendations whose controller went silent back to the other controllers."""
    return recommendations.release_expired_leases()
