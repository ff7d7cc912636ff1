from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse
from pytest_django.fixtures import Settings as SettingsWrapper

from tests.conftest import TEST_PASSWORD

pytestmark = pytest.mark.django_db


def test_it_reports_healthy_services_to_anyone() -> None:
    response = Client().get(reverse("api:health"))
    assert response.status_code == 200
    body = response.json()
    assert body["healthy"] is True
    assert body["services"] == [{"name": "database", "ok": True}, {"name": "redis", "ok": True}]


def test_it_reports_an_unreachable_redis_as_503(settings: SettingsWrapper, viewer: User) -> None:
    settings.REDIS_URL = "redis://127.0.0.1:1/0"
    client = Client()
    client.login(username=viewer.username, password=TEST_PASSWORD)
    response = client.get(reverse("api:health"))
    assert response.status_code == 503
    redis_status = response.json()["services"][1]
    assert redis_status["name"] == "redis"
    assert redis_status["ok"] is False
    assert "Connection refused" in redis_status["detail"] or "Error" in redis_status["detail"]
