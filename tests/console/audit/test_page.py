"""The audit trail page: filters, keyset pages, permalinks, access."""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.http import QueryDict
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone
from django.utils.html import escape

from console.formatting import trail_query_params
from recovery.audit import trail as audit_trail
from recovery.audit.trail import (
    AuditFilters,
    Cursor,
    InvalidCursor,
    WorkloadRef,
    decode_cursor,
    encode_cursor,
    events_page,
)
from recovery.choices import AuditKind
from recovery.models import AuditEvent
from recovery.read.filters import AuditTrailFilterSet
from tests.console.audit.conftest import (
    AUDIT,
    EXPORT,
    T0,
    ids_of,
    link,
    logged_in,
    record,
    required_link,
    row_ids,
)
from tests.factories import ClusterFactory, WorkloadFactory

pytestmark = pytest.mark.django_db

# ---------- the page ----------


def test_a_viewer_sees_every_event_newest_first(viewer: User, trail: dict[str, Any]) -> None:
    response = logged_in(viewer).get(AUDIT)
    assert response.status_code == 200
    body = response.content.decode()
    assert row_ids(body) == ids_of(
        trail, "cluster_wide", "remote", "other", "approved", "recommended", "detected"
    )
    detected = trail["events"]["detected"]
    assert f'href="{reverse("console:audit_event", args=[detected.pk])}"' in body
    assert f'href="{reverse("console:workload", args=[trail["train"].pk])}"' in body
    assert '<time datetime="2025-03-14T09:00:00+00:00">2025-03-14 09:00:00</time>' in body
    assert "Node flagged as suspect" in body  # the kind's label, not its value
    assert "exit_code:</span> 137" in body
    assert "category:</span> gpu_hardware" in body
    assert "console/audit.css" in body


def test_it_filters_by_cluster(viewer: User, trail: dict[str, Any]) -> None:
    body = logged_in(viewer).get(AUDIT, {"cluster": "prod"}).content.decode()
    assert row_ids(body) == ids_of(trail, "cluster_wide", "remote")


def test_it_filters_by_workload_id(viewer: User, trail: dict[str, Any]) -> None:
    body = logged_in(viewer).get(AUDIT, {"workload": trail["train"].pk}).content.decode()
    assert row_ids(body) == ids_of(trail, "approved", "recommended", "detected")


def test_it_filters_by_cluster_and_job_id(viewer: User, trail: dict[str, Any]) -> None:
    client = logged_in(viewer)
    body = client.get(AUDIT, {"workload": "lab:40001"}).content.decode()
    assert row_ids(body) == ids_of(trail, "approved", "recommended", "detected")
    body = client.get(AUDIT, {"workload": "prod:40001"}).content.decode()
    assert row_ids(body) == ids_of(trail, "remote")


def test_a_job_id_reused_by_slurm_shows_every_workload_that_had_it(
    viewer: User, trail: dict[str, Any]
) -> None:
    """GIVEN a job id that Slurm handed out twice on one cluster
    WHEN the trail is filtered by cluster:job id
    THEN the events of both workloads show."""
    reused = WorkloadFactory(
        cluster=trail["lab"], job_id="40001", submit_time=T0 - timedelta(days=30)
    )
    old = record(trail["lab"], at=T0 - timedelta(days=29), workload=reused)
    body = logged_in(viewer).get(AUDIT, {"workload": "lab:40001"}).content.decode()
    assert row_ids(body) == [*ids_of(trail, "approved", "recommended", "detected"), old.pk]


def test_an_unknown_workload_matches_nothing(viewer: User, trail: dict[str, Any]) -> None:
    client = logged_in(viewer)
    for value in ("lab:99999", "987654"):
        response = client.get(AUDIT, {"workload": value})
        assert response.status_code == 200
        assert row_ids(response.content.decode()) == []
        assert "No event matches these filters." in response.content.decode()


def test_it_filters_by_one_kind_or_several(viewer: User, trail: dict[str, Any]) -> None:
    client = logged_in(viewer)
    body = client.get(AUDIT, {"kind": "detected"}).content.decode()
    assert row_ids(body) == ids_of(trail, "other", "detected")
    body = client.get(AUDIT, {"kind": ["detected", "approved"]}).content.decode()
    assert row_ids(body) == ids_of(trail, "other", "approved", "detected")
    body = client.get(AUDIT, {"kind": "approved,node_suspect"}).content.decode()
    assert row_ids(body) == ids_of(trail, "cluster_wide", "approved")
    assert 'value="approved" checked' in body


def test_it_filters_by_exact_actor(viewer: User, trail: dict[str, Any]) -> None:
    client = logged_in(viewer)
    body = client.get(AUDIT, {"actor": "otto"}).content.decode()
    assert row_ids(body) == ids_of(trail, "approved")
    # Exact, not a prefix: "policy" leaves out "policy-engine".
    body = client.get(AUDIT, {"actor": "policy"}).content.decode()
    assert trail["events"]["cluster_wide"].pk not in row_ids(body)
    assert len(row_ids(body)) == 4


def test_it_filters_by_time_range_inclusively(viewer: User, trail: dict[str, Any]) -> None:
    body = (
        logged_in(viewer)
        .get(AUDIT, {"from": "2025-03-14T09:01", "to": "2025-03-14T09:30"})
        .content.decode()
    )
    assert row_ids(body) == ids_of(trail, "other", "approved", "recommended")
    assert 'value="2025-03-14T09:01"' in body


def test_a_time_with_an_offset_is_read_in_utc(viewer: User, trail: dict[str, Any]) -> None:
    body = logged_in(viewer).get(AUDIT, {"from": "2025-03-14T11:00:00+01:00"}).content.decode()
    assert row_ids(body) == ids_of(trail, "cluster_wide", "remote")


def test_quick_ranges_count_back_from_now(viewer: User, trail: dict[str, Any]) -> None:
    lab = trail["lab"]
    now = timezone.now()
    recent = record(lab, at=now - timedelta(minutes=10))
    yesterday = record(lab, at=now - timedelta(hours=20))
    last_week = record(lab, at=now - timedelta(days=3))
    client = logged_in(viewer)
    assert row_ids(client.get(AUDIT, {"range": "1h"}).content.decode()) == [recent.pk]
    assert row_ids(client.get(AUDIT, {"range": "24h"}).content.decode()) == [
        recent.pk,
        yesterday.pk,
    ]
    body = client.get(AUDIT, {"range": "7d", "cluster": "lab"}).content.decode()
    assert row_ids(body) == [recent.pk, yesterday.pk, last_week.pk]
    # The quick range links keep the other filters.
    assert 'href="/audit/?cluster=lab&amp;range=1h"' in body


def test_a_quick_range_replaces_from_and_to_and_says_so(
    viewer: User, trail: dict[str, Any]
) -> None:
    body = logged_in(viewer).get(AUDIT, {"range": "1h", "from": "2025-03-14T09:00"}).content
    assert "“Last hour” replaces the From and To dates." in body.decode()
    assert row_ids(body.decode()) == []


def test_filters_combine(viewer: User, trail: dict[str, Any]) -> None:
    body = (
        logged_in(viewer)
        .get(
            AUDIT,
            {
                "cluster": "lab",
                "workload": "lab:40001",
                "kind": ["approved", "recommended"],
                "actor": "policy",
                "from": "2025-03-14T08:00",
                "to": "2025-03-14T10:00",
            },
        )
        .content.decode()
    )
    assert row_ids(body) == ids_of(trail, "recommended")


def test_no_event_yet_says_so(viewer: User) -> None:
    body = logged_in(viewer).get(AUDIT).content.decode()
    assert "No events recorded yet." in body


# ---------- bad input ----------


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"kind": "exploded"}, "There is no event kind “exploded”; it is ignored."),
        ({"from": "yesterday"}, "“From” is not a date and time: “yesterday”"),
        ({"to": "2025-13-45T99:99"}, "“To” is not a date and time"),
        ({"from": "0001-01-01T00:00"}, "“From” is not a date and time"),
        ({"workload": "llama"}, "“llama” is not a workload"),
        ({"workload": "lab:"}, "“lab:” is not a workload"),
        ({"workload": "9" * 30}, "No workload can have the id"),
        ({"cluster": "atlantis"}, "No cluster is named “atlantis”; showing every cluster."),
        ({"range": "forever"}, "“forever” is not a quick range"),
        ({"actor": "x" * 200}, "An actor is at most 150 characters"),
        (
            {"from": "2025-03-14T10:00", "to": "2025-03-14T09:00"},
            "“To” is before “From”, so the time range is ignored.",
        ),
        ({"cursor": "not-a-cursor!!"}, "That page link cannot be read"),
        ({"cursor": encode_cursor(Cursor("older", T0, 1))[:-3] + "xyz"}, "cannot be read"),
    ],
)
def test_a_bad_value_is_ignored_with_the_reason_shown(
    viewer: User, trail: dict[str, Any], params: dict[str, str], message: str
) -> None:
    response = logged_in(viewer).get(AUDIT, params)
    assert response.status_code == 200
    body = response.content.decode()
    assert escape(message) in body or message in body
    assert 'class="form-errors" role="alert"' in body
    # The filter is ignored: every event shows.
    assert len(row_ids(body)) == 6


def test_a_bad_kind_leaves_the_good_ones_applied(viewer: User, trail: dict[str, Any]) -> None:
    response = logged_in(viewer).get(AUDIT, {"kind": ["approved", "exploded"]})
    assert response.status_code == 200
    assert row_ids(response.content.decode()) == ids_of(trail, "approved")
    assert "There is no event kind “exploded”" in response.content.decode()


def test_a_bad_workload_stays_in_the_form_to_be_fixed(viewer: User, trail: dict[str, Any]) -> None:
    body = logged_in(viewer).get(AUDIT, {"workload": "llama", "actor": "otto"}).content.decode()
    assert 'value="llama"' in body
    assert 'aria-invalid="true"' in body
    assert row_ids(body) == ids_of(trail, "approved")  # the good filter still applies


def test_an_out_of_range_event_id_in_a_cursor_is_refused() -> None:
    with pytest.raises(InvalidCursor):
        decode_cursor(encode_cursor(Cursor("older", T0, 2**63)))
    with pytest.raises(InvalidCursor):
        decode_cursor("b.1.2")  # readable base64, not a cursor
    with pytest.raises(InvalidCursor):
        decode_cursor("ü")


# ---------- keyset pages ----------


def test_pages_walk_older_and_back_newer_through_ties(tied_events: list[AuditEvent]) -> None:
    everything = [event.pk for event in tied_events]
    seen: list[int] = []
    page = events_page(AuditFilters(), size=3)
    assert page.is_newest
    assert page.newer_cursor is None
    pages = [page]
    while True:
        seen += [event.pk for event in page.events]
        if not page.older_cursor:
            break
        page = events_page(AuditFilters(), decode_cursor(page.older_cursor), size=3)
        assert not page.is_newest
        pages.append(page)
    assert seen == everything
    assert len(pages) == 4

    # And back: each "newer" page is the one before it, until the newest page, which is live.
    for previous in reversed(pages[:-1]):
        assert page.newer_cursor
        page = events_page(AuditFilters(), decode_cursor(page.newer_cursor), size=3)
        assert [e.pk for e in page.events] == [e.pk for e in previous.events]
    assert page.is_newest


def test_going_newer_from_a_short_distance_lands_on_a_full_newest_page(
    tied_events: list[AuditEvent],
) -> None:
    """GIVEN a page whose newer neighbour holds fewer events than a page
    WHEN the operator goes newer
    THEN the newest page shows, full, and live."""
    second = tied_events[1]
    page = events_page(AuditFilters(), Cursor("newer", second.occurred_at, second.pk), size=3)
    assert page.is_newest
    assert [e.pk for e in page.events] == [e.pk for e in tied_events[:3]]


def test_the_page_links_older_and_newer_with_an_opaque_cursor(
    viewer: User, tied_events: list[AuditEvent], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(audit_trail, "PAGE_SIZE", 4)
    client = logged_in(viewer)
    body = client.get(AUDIT, {"cluster": "lab"}).content.decode()
    assert row_ids(body) == [e.pk for e in tied_events[:4]]
    assert link(body, "prev") is None
    older = link(body, "next")
    assert older and "cluster=lab" in older and "cursor=" in older

    body = client.get(older).content.decode()
    assert row_ids(body) == [e.pk for e in tied_events[4:8]]
    body = client.get(required_link(body, "next")).content.decode()
    assert row_ids(body) == [e.pk for e in tied_events[8:]]
    assert link(body, "next") is None

    body = client.get(required_link(body, "prev")).content.decode()
    assert row_ids(body) == [e.pk for e in tied_events[4:8]]
    # Back at the top the cursor goes, so the live refresh keeps following the newest events.
    response = client.get(required_link(body, "prev"))
    assert response.status_code == 302
    assert response["Location"] == f"{AUDIT}?cluster=lab"
    body = client.get(response["Location"]).content.decode()
    assert row_ids(body) == [e.pk for e in tied_events[:4]]
    assert 'data-live-url="/ws/live/"' in body


def test_only_the_newest_page_is_live(
    viewer: User, tied_events: list[AuditEvent], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(audit_trail, "PAGE_SIZE", 4)
    client = logged_in(viewer)
    body = client.get(AUDIT).content.decode()
    assert 'data-live-url="/ws/live/"' in body
    assert '<tbody id="audit-trail" data-live-refresh>' in body
    assert 'id="audit-pagination" class="pagination" aria-label="Pages" data-live-refresh' in body

    body = client.get(required_link(body, "next")).content.decode()
    assert "data-live-url" not in body
    assert 'id="audit-trail"' not in body
    assert "Live updates pause on older pages." in body


def test_a_damaged_cursor_shows_the_newest_page(
    viewer: User, tied_events: list[AuditEvent]
) -> None:
    body = logged_in(viewer).get(AUDIT, {"cursor": "Zm9vYmFy"}).content.decode()
    assert "That page link cannot be read" in body
    assert row_ids(body)[0] == tied_events[0].pk
    assert 'data-live-url="/ws/live/"' in body


def test_the_page_reads_a_bounded_number_of_rows_whatever_the_table_holds(
    viewer: User,
    trail: dict[str, Any],
    django_assert_max_num_queries: Callable[..., Any],
) -> None:
    client = logged_in(viewer)
    with CaptureQueriesContext(connection) as few:
        client.get(AUDIT)
    lab, train = trail["lab"], trail["train"]
    AuditEvent.objects.bulk_create(
        AuditEvent(
            cluster=lab,
            workload=train,
            kind=AuditKind.PROGRESS_RESUMED,
            actor="watchdog",
            occurred_at=T0 + timedelta(seconds=n),
            payload={"step": n},
        )
        for n in range(250)
    )
    with django_assert_max_num_queries(len(few.captured_queries)):
        body = client.get(AUDIT).content.decode()
    assert len(row_ids(body)) == audit_trail.PAGE_SIZE
    with django_assert_max_num_queries(len(few.captured_queries)) as many:
        client.get(required_link(body, "next"))
    # No query counts the table.
    assert not any("COUNT(" in query["sql"].upper() for query in many.captured_queries)
    assert any("LIMIT 101" in query["sql"] for query in many.captured_queries)


@pytest.mark.skipif(connection.vendor != "mysql", reason="index hints are for MySQL/MariaDB")
def test_a_filtered_page_reads_the_audit_table_alone_through_the_filters_index(
    trail: dict[str, Any],
) -> None:
    """MariaDB left to itself walks (cluster, occurred_at) by its first column only and skips
    every newer row one by one; the page names the index, and joins nothing."""
    filters = AuditTrailFilterSet(QueryDict("cluster=lab&actor=otto"), now=T0).audit_filters()
    approved = trail["events"]["approved"]
    with CaptureQueriesContext(connection) as queries:
        page = events_page(filters, Cursor("older", approved.occurred_at, approved.pk + 1))
    assert [e.pk for e in page.events] == [approved.pk]
    (read,) = [q["sql"] for q in queries.captured_queries if "recovery_auditevent" in q["sql"]]
    assert "FORCE INDEX (`recovery_au_actor_b377f4_idx`, `recovery_au_cluster_829a6d_idx`)" in read
    assert "JOIN" not in read.upper()
    # Several kinds are left to the optimizer: the kind index would need a sort.
    filters = AuditTrailFilterSet(QueryDict("kind=approved&kind=detected"), now=T0).audit_filters()
    with CaptureQueriesContext(connection) as queries:
        events_page(filters)
    assert not any("FORCE INDEX" in q["sql"] for q in queries.captured_queries)


def test_a_payload_with_an_items_key_is_shown_as_such(viewer: User, trail: dict[str, Any]) -> None:
    record(trail["lab"], at=T0 + timedelta(days=1), payload={"items": [1, 2], "zone": "b"})
    body = logged_in(viewer).get(AUDIT).content.decode()
    assert "items:</span> [1, 2]" in body
    assert "zone:</span> b" in body


def test_the_export_link_carries_the_filters_that_parsed(
    viewer: User, trail: dict[str, Any]
) -> None:
    body = (
        logged_in(viewer)
        .get(AUDIT, {"cluster": "lab", "kind": ["approved", "bogus"], "actor": "otto"})
        .content.decode()
    )
    assert f'href="{EXPORT}?cluster=lab&amp;kind=approved&amp;actor=otto"' in body


# ---------- the permalink ----------


def test_an_events_permalink_shows_it_whole_with_its_neighbours(
    viewer: User, trail: dict[str, Any]
) -> None:
    events = trail["events"]
    before = record(
        trail["lab"],
        AuditKind.CHECKPOINT_SAVED,
        at=T0 - timedelta(minutes=1),
        workload=trail["train"],
        payload={"step": 1200},
    )
    response = logged_in(viewer).get(
        reverse("console:audit_event", args=[events["recommended"].pk])
    )
    assert response.status_code == 200
    body = response.content.decode()
    assert "Recommended" in body
    assert "2025-03-14 09:01:00.000000" in body
    assert f'href="{reverse("console:workload", args=[trail["train"].pk])}"' in body
    assert f'href="{AUDIT}?cluster=lab"' in body
    assert f'href="{AUDIT}?workload={trail["train"].pk}"' in body
    # Neighbours of the same workload, oldest first; another workload's events stay out.
    nearby = body[body.index('id="nearby-heading"') :]
    positions = [
        nearby.index(f'href="{reverse("console:audit_event", args=[pk])}"')
        for pk in (before.pk, events["detected"].pk, events["approved"].pk)
    ]
    assert positions == sorted(positions)
    assert 'aria-current="true"' in nearby
    assert reverse("console:audit_event", args=[events["other"].pk]) not in nearby


def test_the_permalink_pretty_prints_the_payload(viewer: User, trail: dict[str, Any]) -> None:
    detected = trail["events"]["detected"]
    body = logged_in(viewer).get(reverse("console:audit_event", args=[detected.pk])).content
    assert escape('{\n  "category": "gpu_hardware",\n  "exit_code": 137\n}') in body.decode()


def test_a_cluster_wide_event_shows_its_clusters_neighbours(
    viewer: User, trail: dict[str, Any]
) -> None:
    event = trail["events"]["cluster_wide"]
    body = logged_in(viewer).get(reverse("console:audit_event", args=[event.pk])).content
    text = body.decode()
    assert "a cluster-wide event" in text
    assert reverse("console:audit_event", args=[trail["events"]["remote"].pk]) in text


def test_show_in_trail_opens_the_page_that_starts_with_the_event(
    viewer: User, trail: dict[str, Any]
) -> None:
    client = logged_in(viewer)
    approved = trail["events"]["approved"]
    body = client.get(reverse("console:audit_event", args=[approved.pk])).content.decode()
    found = re.search(r'href="([^"]+)">Show in the cluster', body)
    assert found
    url = found.group(1).replace("&amp;", "&")
    assert url.endswith(f"#event-{approved.pk}")
    page = client.get(url.split("#")[0]).content.decode()
    assert row_ids(page) == ids_of(trail, "approved", "recommended", "detected")


@pytest.mark.parametrize("event_id", [987654, 2**70])
def test_an_unknown_event_is_not_found(viewer: User, trail: dict[str, Any], event_id: int) -> None:
    response = logged_in(viewer).get(f"/audit/{event_id}/")
    assert response.status_code == 404
    assert "Nothing here" in response.content.decode()


def test_the_permalink_reads_a_bounded_number_of_rows(
    viewer: User,
    trail: dict[str, Any],
    django_assert_max_num_queries: Callable[..., Any],
) -> None:
    AuditEvent.objects.bulk_create(
        AuditEvent(
            cluster=trail["lab"],
            workload=trail["train"],
            kind=AuditKind.PROGRESS_RESUMED,
            actor="watchdog",
            occurred_at=T0 + timedelta(seconds=n),
        )
        for n in range(100)
    )
    client = logged_in(viewer)
    # Ten, and one more on every page for each of the banner of abandoned actions and the
    # count of pending approvals in the navigation.
    with django_assert_max_num_queries(12):
        body = client.get(
            reverse("console:audit_event", args=[trail["events"]["detected"].pk])
        ).content.decode()
    nearby = body[body.index('id="nearby-heading"') :]
    assert nearby.count("<tr") == 1 + 1 + 5  # header, this event, five after


# ---------- the filters without HTTP ----------


def test_the_filterset_reads_every_filter() -> None:
    ClusterFactory(name="lab")
    filterset = AuditTrailFilterSet(
        QueryDict(
            "cluster=lab&workload=lab:40001&kind=approved&kind=detected,stopped&actor=otto"
            "&from=2025-03-14T09:00&to=2025-03-14T10:00:30"
        ),
        now=T0,
    )
    assert filterset.problems == []
    filters = filterset.audit_filters()
    assert filters == AuditFilters(
        cluster="lab",
        workload=WorkloadRef(cluster="lab", job_id="40001"),
        kinds=("detected", "approved", "stopped"),
        actor="otto",
        since=T0,
        until=datetime(2025, 3, 14, 10, 0, 30, tzinfo=UTC),
    )
    assert trail_query_params(filters) == [
        ("cluster", "lab"),
        ("workload", "lab:40001"),
        ("kind", "detected"),
        ("kind", "approved"),
        ("kind", "stopped"),
        ("actor", "otto"),
        ("from", "2025-03-14T09:00"),
        ("to", "2025-03-14T10:00:30"),
    ]


def test_the_filterset_turns_a_quick_range_into_a_start() -> None:
    filters = AuditTrailFilterSet(QueryDict("range=7d"), now=T0).audit_filters()
    assert filters.since == T0 - timedelta(days=7)
    assert filters.until is None
    assert trail_query_params(filters) == [("range", "7d")]


def test_the_filterset_reports_without_raising() -> None:
    filterset = AuditTrailFilterSet(
        QueryDict("workload=abc&kind=nope&from=2025-03-14T10:00&to=2025-03-14T09:00&range=2w"),
        now=T0,
    )
    assert filterset.audit_filters() == AuditFilters()
    assert filterset.invalid_fields == {"workload", "kind", "to", "range"}
    assert filterset.form["workload"].value() == "abc"


def test_the_navigation_links_the_audit_trail(viewer: User) -> None:
    body = logged_in(viewer).get(AUDIT).content.decode()
    assert f'href="{AUDIT}" aria-current="page"' in body


# ---------- access ----------


@pytest.mark.parametrize(
    "url", [AUDIT, EXPORT, reverse("console:audit_event", args=[1])], ids=["page", "csv", "event"]
)
def test_anonymous_users_are_sent_to_log_in(url: str) -> None:
    response = Client().get(url)
    assert response.status_code == 302
    assert response["Location"].startswith(reverse("login"))


@pytest.mark.parametrize("view", ["page", "csv", "event"])
def test_a_user_without_a_role_is_refused(outsider: User, trail: dict[str, Any], view: str) -> None:
    url = {
        "page": AUDIT,
        "csv": EXPORT,
        "event": reverse("console:audit_event", args=[trail["events"]["detected"].pk]),
    }[view]
    response = logged_in(outsider).get(url)
    assert response.status_code == 403
    assert "needs a Console role" in response.content.decode()


@pytest.mark.parametrize("role_user", ["viewer", "operator", "site_admin"])
def test_every_console_role_reads_the_trail(
    role_user: str, request: pytest.FixtureRequest, trail: dict[str, Any]
) -> None:
    user = request.getfixturevalue(role_user)
    client = logged_in(user)
    assert client.get(AUDIT).status_code == 200
    assert client.get(EXPORT).status_code == 200
    event = trail["events"]["detected"]
    assert client.get(reverse("console:audit_event", args=[event.pk])).status_code == 200
