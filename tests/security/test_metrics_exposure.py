"""/metrics tells how many jobs fail and why: production settings do not start with it open to
anyone unless the site says so (a scrape token, scrape networks, or WR_METRICS_PUBLIC=true)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.test_settings import run_manage


def test_production_settings_refuse_to_start_with_metrics_open(tmp_path: Path) -> None:
    """
    GIVEN production settings with neither a scrape token nor scrape networks for /metrics
    WHEN any process loads them
    THEN it stops, saying how to protect /metrics or how to say it is meant to be open
    """
    result = run_manage(
        "check",
        DJANGO_SETTINGS_MODULE="workload_recovery.production",
        WR_VAR_DIR=str(tmp_path),
        SECRET_KEY="metrics-exposure-test-" + "k" * 50,
        ALLOWED_HOSTS="recovery.example.org",
    )
    assert result.returncode != 0
    assert "ImproperlyConfigured: /metrics would be open to anyone" in result.stderr
    for remedy in ("WR_METRICS_TOKEN", "WR_METRICS_NETWORKS", "WR_METRICS_PUBLIC=true"):
        assert remedy in result.stderr


@pytest.mark.parametrize(
    "protection",
    [
        {"WR_METRICS_TOKEN": "scrape-token-of-the-site"},
        {"WR_METRICS_NETWORKS": "10.20.0.0/16"},
        {"WR_METRICS_PUBLIC": "true"},
    ],
    ids=["token", "networks", "explicitly-public"],
)
def test_production_settings_start_with_metrics_protected_or_declared_public(
    protection: dict[str, str], tmp_path: Path
) -> None:
    result = run_manage(
        "check",
        DJANGO_SETTINGS_MODULE="workload_recovery.production",
        WR_VAR_DIR=str(tmp_path),
        SECRET_KEY="metrics-exposure-test-" + "k" * 50,
        ALLOWED_HOSTS="recovery.example.org",
        **protection,
    )
    assert result.returncode == 0, result.stdout + result.stderr
