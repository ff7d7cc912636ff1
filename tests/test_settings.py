"""Settings come from the environment, with clear errors and production-safe deploy settings.

Production settings refuse to start without a signing key given to every process (SECRET_KEY or
an owner-only SECRET_KEY_FILE): a key generated per host broke sessions and CSRF across web
replicas. The demo, development and the tests still generate one.
"""

from __future__ import annotations

import hashlib
import os
import secrets
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from workload_recovery.env import (
    configured_secret_key,
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


def test_it_refuses_a_generated_key_file_others_can_read(tmp_path: Path) -> None:
    path = tmp_path / "secret_key"
    persistent_secret_key(path)
    path.chmod(0o644)
    with pytest.raises(
        ImproperlyConfigured, match=r"may be read or written by others \(mode 0644\)"
    ):
        persistent_secret_key(path)


def key_file(tmp_path: Path, mode: int, content: str = "k" * 60) -> Path:
    path = tmp_path / "etc" / "secret_key"
    path.parent.mkdir(exist_ok=True)
    path.write_text(content + "\n")
    path.chmod(mode)
    return path


@pytest.mark.parametrize("mode", [0o600, 0o400], ids=oct)
def test_it_reads_an_owner_only_key_file(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, mode: int
) -> None:
    monkeypatch.setenv("SECRET_KEY_FILE", str(key_file(tmp_path, mode)))
    monkeypatch.setenv("SECRET_KEY", "ignored-when-a-file-is-named")
    assert configured_secret_key() == "k" * 60


@pytest.mark.parametrize("mode", [0o640, 0o644, 0o604, 0o620, 0o602], ids=oct)
def test_it_refuses_a_key_file_others_may_read_or_write(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, mode: int
) -> None:
    monkeypatch.setenv("SECRET_KEY_FILE", str(key_file(tmp_path, mode)))
    with pytest.raises(ImproperlyConfigured, match=f"by others \\(mode {mode:04o}\\)"):
        configured_secret_key()


def test_it_refuses_an_empty_or_missing_key_file(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("SECRET_KEY_FILE", str(key_file(tmp_path, 0o600, content="  ")))
    with pytest.raises(ImproperlyConfigured, match="is empty"):
        configured_secret_key()
    monkeypatch.setenv("SECRET_KEY_FILE", str(tmp_path / "missing"))
    with pytest.raises(ImproperlyConfigured, match="cannot be read"):
        configured_secret_key()


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
        if k not in {"DEBUG", "SECRET_KEY", "SECRET_KEY_FILE"} and not k.startswith("WR_METRICS_")
    }
    return subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=BASE_DIR,
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )


PRODUCTION = {
    "DJANGO_SETTINGS_MODULE": "workload_recovery.production",
    "ALLOWED_HOSTS": "recovery.example.org",
    "WR_METRICS_TOKEN": "scrape-token-of-the-site",
}


def test_production_settings_pass_the_deploy_check(tmp_path: Path) -> None:
    result = run_manage(
        "check",
        "--deploy",
        "--fail-level",
        "WARNING",
        WR_VAR_DIR=str(tmp_path),
        SECRET_KEY=secrets.token_urlsafe(64),
        **PRODUCTION,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert not (tmp_path / "secret_key").exists()


def test_production_settings_refuse_to_start_without_a_secret_key(tmp_path: Path) -> None:
    """
    GIVEN production settings with neither SECRET_KEY nor SECRET_KEY_FILE
    WHEN any process loads them
    THEN it stops with a message naming both, and writes no key of this host's own
    """
    result = run_manage("check", WR_VAR_DIR=str(tmp_path), **PRODUCTION)

    assert result.returncode != 0
    assert "ImproperlyConfigured: SECRET_KEY is not set" in result.stderr
    assert "SECRET_KEY_FILE" in result.stderr
    assert list(tmp_path.iterdir()) == []


def settings_key_digest(**env: str) -> subprocess.CompletedProcess[str]:
    """The SHA-256 of the key the settings end up with (the key itself is never printed)."""
    return run_manage(
        "shell",
        "--no-imports",
        "-c",
        "import hashlib; from django.conf import settings; "
        "print(hashlib.sha256(settings.SECRET_KEY.encode()).hexdigest())",
        **env,
    )


def test_production_settings_use_an_owner_only_key_file(tmp_path: Path) -> None:
    key = secrets.token_urlsafe(64)
    path = key_file(tmp_path, 0o600, content=key)
    var = tmp_path / "var"
    var.mkdir()

    result = settings_key_digest(SECRET_KEY_FILE=str(path), WR_VAR_DIR=str(var), **PRODUCTION)

    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == hashlib.sha256(key.encode()).hexdigest()
    assert list(var.iterdir()) == []


@pytest.mark.parametrize("mode", [0o640, 0o644], ids=oct)
def test_production_settings_refuse_a_key_file_others_can_read(tmp_path: Path, mode: int) -> None:
    """
    GIVEN production settings whose SECRET_KEY_FILE the group or everyone may read
    WHEN any process loads them
    THEN it stops, naming the file's mode and how to fix it
    """
    path = key_file(tmp_path, mode)

    result = run_manage("check", SECRET_KEY_FILE=str(path), WR_VAR_DIR=str(tmp_path), **PRODUCTION)

    assert result.returncode != 0
    assert f"may be read or written by others (mode {mode:04o})" in result.stderr
    assert "chmod 600" in result.stderr


def test_every_web_replica_signs_with_the_same_key(tmp_path: Path) -> None:
    # Two hosts: each its own var directory, one SECRET_KEY for both.
    key = secrets.token_urlsafe(64)
    digests = set()
    for host in ("web-1", "web-2"):
        var = tmp_path / host
        var.mkdir()
        result = settings_key_digest(SECRET_KEY=key, WR_VAR_DIR=str(var), **PRODUCTION)
        assert result.returncode == 0, result.stderr
        digests.add(result.stdout.strip())
    assert digests == {hashlib.sha256(key.encode()).hexdigest()}


def test_development_settings_still_generate_a_key_once(tmp_path: Path) -> None:
    # The demo and a developer's checkout start without any configuration.
    first = settings_key_digest(WR_VAR_DIR=str(tmp_path))
    second = settings_key_digest(WR_VAR_DIR=str(tmp_path))
    assert first.returncode == 0, first.stderr
    assert first.stdout == second.stdout
    assert stat.S_IMODE((tmp_path / "secret_key").stat().st_mode) == 0o600


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
