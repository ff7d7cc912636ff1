"""The navigation's count of recommendations awaiting approval, and the JSON that keeps it live."""

from __future__ import annotations

import re

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse

from console.views.approvals_count import (
    BADGE_COUNT_LIMIT,
    COUNT_CHANGING_KINDS,
    AwaitingApproval,
)
from recovery.choices import AuditKind, RecommendationAction, RecommendationStatus
from recovery.models import Recommendation
from tests.conftest import TEST_PASSWORD
from tests.factories import RecommendationFactory, WorkloadFactory

pytestmark = pytest.mark.django_db

COUNT_URL = "/approvals/count/"


def logged_in(user: User) -> Client:
    client = Client()
    assert client.login(username=user.username, password=TEST_PASSWORD)
    return client


def approvals_link(body: str) -> str:
    """The navigation's Approvals link, with what it holds."""
    nav = body.split('<nav class="site-nav"', 1)[1].split("</nav>", 1)[0]
    found = re.search(r'<a href="/approvals/"[^>]*>.*?</a>', nav, re.S)
    assert found is not None, nav
    return found.group(0)


def awaiting(count: int) -> None:
    """``count`` recommendations awaiting approval, on one workload, in one statement."""
    workload = WorkloadFactory()
    Recommendation.objects.bulk_create(
        Recommendation(
            workload=workload,
            action=RecommendationAction.RESTART,
            reason="NCCL watchdog timeout",
            status=RecommendationStatus.AWAITING_APPROVAL,
            idempotency_key=f"badge:{workload.pk}:{n}",
        )
        for n in range(count)
    )


def test_the_approvals_link_shows_how_many_await_approval(viewer: User) -> None:
    RecommendationFactory()
    RecommendationFactory()
    RecommendationFactory(status=RecommendationStatus.READY)
    RecommendationFactory(status=RecommendationStatus.REJECTED)

    link = approvals_link(logged_in(viewer).get(reverse("console:fleet")).content.decode())

    assert (
        '<span class="nav-count__badge" aria-hidden="true" title="2 awaiting approval">2</span>'
        in link
    )
    # What a screen reader says: the link's name is "Approvals (2 awaiting approval)".
    assert '<span class="visually-hidden"> (2 awaiting approval)</span>' in link


def test_it_shows_on_every_page_for_a_viewer(viewer: User) -> None:
    recommendation = RecommendationFactory()
    client = logged_in(viewer)
    for url in (
        reverse("console:nodes"),
        reverse("console:unexplained"),
        reverse("console:workload", args=[recommendation.workload.pk]),
        reverse("console:audit"),
    ):
        assert " (1 awaiting approval)<" in approvals_link(client.get(url).content.decode()), url


def test_nothing_awaiting_shows_no_number_but_keeps_the_place_for_one(operator: User) -> None:
    RecommendationFactory(status=RecommendationStatus.EXECUTED)
    link = approvals_link(logged_in(operator).get(reverse("console:fleet")).content.decode())
    assert "nav-count__badge" not in link
    assert re.search(r'<span id="nav-approvals-count"[^>]*></span>', link)


def test_the_count_is_bounded(viewer: User) -> None:
    awaiting(BADGE_COUNT_LIMIT + 5)
    link = approvals_link(logged_in(viewer).get(reverse("console:fleet")).content.decode())
    assert 'title="More than 99 awaiting approval">99+</span>' in link
    assert " (more than 99 awaiting approval)<" in link


@pytest.mark.parametrize(
    ("count", "text", "label"),
    [
        (0, "", "0 awaiting approval"),
        (1, "1", "1 awaiting approval"),
        (99, "99", "99 awaiting approval"),
        (100, "99+", "more than 99 awaiting approval"),
    ],
)
def test_the_badge_words(count: int, text: str, label: str) -> None:
    badge = AwaitingApproval(count=count)
    assert (badge.text, badge.label, badge.more) == (text, label, count > 99)


def test_anonymous_readers_and_users_without_a_role_see_no_count(outsider: User) -> None:
    RecommendationFactory()
    assert "nav-approvals-count" not in Client().get(reverse("login")).content.decode()
    assert "nav_badge.js" not in Client().get(reverse("login")).content.decode()
    refused = logged_in(outsider).get(reverse("console:fleet"))
    assert refused.status_code == 403
    assert "nav-approvals-count" not in refused.content.decode()


def test_the_page_says_which_events_change_the_count(viewer: User) -> None:
    body = logged_in(viewer).get(reverse("console:fleet")).content.decode()
    kinds = re.search(r'data-count-kinds="([^"]*)"', body)
    assert kinds is not None
    assert kinds.group(1).split() == [str(kind) for kind in COUNT_CHANGING_KINDS]
    # Every way a recommendation enters or leaves "awaiting approval" is among them.
    assert {AuditKind.RECOMMENDED, AuditKind.APPROVED, AuditKind.REJECTED} <= set(
        COUNT_CHANGING_KINDS
    )
    assert {AuditKind.SUPERSEDED, AuditKind.EXPIRED} <= set(COUNT_CHANGING_KINDS)
    assert f'data-count-url="{COUNT_URL}"' in body
    assert "console/nav_badge.js" in body


# ---------- the JSON ----------


def test_the_count_as_json(viewer: User) -> None:
    RecommendationFactory()
    RecommendationFactory()
    response = logged_in(viewer).get(reverse("console:approvals_count"))
    assert reverse("console:approvals_count") == COUNT_URL
    assert response.status_code == 200
    assert response.json() == {
        "count": 2,
        "more": False,
        "text": "2",
        "label": "2 awaiting approval",
    }
    assert "no-store" in response["Cache-Control"]


def test_the_json_count_is_bounded(operator: User) -> None:
    awaiting(BADGE_COUNT_LIMIT + 1)
    answer = logged_in(operator).get(COUNT_URL).json()
    assert answer == {
        "count": BADGE_COUNT_LIMIT,
        "more": True,
        "text": "99+",
        "label": "more than 99 awaiting approval",
    }


def test_the_json_needs_a_signed_in_user_with_a_role(outsider: User) -> None:
    RecommendationFactory()
    anonymous = Client().get(COUNT_URL)
    assert anonymous.status_code == 302
    assert anonymous["Location"].startswith(reverse("login"))
    assert logged_in(outsider).get(COUNT_URL).status_code == 403


def test_the_json_is_read_only(operator: User) -> None:
    assert logged_in(operator).post(COUNT_URL).status_code == 405
