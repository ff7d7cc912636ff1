"""`manage.py demo` serves the Console with web, worker and beat, and stops them all on Ctrl-C."""

from __future__ import annotations

import contextlib
import http.cookiejar
import os
import re
import signal
import socket
import sqlite3
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
from django.conf import settings

from tests.demo_run import processes_with_marker, wait_for_http
from workload_recovery.stack import free_port

BASE_DIR = Path(settings.BASE_DIR)
DEMO_PASSWORD = "demo password for tests"


def live_recommendations(database: Path) -> set[tuple[str, str]]:
    """(cluster, status) pairs of the recommendations on the demo's live clusters."""
    with contextlib.closing(sqlite3.connect(database, timeout=10)) as connection:
        rows = connection.execute(
            "SELECT DISTINCT c.name, r.status FROM recovery_recommendation r "
            "JOIN recovery_workload w ON r.workload_id = w.id "
            "JOIN recovery_cluster c ON w.cluster_id = c.id WHERE c.name LIKE 'live-%'"
        ).fetchall()
    return {(name, status) for name, status in rows}


def test_the_demo_serves_the_seeded_fleet_and_stops_everything(tmp_path: Path) -> None:
    """
    GIVEN no Redis at REDIS_URL and an empty SQLite database
    WHEN `manage.py demo` runs
    THEN it starts a private Redis, seeds, serves the login page and the seeded fleet,
    AND on SIGINT every process it started is gone
    """
    port = free_port()
    redis_port = free_port()
    marker = str(tmp_path / "var")
    env = {
        **os.environ,
        "WR_VAR_DIR": marker,
        "DATABASE_URL": f"sqlite:///{tmp_path / 'demo.sqlite3'}",
        "REDIS_URL": f"redis://127.0.0.1:{redis_port}/0",
        "DEMO_PASSWORD": DEMO_PASSWORD,
        "PORT": str(port),
    }
    env.pop("DEBUG", None)
    demo = subprocess.Popen(
        [sys.executable, "manage.py", "demo"],
        cwd=BASE_DIR,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        wait_for_http(f"{base}/accounts/login/", demo, seconds=120)
        # demo, web, worker, beat, two simulations and their two controllers
        assert len(processes_with_marker(marker)) >= 8

        jar = http.cookiejar.CookieJar()
        opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar))
        login_page = opener.open(f"{base}/accounts/login/").read().decode()
        token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', login_page)
        assert token, "the login page has no CSRF token"
        form = urllib.parse.urlencode(
            {
                "csrfmiddlewaretoken": token.group(1),
                "username": "operator",
                "password": DEMO_PASSWORD,
            }
        ).encode()
        fleet = opener.open(f"{base}/accounts/login/", data=form)
        assert fleet.geturl() == f"{base}/"
        body = fleet.read().decode()
        assert "demo-a100" in body
        assert body.count('href="/workloads/') >= 10

        css = opener.open(f"{base}/static/console/console.css")
        assert css.status == 200
        health = opener.open(f"{base}/api/v1/health/").read().decode()
        assert '"healthy":true' in health

        # The live clusters: failures detected, recommended; restarted by itself in action
        # mode, waiting for an operator in monitor mode.
        wanted = {("live-action", "executed"), ("live-monitor", "awaiting_approval")}
        deadline = time.monotonic() + 150
        seen = live_recommendations(tmp_path / "demo.sqlite3")
        while not wanted <= seen and time.monotonic() < deadline:
            time.sleep(2)
            seen = live_recommendations(tmp_path / "demo.sqlite3")
        assert wanted <= seen, seen
    finally:
        demo.send_signal(signal.SIGINT)
        try:
            output, _ = demo.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(demo.pid, signal.SIGKILL)
            output, _ = demo.communicate()
            pytest.fail("demo did not stop within 60 s of SIGINT")
    text = output.decode(errors="replace")
    # One banner with the address it really serves, the user names and the password.
    assert f"Workload Recovery demo: open {base}/accounts/login/" in text
    assert "127.0.0.1:8000" not in text
    assert "User names: operator, viewer, admin (one password for all three)" in text
    assert f"Password:   {DEMO_PASSWORD}   (from DEMO_PASSWORD)" in text
    assert "approve a recommendation on live-monitor" in text
    deadline = time.monotonic() + 10
    while processes_with_marker(marker) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert processes_with_marker(marker) == [], "processes left running after the demo stopped"
    # redis-server rewrites its environment for its process title: check its port instead.
    private_redis = re.search(r"Started a private Redis at redis://127\.0\.0\.1:(\d+)/", text)
    assert private_redis, text[-3000:]
    assert int(private_redis.group(1)) != redis_port
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", int(private_redis.group(1))), timeout=2).close()
