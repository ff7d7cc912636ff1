"""The lease kept from a thread of its own while the action waits, and given up when it must be."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

import pytest

from recovery.controller.client import AdvisorAPIError
from recovery.controller.lease import Lease, LeaseLost


@dataclass
class Renewals:
    """The Advisor API's renew, answering as ``answer`` says."""

    answer: AdvisorAPIError | None = None
    at: list[float] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def renew(self, recommendation_id: int, lease_seconds: int) -> None:
        with self.lock:
            self.at.append(time.monotonic())
        if self.answer is not None:
            raise self.answer


def kept(api: Renewals, *, seconds: int = 1, longest_step_seconds: float = 60.0) -> Lease:
    lease = Lease(api, 7, seconds, clock=time.monotonic, longest_step_seconds=longest_step_seconds)
    lease.start()
    return lease


def test_the_thread_renews_while_the_action_waits_on_one_step() -> None:
    api = Renewals()
    lease = kept(api)
    try:
        time.sleep(2.5)  # a command that blocks for two and a half leases
        lease.check()
    finally:
        lease.stop()
    assert len(api.at) >= 5  # every third of the lease
    assert all(b - a < 0.8 for a, b in zip(api.at, api.at[1:], strict=False))


def test_a_refused_renewal_stops_the_action_at_its_next_step() -> None:
    api = Renewals(AdvisorAPIError("409 held by controller:other", 409))
    lease = kept(api)
    try:
        time.sleep(0.6)
        with pytest.raises(LeaseLost, match="held by controller:other"):
            lease.check()
    finally:
        lease.stop()
    assert len(api.at) == 1  # not asked again once refused


def test_an_unanswered_renewal_is_tried_again_then_given_up_before_the_lease_ends() -> None:
    api = Renewals(AdvisorAPIError("control plane unreachable"))
    lease = kept(api, seconds=2)
    try:
        time.sleep(1.0)
        lease.check()  # still within the lease: carried on
        time.sleep(0.9)  # past four fifths of it
        with pytest.raises(LeaseLost, match="before it ran out"):
            lease.check()
    finally:
        lease.stop()
    assert len(api.at) >= 3


def test_a_stuck_action_lets_its_lease_lapse() -> None:
    """A main thread that reaches no step for longer than any step takes is not kept alive."""
    api = Renewals()
    lease = kept(api, longest_step_seconds=1.0)
    try:
        time.sleep(2.0)
        renewed = len(api.at)
        time.sleep(1.0)
        assert len(api.at) == renewed  # nothing renewed since the action went silent
        with pytest.raises(LeaseLost, match="has not moved"):
            lease.check()
    finally:
        lease.stop()
