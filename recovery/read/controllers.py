"""Which Advisor Controllers called in for a cluster, and whether an approval there will be
carried out.

An approved recommendation waits, Ready, until a controller of its cluster claims it. A running
controller calls the Advisor API every few seconds (each call marks its token used), so a
cluster whose controllers have been silent for minutes has nobody to carry out what an operator
approves: the Console says so before and after the approval.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.utils.timesince import timesince

from recovery.models import Cluster, ControllerToken

# A running controller asks for ready recommendations every few seconds (``--interval``,
# 5 s by default), which marks its token used; minutes of silence mean it is not running.
CONTROLLER_SEEN_WITHIN = timedelta(minutes=5)


@dataclass(frozen=True)
class ControllerSeen:
    """One unrevoked controller token and when it last called in."""

    name: str
    last_seen: datetime | None
    seen_ago: str
    recent: bool


@dataclass(frozen=True)
class ClusterControllers:
    """The controllers of one cluster at ``now``, most recently seen first."""

    cluster_name: str
    controllers: list[ControllerSeen] = field(default_factory=list)

    @property
    def last_seen(self) -> datetime | None:
        seen = [c.last_seen for c in self.controllers if c.last_seen is not None]
        return max(seen) if seen else None

    @property
    def recent(self) -> bool:
        """Some controller called in within CONTROLLER_SEEN_WITHIN: an approval will be taken up."""
        return any(c.recent for c in self.controllers)

    @property
    def wait_warning(self) -> str:
        """Why an approval on this cluster will wait, or "" when a controller is calling in."""
        if self.recent:
            return ""
        name = self.cluster_name
        if not self.controllers:
            return (
                f"No controller token is issued for {name}: an approved recommendation will "
                "wait, and expire, until a controller runs for it."
            )
        last_seen = self.controllers[0]
        if last_seen.last_seen is None:
            return (
                f"No controller has called in for {name} yet: an approved recommendation "
                "will wait until one does."
            )
        silent_for = last_seen.seen_ago.removesuffix(" ago")
        return f"No controller has called in for {name} for {silent_for}: this will wait."


def controllers_of(clusters: Iterable[Cluster], now: datetime) -> dict[int, ClusterControllers]:
    """Cluster id → its controllers at ``now``, in one query whatever the number of clusters."""
    clusters = list(clusters)
    tokens: dict[int, list[ControllerSeen]] = defaultdict(list)
    rows = (
        ControllerToken.objects.filter(
            cluster_id__in=[c.pk for c in clusters], revoked_at__isnull=True
        )
        .order_by()
        .values_list("cluster_id", "name", "last_used_at")
    )
    for cluster_id, name, last_used_at in rows:
        tokens[cluster_id].append(
            ControllerSeen(
                name=name,
                last_seen=last_used_at,
                seen_ago=ago(last_used_at, now) if last_used_at else "",
                recent=last_used_at is not None and last_used_at >= now - CONTROLLER_SEEN_WITHIN,
            )
        )
    return {
        c.pk: ClusterControllers(c.name, sorted(tokens[c.pk], key=_most_recent_first))
        for c in clusters
    }


def controller_wait_warning(cluster: Cluster, now: datetime) -> str:
    """Why an approval on ``cluster`` will wait, or "" when a controller is calling in."""
    return controllers_of([cluster], now)[cluster.pk].wait_warning


def ago(then: datetime, now: datetime) -> str:
    """ "12 s ago", "5 minutes ago": Django's timesince alone says "0 minutes" under a minute."""
    seconds = int((now - then).total_seconds())
    if seconds < 60:
        return f"{max(seconds, 0)} s ago"
    return f"{timesince(then, now, depth=1)} ago"


def _most_recent_first(controller: ControllerSeen) -> tuple[bool, float, str]:
    seen = controller.last_seen.timestamp() if controller.last_seen else 0.0
    return (controller.last_seen is None, -seen, controller.name)
