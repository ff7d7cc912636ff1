"""An open page keeps up by itself when its live channel is cut: it reconnects and catches up.

The channel is cut two ways: the ASGI server process dies and comes back (a crash, a deploy, a
cut network), and the Redis behind the channel layer stops and starts again. An event recorded
while the page was away must show once it is back, without anyone reloading the page.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from django.contrib.auth.models import User
from playwright.sync_api import Page, expect

from recovery.audit.record import record_event
from recovery.choices import AuditKind
from recovery.models import AuditEvent, Workload
from tests.browser.conftest import Browsing, off_loop, wait_until_live
from tests.browser.stack import BrowserStack
from tests.browser.test_fleet_and_live import mark_page, page_was_not_reloaded
from tests.factories import AttemptFactory, ClusterFactory, WorkloadFactory

pytestmark = pytest.mark.django_db(transaction=True)

# console.js backs off from 1 s, doubling: a few tries fit in this.
RECONNECT_SECONDS = 20
RECORD_STATES = """() => {
    const status = document.getElementById('live-status');
    window.__liveStates = [status.getAttribute('data-state')];
    new MutationObserver(() => window.__liveStates.push(status.getAttribute('data-state')))
        .observe(status, {attributes: true, attributeFilter: ['data-state']});
}"""
# What a browser says while the server it talks to is gone; expected here, nothing else is.
OUTAGE_NOISE = ("WebSocket connection to", "ERR_CONNECTION_REFUSED", "ERR_CONNECTION_RESET")


@pytest.fixture
def restores_the_stack(stack: BrowserStack) -> Iterator[BrowserStack]:
    """Whatever a test stopped is running again afterwards, for the tests that follow."""
    yield stack
    if not stack.processes["redis"].running:
        stack.start_redis()
    if not stack.processes["web"].running:
        stack.start_web()
    stack.wait_worker_ready(timeout=60)


def checkpoint_event(workload: Workload, step: int) -> AuditEvent:
    return record_event(
        cluster=workload.cluster,
        workload=workload,
        attempt=1,
        kind=AuditKind.CHECKPOINT_SAVED,
        actor="poller",
        payload={"step": step, "path": f"/ckpt/llama/step_{step:08d}.pt"},
    )


def open_live_workload_page(browsing: Browsing, viewer: User) -> tuple[Page, Workload]:
    workload = WorkloadFactory(cluster=ClusterFactory(name="train-a100"), name="llama-pretrain")
    AttemptFactory(workload=workload)
    page = browsing.page(viewer)
    page.goto(f"/workloads/{workload.pk}/")
    wait_until_live(page)
    page.evaluate(RECORD_STATES)
    mark_page(page)
    return page, workload


def assert_caught_up(page: Page, event: AuditEvent, browsing: Browsing) -> None:
    wait_until_live(page, timeout=RECONNECT_SECONDS * 1000)
    row = page.locator(f"#audit-trail #event-{event.pk}")
    expect(row).to_be_visible(timeout=10_000)
    expect(row).to_contain_text("Checkpoint saved")
    assert page_was_not_reloaded(page)
    states = page.evaluate("() => window.__liveStates")
    assert "reconnecting" in states, f"the page never showed it was cut off: {states}"
    assert states[-1] == "live", states
    unexpected = [
        problem
        for problem in browsing.problems_on(page)
        if not any(noise in problem for noise in OUTAGE_NOISE)
    ]
    assert unexpected == []


def test_the_page_reconnects_and_catches_up_after_the_server_restarts(
    browsing: Browsing, viewer: User, restores_the_stack: BrowserStack
) -> None:
    """
    GIVEN a workload page open and live
    WHEN the ASGI server process dies, an event is recorded meanwhile, and the server comes back
    THEN the page shows it is reconnecting, reconnects by itself and shows the missed event,
        without reloading
    """
    stack = restores_the_stack
    page, workload = open_live_workload_page(browsing, viewer)

    stack.kill_web()
    expect(page.locator("#live-status")).to_have_attribute("data-state", "reconnecting")
    missed = off_loop(checkpoint_event, workload, 4200)
    stack.start_web()

    assert_caught_up(page, missed, browsing)


def test_the_page_reconnects_and_catches_up_after_redis_restarts(
    browsing: Browsing, viewer: User, restores_the_stack: BrowserStack
) -> None:
    """
    GIVEN a workload page open and live
    WHEN the Redis behind the channel layer stops, an event is recorded meanwhile (its live
        announcement is lost), and Redis starts again
    THEN the page reconnects by itself and shows the missed event, without reloading
    """
    stack = restores_the_stack
    page, workload = open_live_workload_page(browsing, viewer)

    stack.stop_redis()
    missed = off_loop(checkpoint_event, workload, 4300)
    page.wait_for_timeout(1_500)  # a moment without Redis, as in a real outage
    stack.start_redis()

    assert_caught_up(page, missed, browsing)


# Longer than channels_redis's 5 s blocking read, and than redis-py 8's default 5 s socket
# timeout, which, when the channel layer keeps it, drops every idle socket after 5 s.
IDLE_SECONDS = 8


def test_an_idle_page_stays_live(
    browsing: Browsing, viewer: User, restores_the_stack: BrowserStack
) -> None:
    """
    GIVEN a workload page open and live, and nothing happening
    WHEN it is left alone for longer than the channel layer's blocking reads
    THEN its socket stays open: it never shows reconnecting, and the server logs no error,
    AND an event recorded after that still arrives live
    """
    stack = restores_the_stack
    sizes = stack.log_sizes()
    page, workload = open_live_workload_page(browsing, viewer)

    page.wait_for_timeout(IDLE_SECONDS * 1000)

    states = page.evaluate("() => window.__liveStates")
    server_errors = [
        line
        for line in stack.tail_since(sizes).splitlines()
        if "Exception inside application" in line
    ]
    event = off_loop(checkpoint_event, workload, 4400)
    expect(page.locator(f"#audit-trail #event-{event.pk}")).to_be_visible(timeout=5_000)
    assert states == ["live"], f"the live channel dropped while idle: {states}"
    assert server_errors == []
    assert page_was_not_reloaded(page)
