"""Quiet workloads cost nothing: what a worker process remembers of them (recovery.loop.held)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from recovery.choices import AnomalyKind
from recovery.loop import held, workload_outputs
from recovery.loop import workloads as workload_work
from recovery.loop.workloads import process_workloads
from recovery.models import Anomaly, LogCursor, Policy, ProgressSample, Workload
from recovery.schedulers.transport import LocalTransport
from tests.loop.test_workloads import running_workload, write

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def nothing_remembered() -> Iterator[None]:
    held.forget_all()
    yield
    held.forget_all()


def progress(second: int, step: int) -> str:
    """A progress line printed minutes ago (not at import: a long test session would make it
    old enough for a hang)."""
    stamp = (timezone.now() - timedelta(minutes=5)).strftime("%Y-%m-%dT%H:%M")
    return f"0: {stamp}:{second:02d}Z gpu-001: step: {step} loss: 2.5 tps: 4,800 mfu: 40%\n"


def tokens(*workloads: Workload, token: str = "facts|settings") -> dict[int, str]:
    return {workload.pk: token for workload in workloads}


def test_a_quiet_workload_costs_no_query_until_its_output_grows(tmp_path: Path) -> None:
    """
    GIVEN a running workload processed once, its output read to the end
    WHEN it is processed again with the same token and nothing new in its output
    THEN it is left alone without a single query; once its output grows it is read again
    """
    workload = running_workload(tmp_path, "job")
    write(workload, progress(second=1, step=10))
    now = timezone.now()
    first = process_workloads(
        workload.cluster, [workload.pk], LocalTransport(), now, tokens=tokens(workload)
    )
    assert (first.workloads, first.left_quiet, first.progress_checks) == (1, 0, 1)

    with CaptureQueriesContext(connection) as queries:
        again = process_workloads(
            workload.cluster, [workload.pk], LocalTransport(), now + timedelta(seconds=5),
            tokens=tokens(workload),
        )  # fmt: skip
    assert (again.workloads, again.left_quiet) == (0, 1)
    assert [q["sql"] for q in queries] == []

    write(workload, progress(second=2, step=11))
    grown = process_workloads(
        workload.cluster, [workload.pk], LocalTransport(), now + timedelta(seconds=10),
        tokens=tokens(workload),
    )  # fmt: skip
    assert (grown.workloads, grown.left_quiet) == (1, 0)
    assert ProgressSample.objects.filter(workload=workload).count() == 2


def test_a_changed_token_or_a_message_without_tokens_processes_the_workload(
    tmp_path: Path,
) -> None:
    """New facts (a new attempt, an ending to judge), other settings or policies change the
    token; a message from an earlier release carries none: either way the workload is read."""
    workload = running_workload(tmp_path, "job")
    now = timezone.now()
    process_workloads(
        workload.cluster, [workload.pk], LocalTransport(), now, tokens=tokens(workload)
    )
    later = now + timedelta(seconds=5)
    changed = process_workloads(
        workload.cluster, [workload.pk], LocalTransport(), later,
        tokens=tokens(workload, token="new facts|settings"),
    )  # fmt: skip
    assert (changed.workloads, changed.left_quiet) == (1, 0)
    untokened = process_workloads(workload.cluster, [workload.pk], LocalTransport(), later)
    assert (untokened.workloads, untokened.left_quiet) == (1, 0)


def test_the_settings_token_follows_policies_and_the_cluster(tmp_path: Path) -> None:
    workload = running_workload(tmp_path, "job")
    cluster = workload.cluster
    before = held.tokens_for(cluster, {workload.pk: "a" * 64})
    assert held.tokens_for(cluster, {workload.pk: "a" * 64}) == before
    Policy.objects.create(name="shorter hangs", hang_timeout_minutes=5)
    with_policy = held.tokens_for(cluster, {workload.pk: "a" * 64})
    assert with_policy != before
    cluster.environment = "prod"
    cluster.save()
    assert held.tokens_for(cluster, {workload.pk: "a" * 64}) != with_policy
    assert held.tokens_for(cluster, {workload.pk: "b" * 64}) != held.tokens_for(
        cluster, {workload.pk: "a" * 64}
    )


def test_a_silent_workload_is_checked_again_when_its_hang_is_due(tmp_path: Path) -> None:
    """
    GIVEN a workload whose last step was printed 25 minutes ago (hang timeout 30 minutes)
    WHEN it stays silent
    THEN it is left alone, without a check, until the silence passes what the policy allows,
         and then the hang is found
    """
    workload = running_workload(tmp_path, "job")
    now = timezone.now()
    # Two steps a minute apart, 25 minutes ago: the allowance is the 30-minute floor.
    Path(workload.stdout_path).write_text("")
    for minutes, step in ((26, 1), (25, 2)):
        at = now - timedelta(minutes=minutes)
        ProgressSample.objects.create(
            workload=workload, attempt=1, rank=0, node="gpu-001", step=step, at=at
        )
    Workload.objects.filter(pk=workload.pk).update(last_progress_at=now - timedelta(minutes=25))
    workload.attempts.update(started_at=now - timedelta(hours=1))
    first = process_workloads(
        workload.cluster, [workload.pk], LocalTransport(), now, tokens=tokens(workload)
    )
    assert first.progress_checks == 1
    for seconds in (30, 60, 240, 290):
        quiet = process_workloads(
            workload.cluster, [workload.pk], LocalTransport(), now + timedelta(seconds=seconds),
            tokens=tokens(workload),
        )  # fmt: skip
        assert (quiet.left_quiet, quiet.progress_checks) == (1, 0), seconds
    due = now + timedelta(minutes=5, seconds=1)
    found = process_workloads(
        workload.cluster, [workload.pk], LocalTransport(), due, tokens=tokens(workload)
    )
    assert (found.left_quiet, found.progress_checks, found.anomalies_new) == (0, 1, 1)
    assert Anomaly.objects.get().kind == AnomalyKind.HANG


def test_a_workload_read_with_new_progress_is_checked_at_the_usual_cadence(tmp_path: Path) -> None:
    """New samples since the last check may show a straggler or a trend: a workload that went
    quiet right after them is still checked once at the usual cadence."""
    workload = running_workload(tmp_path, "job")
    now = timezone.now()
    process_workloads(
        workload.cluster, [workload.pk], LocalTransport(), now, tokens=tokens(workload)
    )
    write(workload, progress(second=3, step=12))
    soon = now + timedelta(seconds=5)
    read = process_workloads(
        workload.cluster, [workload.pk], LocalTransport(), soon, tokens=tokens(workload)
    )
    assert (read.workloads, read.progress_checks) == (1, 0)
    cadence = now + timedelta(seconds=workload_work.PROGRESS_CHECK_SECONDS + 1)
    checked = process_workloads(
        workload.cluster, [workload.pk], LocalTransport(), cadence, tokens=tokens(workload)
    )
    assert (checked.left_quiet, checked.progress_checks) == (0, 1)
    after = cadence + timedelta(seconds=workload_work.PROGRESS_CHECK_SECONDS + 1)
    quiet = process_workloads(
        workload.cluster, [workload.pk], LocalTransport(), after, tokens=tokens(workload)
    )
    assert (quiet.left_quiet, quiet.progress_checks) == (1, 0)


def test_a_read_cut_at_the_limit_is_read_on_at_the_next_poll(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Output longer than one read's limit is not remembered as read: the rest is read next
    time though the file did not grow."""
    monkeypatch.setattr("recovery.loop.logs.MAX_READ_BYTES", 200)
    monkeypatch.setattr("recovery.loop.workload_outputs.MAX_READ_BYTES", 200)
    workload = running_workload(tmp_path, "job")
    write(workload, "".join(progress(second=s, step=s) for s in range(6)))
    now = timezone.now()
    process_workloads(
        workload.cluster, [workload.pk], LocalTransport(), now, tokens=tokens(workload)
    )
    first = LogCursor.objects.get().offset
    assert 0 < first < Path(workload.stdout_path).stat().st_size
    again = process_workloads(
        workload.cluster, [workload.pk], LocalTransport(), now + timedelta(seconds=5),
        tokens=tokens(workload),
    )  # fmt: skip
    assert again.left_quiet == 0
    assert LogCursor.objects.get().offset > first


def test_a_read_another_reader_overtook_is_not_remembered(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A read dropped because another worker moved the cursor meanwhile leaves the workload to
    be processed again, not remembered as read to the end."""
    workload = running_workload(tmp_path, "job")
    write(workload, progress(second=1, step=1))
    original = workload_outputs._unmoved

    def overtaken(reads: list[workload_outputs._Read]) -> list[workload_outputs._Read]:
        LogCursor.objects.filter(pk__in=[r.cursor.pk for r in reads]).update(offset=1)
        return original(reads)

    monkeypatch.setattr(workload_outputs, "_unmoved", overtaken)
    now = timezone.now()
    process_workloads(
        workload.cluster, [workload.pk], LocalTransport(), now, tokens=tokens(workload)
    )
    monkeypatch.setattr(workload_outputs, "_unmoved", original)
    again = process_workloads(
        workload.cluster, [workload.pk], LocalTransport(), now + timedelta(seconds=5),
        tokens=tokens(workload),
    )  # fmt: skip
    assert again.left_quiet == 0


def test_a_refused_output_is_never_left_alone(tmp_path: Path) -> None:
    workload = running_workload(tmp_path, "job")
    link = Path(workload.stdout_path)
    link.symlink_to(tmp_path / "elsewhere")
    (tmp_path / "elsewhere").write_text("x\n")
    now = timezone.now()
    first = process_workloads(
        workload.cluster, [workload.pk], LocalTransport(), now, tokens=tokens(workload)
    )
    assert first.outputs_refused == 1
    again = process_workloads(
        workload.cluster, [workload.pk], LocalTransport(), now + timedelta(seconds=5),
        tokens=tokens(workload),
    )  # fmt: skip
    assert (again.left_quiet, again.outputs_refused) == (0, 1)
