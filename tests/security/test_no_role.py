"""An account signed in with no Console role tries every page, endpoint and admin URL, with
every method, and is refused each time; nothing stored changes.

The URLs come from the URL configuration itself, so a page or endpoint added later is tried
too. The few that answer without a role are named in ``PUBLIC`` with the reason. The
WebSocket is covered in tests/console/test_live_updates.py.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from django.apps import apps
from django.contrib.auth.models import Group, User
from django.contrib.contenttypes.models import ContentType
from django.db.models import Model
from django.test import Client
from django.urls import URLPattern, URLResolver, get_resolver, reverse
from django.utils import timezone
from pytest_django.fixtures import Settings as SettingsWrapper

from recovery.audit.record import record_event
from recovery.choices import AuditKind, Connection
from recovery.models import (
    ApiToken,
    Cluster,
    ClusterGoodputSnapshot,
    ControllerToken,
    DetectionPattern,
    EnvironmentBinding,
    IngestToken,
    IngestTokenKind,
    Node,
    Policy,
    Verdict,
    Workflow,
)
from recovery.roles import ADMIN
from tests.conftest import TEST_PASSWORD
from tests.factories import AnomalyFactory, AttemptFactory, RecommendationFactory

pytestmark = pytest.mark.django_db

# URL names that answer without a Console role, on purpose.
PUBLIC = {
    "login": "the sign-in page (a signed-in user is sent on to the fleet)",
    "logout": "ends the caller's own session; not tried, it would delete that session's row",
    "admin:login": "the admin's sign-in page",
    "admin:logout": "ends the caller's own session, as logout does; not tried",
    "api:health": "for load balancers",
    "api:schema": "the API's documentation",
    "api:docs": "the API's documentation",
    "metrics": "for Prometheus: a scrape token, not a role (tried below with one set)",
}
# Unnamed patterns, by their route: what to request for them, or None when public.
UNNAMED = {
    "favicon.ico": None,  # a redirect to a static file
    "admin/login/": None,  # the throttled admin sign-in, the same page as admin:login
    "admin/(?P<url>.*)$": "/admin/no-such-page/",  # the admin's catch-all
}
ADMIN_OBJECT_REDIRECT = re.compile(r"^admin/(?P<app>\w+)/(?P<model>\w+)/<path:object_id>/$")
API_METHODS = ("get", "post", "put", "patch", "delete")
PAGE_METHODS = ("get", "post")


@dataclass(frozen=True)
class Target:
    name: str  # qualified URL name, or the route of an unnamed pattern
    path: str
    area: str  # "console", "api", "admin"


def leaf_patterns(
    resolver: URLResolver, namespace: str = "", route: str = ""
) -> Iterator[tuple[str, str, URLPattern]]:
    """(qualified name or "", full route, pattern) of every URL the project serves."""
    for entry in resolver.url_patterns:
        if isinstance(entry, URLResolver):
            inner = f"{namespace}{entry.namespace}:" if entry.namespace else namespace
            yield from leaf_patterns(entry, inner, route + str(entry.pattern))
        elif isinstance(entry, URLPattern):
            name = f"{namespace}{entry.name}" if entry.name else ""
            yield name, route + str(entry.pattern), entry


@pytest.fixture
def stored(make_user: Callable[..., User]) -> dict[str, Model]:
    """One row of every model the URLs take an id of."""
    other_admin = make_user("ada", ADMIN, is_staff=True)
    recommendation = RecommendationFactory(
        workload__cluster__connection=Connection.SSH,
        workload__cluster__connection_settings={"host": "login01.example.org"},
    )
    workload = recommendation.workload
    cluster = workload.cluster
    workload.workflow = Workflow.objects.create(cluster=cluster, user="alice", name="pretrain")
    workload.save()
    attempt = AttemptFactory(workload=workload)
    anomaly = AnomalyFactory(workload=workload, attempt=attempt)
    rows: list[Model] = [
        other_admin,
        Group.objects.get(name=ADMIN),
        cluster,
        Node.objects.create(cluster=cluster, name="gpu-002"),
        workload,
        workload.workflow,
        attempt,
        anomaly,
        Verdict.objects.create(anomaly=anomaly, attribution="hardware", confidence=0.9),
        recommendation,
        record_event(cluster=cluster, kind=AuditKind.DETECTED, actor="detector", payload={}),
        Policy.objects.create(name="site default"),
        EnvironmentBinding.objects.create(cluster=cluster, environment="scratch", any_job=True),
        DetectionPattern.objects.create(
            name="xid-79",
            pattern="Xid.*79",
            category="gpu_hardware",
            attribution="hardware",
            examples="NVRM: Xid (PCI:0000:3b:00): 79",
        ),
        ControllerToken.issue(cluster, "ctl")[0],
        IngestToken.issue(
            cluster, IngestTokenKind.JOB, name="job-1", issued_by="olga", user="alice"
        )[0],
        ApiToken.issue(other_admin, "integration")[0],
        ClusterGoodputSnapshot.objects.create(
            cluster=cluster, taken_at=timezone.now(), window_seconds=7 * 24 * 3600
        ),
    ]
    return {f"{row._meta.app_label}_{row._meta.model_name}": row for row in rows}


def fill(name: str, route: str, stored: dict[str, Model]) -> dict[str, Any]:
    """Path parameters for the URL named ``name``, taken from the stored rows."""
    by_param = {
        "workload_id": stored["recovery_workload"].pk,
        "workflow_id": stored["recovery_workflow"].pk,
        "recommendation_id": stored["recovery_recommendation"].pk,
        "event_id": stored["recovery_auditevent"].pk,
        "cluster_id": stored["recovery_cluster"].pk,
        "cluster_name": Cluster.objects.get(pk=stored["recovery_cluster"].pk).name,
        "node_id": stored["recovery_node"].pk,
        "token_id": stored["recovery_ingesttoken"].pk,
        "anomaly_id": stored["recovery_anomaly"].pk,
        "app_label": "recovery",
        "content_type_id": ContentType.objects.get_for_model(Cluster).pk,
        "id": stored["auth_user"].pk,
    }
    kwargs: dict[str, Any] = {}
    for param in re.findall(r"<(?:\w+:)?(\w+)>|\(\?P<(\w+)>", route):
        param = param[0] or param[1]
        if param in by_param:
            kwargs[param] = by_param[param]
        elif param == "pk":  # an API resource: "api:cluster-detail" names the model
            kwargs[param] = stored[f"recovery_{name.split(':')[1].removesuffix('-detail')}"].pk
        elif param == "object_id" and name == "admin:view_on_site":
            kwargs[param] = stored["recovery_cluster"].pk
        elif param == "object_id":  # an admin page: "admin:recovery_cluster_change"
            models = [key for key in stored if name.startswith(f"admin:{key}_")]
            assert models, f"no stored row to try {name} with: add one to `stored`"
            kwargs[param] = stored[models[0]].pk
        else:
            raise AssertionError(f"no value for the parameter {param!r} of {name or route}")
    return kwargs


def targets(stored: dict[str, Model]) -> list[Target]:
    found: dict[str, Target] = {}
    for name, route, _pattern in leaf_patterns(get_resolver()):
        if not name and (redirect := ADMIN_OBJECT_REDIRECT.match(route)):
            # The admin's "<object_id>/" pages: unnamed redirects to the change page.
            row = stored.get(f"{redirect['app']}_{redirect['model']}")
            assert row is not None, f"no stored row to try {route} with: add one to `stored`"
            path = f"/admin/{redirect['app']}/{redirect['model']}/{row.pk}/"
            found[path] = Target(route, path, "admin")
            continue
        if not name:
            assert route in UNNAMED, f"an unnamed URL pattern nobody tries: {route}"
            if UNNAMED[route] is not None:
                found[route] = Target(route, str(UNNAMED[route]), "admin")
            continue
        if name in PUBLIC:
            continue
        if route.startswith("admin/") and not name.startswith("admin:"):
            raise AssertionError(f"{name}: an admin URL outside the admin site")
        path = reverse(name, kwargs=fill(name, route, stored))
        area = name.split(":")[0] if ":" in name else "other"
        assert area in {"console", "api", "admin"}, f"{name}: a URL of no known area"
        found[name] = Target(name, path, area)
    return list(found.values())


def everything_stored() -> dict[str, list[dict[str, Any]]]:
    return {
        model._meta.label: list(model._default_manager.order_by("pk").values())
        for model in apps.get_models(include_auto_created=True)
    }


def refusal_problem(target: Target, method: str, response: Any) -> str:
    """What is wrong with the answer, or "" for a clear refusal."""
    status = response.status_code
    if target.area == "console":
        # The 403 page says why ("... needs a Console role", "Only operators may ...").
        if status == 403 and "You are not allowed to do that" in response.content.decode():
            return ""
        if status == 302 and response["Location"].startswith(reverse("login")):
            return ""
        # A method the URL takes from nobody (GET of a decision) is refused before any role.
        if status == 405 and method.upper() not in response["Allow"]:
            return ""
    elif target.area == "admin":
        if status == 302 and response["Location"].startswith(reverse("admin:login")):
            return ""
    elif target.area == "api":
        body = response.json() if response.get("Content-Type") == "application/json" else {}
        shaped = {"error", "code", "detail"} <= set(body) and body["error"] == body["detail"]
        if status in (401, 403) and shaped:
            return ""
    return f"{method.upper()} {target.path} ({target.name}): {status}"


def test_an_account_without_a_role_is_refused_everywhere_and_changes_nothing(
    outsider: User, stored: dict[str, Model], settings: SettingsWrapper
) -> None:
    settings.METRICS_TOKEN = "scrape-token-of-the-site"
    client = Client()
    assert client.login(username=outsider.username, password=TEST_PASSWORD)
    tried = targets(stored)
    assert {t.area for t in tried} == {"console", "api", "admin"}
    assert len([t for t in tried if t.area == "console"]) == 25
    before = everything_stored()

    problems = []
    for target in tried:
        methods = API_METHODS if target.area == "api" else PAGE_METHODS
        for method in methods:
            response = getattr(client, method)(target.path, content_type="application/json")
            if problem := refusal_problem(target, method, response):
                problems.append(problem)
    metrics = client.get(reverse("metrics"))
    if metrics.status_code != 401:
        problems.append(f"GET /metrics with a token set: {metrics.status_code}")

    assert not problems, "\n".join(problems)
    assert client.session.get("_auth_user_id") == str(outsider.pk), "tried as someone else"
    assert everything_stored() == before


def test_the_public_urls_are_the_named_few(outsider: User) -> None:
    """The sign-in pages, health and API documentation answer without a role, and nothing
    else is left out of the test above."""
    client = Client()
    assert client.login(username=outsider.username, password=TEST_PASSWORD)
    assert client.get(reverse("login"))["Location"] == reverse("console:fleet")
    assert client.get(reverse("admin:login")).status_code == 200
    assert client.get(reverse("api:health")).status_code in (200, 503)
    assert client.get(reverse("api:schema")).status_code == 200
    assert client.get(reverse("api:docs")).status_code == 200
    named = {name for name, _, _ in leaf_patterns(get_resolver()) if name}
    assert set(PUBLIC) <= named
