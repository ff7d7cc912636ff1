"""Schemathesis over the whole OpenAPI schema, as signed-in people and as a controller.

Every operation of ``/api/schema/`` gets generated requests, valid and invalid; every answer must
be free of server errors and match the schema (status codes, content type, body). ``make test``
runs a bounded number of examples per operation (``WR_FUZZ_EXAMPLES``, 5); ``make fuzz-api``
runs many more.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import schemathesis
from django.contrib.auth.models import User
from django.core import signals
from django.core.wsgi import get_wsgi_application
from django.db import close_old_connections
from django.test import Client
from drf_spectacular.generators import SchemaGenerator
from drf_spectacular.renderers import OpenApiJsonRenderer
from hypothesis import HealthCheck
from hypothesis import settings as hypothesis_settings
from schemathesis.checks import CheckFunction
from schemathesis.specs.openapi.checks import positive_data_acceptance

from recovery.models import ControllerToken, IngestToken, IngestTokenKind
from tests.conftest import TEST_PASSWORD
from tests.factories import ClusterFactory, RecommendationFactory, WorkloadFactory

FUZZ_EXAMPLES = int(os.environ.get("WR_FUZZ_EXAMPLES", "5"))

pytestmark = pytest.mark.django_db


def _openapi_document() -> dict[str, Any]:
    """The schema /api/schema/ serves, generated in process (no request, no database)."""
    # drf-spectacular leaves its generator unannotated.
    document = SchemaGenerator().get_schema(request=None, public=True)  # type: ignore[no-untyped-call]
    schema: dict[str, Any] = json.loads(OpenApiJsonRenderer().render(document))
    return schema


schema = schemathesis.openapi.from_dict(_openapi_document())
schema.app = get_wsgi_application()


@pytest.fixture(autouse=True)
def _requests_keep_the_test_connection() -> Iterator[None]:
    # Calls run in process, as with Django's test client: a request must not close the test's
    # connection, which would break the transaction the test runs in.
    signals.request_started.disconnect(close_old_connections)
    signals.request_finished.disconnect(close_old_connections)
    yield
    signals.request_started.connect(close_old_connections)
    signals.request_finished.connect(close_old_connections)


@pytest.fixture
def credentials(make_user: Callable[..., User]) -> dict[str, dict[str, str]]:
    """Headers per audience: the Advisor API takes a controller token, the ingest endpoints a job
    token (a job's evidence) or a hook token (scheduler events), the rest a person."""
    cluster = ClusterFactory(name="fuzz")
    workload = WorkloadFactory(cluster=cluster)
    RecommendationFactory(workload=workload)
    _, controller_token = ControllerToken.issue(cluster=cluster, name="fuzz-controller")
    _, job_token = IngestToken.issue(
        cluster, IngestTokenKind.JOB, name="fuzz-job", issued_by="fuzz", user=workload.user
    )
    _, hook_token = IngestToken.issue(
        cluster, IngestTokenKind.HOOK, name="fuzz-hooks", issued_by="fuzz"
    )
    operator = make_user("fuzz-operator", "operator")
    client = Client()
    assert client.login(username=operator.username, password=TEST_PASSWORD)
    session = client.cookies["sessionid"].value
    return {
        "controller": {"Authorization": f"Bearer {controller_token}"},
        "job": {"Authorization": f"Bearer {job_token}"},
        "hook": {"Authorization": f"Bearer {hook_token}"},
        "person": {"Cookie": f"sessionid={session}"},
    }


@schema.parametrize()
@hypothesis_settings(
    max_examples=FUZZ_EXAMPLES,
    deadline=None,
    database=None,
    suppress_health_check=list(HealthCheck),
)
def test_the_api_answers_every_request_within_its_schema(
    case: schemathesis.Case[schemathesis.APIOperation[Any, Any, Any, Any]],
    credentials: dict[str, dict[str, str]],
) -> None:
    if "/advisor/" in case.path:
        audience = "controller"
    elif "/ingest/scheduler/" in case.path:
        audience = "hook"
    elif "/ingest/" in case.path:
        audience = "job"
    else:
        audience = "person"
    # The ingest endpoints refuse some bodies the schema cannot tell apart from good ones: a
    # cluster name other than the token's, a text/plain batch without job_id in the query.
    relaxed: list[CheckFunction] = [positive_data_acceptance] if "/ingest/" in case.path else []
    case.call_and_validate(headers=credentials[audience], excluded_checks=relaxed)
