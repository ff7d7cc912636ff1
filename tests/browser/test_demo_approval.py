"""From `make demo`: an operator approves a recommendation on live-monitor and sees the job
restarted by the demo's own controller, and the demo leaves nothing in Redis when it stops."""

from __future__ import annotations

import contextlib
import re
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from playwright.sync_api import Browser, Page, expect

from tests.demo_run import DemoRun, processes_with_marker, wait_for_http
from workload_recovery.stack import DEMO_DATABASE_MARKER, free_port

# The package's fixtures serve the Console stack from the test database; the demo has its own.
pytestmark = pytest.mark.django_db(transaction=True)

DEMO_PASSWORD = "demo password for the browser"
SHARED_REDIS = "redis://127.0.0.1:6379/0"


def query(database: Path, sql: str, *params: object) -> list[tuple[object, ...]]:
    with contextlib.closing(sqlite3.connect(database, timeout=10)) as connection:
        return connection.execute(sql, params).fetchall()


@pytest.fixture
def demo(tmp_path: Path) -> Iterator[tuple[DemoRun, str, Path]]:
    port = free_port()
    run = DemoRun(
        {
            "WR_VAR_DIR": str(tmp_path / "var"),
            "DATABASE_URL": f"sqlite:///{tmp_path / 'demo.sqlite3'}",
            # A Redis that answers and is shared: the demo must take a database of its own.
            "REDIS_URL": SHARED_REDIS,
            "DEMO_PASSWORD": DEMO_PASSWORD,
            "PORT": str(port),
        }
    )
    try:
        yield run, f"http://127.0.0.1:{port}", tmp_path / "demo.sqlite3"
    finally:
        run.stop()


def awaiting_on_live_monitor(page: Page, database: Path, seconds: float) -> int:
    """The id of a card on the Approvals page for live-monitor, once one is there."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        page.goto("/approvals/?cluster=live-monitor")
        card = page.locator("[id^=recommendation-]").first
        if card.count():
            return int((card.get_attribute("id") or "").rsplit("-", 1)[1])
        time.sleep(3)
    raise AssertionError(f"nothing awaited approval on live-monitor within {seconds} s")


def test_an_approval_on_the_monitor_cluster_is_carried_out_and_the_demo_cleans_up(
    browser: Browser, demo: tuple[DemoRun, str, Path], tmp_path: Path
) -> None:
    run, base, database = demo
    run.wait_for_output(f"Workload Recovery demo: open {base}/accounts/login/", seconds=180)
    wait_for_http(f"{base}/accounts/login/", run.process, seconds=30)
    claimed = re.search(r"Using Redis database (redis://127\.0\.0\.1:6379/(\d+))", run.output)
    assert claimed, run.output[-3000:]
    assert claimed.group(2) != "0"

    context = browser.new_context(base_url=base)
    try:
        page = context.new_page()
        page.goto("/accounts/login/")
        page.get_by_label("Username").fill("operator")
        page.get_by_label("Password").fill(DEMO_PASSWORD)
        page.get_by_role("button", name="Sign in").click()
        page.wait_for_url(f"{base}/")

        recommendation = awaiting_on_live_monitor(page, database, seconds=150)
        ((workload, attempt_before),) = query(
            database,
            "SELECT w.id, w.current_attempt FROM recovery_recommendation r "
            "JOIN recovery_workload w ON r.workload_id = w.id WHERE r.id = ?",
            recommendation,
        )
        # The demo's monitor cluster has a controller: no "this will wait" before approving.
        card = page.locator(f"#recommendation-{recommendation}")
        expect(page.get_by_text("this will wait")).to_have_count(0)
        card.locator('form[action$="/approve/"] button[type=submit]').first.click()
        expect(page.get_by_text(f"Recommendation {recommendation}:")).to_be_visible()
        approved = time.monotonic()

        deadline = approved + 60
        status: object = ""
        while time.monotonic() < deadline:
            ((status, attempt),) = query(
                database,
                "SELECT r.status, w.current_attempt FROM recovery_recommendation r "
                "JOIN recovery_workload w ON r.workload_id = w.id WHERE r.id = ?",
                recommendation,
            )
            if status == "executed" and int(attempt) > int(attempt_before):  # type: ignore[call-overload]
                break
            time.sleep(1)
        assert status == "executed", f"still {status} a minute after the approval"
        assert int(attempt) > int(attempt_before)  # type: ignore[call-overload]
        trail = query(
            database,
            "SELECT kind, actor FROM recovery_auditevent "
            "WHERE json_extract(payload, '$.recommendation') = ? ORDER BY id",
            recommendation,
        )
        kinds = [kind for kind, _ in trail]
        assert kinds[:1] == ["approved"] or "approved" in kinds
        for step in ("claimed", "dispatched", "scheduler_action"):
            assert step in kinds, trail
        claimer = next(actor for kind, actor in trail if kind == "claimed")
        assert str(claimer).startswith("controller:demo-controller-")

        page.goto(f"/workloads/{workload}/")
        expect(page.locator(f"#recommendation-{recommendation}")).to_contain_text("Executed")
    finally:
        context.close()

    marker = str(tmp_path / "var")
    text = run.stop()
    assert processes_with_marker(marker) == [], "processes left running after the demo stopped"
    assert f"Emptied the demo's Redis database {claimed.group(1)}" in text
    database_number = int(claimed.group(2))
    left = redis.Redis.from_url(f"redis://127.0.0.1:6379/{database_number}")
    try:
        assert left.dbsize() == 0
        assert left.get(DEMO_DATABASE_MARKER) is None
    finally:
        left.close()
