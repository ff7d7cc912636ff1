"""What came of an action is a field: converged, abandoned with the reason, or pending.

The controller's reports arrive through the function the Advisor API calls.
"""

from __future__ import annotations

import pytest

from recovery.choices import AuditKind, Disposition, RecommendationStatus
from recovery.loop.recommendations import ActionReport, acknowledge, claim, report
from recovery.models import AuditEvent, Recommendation
from tests.factories import RecommendationFactory

pytestmark = pytest.mark.django_db

CONTROLLER = "controller:lab"
INSTANCE = "3b4a1a60-6f59-4a57-9d0e-6f2f1c1a9e01"
REQUEUED = [{"argv": ["scontrol", "requeuehold", "4242"], "returncode": 0, "output": ""}]


def claimed() -> Recommendation:
    ready = RecommendationFactory(status=RecommendationStatus.READY)
    held = claim(ready.pk, controller=CONTROLLER, instance=INSTANCE, lease_seconds=60)
    assert held.disposition == Disposition.PENDING
    return held


@pytest.mark.parametrize(
    ("outcome", "converged", "detail", "disposition", "reason"),
    [
        ("executed", True, "", Disposition.CONVERGED, ""),
        ("skipped", True, "already restarted", Disposition.CONVERGED, ""),
        ("executed", False, "not converged: held", Disposition.ABANDONED, "not converged: held"),
        ("failed", None, "refused before any command: x", Disposition.ABANDONED, "refused"),
        ("retry", False, "the scheduler was unreachable", Disposition.PENDING, "to be continued"),
    ],
)
def test_the_report_sets_the_disposition(
    outcome: str, converged: bool | None, detail: str, disposition: str, reason: str
) -> None:
    held = claimed()
    result = ActionReport(outcome, {"state": "RUNNING"}, REQUEUED, converged, detail)
    stored = report(held.pk, controller=CONTROLLER, instance=INSTANCE, result=result)
    stored.refresh_from_db()
    assert stored.disposition == disposition
    assert reason in stored.disposition_reason


def test_an_abandoned_action_is_acknowledged_once_and_the_trail_says_by_whom() -> None:
    held = claimed()
    result = ActionReport("executed", {}, REQUEUED, False, "abandoned: the job is FAILED")
    report(held.pk, controller=CONTROLLER, instance=INSTANCE, result=result)

    first = acknowledge(held.pk, operator="operator:olivia", note="requeued it by hand")
    again = acknowledge(held.pk, operator="operator:omar")

    assert (first.changed, again.changed) == (True, False)
    assert "olivia" in again.message
    held.refresh_from_db()
    assert held.acknowledged_by == "operator:olivia" and held.acknowledged_at is not None
    (event,) = AuditEvent.objects.filter(kind=AuditKind.ABANDONMENT_ACKNOWLEDGED)
    assert event.actor == "operator:olivia"
    assert event.payload["note"] == "requeued it by hand"


def test_only_an_abandoned_action_can_be_acknowledged() -> None:
    converged = RecommendationFactory(
        status=RecommendationStatus.EXECUTED, disposition=Disposition.CONVERGED
    )
    assert not acknowledge(converged.pk, operator="operator:olivia").changed
    assert not AuditEvent.objects.filter(kind=AuditKind.ABANDONMENT_ACKNOWLEDGED).exists()
