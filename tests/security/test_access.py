"""Access hardening: failed sign-ins are throttled, the configurator connects only to allowed
hosts, connection settings are for superusers, and changes of a cluster's mode and acknowledgement
land in the audit trail. (Production refusing an open /metrics is in tests/test_settings.py.)"""

from __future__ import annotations

import json
import logging
import socket
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.contrib.auth.signals import user_logged_in, user_login_failed
from django.test import Client
from django.urls import reverse
from pytest_django.fixtures import Settings as SettingsWrapper

from recovery.audit.payloads import payload_problems
from recovery.choices import AuditKind, ClusterMode, Connection
from recovery.clusters import configurator
from recovery.clusters.configurator import inspect_logs, inspect_metrics
from recovery.models import AuditEvent, Cluster
from tests.conftest import TEST_PASSWORD
from tests.factories import ClusterFactory
from tests.sources.recorded_servers import LokiEntry, loki, serving

pytestmark = pytest.mark.django_db

WRONG_PASSWORD = "not the password"


def logged_in(user: User) -> Client:
    client = Client()
    assert client.login(username=user.username, password=TEST_PASSWORD)
    return client


# -- failed sign-ins ----------------------------------------------------------------------------


@pytest.fixture
def login_limits(settings: SettingsWrapper) -> SettingsWrapper:
    # The counters are in the real Redis (tests/conftest.py gives each test its own prefix).
    assert settings.CACHES["throttle"]["BACKEND"].endswith("RedisCache")
    settings.LOGIN_FAILURES = 3
    settings.LOGIN_ADDRESS_FAILURES = 5
    settings.LOGIN_WINDOW_SECONDS = 600
    return settings


@dataclass
class SignInSignals:
    """Every password check, seen through the signals Django sends after checking one."""

    failed: list[str] = field(default_factory=list)
    succeeded: list[str] = field(default_factory=list)

    @property
    def checks(self) -> int:
        return len(self.failed) + len(self.succeeded)


@pytest.fixture
def sign_in_signals() -> Iterator[SignInSignals]:
    seen = SignInSignals()

    def failed(sender: object, credentials: dict[str, Any], **_: Any) -> None:
        seen.failed.append(str(credentials.get("username")))

    def succeeded(sender: object, user: User, **_: Any) -> None:
        seen.succeeded.append(user.username)

    user_login_failed.connect(failed)
    user_logged_in.connect(succeeded)
    yield seen
    user_login_failed.disconnect(failed)
    user_logged_in.disconnect(succeeded)


def sign_in(
    username: str, password: str, *, address: str = "192.0.2.10", path: str = ""
) -> tuple[Client, Any]:
    client = Client(REMOTE_ADDR=address)
    response = client.post(path or reverse("login"), {"username": username, "password": password})
    return client, response


def is_signed_in(client: Client) -> bool:
    return "_auth_user_id" in client.session


def assert_throttled(response: Any) -> None:
    assert response.status_code == 429
    body = response.content.decode()
    assert "Too many failed sign-ins" in body
    assert "Try again after" in body
    assert "UTC" in body
    retry_after = int(response["Retry-After"])
    assert 0 < retry_after <= 600


def test_an_account_is_locked_after_its_failures_and_the_password_is_not_checked(
    operator: User, login_limits: SettingsWrapper, sign_in_signals: SignInSignals
) -> None:
    """
    GIVEN three wrong passwords for one account, from three addresses
    WHEN the right password is sent for it, from a fourth address
    THEN the answer is 429 saying when to retry, nobody is signed in and no password is checked
    """
    for address in ("192.0.2.1", "192.0.2.2", "192.0.2.3"):
        _, response = sign_in(operator.username, WRONG_PASSWORD, address=address)
        assert response.status_code == 200
        assert "enter a correct username and password" in response.content.decode()
    assert sign_in_signals.failed == [operator.username] * 3

    client, response = sign_in(operator.username, TEST_PASSWORD, address="192.0.2.4")
    assert_throttled(response)
    assert not is_signed_in(client)
    # Another spelling of the same account name is the same account.
    _, response = sign_in(f"  {operator.username.upper()} ", TEST_PASSWORD, address="192.0.2.5")
    assert_throttled(response)
    assert sign_in_signals.checks == 3


def test_an_address_is_locked_after_its_failures_across_accounts(
    make_user: Callable[..., User],
    login_limits: SettingsWrapper,
    sign_in_signals: SignInSignals,
) -> None:
    """
    GIVEN five wrong passwords from one address, each for a different account name
    WHEN that address signs in to a sixth account with its right password
    THEN it is refused with 429, while another address signs in to that account
    """
    target = make_user("tess")
    for number in range(5):
        _, response = sign_in(f"guess-{number}", WRONG_PASSWORD, address="198.51.100.7")
        assert response.status_code == 200

    client, response = sign_in(target.username, TEST_PASSWORD, address="198.51.100.7")
    assert_throttled(response)
    assert not is_signed_in(client)
    assert sign_in_signals.checks == 5

    client, response = sign_in(target.username, TEST_PASSWORD, address="198.51.100.8")
    assert response.status_code == 302
    assert is_signed_in(client)


def test_a_success_does_not_reset_another_addresses_count(
    operator: User, login_limits: SettingsWrapper
) -> None:
    """
    GIVEN an address with four failures (one short of its limit of five)
    WHEN the account it guessed at signs in from another address
    THEN the guessing address is still stopped at its fifth failure
    """
    login_limits.LOGIN_FAILURES = 100
    for _ in range(4):
        assert (
            sign_in(operator.username, WRONG_PASSWORD, address="203.0.113.9")[1].status_code == 200
        )

    client, response = sign_in(operator.username, TEST_PASSWORD, address="203.0.113.10")
    assert response.status_code == 302 and is_signed_in(client)

    assert sign_in(operator.username, WRONG_PASSWORD, address="203.0.113.9")[1].status_code == 200
    assert_throttled(sign_in(operator.username, TEST_PASSWORD, address="203.0.113.9")[1])


def test_the_admin_sign_in_is_throttled_with_the_consoles(
    site_admin: User, login_limits: SettingsWrapper, sign_in_signals: SignInSignals
) -> None:
    admin_login = reverse("admin:login")
    for _ in range(3):
        _, response = sign_in(site_admin.username, WRONG_PASSWORD, path=admin_login)
        assert response.status_code == 200
    client, response = sign_in(site_admin.username, TEST_PASSWORD, path=admin_login)
    assert_throttled(response)
    assert not is_signed_in(client)
    assert_throttled(sign_in(site_admin.username, TEST_PASSWORD)[1])
    assert sign_in_signals.checks == 3


def test_an_unreachable_throttle_cache_lets_sign_ins_through_with_a_warning(
    operator: User, login_limits: SettingsWrapper, caplog: pytest.LogCaptureFixture
) -> None:
    login_limits.CACHES = {
        **login_limits.CACHES,
        "throttle": {**login_limits.CACHES["throttle"], "LOCATION": "redis://127.0.0.1:1/0"},
    }
    with caplog.at_level(logging.WARNING, logger="console.login_throttle"):
        for _ in range(5):
            assert sign_in(operator.username, WRONG_PASSWORD)[1].status_code == 200
        client, response = sign_in(operator.username, TEST_PASSWORD)
    assert response.status_code == 302
    assert is_signed_in(client)
    assert "Login throttle cache unavailable" in caplog.text


# -- the configurator connects only to allowed hosts ------------------------------------------


@dataclass
class RecordingListener:
    """A loopback TCP listener that notes every connection and answers each with a 404."""

    port: int
    connections: list[tuple[str, int]] = field(default_factory=list)

    def url(self, host: str = "127.0.0.1") -> str:
        return f"http://{host}:{self.port}"


@pytest.fixture
def listener() -> Iterator[RecordingListener]:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    server.settimeout(0.1)
    recording = RecordingListener(port=server.getsockname()[1])
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                connection, peer = server.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            recording.connections.append(peer)
            with connection:
                connection.settimeout(2)
                try:
                    connection.recv(65536)
                    connection.sendall(
                        b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
                    )
                except OSError:
                    pass

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield recording
    stop.set()
    thread.join(timeout=5)
    server.close()


@pytest.mark.parametrize("inspect", [inspect_logs, inspect_metrics], ids=["logs", "metrics"])
def test_with_no_allowed_host_the_configurator_connects_nowhere(
    inspect: Callable[..., Any], listener: RecordingListener, settings: SettingsWrapper
) -> None:
    settings.CONFIGURATOR_ALLOWED_HOSTS = []
    report = inspect(listener.url(), timeout=2)
    assert not report.ok
    assert report.diagnosis == (
        "127.0.0.1 is not an allowed store host: WR_CONFIGURATOR_ALLOWED_HOSTS is empty, so the "
        "configurator connects to no host; the server's administrator lists the log and metric "
        "store hosts there"
    )
    assert listener.connections == []


@pytest.mark.parametrize("inspect", [inspect_logs, inspect_metrics], ids=["logs", "metrics"])
def test_a_host_not_listed_is_refused_before_any_connection(
    inspect: Callable[..., Any], listener: RecordingListener, settings: SettingsWrapper
) -> None:
    settings.CONFIGURATOR_ALLOWED_HOSTS = ["loki.example.org", "prometheus.example.org"]
    report = inspect(listener.url(), timeout=2)
    assert report.diagnosis == (
        "127.0.0.1 is not an allowed store host (allowed: loki.example.org, "
        "prometheus.example.org); the server's administrator can add it to "
        "WR_CONFIGURATOR_ALLOWED_HOSTS"
    )
    assert listener.connections == []


@pytest.mark.parametrize(
    "written",
    [
        # The host is localhost (it resolves to the listener); 127.0.0.1 is only user info.
        "http://127.0.0.1@localhost:{port}/",
        "http://127.0.0.1:x@localhost:{port}/",
        "http://127.0.0.1\\@localhost:{port}/",
        "http://localhost:{port}/?host=127.0.0.1",
        "http://localhost:{port}#127.0.0.1",
    ],
)
def test_only_the_urls_own_host_counts(
    written: str, listener: RecordingListener, settings: SettingsWrapper
) -> None:
    settings.CONFIGURATOR_ALLOWED_HOSTS = ["127.0.0.1"]
    report = inspect_logs(written.format(port=listener.port), timeout=2)
    assert not report.ok
    assert "localhost is not an allowed store host" in report.diagnosis
    assert listener.connections == []


@pytest.mark.parametrize(
    ("url", "allowed", "refused"),
    [
        ("http://loki.example.org.attacker.test:3100", ["loki.example.org"], True),
        ("http://attacker-loki.example.org:3100", ["loki.example.org"], True),
        ("http://loki.example:3100", ["loki.example.org"], True),
        ("http://127.0.0.10:3100", ["127.0.0.1"], True),
        ("http://LOKI.Example.ORG:3100/", ["loki.example.org"], False),
        ("http://[::1]:9090", ["::1"], False),
        ("http://[0:0::1]:9090", ["[::1]"], False),
        ("http://10.0.0.5:9090", [" 10.0.0.5 "], False),
        ("not a url", ["127.0.0.1"], True),
    ],
)
def test_hosts_are_compared_whole_never_by_prefix(
    url: str, allowed: list[str], refused: bool
) -> None:
    assert bool(configurator.refused_target(url, allowed)) is refused


def test_a_listed_host_is_connected_to(
    listener: RecordingListener, settings: SettingsWrapper
) -> None:
    settings.CONFIGURATOR_ALLOWED_HOSTS = ["127.0.0.1"]
    report = inspect_metrics(listener.url(), timeout=2)
    assert "not an allowed store host" not in report.diagnosis
    assert len(listener.connections) >= 1


def test_the_console_shows_the_refusal_and_connects_nowhere(
    site_admin: User, listener: RecordingListener, settings: SettingsWrapper
) -> None:
    settings.CONFIGURATOR_ALLOWED_HOSTS = []
    cluster = ClusterFactory()
    response = logged_in(site_admin).post(
        reverse("console:cluster_signals", args=[cluster.pk]),
        {"logs": listener.url(), "metrics": listener.url(), "inspect": ""},
    )
    assert response.status_code == 200
    assert response.content.decode().count("127.0.0.1 is not an allowed store host") == 2
    assert listener.connections == []


# -- connection settings are for superusers ---------------------------------------------------


@pytest.fixture
def superuser(make_user: Callable[..., User]) -> User:
    return make_user("root", is_staff=True, is_superuser=True)


SSH_SETTINGS = {"host": "login01.example.org", "user": "recovery", "port": 22}


def cluster_form(cluster: Cluster, **overrides: Any) -> dict[str, Any]:
    form: dict[str, Any] = {
        "name": cluster.name,
        "scheduler_kind": cluster.scheduler_kind,
        "connection": cluster.connection,
        "connection_settings": '{"host": "attacker.example", "user": "root"}',
        "mode": cluster.mode,
        "action_partitions": json.dumps(cluster.action_partitions),
        "action_share_percent": cluster.action_share_percent,
        "environment": cluster.environment,
        "last_polled_at_0": "",
        "last_polled_at_1": "",
        "last_poll_error": "",
        "last_poll_error_at_0": "",
        "last_poll_error_at_1": "",
    }
    if cluster.acknowledge_scheduler_actions:
        form["acknowledge_scheduler_actions"] = "on"
    form.update(overrides)
    return {key: value for key, value in form.items() if value is not None}


def test_an_admin_who_is_not_a_superuser_sees_connection_settings_read_only(
    site_admin: User,
) -> None:
    cluster = ClusterFactory(connection=Connection.SSH, connection_settings=SSH_SETTINGS)
    client = logged_in(site_admin)
    page = client.get(reverse("admin:recovery_cluster_change", args=[cluster.pk]))
    body = page.content.decode()
    assert page.status_code == 200
    assert 'name="connection_settings"' not in body
    assert "login01.example.org" in body  # shown, not editable

    response = client.post(
        reverse("admin:recovery_cluster_change", args=[cluster.pk]),
        cluster_form(cluster, environment="prod"),
    )
    assert response.status_code == 302
    cluster.refresh_from_db()
    assert cluster.environment == "prod"
    assert cluster.connection_settings == SSH_SETTINGS


def test_an_admin_who_is_not_a_superuser_adds_a_cluster_without_connection_settings(
    site_admin: User,
) -> None:
    form = cluster_form(ClusterFactory.build(name="new-one"))
    response = logged_in(site_admin).post(reverse("admin:recovery_cluster_add"), form)
    assert response.status_code == 302
    assert Cluster.objects.get(name="new-one").connection_settings == {}


def test_a_superuser_edits_connection_settings(superuser: User) -> None:
    cluster = ClusterFactory(connection=Connection.SSH, connection_settings=SSH_SETTINGS)
    client = logged_in(superuser)
    page = client.get(reverse("admin:recovery_cluster_change", args=[cluster.pk]))
    assert 'name="connection_settings"' in page.content.decode()
    response = client.post(
        reverse("admin:recovery_cluster_change", args=[cluster.pk]),
        cluster_form(cluster, connection_settings='{"host": "login02.example.org"}'),
    )
    assert response.status_code == 302
    cluster.refresh_from_db()
    assert cluster.connection_settings == {"host": "login02.example.org"}


def test_an_admin_who_is_not_a_superuser_cannot_save_stores_from_the_console(
    site_admin: User, superuser: User, settings: SettingsWrapper
) -> None:
    settings.CONFIGURATOR_ALLOWED_HOSTS = ["127.0.0.1"]
    cluster = ClusterFactory(connection_settings=SSH_SETTINGS)
    url = reverse("console:cluster_signals", args=[cluster.pk])
    at = int(datetime.now(UTC).timestamp() * 1e9) - 60_000_000_000
    entry = LokiEntry({"slurm_job_id": "4242", "host": "gpu-002"}, at, "step 1 loss 2.3")
    with serving(loki([entry])) as store:
        refused = logged_in(site_admin).post(url, {"logs": store.url, "save": ""})
        assert refused.status_code == 200
        assert "only a superuser may change" in refused.content.decode()
        cluster.refresh_from_db()
        assert cluster.connection_settings == SSH_SETTINGS

        saved = logged_in(superuser).post(url, {"logs": store.url, "save": ""})
    assert saved.status_code == 302
    cluster.refresh_from_db()
    assert cluster.connection_settings["log_source"]["url"] == store.url
    assert cluster.connection_settings["host"] == SSH_SETTINGS["host"]


# -- changes of mode and acknowledgement are audited ------------------------------------------


def control_events() -> list[tuple[str, str, dict[str, Any]]]:
    return [
        (event.kind, event.actor, event.payload)
        for event in AuditEvent.objects.filter(
            kind__in=[AuditKind.MODE_CHANGED, AuditKind.ACKNOWLEDGEMENT_CHANGED]
        ).order_by("id")
    ]


def change_cluster(client: Client, cluster: Cluster, **overrides: Any) -> None:
    response = client.post(
        reverse("admin:recovery_cluster_change", args=[cluster.pk]),
        cluster_form(cluster, **overrides),
    )
    assert response.status_code == 302, response.content.decode()[:2000]


def test_a_mode_change_in_admin_is_one_audit_event_with_who_and_from_what_to_what(
    site_admin: User,
) -> None:
    cluster = ClusterFactory()
    change_cluster(logged_in(site_admin), cluster, mode=ClusterMode.ACTION)
    assert control_events() == [
        (AuditKind.MODE_CHANGED, site_admin.username, {"from": "monitor", "to": "action"})
    ]
    event = AuditEvent.objects.get()
    assert event.cluster == cluster and event.workload is None
    assert payload_problems(event.kind, event.payload) == []


def test_an_acknowledgement_change_is_audited_and_an_unchanged_save_records_nothing(
    site_admin: User,
) -> None:
    cluster = ClusterFactory(mode=ClusterMode.ACTION)
    client = logged_in(site_admin)
    change_cluster(client, cluster, acknowledge_scheduler_actions="on")
    cluster.refresh_from_db()
    change_cluster(client, cluster, environment="staging")  # neither control changes
    change_cluster(client, cluster, acknowledge_scheduler_actions=None, mode=ClusterMode.MONITOR)
    assert control_events() == [
        (AuditKind.ACKNOWLEDGEMENT_CHANGED, site_admin.username, {"from": False, "to": True}),
        (AuditKind.MODE_CHANGED, site_admin.username, {"from": "action", "to": "monitor"}),
        (AuditKind.ACKNOWLEDGEMENT_CHANGED, site_admin.username, {"from": True, "to": False}),
    ]
    for event in AuditEvent.objects.all():
        assert payload_problems(event.kind, event.payload) == []


def test_the_value_before_is_the_stored_one_not_the_forms(site_admin: User) -> None:
    """
    GIVEN an admin page opened while the cluster was in monitor mode
    WHEN someone else switches it to action mode, then the admin saves the page in action mode
    THEN nothing is recorded for the admin's save: it changed nothing that was stored
    """
    cluster = ClusterFactory()
    Cluster.objects.filter(pk=cluster.pk).update(mode=ClusterMode.ACTION)
    change_cluster(logged_in(site_admin), cluster, mode=ClusterMode.ACTION)
    assert control_events() == []


def test_a_new_cluster_records_what_differs_from_a_new_clusters_defaults(
    site_admin: User,
) -> None:
    client = logged_in(site_admin)
    added = client.post(
        reverse("admin:recovery_cluster_add"),
        cluster_form(ClusterFactory.build(name="quiet"), connection_settings=None),
    )
    assert added.status_code == 302
    assert control_events() == []
    added = client.post(
        reverse("admin:recovery_cluster_add"),
        cluster_form(
            ClusterFactory.build(name="eager"),
            mode=ClusterMode.ACTION,
            acknowledge_scheduler_actions="on",
        ),
    )
    assert added.status_code == 302
    assert control_events() == [
        (AuditKind.MODE_CHANGED, site_admin.username, {"from": "monitor", "to": "action"}),
        (AuditKind.ACKNOWLEDGEMENT_CHANGED, site_admin.username, {"from": False, "to": True}),
    ]
    assert {event.cluster.name for event in AuditEvent.objects.all()} == {"eager"}


def test_the_audit_trail_shows_the_new_kinds(site_admin: User, viewer: User) -> None:
    cluster = ClusterFactory(name="east", mode=ClusterMode.ACTION)
    change_cluster(logged_in(site_admin), cluster, acknowledge_scheduler_actions="on")
    cluster.refresh_from_db()
    change_cluster(logged_in(site_admin), cluster, mode=ClusterMode.MONITOR)
    client = logged_in(viewer)

    trail = client.get(reverse("console:audit")).content.decode()
    assert "Cluster mode changed" in trail
    assert "Acknowledgement of scheduler actions changed" in trail
    assert 'class="event-kind event-mode_changed"' in trail
    assert '<span class="payload-compact__key">from:</span> action' in trail
    assert '<span class="payload-compact__key">to:</span> monitor' in trail
    assert '<span class="payload-compact__key">to:</span> true' in trail

    filtered = client.get(reverse("console:audit"), {"kind": AuditKind.MODE_CHANGED})
    assert filtered.status_code == 200
    assert "Acknowledgement of scheduler actions changed</span>" not in filtered.content.decode()

    mode_event = AuditEvent.objects.get(kind=AuditKind.MODE_CHANGED)
    permalink = client.get(reverse("console:audit_event", args=[mode_event.pk]))
    assert permalink.status_code == 200
    assert "Cluster mode changed" in permalink.content.decode()

    export = client.get(reverse("console:audit_csv"))
    csv_text = b"".join(export.streaming_content).decode()  # type: ignore[attr-defined]
    assert "mode_changed" in csv_text and "acknowledgement_changed" in csv_text
