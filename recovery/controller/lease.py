"""The lease of the recommendation a controller is carrying out, kept for as long as it acts.

A lease is short so that a controller killed or frozen in the middle of an action costs the
cluster seconds, not minutes: a standby controller of the same cluster claims the
recommendation once it lapses and finishes the action from the scheduler's state. A short lease
must then be renewed even while the controller waits on something slow (a scheduler command
that takes its full timeout, an SSH connection, a read retried with backoff), so it is renewed
from two places: at each step of the action (``check``, which the controller calls before every
read and every dispatch), and from a thread of its own in between. A renewal refused means
another controller may own the recommendation: the next ``check`` raises ``LeaseLost`` and the
controller does nothing more for it. The thread cannot interrupt a command already running;
the dispatch before each command stays the control plane's last word on whether it may run.

A paused process (SIGSTOP, a frozen VM) renews nothing, its thread included, so its lease
lapses like a killed one's. A process alive but stuck, whose action has not reached a step for
longer than any step may take, is given up on too: the thread stops renewing and the lease
lapses, rather than holding the recommendation until its deadline.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Protocol

from recovery.controller.client import AdvisorAPIError

logger = logging.getLogger(__name__)

# How often the thread looks at the lease, as a share of it: a renewal that failed (the control
# plane restarting, a timeout) is tried again this soon, several times before the lease runs out.
TICKS_PER_LEASE = 10
# A renewal is due once this share of the lease has gone by.
RENEW_AFTER = 1 / 3
# A renewal not made by then gives up: the rest of the lease is the margin for the steps in
# flight to notice before another controller may claim.
GIVE_UP_AFTER = 0.8


class LeaseLost(Exception):
    """Another controller may own the recommendation now: stop acting on it at once."""


class Renews(Protocol):
    def renew(self, recommendation_id: int, lease_seconds: int) -> None: ...


class Lease:
    def __init__(
        self,
        api: Renews,
        recommendation_id: int,
        seconds: int,
        *,
        clock: Callable[[], float],
        longest_step_seconds: float,
    ) -> None:
        self.api = api
        self.recommendation_id = recommendation_id
        self.seconds = seconds
        self.clock = clock
        self.longest_step_seconds = longest_step_seconds
        self._renewed_at = clock()  # claimed just now
        self._checked_at = self._renewed_at
        self._lost: str | None = None
        # One renewal at a time. Held only around a renewal, so that a renewal the control
        # plane is slow to answer never holds the action back: the action goes on, and gives
        # up by itself once the last renewal it knows of is too old.
        self._renewing = threading.Lock()
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Renew from a thread of its own too, until ``stop``."""
        self._thread = threading.Thread(
            target=self._keep,
            name=f"lease of recommendation {self.recommendation_id}",
            daemon=True,
        )
        self._thread.start()

    def stop(self) -> None:
        self._stopped.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def check(self) -> None:
        """At each step of the action: raise ``LeaseLost`` once the lease is lost or about to
        run out unrenewed; renew it when due."""
        self._checked_at = self.clock()
        self._renew_if_due()
        if self._lost is None and self.clock() - self._renewed_at > self.seconds * GIVE_UP_AFTER:
            self._lost = (
                f"the lease of recommendation {self.recommendation_id} was not renewed in time "
                "(the control plane is slow to answer)"
            )
        if self._lost is not None:
            raise LeaseLost(self._lost)

    def _keep(self) -> None:
        while not self._stopped.wait(self.seconds / TICKS_PER_LEASE):
            if self._lost is not None:
                return
            silent = self.clock() - self._checked_at
            if silent > self.longest_step_seconds:
                self._lost = (
                    f"the action on recommendation {self.recommendation_id} has not moved for "
                    f"{silent:.0f} s: its lease is let lapse for another controller"
                )
                logger.warning("%s", self._lost)
                return
            try:
                self._renew_if_due()
            except LeaseLost:
                return  # the action's next step is told

    def _renew_if_due(self) -> None:
        """Renew when a third of the lease has gone by, unless the other thread is at it.
        Raises ``LeaseLost`` (and keeps why) when the renewal is refused, or fails too close
        to the end of the lease."""
        if not self._renewing.acquire(blocking=False):
            return
        try:
            started = self.clock()
            if self._lost is not None or started - self._renewed_at < self.seconds * RENEW_AFTER:
                return
            try:
                self.api.renew(self.recommendation_id, self.seconds)
            except AdvisorAPIError as exc:
                if exc.status in {404, 409}:
                    self._lost = (
                        f"the lease of recommendation {self.recommendation_id} is lost: {exc}"
                    )
                elif self.clock() - self._renewed_at > self.seconds * GIVE_UP_AFTER:
                    self._lost = (
                        f"could not renew the lease of recommendation {self.recommendation_id} "
                        f"before it ran out: {exc}"
                    )
                else:
                    logger.warning("lease renewal failed, trying again: %s", exc)
                    return
                raise LeaseLost(self._lost) from None
            # The control plane counts the new lease from when it answered, never earlier.
            self._renewed_at = started
        finally:
            self._renewing.release()
