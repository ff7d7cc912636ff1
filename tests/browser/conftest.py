"""Fixtures for the Console's real-browser tests.

One Console stack (tests/browser/stack.py) and one headless Debian Chromium serve every test of
this package. Tests commit their data (``django_db(transaction=True)``) to the pytest-django test
database, which the stack's processes use too.

Playwright's sync API keeps an asyncio loop running in the test thread, where Django refuses ORM
calls (SynchronousOnlyOperation) and asgiref refuses ``async_to_sync``. So, while this package
runs, DJANGO_ALLOW_ASYNC_UNSAFE lifts the first guard in this process only (the stack's servers
keep it), and ``off_loop`` runs code that announces live events in a plain thread, where
publishing to the channel layer works as in production.
"""

from __future__ import annotations

import atexit
import os
import shutil
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import quote

import pytest
from django.conf import settings
from django.contrib.auth.models import User
from django.db import connection, connections
from playwright.sync_api import (
    Browser,
    BrowserContext,
    ConsoleMessage,
    Page,
    Playwright,
    Request,
    Response,
    ViewportSize,
    expect,
    sync_playwright,
)
from pytest_django.fixtures import Settings as SettingsWrapper

from tests.browser.stack import CHANNEL_PREFIX, BrowserStack, StackFailed
from tests.conftest import TEST_PASSWORD

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-quic",
]
VIEWPORT: ViewportSize = {"width": 1280, "height": 800}
HERE = Path(__file__).resolve().parent
BASE_DIR = Path(settings.BASE_DIR)
# Each run has its own folder (static files, logs): runs beside each other must not share them.
RUNS_DIR = BASE_DIR / "var" / "browser"
SCREENSHOT_DIR = BASE_DIR / "var" / "screenshots"

T = TypeVar("T")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if HERE in Path(str(item.path)).resolve().parents:
            item.add_marker(pytest.mark.browser)


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    report = yield
    setattr(item, f"report_{report.when}", report)
    return report


# ---------- the package-wide pieces: async guard, stack, browser ----------


@pytest.fixture(scope="package")
def _orm_beside_playwright() -> Iterator[None]:
    previous = os.environ.get("DJANGO_ALLOW_ASYNC_UNSAFE")
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    yield
    if previous is None:
        os.environ.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
    else:
        os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = previous


def database_url_for_stack() -> str:
    db = connection.settings_dict
    if connection.vendor != "mysql":
        pytest.fail(
            "The browser tests share the test database with server processes: run them on "
            "MariaDB (DATABASE_URL=mysql://...), as `make test` does."
        )
    password = f":{quote(db['PASSWORD'], safe='')}" if db["PASSWORD"] else ""
    host = f"{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 3306}"
    return f"mysql://{quote(db['USER'], safe='')}{password}@{host}/{db['NAME']}"


def remove_finished_runs() -> None:
    """Folders of earlier runs whose pytest is gone; a run's logs stay until the next run."""
    for folder in RUNS_DIR.glob("run-*"):
        pid = folder.name.removeprefix("run-")
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="package")
def stack(_orm_beside_playwright: None, django_db_setup: None) -> Iterator[BrowserStack]:
    """uvicorn, a Celery worker and a private Redis, on the test database; stopped at the end."""
    remove_finished_runs()
    running = BrowserStack(
        base_dir=BASE_DIR,
        database_url=database_url_for_stack(),
        work_dir=RUNS_DIR / f"run-{os.getpid()}",
    )
    try:
        running.start()
    except StackFailed as exc:
        running.stop()
        pytest.fail(f"the Console stack did not start: {exc}", pytrace=False)
    except BaseException:
        running.stop()
        raise
    # Also when pytest is interrupted before the fixture's own teardown.
    atexit.register(running.stop)
    yield running
    running.stop()
    atexit.unregister(running.stop)


@pytest.fixture(scope="package")
def playwright(_orm_beside_playwright: None) -> Iterator[Playwright]:
    if not CHROMIUM.exists() or shutil.which(str(CHROMIUM)) is None:
        pytest.fail(f"{CHROMIUM} is missing (Debian: apt-get install chromium)", pytrace=False)
    driver = sync_playwright().start()
    yield driver
    driver.stop()


@pytest.fixture(scope="package")
def browser(playwright: Playwright, stack: BrowserStack) -> Iterator[Browser]:
    # Debian's Chromium, never a downloaded one.
    launched = playwright.chromium.launch(
        executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS
    )
    yield launched
    launched.close()


# ---------- per test ----------


@pytest.fixture(autouse=True)
def _stack_logs_on_failure(
    request: pytest.FixtureRequest, stack: BrowserStack, settings: SettingsWrapper
) -> Iterator[None]:
    """Point this process's channel layer at the stack; print the stack's logs when a test fails."""
    layer = dict(settings.CHANNEL_LAYERS["default"])
    hosts = [
        {**host, "address": stack.redis_url} if isinstance(host, dict) else stack.redis_url
        for host in layer["CONFIG"].get("hosts") or [stack.redis_url]
    ]
    layer["CONFIG"] = {**layer["CONFIG"], "hosts": hosts, "prefix": CHANNEL_PREFIX}
    settings.CHANNEL_LAYERS = {"default": layer}
    sizes = stack.log_sizes()
    yield
    failed = any(
        getattr(getattr(request.node, f"report_{when}", None), "failed", False)
        for when in ("setup", "call")
    )
    if failed:
        print(stack.tail_since(sizes))


# Chromium asks for /favicon.ico by itself when a page names no icon. Whether every page names
# one is checked once, in test_every_page.py; elsewhere that request is not the page's doing.
BROWSER_OWN_REQUESTS = ("/favicon.ico",)


@dataclass
class PageProblems:
    """What went wrong on a page as a person would not see it: console errors, failed requests."""

    origin: str
    found: list[str] = field(default_factory=list)
    ignored: tuple[str, ...] = BROWSER_OWN_REQUESTS

    def _ignores(self, url: str | None) -> bool:
        return bool(url) and any(url == self.origin + path for path in self.ignored)

    def watch(self, page: Page) -> None:
        page.on("console", self._console)
        page.on("pageerror", lambda error: self.found.append(f"page error: {error}"))
        page.on("response", self._response)
        page.on("requestfailed", self._request_failed)

    def _console(self, message: ConsoleMessage) -> None:
        if message.type == "error" and not self._ignores(message.location.get("url")):
            self.found.append(f"console error: {message.text} ({message.location.get('url')})")

    def _response(self, response: Response) -> None:
        if self._ignores(response.url):
            return
        if response.url.startswith(self.origin) and response.status >= 400:
            self.found.append(f"HTTP {response.status} for {response.url}")

    def _request_failed(self, request: Request) -> None:
        if not request.url.startswith(self.origin):
            return
        failure = request.failure or ""
        if "ERR_ABORTED" in failure:
            # Cancelled by the browser, not failed: a navigation replaced by the next one (a
            # double submit), or a live refresh still in flight when the page navigated away.
            return
        self.found.append(f"request failed: {request.method} {request.url}: {failure}")

    def take(self) -> list[str]:
        found, self.found = self.found, []
        return found


@dataclass
class Browsing:
    """Opens browser contexts on the stack, logged in or not, and closes them after the test."""

    browser: Browser
    stack: BrowserStack
    contexts: list[BrowserContext] = field(default_factory=list)
    problems: dict[int, PageProblems] = field(default_factory=dict)

    def context(self, color_scheme: str = "light") -> BrowserContext:
        context = self.browser.new_context(
            base_url=self.stack.base_url,
            viewport=VIEWPORT,
            color_scheme=color_scheme,  # type: ignore[arg-type]
            locale="en-GB",
            timezone_id="UTC",
        )
        context.set_default_timeout(10_000)
        self.contexts.append(context)
        return context

    def page(self, user: User | None = None, color_scheme: str = "light") -> Page:
        page = self.context(color_scheme).new_page()
        self.problems[id(page)] = PageProblems(self.stack.base_url)
        self.problems[id(page)].watch(page)
        if user is not None:
            log_in(page, user)
        return page

    def problems_on(self, page: Page) -> list[str]:
        return self.problems[id(page)].take()

    def close(self) -> None:
        for context in self.contexts:
            context.close()
        self.contexts.clear()


@pytest.fixture
def browsing(browser: Browser, stack: BrowserStack) -> Iterator[Browsing]:
    opened = Browsing(browser, stack)
    yield opened
    # Closed before pytest-django empties the tables, so no page is still asking for them.
    opened.close()


def log_in(page: Page, user: User, password: str = TEST_PASSWORD) -> None:
    """Sign in through the real login form, as a person does."""
    page.goto("/accounts/login/")
    page.get_by_label("Username").fill(user.get_username())
    page.get_by_label("Password").fill(password)
    page.get_by_role("button", name="Sign in").click()
    page.wait_for_url(lambda url: not url.split("?")[0].endswith("/accounts/login/"))


def wait_until_live(page: Page, timeout: float = 10_000) -> None:
    expect(page.locator("#live-status")).to_have_attribute("data-state", "live", timeout=timeout)


def off_loop(function: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Run ``function`` in a plain thread (no event loop), as a web or worker process would.

    Audit events recorded there are announced to the live channel like in production; in the
    test thread Playwright's running loop makes asgiref refuse to publish.
    """

    def run() -> T:
        try:
            return function(*args, **kwargs)
        finally:
            connections.close_all()

    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(run).result(timeout=120)
