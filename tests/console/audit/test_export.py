"""The audit trail's CSV export: streamed, filtered, guarded against formulas, batched."""

from __future__ import annotations

import csv
import io
import re
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from django.contrib.auth.models import User
from django.db import connection
from django.test.utils import CaptureQueriesContext

from recovery.audit import export as audit_export
from recovery.audit.export import acsv_lines, csv_lines, csv_row, guard_cell
from recovery.audit.trail import (
    AuditFilters,
)
from recovery.models import AuditEvent
from tests.console.audit.conftest import (
    EXPORT,
    T0,
    ids_of,
    logged_in,
    record,
)
from tests.factories import WorkloadFactory

pytestmark = pytest.mark.django_db

# ---------- CSV ----------


def read_csv(response: Any) -> list[list[str]]:
    assert response.streaming
    text = b"".join(response.streaming_content).decode("utf-8")
    return list(csv.reader(io.StringIO(text)))


def test_the_export_is_a_streamed_csv_of_the_filtered_events(
    viewer: User, trail: dict[str, Any]
) -> None:
    response = logged_in(viewer).get(
        EXPORT, {"cluster": "lab", "from": "2025-03-14T09:00", "to": "2025-03-14T09:05"}
    )
    assert response.status_code == 200
    assert response["Content-Type"] == "text/csv; charset=utf-8"
    assert response["Content-Disposition"] == (
        'attachment; filename="audit-trail_lab_20250314T090000Z_to_20250314T090500Z.csv"'
    )
    rows = read_csv(response)
    assert rows[0] == [
        "id",
        "occurred_at",
        "cluster",
        "workload_id",
        "job_id",
        "attempt",
        "kind",
        "actor",
        "payload",
    ]
    detected = trail["events"]["detected"]
    assert [int(row[0]) for row in rows[1:]] == ids_of(trail, "approved", "recommended", "detected")
    assert rows[-1] == [
        str(detected.pk),
        "2025-03-14T09:00:00Z",
        "lab",
        str(trail["train"].pk),
        "40001",
        "1",
        "detected",
        "policy",
        '{"category":"gpu_hardware","exit_code":137}',
    ]


def test_an_open_ended_export_is_named_up_to_now(viewer: User, trail: dict[str, Any]) -> None:
    response = logged_in(viewer).get(EXPORT)
    disposition = response["Content-Disposition"]
    assert re.fullmatch(
        r'attachment; filename="audit-trail_beginning_to_\d{8}T\d{6}Z\.csv"', disposition
    )
    rows = read_csv(response)
    assert len(rows) == 1 + 6
    cluster_wide = next(row for row in rows if row[0] == str(trail["events"]["cluster_wide"].pk))
    assert cluster_wide[3:6] == ["", "", ""]  # no workload, job or attempt


def test_a_quick_range_export_names_the_range_it_covers(
    viewer: User, trail: dict[str, Any]
) -> None:
    response = logged_in(viewer).get(EXPORT, {"range": "24h"})
    start, end = re.findall(r"(\d{8}T\d{6}Z)", response["Content-Disposition"])

    def parse(text: str) -> datetime:
        return datetime.strptime(text, "%Y%m%dT%H%M%SZ")

    assert parse(end) - parse(start) == timedelta(hours=24)
    assert read_csv(response) == [list(audit_export.CSV_COLUMNS)]


@pytest.mark.parametrize(
    ("value", "cell"),
    [
        ('=HYPERLINK("http://x")', '\'=HYPERLINK("http://x")'),
        ("+1", "'+1"),
        ("-1+2", "'-1+2"),
        ("@SUM(A1)", "'@SUM(A1)"),
        ("\tx", "'\tx"),
        ("\rx", "'\rx"),
        ("policy", "policy"),
        ("", ""),
    ],
)
def test_cells_that_a_spreadsheet_would_run_get_an_apostrophe(value: str, cell: str) -> None:
    assert guard_cell(value) == cell


def test_the_export_guards_every_text_cell(viewer: User, trail: dict[str, Any]) -> None:
    job = WorkloadFactory(cluster=trail["lab"], job_id="-1")
    record(trail["lab"], at=T0, actor="=cmd|' /C calc'!A0", workload=job, payload="@evil")
    rows = read_csv(logged_in(viewer).get(EXPORT, {"workload": job.pk}))
    assert rows[1][4] == "'-1"
    assert rows[1][7] == "'=cmd|' /C calc'!A0"
    assert rows[1][8] == '"@evil"'  # JSON quotes the string: it starts with a quote, not a @


def test_the_export_reads_in_bounded_batches(
    viewer: User, tied_events: list[AuditEvent], monkeypatch: pytest.MonkeyPatch
) -> None:
    """GIVEN more events than one batch holds
    WHEN they are exported
    THEN each query reads at most one batch, and every event comes out once, newest first."""
    monkeypatch.setattr(audit_export, "CSV_BATCH_SIZE", 4)
    client = logged_in(viewer)
    response = client.get(EXPORT)
    with CaptureQueriesContext(connection) as queries:
        rows = read_csv(response)
    assert [int(row[0]) for row in rows[1:]] == [e.pk for e in tied_events]
    reads = [q["sql"] for q in queries.captured_queries if "recovery_auditevent" in q["sql"]]
    assert len(reads) == 3  # 4 + 4 + 3
    assert all("LIMIT 4" in sql for sql in reads)


def test_the_async_export_streams_the_same_rows(tied_events: list[AuditEvent]) -> None:
    async def collect() -> str:
        return "".join([chunk async for chunk in acsv_lines(AuditFilters(), batch_size=4)])

    assert async_to_sync(collect)() == "".join(csv_lines(AuditFilters(), batch_size=4))


def test_an_export_with_bad_filters_is_refused_with_the_reasons(
    viewer: User, trail: dict[str, Any]
) -> None:
    response = logged_in(viewer).get(EXPORT, {"kind": "exploded", "from": "soon"})
    assert response.status_code == 400
    text = response.content.decode()
    assert "There is no event kind “exploded”" in text
    assert "“From” is not a date and time" in text


def test_csv_rows_format_times_in_utc_with_a_z() -> None:
    at = datetime(2025, 3, 14, 10, 0, 0, 123456, tzinfo=UTC)
    row = csv_row((7, at, "lab", None, None, None, "stopped", "otto", {"b": 1, "a": "ü"}))
    assert row == [
        "7",
        "2025-03-14T10:00:00.123456Z",
        "lab",
        "",
        "",
        "",
        "stopped",
        "otto",
        '{"a":"ü","b":1}',
    ]
