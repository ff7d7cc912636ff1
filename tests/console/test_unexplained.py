"""The Unexplained failures page, and teaching a detection pattern from one of their lines:
viewers read, operators preview and save, and a pattern the preview refuses is never saved."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse
from django.utils import timezone
from pytest_django.fixtures import Settings as SettingsWrapper

from recovery.choices import AuditKind, FailureCategory
from recovery.detection.teaching import pattern_for_line
from recovery.loop.logs import scan
from recovery.loop.patterns import active_signature_set
from recovery.loop.teaching import PatternDraft
from recovery.models import Anomaly, AuditEvent, DetectionPattern, Workload
from tests.conftest import TEST_PASSWORD
from tests.factories import AnomalyFactory, AttemptFactory, ClusterFactory, WorkloadFactory

pytestmark = pytest.mark.django_db

WEKA = " 3: 2024-05-01T10:00:07Z weka: io stalled on fd 0x7f3a for 120 s (tries=3)"
LINES = ["step 812 loss 2.0411", "step 813 loss 2.0397", WEKA]
WEKA_LINE = 2
PRINTED_BY = "WekaFS client (docs.weka.io)"


def logged_in(user: User) -> Client:
    client = Client()
    assert client.login(username=user.username, password=TEST_PASSWORD)
    return client


def unexplained(
    workload: Workload | None = None,
    lines: list[str] | None = None,
    *,
    minutes_ago: int = 5,
    exit_code: int | None = 3,
    signal: int | None = None,
) -> Anomaly:
    workload = workload or WorkloadFactory(cluster=ClusterFactory(name="lab"), name="llama-70b")
    attempt = AttemptFactory(workload=workload, number=workload.attempts.count() + 1)
    at = timezone.now() - timedelta(minutes=minutes_ago)
    return AnomalyFactory(
        workload=workload,
        attempt=attempt,
        category=FailureCategory.UNEXPLAINED,
        attribution="unknown",
        signature=f"slurm-failed-exit-{exit_code}",
        evidence_line=f"Slurm job state FAILED, exit code {exit_code}",
        implicated_nodes=[],
        evidence_at=at,
        detected_at=at,
        details={
            "role": "wrapper",
            "source": "scheduler",
            "exit_code": exit_code,
            "signal": signal,
            "last_lines": LINES if lines is None else lines,
        },
    )


def teach_url(anomaly: Anomaly, line: int | None = WEKA_LINE) -> str:
    url = reverse("console:teach_pattern", args=[anomaly.pk])
    return url if line is None else f"{url}?line={line}"


def draft_fields(**fields: Any) -> dict[str, Any]:
    values = {
        "line": WEKA_LINE,
        "name": "weka-io-stalled",
        "pattern": pattern_for_line(WEKA),
        "category": "storage_io",
        "attribution": "system_software",
        "description": "The Weka client gave up on an I/O",
        "printed_by": "",
    }
    values.update(fields)
    return values


def preview(client: Client, anomaly: Anomaly, **fields: Any) -> str:
    response = client.post(teach_url(anomaly, None), {**draft_fields(**fields), "preview": ""})
    assert response.status_code == 200
    return response.content.decode()


def saved_digest(body: str) -> str:
    marker = 'name="previewed" value="'
    start = body.index(marker) + len(marker)
    return body[start : body.index('"', start)]


def save(client: Client, anomaly: Anomaly, digest: str, **fields: Any) -> Any:
    return client.post(
        teach_url(anomaly, None), {**draft_fields(**fields), "previewed": digest, "save": ""}
    )


@pytest.fixture
def labelled(tmp_path: Path, settings: SettingsWrapper) -> Path:
    """A folder of labelled cases of this test's own (``WR_LABELLED_CASES_DIR``)."""
    folder = tmp_path / "labelled"
    (folder / "rounds").mkdir(parents=True)
    settings.LABELLED_CASES_DIR = folder
    write_cases(folder / "corpus.jsonl", [case("fine-1", "step 1 loss 2.0\nstep 2 loss 1.9")])
    return folder


def case(
    case_id: str, log: str, category: str = "healthy", attribution: str = "none"
) -> dict[str, str]:
    return {
        "id": case_id,
        "category": category,
        "attribution": attribution,
        "source": f"https://example.org/{case_id}",
        "log": log,
    }


def write_cases(path: Path, cases: list[dict[str, str]]) -> None:
    path.write_text("".join(json.dumps(c) + "\n" for c in cases), encoding="utf-8")


# ------------------------------------------------------------------ the list


def test_a_viewer_sees_the_unexplained_failures_newest_first(viewer: User) -> None:
    older = unexplained(minutes_ago=50, lines=["old job's last words"], exit_code=None, signal=9)
    newer = unexplained(WorkloadFactory(cluster=older.workload.cluster, name="mixtral-ft"))
    AnomalyFactory(workload=newer.workload)  # explained: not listed

    response = logged_in(viewer).get(reverse("console:unexplained"))

    assert response.status_code == 200
    body = response.content.decode()
    assert "2 failures" in body
    assert body.index("mixtral-ft") < body.index("llama-70b")
    assert body.count('class="panel unexplained"') == 2
    assert "lab" in body and newer.workload.job_id in body
    assert "weka: io stalled on fd 0x7f3a for 120 s (tries=3)" in body
    assert "old job&#x27;s last words" in body
    assert '<dd class="mono">9</dd>' in body  # the signal of the older one
    assert "Teach" not in body  # viewers read, they do not teach


def test_an_operator_can_pick_each_line_to_teach_from(operator: User) -> None:
    anomaly = unexplained()
    body = logged_in(operator).get(reverse("console:unexplained")).content.decode()
    for index in range(len(LINES)):
        assert f'href="{teach_url(anomaly, index)}"' in body
    assert f'aria-label="Teach a pattern from line {len(LINES)}"' in body


def test_the_list_filters_by_cluster_and_says_when_there_is_none(viewer: User) -> None:
    unexplained()
    client = logged_in(viewer)
    other = ClusterFactory(name="prod")
    body = client.get(reverse("console:unexplained"), {"cluster": other.name}).content.decode()
    assert "No unexplained failure on prod." in body


def test_the_navigation_links_the_page(viewer: User) -> None:
    body = logged_in(viewer).get(reverse("console:fleet")).content.decode()
    assert f'href="{reverse("console:unexplained")}"' in body


def test_anonymous_readers_log_in_and_outsiders_are_refused(outsider: User) -> None:
    anomaly = unexplained()
    for url in (reverse("console:unexplained"), teach_url(anomaly)):
        response = Client().get(url)
        assert response.status_code == 302
        assert response["Location"].startswith(reverse("login"))
        assert logged_in(outsider).get(url).status_code == 403


# ------------------------------------------------------------------ who may teach


def test_a_viewer_is_refused_the_teach_form_and_its_posts(viewer: User, labelled: Path) -> None:
    anomaly = unexplained()
    client = logged_in(viewer)
    assert client.get(teach_url(anomaly)).status_code == 403
    response = client.post(teach_url(anomaly, None), {**draft_fields(), "preview": ""})
    assert response.status_code == 403
    body = client.post(
        teach_url(anomaly, None), {**draft_fields(printed_by=PRINTED_BY), "save": ""}
    )
    assert body.status_code == 403
    assert not DetectionPattern.objects.exists()
    assert not AuditEvent.objects.filter(kind=AuditKind.PATTERN_TAUGHT).exists()


def test_only_an_unexplained_failures_lines_can_be_taught_from(operator: User) -> None:
    client = logged_in(operator)
    explained = AnomalyFactory(details={"last_lines": LINES})
    assert client.get(teach_url(explained)).status_code == 404
    anomaly = unexplained()
    assert client.get(teach_url(anomaly, len(LINES))).status_code == 404
    assert client.get(teach_url(anomaly, None)).status_code == 404


# ------------------------------------------------------------------ the form and its preview


def test_the_form_is_prefilled_from_the_chosen_line(operator: User) -> None:
    anomaly = unexplained()
    body = logged_in(operator).get(teach_url(anomaly)).content.decode()
    assert "weka: io stalled on fd 0x7f3a for 120 s (tries=3)" in body
    # Prefixes dropped, the numbers generalised, escaped for RE2.
    assert r"weka: io stalled on fd 0x[0-9a-fA-F]+ for \d+ s \(tries=\d+\)" in body
    assert 'value="taught-weka-io-stalled-on"' in body
    assert "Save pattern" not in body  # a preview comes first


def test_a_pattern_fitted_to_its_one_line_is_refused_until_its_printer_is_named(
    operator: User, labelled: Path
) -> None:
    """
    GIVEN an unexplained failure whose line no labelled case and no other failure shows
    WHEN an operator previews the pattern derived from it
    THEN the preview refuses it as fitted to one line and offers no Save, even when the save
         is forged; naming the program that prints the message lets it be saved
    """
    anomaly = unexplained()
    client = logged_in(operator)
    body = preview(client, anomaly)
    assert "fitted to this one line" in body
    assert "Save pattern" not in body
    assert saved_digest(body) == ""

    forged = PatternDraft(
        "weka-io-stalled", pattern_for_line(WEKA), "storage_io", "system_software"
    ).digest()
    response = save(client, anomaly, forged)
    assert response.status_code == 200
    assert "fitted to this one line" in response.content.decode()
    assert not DetectionPattern.objects.exists()

    body = preview(client, anomaly, printed_by=PRINTED_BY)
    assert "Nothing refuses this pattern" in body
    assert "Save pattern" in body
    assert saved_digest(body)


def test_a_pattern_that_makes_a_healthy_labelled_log_a_failure_is_refused(
    operator: User, labelled: Path
) -> None:
    write_cases(
        labelled / "rounds" / "round-9.jsonl",
        [
            case("fine-weka", "step 1 loss 2.0\nweka: io stalled on fd 0x10 for 1 s (tries=1)"),
            case(
                "weka-died",
                "step 1 loss 2.0\nweka: io stalled on fd 0x10 for 900 s (tries=9)",
                "storage_io",
                "system_software",
            ),
        ],
    )
    anomaly = unexplained()
    body = preview(logged_in(operator), anomaly, printed_by=PRINTED_BY)
    assert "false alarms: fine-weka" in body
    assert 'id="changed-cases"' in body
    assert "weka-died" in body and "now as labelled" in body
    assert "healthy / none → storage_io / system_software" in body
    assert "Save pattern" not in body


def test_the_model_validation_is_kept(operator: User, labelled: Path) -> None:
    """RE2 only; no line healthy jobs print; the chosen line must be matched; a real category."""
    anomaly = unexplained()
    client = logged_in(operator)
    body = preview(client, anomaly, pattern=r"(a)\1", printed_by=PRINTED_BY)
    assert "linear-time engine (RE2)" in body
    assert 'id="preview"' not in body
    body = preview(client, anomaly, pattern=r"NCCL INFO", printed_by=PRINTED_BY)
    assert "healthy training jobs print" in body
    body = preview(client, anomaly, pattern=r"lustre: io stalled", printed_by=PRINTED_BY)
    assert "does not match this line" in body
    for category in ("healthy", "unexplained", ""):
        body = preview(client, anomaly, category=category, printed_by=PRINTED_BY)
        assert "Save pattern" not in body
    body = preview(client, anomaly, attribution="none", printed_by=PRINTED_BY)
    assert "Save pattern" not in body


def test_a_match_in_another_unexplained_failure_is_enough(operator: User, labelled: Path) -> None:
    anomaly = unexplained()
    other = unexplained(
        WorkloadFactory(cluster=anomaly.workload.cluster, name="gpt-neox"),
        ["weka: io stalled on fd 0x99 for 61 s (tries=2)"],
    )
    body = preview(logged_in(operator), anomaly)
    assert 'id="other-failures"' in body
    assert f"failure {other.pk}" in body
    assert "Save pattern" in body


def test_a_missing_folder_of_labelled_cases_is_said(
    operator: User, settings: SettingsWrapper, tmp_path: Path
) -> None:
    settings.LABELLED_CASES_DIR = tmp_path / "nowhere"
    body = preview(logged_in(operator), unexplained(), printed_by=PRINTED_BY)
    assert "no folder of labelled cases at" in body
    assert "WR_LABELLED_CASES_DIR" in body


# ------------------------------------------------------------------ saving


def test_an_operator_saves_a_previewed_pattern_and_the_detectors_use_it(
    operator: User, labelled: Path
) -> None:
    """
    GIVEN the preview of a pattern nothing refuses
    WHEN the operator saves it
    THEN a detection pattern is stored with the chosen line as its example, a pattern_taught
         event names the operator, and the detectors' active set finds the line with it
    """
    anomaly = unexplained()
    client = logged_in(operator)
    body = preview(client, anomaly, printed_by=PRINTED_BY)
    response = save(client, anomaly, saved_digest(body), printed_by=PRINTED_BY)

    assert response.status_code == 302
    assert response["Location"] == reverse("console:unexplained")
    row = DetectionPattern.objects.get()
    assert (row.name, row.category, row.attribution, row.printed_by) == (
        "weka-io-stalled",
        "storage_io",
        "system_software",
        PRINTED_BY,
    )
    assert row.examples == WEKA
    assert row.enabled
    event = AuditEvent.objects.get(kind=AuditKind.PATTERN_TAUGHT)
    assert event.actor == operator.get_username()
    assert event.workload_id == anomaly.workload_id
    assert event.payload["pattern_id"] == row.pk
    assert event.payload["anomaly"] == anomaly.pk
    assert event.payload["line"] == WEKA
    assert "Pattern weka-io-stalled saved" in client.get(response["Location"]).content.decode()

    assert active_signature_set().by_name["weka-io-stalled"].printed_by == PRINTED_BY
    found = scan(b"step 9 loss 1.2\n 0: weka: io stalled on fd 0xa1 for 30 s (tries=4)\n")
    assert [(f.signature, f.category) for f in found.findings] == [
        ("weka-io-stalled", "storage_io")
    ]


def test_a_save_that_was_not_previewed_shows_the_preview_instead(
    operator: User, labelled: Path
) -> None:
    anomaly = unexplained()
    client = logged_in(operator)
    body = preview(client, anomaly, printed_by=PRINTED_BY)
    changed = save(
        client, anomaly, saved_digest(body), printed_by=PRINTED_BY, pattern=r"weka: io stalled"
    )
    assert changed.status_code == 200
    assert "changed since its preview" in changed.content.decode()
    assert "Save pattern" in changed.content.decode()
    assert not DetectionPattern.objects.exists()


def test_a_taken_name_is_refused(operator: User, labelled: Path) -> None:
    DetectionPattern.objects.create(
        name="weka-io-stalled",
        pattern="weka",
        category="storage_io",
        attribution="system_software",
        examples="weka",
    )
    body = preview(logged_in(operator), unexplained(), printed_by=PRINTED_BY)
    assert "Detection pattern with this Name already exists." in body
    assert "Save pattern" not in body
