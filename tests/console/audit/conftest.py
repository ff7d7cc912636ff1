"""What the audit trail's page and export tests share: a small trail, events tied in time,
a logged-in client and the page's links."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse

from recovery.choices import AuditKind
from recovery.models import AuditEvent, Cluster, Workload
from tests.conftest import TEST_PASSWORD
from tests.factories import ClusterFactory, WorkloadFactory

T0 = datetime(2025, 3, 14, 9, 0, tzinfo=UTC)
AUDIT = reverse("console:audit")
EXPORT = reverse("console:audit_csv")


def logged_in(user: User) -> Client:
    client = Client()
    assert client.login(username=user.username, password=TEST_PASSWORD)
    return client


def record(
    cluster: Cluster,
    kind: str = AuditKind.DETECTED,
    *,
    at: datetime = T0,
    actor: str = "policy",
    workload: Workload | None = None,
    attempt: int | None = None,
    payload: Any = None,
) -> AuditEvent:
    return AuditEvent.objects.create(
        cluster=cluster,
        workload=workload,
        attempt=attempt,
        kind=kind,
        actor=actor,
        payload={} if payload is None else payload,
        occurred_at=at,
    )


def row_ids(body: str) -> list[int]:
    """Event ids of the trail's rows, in page order."""
    table = body[body.index("<tbody") : body.index("</tbody>")]
    return [int(found) for found in re.findall(r'<tr id="event-(\d+)"', table)]


def link(body: str, rel: str) -> str | None:
    found = re.search(rf'href="([^"]+)" rel="{rel}"', body)
    return found.group(1).replace("&amp;", "&") if found else None


def required_link(body: str, rel: str) -> str:
    """The page's ``rel`` link, to follow; the test fails when the page has none."""
    href = link(body, rel)
    assert href is not None, f"no {rel} link"
    return href


@pytest.fixture
def trail() -> dict[str, Any]:
    """Two clusters, three workloads and a handful of events over two hours."""
    lab = ClusterFactory(name="lab")
    prod = ClusterFactory(name="prod")
    train = WorkloadFactory(cluster=lab, job_id="40001", name="llama-pretrain")
    other = WorkloadFactory(cluster=lab, job_id="40002", name="bert-finetune")
    remote = WorkloadFactory(cluster=prod, job_id="40001", name="same-job-id-elsewhere")
    events = {
        "detected": record(
            lab,
            AuditKind.DETECTED,
            at=T0,
            workload=train,
            attempt=1,
            payload={"category": "gpu_hardware", "exit_code": 137},
        ),
        "recommended": record(
            lab, AuditKind.RECOMMENDED, at=T0 + timedelta(minutes=1), workload=train, attempt=1
        ),
        "approved": record(
            lab,
            AuditKind.APPROVED,
            at=T0 + timedelta(minutes=5),
            actor="otto",
            workload=train,
            attempt=1,
            payload={"note": "go"},
        ),
        "other": record(lab, AuditKind.DETECTED, at=T0 + timedelta(minutes=30), workload=other),
        "remote": record(
            prod, AuditKind.STATE_CHANGED, at=T0 + timedelta(hours=1), workload=remote
        ),
        "cluster_wide": record(
            prod, AuditKind.NODE_SUSPECT, at=T0 + timedelta(hours=2), actor="policy-engine"
        ),
    }
    return {"lab": lab, "prod": prod, "train": train, "other": other, "events": events}


def ids_of(trail: dict[str, Any], *names: str) -> list[int]:
    return [trail["events"][name].pk for name in names]


@pytest.fixture
def tied_events() -> list[AuditEvent]:
    """Eleven events at three instants: many share an occurred_at, only the id tells them
    apart. Newest first, as the trail shows them."""
    lab = ClusterFactory(name="lab")
    events = [record(lab, at=T0 + timedelta(seconds=(n % 3)), payload={"n": n}) for n in range(11)]
    return sorted(events, key=lambda e: (e.occurred_at, e.pk), reverse=True)
