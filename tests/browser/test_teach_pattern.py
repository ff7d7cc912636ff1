"""An operator teaches a detection pattern from an unexplained failure, in the browser."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.contrib.auth.models import User
from django.utils import timezone
from playwright.sync_api import expect

from recovery.choices import AuditKind, FailureCategory
from recovery.models import Anomaly, AuditEvent, DetectionPattern
from tests.browser.conftest import Browsing
from tests.factories import AnomalyFactory, AttemptFactory, ClusterFactory, WorkloadFactory

pytestmark = pytest.mark.django_db(transaction=True)

# A line no built-in signature and no labelled real log knows, as srun --label printed it.
WEKA = " 3: 2024-05-01T10:00:07Z weka: io stalled on fd 0x7f3a for 120 s (tries=3)"
LINES = ["step 812 loss 2.0411", "step 813 loss 2.0397", WEKA]
PRINTED_BY = "WekaFS client (docs.weka.io)"


def failure_nothing_explained() -> Anomaly:
    workload = WorkloadFactory(cluster=ClusterFactory(name="train-h100"), name="llama-pretrain")
    at = timezone.now() - timedelta(minutes=3)
    return AnomalyFactory(
        workload=workload,
        attempt=AttemptFactory(workload=workload),
        category=FailureCategory.UNEXPLAINED,
        attribution="unknown",
        signature="slurm-failed-exit-3",
        evidence_line="Slurm job state FAILED, exit code 3",
        implicated_nodes=[],
        evidence_at=at,
        detected_at=at,
        details={"role": "wrapper", "source": "scheduler", "exit_code": 3, "last_lines": LINES},
    )


def test_an_operator_teaches_a_pattern_from_an_unexplained_failure(
    browsing: Browsing, operator: User
) -> None:
    """
    GIVEN a failure nothing explained, its job's last lines kept
    WHEN the operator opens Unexplained from the navigation, picks the line that says what
         happened and previews the pattern derived from it
    THEN the preview refuses it as fitted to that one line and offers no Save;
    WHEN the operator names the program that prints the message and previews again
    THEN nothing refuses it, and Save stores the pattern, with a pattern_taught event naming
         the operator
    """
    anomaly = failure_nothing_explained()
    page = browsing.page(operator)
    page.goto("/")
    page.get_by_role("navigation", name="Main").get_by_role("link", name="Unexplained").click()

    expect(page.get_by_role("heading", level=1)).to_have_text("Unexplained failures")
    failure = page.locator(f"#unexplained-{anomaly.pk}")
    expect(failure).to_contain_text("llama-pretrain")
    expect(failure).to_contain_text("train-h100")
    expect(failure).to_contain_text("weka: io stalled on fd 0x7f3a for 120 s (tries=3)")
    failure.get_by_role("link", name="Teach a pattern from line 3").click()

    expect(page).to_have_url(re.compile(rf"/unexplained/{anomaly.pk}/teach/\?line=2$"))
    expect(page.locator("#teach-line")).to_have_text(WEKA.rstrip())
    pattern = page.get_by_label("Pattern")
    expect(pattern).to_have_value(r"weka: io stalled on fd 0x[0-9a-fA-F]+ for \d+ s \(tries=\d+\)")
    page.get_by_label("Name").fill("weka-io-stalled")
    page.get_by_label("Category").select_option("storage_io")
    page.get_by_label("Attribution").select_option("system_software")
    page.get_by_role("button", name="Preview").click()

    expect(page.locator("#id_pattern-errors")).to_contain_text("fitted to this one line")
    expect(page.locator("#preview-summary")).to_contain_text("matches a line of 0 of")
    expect(page.get_by_role("button", name="Save pattern")).to_have_count(0)
    assert not DetectionPattern.objects.exists()

    page.get_by_label("Printed by").fill(PRINTED_BY)
    page.get_by_role("button", name="Preview").click()

    expect(page.get_by_text("Nothing refuses this pattern")).to_be_visible()
    expect(page.locator("#id_pattern-errors")).to_have_count(0)
    page.get_by_role("button", name="Save pattern").click()

    expect(page).to_have_url(re.compile(r"/unexplained/$"))
    expect(page.locator(".messages")).to_contain_text("Pattern weka-io-stalled saved")
    row = DetectionPattern.objects.get()
    assert (row.name, row.category, row.attribution, row.printed_by, row.examples) == (
        "weka-io-stalled",
        "storage_io",
        "system_software",
        PRINTED_BY,
        WEKA,
    )
    taught = AuditEvent.objects.get(kind=AuditKind.PATTERN_TAUGHT)
    assert taught.actor == operator.get_username()
    assert taught.payload["pattern_id"] == row.pk
    assert browsing.problems_on(page) == []
