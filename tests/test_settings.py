"""Settings come from the environment, with clear errors and production-safe deploy settings."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from workload_recovery.env import (
    env_bool,
    env_int,
    env_list,
    env_str,
    parse_database_url,
    persistent_secret_key,
)

BASE_DIR = Path(settings.BASE_DIR)


def test_it_reads_booleans_strictly(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WR_FLAG", "True")
    assert env_bool("WR_FLAG", False) is True
    monkeypatch.setenv("WR_FLAG", "off")
    assert env_bool("WR_FLAG", True) is False
    monkeypatch.setenv("WR_FLAG", "maybe")
    with pytest.raises(ImproperlyConfigured, match="WR_FLAG='maybe' is not a boolean"):
        env_bool("WR_FLAG", False)


def test_it_reads_integers_with_a_minimum(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WR_NUMBER", "12")
    assert env_int("WR_NUMBER", 1, minimum=1) == 12
    monkeypatch.setenv("WR_NUMBER", "twelve")
    with pytest.raises(ImproperlyConfigured, match="not an integer"):
        env_int("WR_NUMBER", 1)
    monkeypatch.setenv("WR_NUMBER", "0")
    with pytest.raises(ImproperlyConfigured, match="below the minimum"):
        env_int("WR_NUMBER", 1, minimum=1)


def test_it_reads_lists_and_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("WR_HOSTS", raising=False)
    assert env_list("WR_HOSTS", ["localhost"]) == ["localhost"]
    monkeypatch.setenv("WR_HOSTS", " a.example, ,b.example ")
    assert env_list("WR_HOSTS", []) == ["a.example", "b.example"]


def test_it_reads_secrets_from_files(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_text("s3cret\n")
    monkeypatch.setenv("WR_TOKEN_FILE", str(secret))
    assert env_str("WR_TOKEN") == "s3cret"
    monkeypatch.setenv("WR_TOKEN_FILE", str(tmp_path / "missing"))
    with pytest.raises(ImproperlyConfigured, match="cannot be read"):
        env_str("WR_TOKEN")


def test_it_generates_and_keeps_a_secret_key(tmp_path: Path) -> None:
    path = tmp_path / "var" / "secret_key"
    first = persistent_secret_key(path)
    assert len(first) >= 50
    assert persistent_secret_key(path) == first
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_it_parses_database_urls(tmp_path: Path) -> None:
    mysql = parse_database_url("mysql://wr:p%40ss@db.internal:3307/recovery", base_dir=tmp_path)
    assert mysql["ENGINE"] == "django.db.backends.mysql"
    assert (mysql["NAME"], mysql["USER"], mysql["PASSWORD"]) == ("recovery", "wr", "p@ss")
    assert (mysql["HOST"], mysql["PORT"]) == ("db.internal", "3307")
    assert mysql["OPTIONS"] == {"charset": "utf8mb4"}
    relative = parse_database_url("sqlite:///var/db.sqlite3", base_dir=tmp_path)
    assert relative["NAME"] == str(tmp_path / "var" / "db.sqlite3")
    absolute = parse_database_url("sqlite:////srv/db.sqlite3", base_dir=tmp_path)
    assert absolute["NAME"] == "/srv/db.sqlite3"


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("postgres://localhost/db", "scheme 'postgres' is not supported"),
        ("mysql://root@localhost/", "names no database"),
        ("mysql://root@localhost:notaport/db", "invalid port"),
        ("sqlite://", "names no file"),
    ],
)
def test_it_explains_bad_database_urls(url: str, message: str, tmp_path: Path) -> None:
    with pytest.raises(ImproperlyConfigured, match=message):
        parse_database_url(url, base_dir=tmp_path)


def run_manage(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {
        k: v
        for k, v in os.environ.items()
        if k not in {"DEBUG", "SECRET_KEY"} and not k.startswith("WR_METRICS_")
    }
    return subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=BASE_DIR,
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_production_settings_pass_the_deploy_check(tmp_path: Path) -> None:
    result = run_manage(
        "check",
        "--deploy",
        "--fail-level",
        "WARNING",
        DJANGO_SETTINGS_MODULE="workload_recovery.production",
        WR_VAR_DIR=str(tmp_path),
        ALLOWED_HOSTS="recovery.example.org",
        WR_METRICS_TOKEN="scrape-token-of-the-site",
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert (tmp_path / "secret_key").exists()


def test_development_settings_keep_metrics_open_by_default(tmp_path: Path) -> None:
    result = run_manage("check", WR_VAR_DIR=str(tmp_path))
    assert result.returncode == 0, result.stdout + result.stderr


def test_a_malformed_setting_stops_start_up() -> None:
    result = run_manage("check", DEBUG="perhaps")
    assert result.returncode != 0
    assert "DEBUG='perhaps' is not a boolean" in result.stderr


def test_every_model_change_has_a_migration() -> None:
    result = run_manage("makemigrations", "--check", "--dry-run")
    assert result.returncode == 0, result.stdout + result.stderr
