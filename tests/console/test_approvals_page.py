"""The approval queue: what each one-line card tells (how the crash behind a recommendation was
confirmed, the job's mode, the excluded nodes, whether a controller will carry out an approval),
and deciding on several recommendations at once."""

from __future__ import annotations

import html
import re
from collections.abc import Callable
from datetime import timedelta

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from console.forms import MAX_BULK_DECISIONS
from recovery.choices import (
    AnomalyKind,
    AuditKind,
    ClusterMode,
    Confirmation,
    OptInMode,
    RecommendationStatus,
)
from recovery.loop.recommendations import reject
from recovery.models import AuditEvent, Cluster, ControllerToken, Recommendation
from recovery.roles import OPERATOR
from tests.conftest import TEST_PASSWORD
from tests.factories import AnomalyFactory, ClusterFactory, RecommendationFactory, WorkloadFactory

pytestmark = pytest.mark.django_db


def logged_in(user: User) -> Client:
    client = Client()
    assert client.login(username=user.username, password=TEST_PASSWORD)
    return client


def test_a_recommendation_shows_its_crashs_confirmation(viewer: User) -> None:
    """GIVEN a recommendation for a stalled crash and one for a hang
    WHEN a viewer opens the approval queue
    THEN the stalled crash is badged as such, and the hang has no confirmation badge
    """
    stalled = AnomalyFactory(confirmation=Confirmation.STALLED)
    hang = AnomalyFactory(kind=AnomalyKind.HANG)
    RecommendationFactory(workload=stalled.workload, anomaly=stalled)
    RecommendationFactory(workload=hang.workload, anomaly=hang)

    body = logged_in(viewer).get(reverse("console:approvals")).content.decode()

    assert body.count('class="badge confirmation-') == 1
    assert (
        '<span class="badge confirmation-stalled"'
        ' title="Stalled (no exit, no progress: handled as a hang)">Stalled</span>'
    ) in body


def test_the_job_and_the_cluster_say_why_a_recommendation_waits(viewer: User) -> None:
    """GIVEN an acknowledged action-mode cluster and a job on it opted in to be observed
    WHEN a viewer opens the approval queue and the job's page
    THEN both say the job's mode holds its actions for approval, and the cluster's mode beside it
    """
    cluster = ClusterFactory(mode=ClusterMode.ACTION, acknowledge_scheduler_actions=True)
    observed = WorkloadFactory(cluster=cluster, opt_in_mode=OptInMode.OBSERVE)
    acting = WorkloadFactory(cluster=cluster)
    RecommendationFactory(workload=observed)
    client = logged_in(viewer)

    queue = client.get(reverse("console:approvals")).content.decode()
    assert "action mode" in queue
    assert "its owner asked for observation: acts only on approval" in queue

    page = client.get(reverse("console:workload", args=[observed.pk])).content.decode()
    assert "acts only on approval, whatever the cluster's mode" in page
    page = client.get(reverse("console:workload", args=[acting.pk])).content.decode()
    assert "the cluster's mode decides: acts automatically" in page


def test_each_excluded_node_says_where_it_came_from(viewer: User) -> None:
    recommendation = RecommendationFactory(
        excluded_nodes=["gpu-003", "gpu-007"],
        exclusion_sources={"gpu-003": "cluster: unhealthy", "gpu-007": "implicated"},
    )
    queue = logged_in(viewer).get(reverse("console:approvals")).content.decode()
    assert 'gpu-003 <span class="muted">(cluster: unhealthy)</span>' in queue
    page = (
        logged_in(viewer)
        .get(reverse("console:workload", args=[recommendation.workload.pk]))
        .content.decode()
    )
    assert 'gpu-007 <span class="muted">(implicated)</span>' in page


# ---------- deciding on several recommendations at once ----------

BULK_NOTE = "Xid 79 storm on the a100 rack: restart all, excluding the bad nodes"


def awaiting(cluster: Cluster | None = None, **extra: object) -> Recommendation:
    cluster = cluster or ClusterFactory()
    return RecommendationFactory(workload=WorkloadFactory(cluster=cluster), **extra)


def bulk(
    client: Client, ids: list[object], decision: str = "approve", note: str = BULK_NOTE
) -> str:
    """Post the bulk form as the page sends it; the text of the page it redirects to."""
    answer = client.post(
        reverse("console:bulk_decide"),
        {"recommendation": ids, "decision": decision, "note": note, "next": "/approvals/"},
        follow=True,
    )
    assert answer.status_code == 200, answer.status_code
    assert answer.redirect_chain[0][0] == "/approvals/"
    return answer.content.decode()


def decided_events(recommendation: Recommendation, kind: str) -> list[AuditEvent]:
    return [
        event
        for event in AuditEvent.objects.filter(workload=recommendation.workload, kind=kind)
        if event.payload.get("recommendation") == recommendation.pk
    ]


def statuses(*recommendations: Recommendation) -> list[str]:
    return [Recommendation.objects.get(pk=r.pk).status for r in recommendations]


def messages_of(body: str) -> list[tuple[str, str]]:
    """(level, text) of each message the page shows."""
    return [
        (level, html.unescape(text))
        for level, text in re.findall(
            r'<li class="message message--(\w+)"[^>]*>(.*?)</li>', body, flags=re.S
        )
    ]


def test_an_operator_approves_three_at_once_each_audited_on_its_own(operator: User) -> None:
    """GIVEN three recommendations awaiting approval
    WHEN an operator approves the three with one note
    THEN each is ready, decided by the operator, with its own `approved` event carrying the note,
    AND one message says all three were approved
    """
    cluster = ClusterFactory()
    chosen = [awaiting(cluster) for _ in range(3)]

    body = bulk(logged_in(operator), [r.pk for r in chosen])

    assert statuses(*chosen) == [RecommendationStatus.READY] * 3
    for recommendation in chosen:
        recommendation.refresh_from_db()
        assert recommendation.decided_by == operator.get_username()
        assert recommendation.decision_note == BULK_NOTE
        (event,) = decided_events(recommendation, AuditKind.APPROVED)
        assert (event.actor, event.payload["note"]) == (operator.get_username(), BULK_NOTE)
    ids = ", ".join(str(r.pk) for r in chosen)
    assert ("success", f"Approved 3 of 3: recommendations {ids}.") in messages_of(body)


def test_a_bulk_reject_rejects_each_with_the_note(operator: User) -> None:
    chosen = [awaiting() for _ in range(2)]

    body = bulk(logged_in(operator), [r.pk for r in chosen], decision="reject")

    assert statuses(*chosen) == [RecommendationStatus.REJECTED] * 2
    for recommendation in chosen:
        (event,) = decided_events(recommendation, AuditKind.REJECTED)
        assert event.payload["note"] == BULK_NOTE
    assert messages_of(body)[0][1].startswith("Rejected 2 of 2: recommendations ")
    # A rejection is not carried out by anybody: no word about controllers.
    assert [level for level, _ in messages_of(body)] == ["success"]


def test_one_already_decided_is_named_and_the_others_are_approved(
    operator: User, make_user: Callable[..., User]
) -> None:
    """GIVEN five recommendations, one of which another operator rejected meanwhile
    WHEN an operator approves the five
    THEN the four others are approved, the rejected one stays rejected with no second event,
    AND the message says 4 of 5 and who rejected the fifth
    """
    cluster = ClusterFactory()
    chosen = [awaiting(cluster) for _ in range(5)]
    ruth = make_user("ruth", OPERATOR)
    reject(chosen[2].pk, operator=ruth.get_username(), note="not this one")

    body = bulk(logged_in(operator), [r.pk for r in chosen])

    assert statuses(*chosen) == [
        RecommendationStatus.READY,
        RecommendationStatus.READY,
        RecommendationStatus.REJECTED,
        RecommendationStatus.READY,
        RecommendationStatus.READY,
    ]
    assert decided_events(chosen[2], AuditKind.APPROVED) == []
    assert len(decided_events(chosen[2], AuditKind.REJECTED)) == 1
    assert (
        "success",
        f"Approved 4 of 5: recommendation {chosen[2].pk} was already rejected by ruth.",
    ) in messages_of(body)


def test_approving_again_what_is_already_approved_changes_nothing(operator: User) -> None:
    chosen = [awaiting() for _ in range(2)]
    client = logged_in(operator)
    bulk(client, [r.pk for r in chosen])

    body = bulk(client, [r.pk for r in chosen])

    assert all(len(decided_events(r, AuditKind.APPROVED)) == 1 for r in chosen)
    (level, text), *_ = messages_of(body)
    assert level == "info"
    assert text == (
        f"Approved 0 of 2: recommendation {chosen[0].pk} was already approved by otto (now ready); "
        f"recommendation {chosen[1].pk} was already approved by otto (now ready)."
    )


def test_a_viewer_is_refused_and_nothing_changes(viewer: User) -> None:
    chosen = [awaiting() for _ in range(2)]

    answer = logged_in(viewer).post(
        reverse("console:bulk_decide"),
        {"recommendation": [r.pk for r in chosen], "decision": "approve", "note": "forged"},
    )

    assert answer.status_code == 403
    assert "Only operators may approve or reject" in answer.content.decode()
    assert statuses(*chosen) == [RecommendationStatus.AWAITING_APPROVAL] * 2
    assert not AuditEvent.objects.exists()


def test_a_signed_out_caller_is_sent_to_log_in() -> None:
    recommendation = awaiting()
    answer = Client().post(
        reverse("console:bulk_decide"),
        {"recommendation": [recommendation.pk], "decision": "approve"},
    )
    assert answer.status_code == 302 and "/accounts/login/" in answer["Location"]
    assert statuses(recommendation) == [RecommendationStatus.AWAITING_APPROVAL]


def test_the_bulk_decision_takes_only_post(operator: User) -> None:
    assert logged_in(operator).get(reverse("console:bulk_decide")).status_code == 405


@pytest.mark.parametrize(
    ("given", "decision", "problem"),
    [
        (lambda ids: [*ids, "12abc"], "approve", "Not a recommendation id: '12abc'."),
        (lambda ids: [*ids, "-3"], "approve", "Not a recommendation id: '-3'."),
        (lambda ids: [*ids, str(2**70)], "approve", "Not a recommendation id:"),
        (lambda ids: [*ids, ids[0]], "approve", "Selected more than once: recommendation "),
        (lambda ids: [*ids, 999999], "approve", "No such recommendation: 999999."),
        (lambda ids: [], "approve", "Select at least one recommendation."),
        (lambda ids: ids, "execute", "Choose to approve or to reject the selection."),
        (lambda ids: ids, "", "Choose to approve or to reject the selection."),
    ],
    ids=["not-a-number", "negative", "too-large", "duplicate", "unknown", "none", "bad", "no-verb"],
)
def test_invalid_ids_decide_nothing_and_say_why(
    operator: User, given: Callable[[list[object]], list[object]], decision: str, problem: str
) -> None:
    chosen = [awaiting() for _ in range(2)]

    body = bulk(logged_in(operator), given([r.pk for r in chosen]), decision=decision)

    assert statuses(*chosen) == [RecommendationStatus.AWAITING_APPROVAL] * 2
    assert not AuditEvent.objects.exists()
    (level, text), *_ = messages_of(body)
    assert level == "error"
    assert text.startswith("Nothing was decided. ") and problem in text, text


def test_a_note_too_long_decides_nothing(operator: User) -> None:
    recommendation = awaiting()
    body = bulk(logged_in(operator), [recommendation.pk], note="x" * 2001)
    assert statuses(recommendation) == [RecommendationStatus.AWAITING_APPROVAL]
    assert messages_of(body) == [
        ("error", "Nothing was decided. The note is longer than 2000 characters.")
    ]


def test_more_than_a_page_is_refused(operator: User) -> None:
    """GIVEN 51 recommendations awaiting approval (a page holds 50)
    WHEN an operator sends all 51 ids
    THEN none is decided, and the message says at most 50
    """
    cluster = ClusterFactory()
    workload = WorkloadFactory(cluster=cluster)
    chosen = [RecommendationFactory(workload=workload) for _ in range(MAX_BULK_DECISIONS + 1)]

    body = bulk(logged_in(operator), [r.pk for r in chosen])

    assert not Recommendation.objects.exclude(
        status=RecommendationStatus.AWAITING_APPROVAL
    ).exists()
    assert not AuditEvent.objects.exists()
    assert (
        "error",
        "Nothing was decided. 51 recommendations were selected: at most 50 (one page of the "
        "queue) are decided at once.",
    ) in messages_of(body)


def test_a_bulk_decision_does_not_redirect_off_site(operator: User) -> None:
    recommendation = awaiting()
    answer = logged_in(operator).post(
        reverse("console:bulk_decide"),
        {
            "recommendation": [recommendation.pk],
            "decision": "reject",
            "next": "https://evil.example/",
        },
    )
    assert answer["Location"] == reverse("console:approvals")
    answer = logged_in(operator).post(
        reverse("console:bulk_decide"), {"recommendation": ["x"], "next": "//evil.example/"}
    )
    assert answer["Location"] == reverse("console:approvals")


# ---------- the page: checkboxes and the bulk bar for operators only ----------


def test_operators_get_a_checkbox_per_card_and_the_bulk_bar_viewers_do_not(
    operator: User, viewer: User
) -> None:
    chosen = [awaiting() for _ in range(2)]
    page = logged_in(operator).get(reverse("console:approvals")).content.decode()
    assert 'id="bulk-decision"' in page and reverse("console:bulk_decide") in page
    for r in chosen:
        assert (
            f'<input type="checkbox" id="select-{r.pk}" '
            f'name="recommendation" value="{r.pk}" form="bulk-decision">'
        ) in page

    page = logged_in(viewer).get(reverse("console:approvals")).content.decode()
    assert 'id="bulk-decision"' not in page and reverse("console:bulk_decide") not in page
    assert 'type="checkbox"' not in page
    assert all(r.reason in page for r in chosen)


def test_select_all_ticks_the_cards_of_this_page_only(operator: User) -> None:
    """GIVEN 52 recommendations: two pages
    WHEN the operator follows "Select all on this page" on the first page
    THEN exactly its 50 cards are ticked; the link names them, so a card arriving later (or on
         another page) is never ticked unseen
    """
    workload = WorkloadFactory()
    chosen = [RecommendationFactory(workload=workload) for _ in range(52)]
    client = logged_in(operator)
    page = client.get(reverse("console:approvals")).content.decode()
    (link,) = re.findall(
        r'<a class="button button--quiet" href="([^"]*)">Select all on this page', page
    )
    link = html.unescape(link)
    assert link == "?" + "&".join(f"select={r.pk}" for r in chosen[:50])

    ticked = client.get(reverse("console:approvals") + link).content.decode()

    assert ticked.count('form="bulk-decision" checked>') == 50
    later = RecommendationFactory(workload=workload)
    page2 = client.get(reverse("console:approvals") + link + f"&select={later.pk}&page=2")
    assert 'form="bulk-decision" checked>' in page2.content.decode()  # the page's own tick
    assert page2.content.decode().count('form="bulk-decision" checked>') == 1
    assert "Clear selection" in ticked


# ---------- controllers: the approval waits where none calls in ----------


# The card's short warning; its title and a screen reader's text say the whole sentence.
WAIT_LABEL = '<span class="decision__wait-label" aria-hidden="true">No controller</span>'


def a_controller(cluster: Cluster, seen_ago: timedelta | None) -> ControllerToken:
    token, _key = ControllerToken.issue(cluster, "login-1")
    if seen_ago is not None:
        ControllerToken.objects.filter(pk=token.pk).update(last_used_at=timezone.now() - seen_ago)
    return token


@pytest.mark.parametrize(
    ("seen_ago", "warning"),
    [
        (None, "No controller token is issued for {}: an approved recommendation will wait"),
        (
            timedelta(minutes=20),
            "No controller has called in for {} for 20\N{NO-BREAK SPACE}minutes: this will wait.",
        ),
    ],
    ids=["no-token", "silent-20-min"],
)
def test_a_card_warns_before_approving_where_no_controller_calls_in(
    operator: User, viewer: User, seen_ago: timedelta | None, warning: str
) -> None:
    cluster = ClusterFactory(name="train-a100")
    recommendation = awaiting(cluster)
    if seen_ago is not None:
        a_controller(cluster, seen_ago)
    sentence = warning.format("train-a100")

    for user in (operator, viewer):
        page = logged_in(user).get(reverse("console:approvals")).content.decode()
        card = page[page.index(f'id="recommendation-{recommendation.pk}"') :]
        line = card[: card.index("<details")]
        assert 'class="decision__wait' in line and WAIT_LABEL in line
        assert sentence in line  # the title and the screen reader's text
        # The controllers of the queue's cluster, above the cards.
        assert 'data-cluster="train-a100"' in page[: page.index('class="card-list')]


def test_no_warning_where_a_controller_called_in_seconds_ago(operator: User) -> None:
    cluster = ClusterFactory(name="train-a100")
    recommendation = awaiting(cluster)
    a_controller(cluster, timedelta(seconds=10))

    page = logged_in(operator).get(reverse("console:approvals")).content.decode()

    assert 'class="decision__wait' not in page
    assert "this will wait" not in page and "No controller" not in page
    assert "Controllers of train-a100:" in page
    # Ten seconds when the controller called, and a little more by the time the page is built
    # on a busy machine.
    called = re.search(r"called in (\d+) s ago", page)
    assert called is not None and 10 <= int(called[1]) <= 20, called
    assert f'id="recommendation-{recommendation.pk}"' in page


def test_only_the_cluster_without_controller_warns(operator: User) -> None:
    quiet, busy = ClusterFactory(name="quiet"), ClusterFactory(name="busy")
    waiting, taken_up = awaiting(quiet), awaiting(busy)
    a_controller(busy, timedelta(seconds=10))

    page = logged_in(operator).get(reverse("console:approvals")).content.decode()

    def line_of(r: Recommendation) -> str:
        card = page[page.index(f'id="recommendation-{r.pk}"') :]
        return card[: card.index("<details")]

    assert WAIT_LABEL in line_of(waiting)
    assert WAIT_LABEL not in line_of(taken_up) and "decision__wait" not in line_of(taken_up)


def test_the_filtered_cluster_shows_its_controllers_even_with_no_card(viewer: User) -> None:
    ClusterFactory(name="idle")
    awaiting(ClusterFactory(name="other"))
    page = logged_in(viewer).get(reverse("console:approvals"), {"cluster": "idle"}).content
    assert b'data-cluster="idle"' in page and b'data-cluster="other"' not in page


def test_the_page_reads_the_controllers_in_one_query(viewer: User) -> None:
    for n in range(4):
        cluster = ClusterFactory(name=f"c{n}")
        a_controller(cluster, timedelta(seconds=n))
        awaiting(cluster)
    client = logged_in(viewer)
    client.get(reverse("console:approvals"))  # the session and the roles, cached from here
    with CaptureQueriesContext(connection) as queries:
        client.get(reverse("console:approvals"))
    assert sum("controllertoken" in q["sql"].lower() for q in queries.captured_queries) == 1


def test_approving_where_no_controller_calls_in_warns_after_too(operator: User) -> None:
    """GIVEN a recommendation on a cluster whose only controller went silent 20 minutes ago
    WHEN an operator approves it, alone and then in bulk
    THEN the message says it was approved, and a warning says it will wait
    """
    cluster = ClusterFactory(name="train-a100")
    first, second = awaiting(cluster), awaiting(cluster)
    a_controller(cluster, timedelta(minutes=20))
    client = logged_in(operator)
    sentence = (
        "No controller has called in for train-a100 for "
        "20\N{NO-BREAK SPACE}minutes: this will wait."
    )

    answer = client.post(
        reverse("console:approve", args=[first.pk]), {"next": "/approvals/"}, follow=True
    )

    assert messages_of(answer.content.decode()) == [
        ("success", f"Recommendation {first.pk}: Approved."),
        ("warning", sentence),
    ]
    body = bulk(client, [second.pk])
    assert messages_of(body) == [
        ("success", f"Approved 1 of 1: recommendation {second.pk}."),
        ("warning", sentence),
    ]
    assert statuses(first, second) == [RecommendationStatus.READY] * 2


def test_no_warning_after_approving_where_a_controller_calls_in(operator: User) -> None:
    cluster = ClusterFactory(name="train-a100")
    first, second = awaiting(cluster), awaiting(cluster)
    a_controller(cluster, timedelta(seconds=10))
    client = logged_in(operator)

    answer = client.post(
        reverse("console:approve", args=[first.pk]), {"next": "/approvals/"}, follow=True
    )
    assert [level for level, _ in messages_of(answer.content.decode())] == ["success"]
    assert [level for level, _ in messages_of(bulk(client, [second.pk]))] == ["success"]


def test_a_rejection_or_an_unchanged_approval_does_not_warn(operator: User) -> None:
    cluster = ClusterFactory(name="train-a100")
    recommendation = awaiting(cluster)
    client = logged_in(operator)
    reject(recommendation.pk, operator="ruth")

    answer = client.post(
        reverse("console:approve", args=[recommendation.pk]), {"next": "/approvals/"}, follow=True
    )

    assert messages_of(answer.content.decode()) == [
        ("info", f"Recommendation {recommendation.pk}: Not awaiting approval: it is rejected.")
    ]
