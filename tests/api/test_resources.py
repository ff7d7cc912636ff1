"""The read-only resources under /api/v1/: lists, details, filters, cursor pages, access."""

from __future__ import annotations

import base64
import subprocess
import sys
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.conf import settings
from django.contrib.auth.models import User
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from pytest_django.fixtures import Settings as SettingsWrapper
from rest_framework.test import APIClient

from recovery.choices import (
    AnomalyKind,
    AuditKind,
    ClusterMode,
    Confirmation,
    FailureCategory,
    NodeHealth,
    RecommendationStatus,
    WorkloadState,
)
from recovery.models import ApiToken, AuditEvent, Node, Verdict
from tests.factories import (
    AnomalyFactory,
    AttemptFactory,
    ClusterFactory,
    RecommendationFactory,
    WorkloadFactory,
)

pytestmark = pytest.mark.django_db

T0 = datetime(2026, 11, 29, 10, 0, tzinfo=UTC)


@pytest.fixture(autouse=True)
def _own_throttle_counters(settings: SettingsWrapper) -> None:
    # The throttle counters live in Redis; a prefix per test keeps tests from sharing them.
    settings.CACHES = {
        **settings.CACHES,
        "throttle": {**settings.CACHES["throttle"], "KEY_PREFIX": f"test-{uuid.uuid4().hex}"},
    }


def as_user(user: User | None) -> APIClient:
    client = APIClient()
    if user is not None:
        client.force_authenticate(user)
    return client


def with_token(user: User) -> APIClient:
    _, key = ApiToken.issue(user, "tests")
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {key}")
    return client


def ids(response: Any) -> list[int]:
    assert response.status_code == 200, response.content
    return [item["id"] for item in response.json()["results"]]


def event(cluster: Any, kind: str, at: datetime, **fields: Any) -> AuditEvent:
    return AuditEvent.objects.create(
        cluster=cluster, kind=kind, occurred_at=at, actor=fields.pop("actor", "policy"), **fields
    )


# ---------- every resource: list, detail, access ----------


def _make(resource: str) -> int:
    if resource == "clusters":
        return ClusterFactory().pk
    if resource == "nodes":
        return Node.objects.create(cluster=ClusterFactory(), name="gpu-001").pk
    if resource == "workloads":
        return WorkloadFactory().pk
    if resource == "attempts":
        return AttemptFactory().pk
    if resource == "anomalies":
        return AnomalyFactory().pk
    if resource == "verdicts":
        return Verdict.objects.create(
            anomaly=AnomalyFactory(), attribution="hardware", confidence=0.9
        ).pk
    if resource == "recommendations":
        return RecommendationFactory().pk
    return event(ClusterFactory(), AuditKind.DETECTED, T0).pk


RESOURCES = [
    "clusters",
    "nodes",
    "workloads",
    "attempts",
    "anomalies",
    "verdicts",
    "recommendations",
    "audit-events",
]


@pytest.mark.parametrize("resource", RESOURCES)
def test_a_viewer_lists_and_reads_each_resource(viewer: User, resource: str) -> None:
    pk = _make(resource)
    client = as_user(viewer)
    listed = client.get(f"/api/v1/{resource}/")
    assert ids(listed) == [pk]
    assert listed.json()["next"] is None and listed.json()["previous"] is None
    detail = client.get(f"/api/v1/{resource}/{pk}/")
    assert detail.status_code == 200
    assert detail.json()["id"] == pk


@pytest.mark.parametrize("resource", RESOURCES)
def test_an_unknown_id_is_a_json_404(viewer: User, resource: str) -> None:
    response = as_user(viewer).get(f"/api/v1/{resource}/999999999/")
    assert response.status_code == 404
    assert response.json()["code"] == "not_found"


@pytest.mark.parametrize("resource", RESOURCES)
def test_anonymous_callers_get_401_with_how_to_authenticate(resource: str) -> None:
    _make(resource)
    response = APIClient().get(f"/api/v1/{resource}/")
    assert response.status_code == 401
    assert response["WWW-Authenticate"].startswith("Bearer")
    assert response.json()["code"] == "not_authenticated"
    assert "results" not in response.json()


@pytest.mark.parametrize("resource", RESOURCES)
def test_an_outsider_without_a_role_is_refused(outsider: User, resource: str) -> None:
    pk = _make(resource)
    for path in (f"/api/v1/{resource}/", f"/api/v1/{resource}/{pk}/"):
        response = as_user(outsider).get(path)
        assert response.status_code == 403
        assert "Console role" in response.json()["error"]


@pytest.mark.parametrize("resource", ["clusters", "audit-events"])
def test_the_resources_are_read_only(operator: User, resource: str) -> None:
    pk = _make(resource)
    client = as_user(operator)
    assert client.post(f"/api/v1/{resource}/", {}, format="json").status_code == 405
    response = client.delete(f"/api/v1/{resource}/{pk}/")
    assert response.status_code == 405
    assert response.json()["code"] == "method_not_allowed"


def test_a_personal_token_reads_with_its_users_role(viewer: User, outsider: User) -> None:
    cluster = ClusterFactory()
    assert ids(with_token(viewer).get("/api/v1/clusters/")) == [cluster.pk]
    assert with_token(outsider).get("/api/v1/clusters/").status_code == 403


def test_a_console_session_reads_the_api(viewer: User) -> None:
    from tests.conftest import TEST_PASSWORD

    cluster = ClusterFactory()
    client = APIClient()
    assert client.login(username=viewer.username, password=TEST_PASSWORD)
    assert ids(client.get("/api/v1/clusters/")) == [cluster.pk]


# ---------- approve/reject and goodput live alongside ----------


def test_recommendation_detail_and_approve_share_the_prefix(operator: User) -> None:
    recommendation = RecommendationFactory()
    client = as_user(operator)
    assert client.get(f"/api/v1/recommendations/{recommendation.pk}/").json()["status"] == (
        RecommendationStatus.AWAITING_APPROVAL
    )
    approved = client.post(f"/api/v1/recommendations/{recommendation.pk}/approve/", {})
    assert approved.status_code == 200 and approved.json()["changed"] is True
    assert client.get(f"/api/v1/recommendations/{recommendation.pk}/").json()["status"] == (
        RecommendationStatus.READY
    )


def test_goodput_stays_under_the_workload_and_cluster(viewer: User) -> None:
    workload = WorkloadFactory()
    client = as_user(viewer)
    assert client.get(f"/api/v1/workloads/{workload.pk}/goodput/").status_code == 200
    assert client.get(f"/api/v1/clusters/{workload.cluster.pk}/goodput/").status_code == 200


# ---------- filters ----------


def test_clusters_filter_by_name_and_mode(viewer: User) -> None:
    lab = ClusterFactory(name="lab", mode=ClusterMode.ACTION)
    ClusterFactory(name="prod")
    client = as_user(viewer)
    assert ids(client.get("/api/v1/clusters/", {"name": "lab"})) == [lab.pk]
    assert ids(client.get("/api/v1/clusters/", {"mode": "action"})) == [lab.pk]


def test_nodes_filter_by_cluster_health_suspect_and_exclusion(viewer: User) -> None:
    lab, prod = ClusterFactory(name="lab"), ClusterFactory(name="prod")
    now = timezone.now()
    suspect = Node.objects.create(
        cluster=lab, name="a", health=NodeHealth.SUSPECT, suspect_since=now
    )
    excluded = Node.objects.create(cluster=lab, name="b", excluded_until=now + timedelta(hours=1))
    lapsed = Node.objects.create(cluster=prod, name="c", excluded_until=now - timedelta(hours=1))
    client = as_user(viewer)
    assert set(ids(client.get("/api/v1/nodes/", {"cluster": "lab"}))) == {suspect.pk, excluded.pk}
    assert ids(client.get("/api/v1/nodes/", {"health": "suspect"})) == [suspect.pk]
    assert ids(client.get("/api/v1/nodes/", {"suspect": "true"})) == [suspect.pk]
    assert set(ids(client.get("/api/v1/nodes/", {"suspect": "false"}))) == {
        excluded.pk,
        lapsed.pk,
    }
    assert ids(client.get("/api/v1/nodes/", {"excluded": "true"})) == [excluded.pk]
    # Never excluded (no date at all) and no longer excluded both count as "not excluded".
    assert set(ids(client.get("/api/v1/nodes/", {"excluded": "false"}))) == {
        suspect.pk,
        lapsed.pk,
    }
    body = client.get(f"/api/v1/nodes/{excluded.pk}/").json()
    assert (body["excluded"], body["suspect"], body["cluster_name"]) == (True, False, "lab")


def test_workloads_filter_by_cluster_state_user_and_job_id(viewer: User) -> None:
    lab = ClusterFactory(name="lab")
    mine = WorkloadFactory(cluster=lab, user="bob", job_id="7", state=WorkloadState.FAILED)
    WorkloadFactory(user="alice")
    client = as_user(viewer)
    for params in ({"cluster": "lab"}, {"state": "failed"}, {"user": "bob"}, {"job_id": "7"}):
        assert ids(client.get("/api/v1/workloads/", params)) == [mine.pk], params


def test_attempts_filter_by_workload(viewer: User) -> None:
    first = AttemptFactory()
    AttemptFactory()
    response = as_user(viewer).get("/api/v1/attempts/", {"workload": first.workload_id})
    assert ids(response) == [first.pk]


def test_anomalies_filter_and_show_their_verdicts(viewer: User) -> None:
    lab = ClusterFactory(name="lab")
    old = AnomalyFactory(workload__cluster=lab, detected_at=T0 - timedelta(days=1))
    new = AnomalyFactory(
        workload__cluster=lab,
        detected_at=T0,
        kind=AnomalyKind.HANG,
        category=FailureCategory.NCCL_TIMEOUT,
        attribution="system_software",
    )
    Verdict.objects.create(anomaly=new, attribution="system_software", confidence=0.7)
    client = as_user(viewer)
    assert ids(client.get("/api/v1/anomalies/", {"cluster": "lab"})) == [new.pk, old.pk]
    assert ids(client.get("/api/v1/anomalies/", {"workload": old.workload_id})) == [old.pk]
    assert ids(client.get("/api/v1/anomalies/", {"category": "nccl_timeout"})) == [new.pk]
    assert ids(client.get("/api/v1/anomalies/", {"kind": "hang"})) == [new.pk]
    assert ids(client.get("/api/v1/anomalies/", {"attribution": "system_software"})) == [new.pk]
    since = (T0 - timedelta(hours=1)).isoformat()
    assert ids(client.get("/api/v1/anomalies/", {"since": since})) == [new.pk]
    assert ids(client.get("/api/v1/anomalies/", {"until": since})) == [old.pk]
    body = client.get(f"/api/v1/anomalies/{new.pk}/").json()
    assert [v["attribution"] for v in body["verdicts"]] == ["system_software"]
    assert body["cluster"] == lab.pk


def test_anomalies_show_how_a_crash_was_confirmed(viewer: User) -> None:
    """GIVEN a crash confirmed 4 s after its evidence and a hang, which needs no confirmation
    WHEN a viewer reads them
    THEN the crash carries its state, when and why it was confirmed and how long that took,
    and the hang carries a blank state and nulls
    """
    crash = AnomalyFactory(
        evidence_at=T0,
        detected_at=T0 + timedelta(seconds=1),
        confirmation=Confirmation.CONFIRMED,
        confirmation_at=T0 + timedelta(seconds=4),
        confirmation_reason="srun: error: node2: task 1: Exited with exit code 1",
    )
    hang = AnomalyFactory(kind=AnomalyKind.HANG, category=FailureCategory.NCCL_TIMEOUT)
    client = as_user(viewer)

    body = client.get(f"/api/v1/anomalies/{crash.pk}/").json()
    assert body["confirmation"] == "confirmed"
    assert body["confirmation_at"] == "2026-11-29T10:00:04Z"
    assert body["confirmation_reason"] == "srun: error: node2: task 1: Exited with exit code 1"
    assert body["confirmation_latency_seconds"] == 4.0

    listed = {item["id"]: item for item in client.get("/api/v1/anomalies/").json()["results"]}
    assert listed[crash.pk]["confirmation"] == "confirmed"
    assert listed[hang.pk]["confirmation"] == ""
    assert listed[hang.pk]["confirmation_at"] is None
    assert listed[hang.pk]["confirmation_reason"] == ""
    assert listed[hang.pk]["confirmation_latency_seconds"] is None


def test_a_crash_that_is_not_confirmed_has_no_confirmation_latency(viewer: User) -> None:
    survived = AnomalyFactory(
        evidence_at=T0,
        confirmation=Confirmation.SURVIVED,
        confirmation_at=T0 + timedelta(seconds=30),
        confirmation_reason="progress to step 57 after it",
    )
    body = as_user(viewer).get(f"/api/v1/anomalies/{survived.pk}/").json()
    assert body["confirmation"] == "survived"
    assert body["confirmation_at"] == "2026-11-29T10:00:30Z"
    assert body["confirmation_latency_seconds"] is None


def test_anomalies_filter_by_confirmation(viewer: User) -> None:
    """GIVEN one crash in each confirmation state and a hang without one
    WHEN a viewer lists anomalies filtered by a state
    THEN only the crash in that state is listed
    """
    by_state = {
        state: AnomalyFactory(confirmation=state, detected_at=T0 + timedelta(seconds=n))
        for n, state in enumerate(Confirmation.values)
    }
    AnomalyFactory(kind=AnomalyKind.HANG, detected_at=T0 + timedelta(seconds=10))
    client = as_user(viewer)
    for state, anomaly in by_state.items():
        assert ids(client.get("/api/v1/anomalies/", {"confirmation": state})) == [anomaly.pk]
    assert len(ids(client.get("/api/v1/anomalies/"))) == 5


def test_verdicts_filter_by_anomaly(viewer: User) -> None:
    anomaly = AnomalyFactory()
    verdict = Verdict.objects.create(anomaly=anomaly, attribution="hardware", confidence=1.0)
    Verdict.objects.create(anomaly=AnomalyFactory(), attribution="hardware", confidence=1.0)
    assert ids(as_user(viewer).get("/api/v1/verdicts/", {"anomaly": anomaly.pk})) == [verdict.pk]


def test_recommendations_filter_by_status_cluster_and_workload(viewer: User) -> None:
    lab = ClusterFactory(name="lab")
    waiting = RecommendationFactory(workload__cluster=lab)
    RecommendationFactory(status=RecommendationStatus.EXECUTED)
    client = as_user(viewer)
    for params in (
        {"status": "awaiting_approval"},
        {"cluster": "lab"},
        {"workload": waiting.workload_id},
    ):
        assert ids(client.get("/api/v1/recommendations/", params)) == [waiting.pk], params


def test_recommendations_filter_by_disposition_and_acknowledgement(viewer: User) -> None:
    abandoned = RecommendationFactory(
        status=RecommendationStatus.FAILED, disposition="abandoned", disposition_reason="x"
    )
    seen = RecommendationFactory(
        status=RecommendationStatus.FAILED,
        disposition="abandoned",
        acknowledged_by="operator:olivia",
        acknowledged_at=timezone.now(),
    )
    RecommendationFactory(status=RecommendationStatus.EXECUTED, disposition="converged")
    client = as_user(viewer)
    found = client.get("/api/v1/recommendations/", {"disposition": "abandoned"})
    assert sorted(ids(found)) == sorted([abandoned.pk, seen.pk])
    assert ids(client.get("/api/v1/recommendations/", {"unacknowledged": "true"})) == [abandoned.pk]
    body = client.get(f"/api/v1/recommendations/{abandoned.pk}/").json()
    assert (body["disposition"], body["disposition_reason"]) == ("abandoned", "x")
    assert client.get("/api/v1/recommendations/", {"disposition": "lost"}).status_code == 400


@pytest.mark.parametrize(
    ("path", "params", "field"),
    [
        ("clusters", {"mode": "sometimes"}, "mode"),
        ("nodes", {"suspect": "perhaps"}, "suspect"),
        ("workloads", {"state": "asleep"}, "state"),
        ("attempts", {"workload": "abc"}, "workload"),
        ("anomalies", {"since": "yesterday"}, "since"),
        ("anomalies", {"confirmation": "probably"}, "confirmation"),
        ("anomalies", {"since": "2026-11-29T10:00Z", "until": "2026-11-28T10:00Z"}, "until"),
        ("recommendations", {"workload": "0"}, "workload"),
        ("audit-events", {"kind": "exploded"}, "kind"),
        ("audit-events", {"until": "2026-13-40"}, "until"),
        ("audit-events", {"actor": "x" * 151}, "actor"),
        ("audit-events", {"workload": str(2**64)}, "workload"),
        ("clusters", {"page_size": "lots"}, "page_size"),
        ("clusters", {"page_size": "0"}, "page_size"),
        ("clusters", {"cursor": "not-a-cursor"}, "cursor"),
        ("audit-events", {"cursor": "not-a-cursor"}, "cursor"),
        # Well-formed DRF cursors whose position is not a value of the ordering field.
        ("clusters", {"cursor": base64.b64encode(b"p=abc").decode()}, "cursor"),
        ("workloads", {"cursor": base64.b64encode(b"p=garbage").decode()}, "cursor"),
        ("anomalies", {"cursor": base64.b64encode(b"p=99999-99-99").decode()}, "cursor"),
    ],
)
def test_a_malformed_filter_is_a_400_naming_it(
    viewer: User, path: str, params: dict[str, str], field: str
) -> None:
    response = as_user(viewer).get(f"/api/v1/{path}/", params)
    assert response.status_code == 400
    body = response.json()
    assert list(body["fields"]) == [field]
    assert body["error"] and body["code"]


# ---------- cursor pages ----------


def test_pages_follow_the_cursor_newest_first(viewer: User) -> None:
    clusters = [ClusterFactory() for _ in range(5)]
    client = as_user(viewer)
    first = client.get("/api/v1/clusters/", {"page_size": 2})
    assert ids(first) == [clusters[4].pk, clusters[3].pk]
    second = client.get(first.json()["next"])
    assert ids(second) == [clusters[2].pk, clusters[1].pk]
    back = client.get(second.json()["previous"])
    assert ids(back) == ids(first)


def test_the_page_size_is_capped(viewer: User) -> None:
    ClusterFactory()
    response = as_user(viewer).get("/api/v1/clusters/", {"page_size": 100000})
    assert ids(response) and response.json()["next"] is None


# ---------- the audit trail ----------


def test_audit_events_filter_by_cluster_workload_kind_actor_and_time(viewer: User) -> None:
    lab, prod = ClusterFactory(name="lab"), ClusterFactory(name="prod")
    workload = WorkloadFactory(cluster=lab)
    detected = event(lab, AuditKind.DETECTED, T0, workload=workload)
    approved = event(lab, AuditKind.APPROVED, T0 + timedelta(minutes=1), actor="olivia")
    elsewhere = event(prod, AuditKind.CLAIMED, T0 + timedelta(minutes=2), actor="controller:a")
    client = as_user(viewer)

    def audit(**params: Any) -> list[int]:
        return ids(client.get("/api/v1/audit-events/", params))

    assert audit() == [elsewhere.pk, approved.pk, detected.pk]
    assert audit(cluster="lab") == [approved.pk, detected.pk]
    assert audit(cluster="nowhere") == []
    assert audit(workload=workload.pk) == [detected.pk]
    assert audit(kind="approved") == [approved.pk]
    assert audit(kind=["approved", "claimed"]) == [elsewhere.pk, approved.pk]
    assert audit(actor="olivia") == [approved.pk]
    assert audit(since="2026-11-29T10:01:00Z") == [elsewhere.pk, approved.pk]
    assert audit(since="2026-11-29T10:01:00", until="2026-11-29T10:01:00+00:00") == [approved.pk]
    body = client.get(f"/api/v1/audit-events/{approved.pk}/").json()
    assert (body["cluster_name"], body["kind"], body["actor"]) == ("lab", "approved", "olivia")


def test_audit_event_pages_keep_ties_in_id_order(viewer: User) -> None:
    cluster = ClusterFactory()
    same_time = [event(cluster, AuditKind.DETECTED, T0) for _ in range(3)]
    earlier = event(cluster, AuditKind.DETECTED, T0 - timedelta(seconds=1))
    client = as_user(viewer)
    query: dict[str, str | int] = {"page_size": 2, "cluster": cluster.name}
    first = client.get("/api/v1/audit-events/", query)
    assert ids(first) == [same_time[2].pk, same_time[1].pk]
    assert first.json()["previous"] is None
    second = client.get(first.json()["next"])
    assert ids(second) == [same_time[0].pk, earlier.pk]
    assert second.json()["next"] is None
    assert ids(client.get(second.json()["previous"])) == ids(first)


def test_audit_events_read_through_the_audit_trail_query(viewer: User) -> None:
    """GIVEN events on two clusters
    WHEN the API lists one cluster's events on MariaDB
    THEN the query names the (cluster, occurred_at) index, as the Console's audit view does."""
    if connection.vendor != "mysql":
        pytest.skip("FORCE INDEX is MySQL/MariaDB only")
    cluster = ClusterFactory()
    event(cluster, AuditKind.DETECTED, T0)
    client = as_user(viewer)
    with CaptureQueriesContext(connection) as queries:
        assert len(ids(client.get("/api/v1/audit-events/", {"cluster": cluster.name}))) == 1
    assert any("FORCE INDEX" in query["sql"] for query in queries.captured_queries)


# ---------- the OpenAPI schema ----------


def test_the_schema_documents_every_resource_with_examples_and_errors() -> None:
    response = APIClient().get("/api/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json")
    schema = response.json()
    paths = schema["paths"]
    for resource in RESOURCES:
        for path in (f"/api/v1/{resource}/", f"/api/v1/{resource}/{{id}}/"):
            operation = paths[path]["get"]
            assert operation["tags"], path
            ok = operation["responses"]["200"]["content"]["application/json"]
            assert ok["examples"], path
            assert {"401", "403", "429"} <= set(operation["responses"]), path
            assert {"personalToken": []} in operation["security"], path
        parameters = {p["name"] for p in paths[f"/api/v1/{resource}/"]["get"]["parameters"]}
        assert {"cursor", "page_size"} <= parameters, resource
    audit_parameters = {p["name"] for p in paths["/api/v1/audit-events/"]["get"]["parameters"]}
    assert {"cluster", "workload", "kind", "actor", "since", "until"} <= audit_parameters
    schemes = schema["components"]["securitySchemes"]
    assert schemes["personalToken"]["scheme"] == "bearer"
    assert "controllerToken" in schemes
    assert "/api/v1/recommendations/{recommendation_id}/approve/" in paths
    assert "/api/v1/advisor/recommendations/" in paths


def test_the_resources_add_no_schema_warnings() -> None:
    result = subprocess.run(
        [sys.executable, "manage.py", "spectacular", "--validate", "--file", "/dev/null"],
        cwd=settings.BASE_DIR,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    ours = [
        line
        for line in result.stderr.splitlines()
        if ("Warning" in line or "Error" in line)
        and ("api/resources" in line or "ViewSet" in line or "api/errors" in line)
    ]
    assert ours == []


def test_drains_and_resumes_name_their_node_and_filter_by_action_and_node(viewer: User) -> None:
    lab = ClusterFactory(name="lab")
    node = Node.objects.create(cluster=lab, name="gpu-002")
    drain = RecommendationFactory(
        workload__cluster=lab, node=node, action="drain", excluded_nodes=[]
    )
    restart = RecommendationFactory(workload__cluster=lab)
    client = as_user(viewer)
    assert ids(client.get("/api/v1/recommendations/", {"action": "drain"})) == [drain.pk]
    assert ids(client.get("/api/v1/recommendations/", {"node": "gpu-002"})) == [drain.pk]
    listed = {item["id"]: item for item in client.get("/api/v1/recommendations/").json()["results"]}
    assert listed[drain.pk]["node"] == "gpu-002"
    assert listed[restart.pk]["node"] is None
    answer = client.get("/api/v1/recommendations/", {"action": "reboot"})
    assert answer.status_code == 400
