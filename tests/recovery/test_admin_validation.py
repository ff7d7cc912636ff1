"""Admin rejects bad detection patterns and policies with a clear message, and keeps good ones."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse

from recovery.models import DetectionPattern, Policy
from tests.conftest import TEST_PASSWORD
from tests.factories import ClusterFactory

pytestmark = pytest.mark.django_db

XID_LINE = "NVRM: Xid (PCI:0000:3b:00): 79, pid=2231, GPU has fallen off the bus."


@pytest.fixture
def admin_client(site_admin: User) -> Client:
    client = Client()
    assert client.login(username=site_admin.username, password=TEST_PASSWORD)
    return client


def pattern_form(**overrides: str) -> dict[str, str]:
    form = {
        "name": "xid-fallen-off-bus",
        "description": "GPU fell off the bus",
        "pattern": r"NVRM: Xid \(PCI:[0-9a-fA-F:.]+\): 79\b",
        "category": "gpu_hardware",
        "attribution": "hardware",
        "severity": "fatal",
        "examples": XID_LINE,
        "counter_examples": "NVRM: Xid (PCI:0000:3b:00): 13, Graphics SM Warp Exception",
        "enabled": "on",
    }
    form.update(overrides)
    return form


def add_pattern(client: Client, **overrides: str) -> Any:
    return client.post(reverse("admin:recovery_detectionpattern_add"), pattern_form(**overrides))


def test_it_saves_a_valid_pattern(admin_client: Client) -> None:
    response = add_pattern(admin_client)
    assert response.status_code == 302
    assert DetectionPattern.objects.get().name == "xid-fallen-off-bus"


def test_it_refuses_a_pattern_that_does_not_compile(admin_client: Client) -> None:
    response = add_pattern(admin_client, pattern=r"Xid \((PCI")
    assert response.status_code == 200
    assert "does not compile" in response.content.decode()
    assert not DetectionPattern.objects.exists()


@pytest.mark.parametrize("pattern", [r"(?=Xid)Xid", r"(Xid) \1", r"Xid(?!.*13)"])
def test_it_refuses_backtracking_only_syntax(admin_client: Client, pattern: str) -> None:
    response = add_pattern(admin_client, pattern=pattern)
    body = response.content.decode()
    assert response.status_code == 200
    assert "linear-time engine" in body
    assert not DetectionPattern.objects.exists()


def test_it_runs_a_catastrophic_pattern_in_linear_time(admin_client: Client) -> None:
    # (a+)+$ backtracks exponentially on Python's re; on RE2 it is an ordinary pattern.
    response = add_pattern(
        admin_client,
        pattern=r"^(a+)+$",
        examples="aaaa",
        counter_examples="a" * 50_000 + "!",
    )
    assert response.status_code == 302


def test_it_refuses_a_pattern_that_misses_an_example(admin_client: Client) -> None:
    response = add_pattern(admin_client, examples=XID_LINE + "\nXid 79 without the NVRM prefix")
    body = response.content.decode()
    assert response.status_code == 200
    assert "does not match this line: Xid 79 without the NVRM prefix" in body
    assert not DetectionPattern.objects.exists()


def test_it_refuses_a_pattern_that_matches_a_counter_example(admin_client: Client) -> None:
    response = add_pattern(admin_client, counter_examples=XID_LINE)
    assert response.status_code == 200
    assert "The pattern matches this line" in response.content.decode()
    assert not DetectionPattern.objects.exists()


def test_it_requires_an_example(admin_client: Client) -> None:
    response = add_pattern(admin_client, examples="   \n")
    assert response.status_code == 200
    assert not DetectionPattern.objects.exists()


def test_it_refuses_attribution_none_for_a_failure(admin_client: Client) -> None:
    response = add_pattern(admin_client, attribution="none")
    assert response.status_code == 200
    assert "attribution other than" in response.content.decode()


def policy_form(**overrides: str) -> dict[str, str]:
    form = {
        "name": "prod default",
        "enabled": "on",
        "cluster": "",
        "environment": "prod",
        "partition": "",
        "crash_action": "restart",
        "crash_confirmation_seconds": "10",
        "crash_confirmation_step_factor": "3",
        "decision_grace_seconds": "30",
        "exclude_on_attributions": '["hardware"]',
        "exclude_on_categories": '["gpu_hardware", "interconnect"]',
        "exclusion_hours": "24",
        "max_attempts": "10",
        "max_attempts_without_checkpoint": "3",
        "hang_timeout_minutes": "30",
        "hang_step_time_factor": "10",
        "straggler_threshold_percent": "20",
        "straggler_window_minutes": "10",
        "straggler_action": "record",
        "nonfinite_steps": "2",
        "loss_spike_factor": "2.0",
        "divergence_action": "record",
        "throughput_collapse_percent": "50",
        "suspect_node_workloads": "3",
        "suspect_window_hours": "24",
        "blast_radius_percent": "10",
        "blast_radius_window_minutes": "60",
        "decision_timeout_seconds": "300",
        "recommendation_ttl_minutes": "30",
        "progress_pattern": "",
        "checkpoint_pattern": "",
    }
    form.update(overrides)
    return form


def add_policy(client: Client, **overrides: str) -> Any:
    return client.post(reverse("admin:recovery_policy_add"), policy_form(**overrides))


def test_it_saves_a_valid_policy(admin_client: Client) -> None:
    response = add_policy(admin_client, progress_pattern=r"iteration\s+(?P<step>\d+)")
    assert response.status_code == 302
    policy = Policy.objects.get()
    assert policy.exclude_on_attributions == ["hardware"]
    assert policy.specificity == 1


def test_it_refuses_unknown_attributions(admin_client: Client) -> None:
    response = add_policy(admin_client, exclude_on_attributions='["hardware", "cosmic_rays"]')
    assert response.status_code == 200
    assert "Unknown value(s): cosmic_rays" in response.content.decode()
    assert not Policy.objects.exists()


def test_it_refuses_a_list_of_the_wrong_shape(admin_client: Client) -> None:
    response = add_policy(admin_client, exclude_on_categories='{"gpu_hardware": true}')
    assert response.status_code == 200
    assert "Give a list of names" in response.content.decode()


def test_it_refuses_out_of_range_numbers(admin_client: Client) -> None:
    response = add_policy(admin_client, blast_radius_percent="150", max_attempts="0")
    body = response.content.decode()
    assert response.status_code == 200
    assert "less than or equal to 100" in body
    assert "greater than or equal to 1" in body


def test_it_refuses_a_progress_pattern_without_a_step_group(admin_client: Client) -> None:
    response = add_policy(admin_client, progress_pattern=r"iteration\s+\d+")
    assert response.status_code == 200
    assert "named group (?P&lt;step&gt;...)" in response.content.decode()


def test_it_refuses_a_progress_pattern_with_lookaround(admin_client: Client) -> None:
    response = add_policy(admin_client, progress_pattern=r"(?<=iter )(?P<step>\d+)")
    assert response.status_code == 200
    assert "linear-time engine" in response.content.decode()


def test_it_refuses_a_second_policy_for_the_same_scope(admin_client: Client) -> None:
    cluster = ClusterFactory()
    assert add_policy(admin_client, cluster=str(cluster.pk)).status_code == 302
    response = add_policy(admin_client, name="duplicate", cluster=str(cluster.pk))
    assert response.status_code == 200
    assert "already has this cluster, environment and partition" in response.content.decode()
    assert Policy.objects.count() == 1


def test_it_refuses_restart_excluding_without_anything_to_exclude(admin_client: Client) -> None:
    response = add_policy(
        admin_client,
        crash_action="restart_excluding",
        exclude_on_attributions="[]",
        exclude_on_categories="[]",
    )
    assert response.status_code == 200
    assert "needs at least one attribution or category" in response.content.decode()


def test_viewers_cannot_reach_admin(viewer: User) -> None:
    client = Client()
    client.login(username=viewer.username, password=TEST_PASSWORD)
    response = client.get(reverse("admin:recovery_policy_add"))
    assert response.status_code == 302
    assert "/admin/login/" in response["Location"]


def test_admin_shows_the_audit_trail_read_only(admin_client: Client) -> None:
    assert admin_client.get(reverse("admin:recovery_auditevent_changelist")).status_code == 200
    assert admin_client.get(reverse("admin:recovery_auditevent_add")).status_code == 403


@pytest.mark.parametrize(
    ("pattern", "shown"),
    [(r"NCCL INFO", "NCCL INFO Bootstrap"), (r"x*", "NCCL INFO Bootstrap"), (r"loss", "iteration")],
)
def test_it_refuses_a_pattern_that_fires_on_healthy_lines(
    admin_client: Client, pattern: str, shown: str
) -> None:
    response = add_pattern(admin_client, pattern=pattern, examples="NCCL INFO loss xx")
    body = response.content.decode()
    assert response.status_code == 200
    assert "healthy training jobs print" in body
    assert shown in body
    assert not DetectionPattern.objects.exists()
