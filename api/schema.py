"""OpenAPI descriptions that the views' code cannot express by itself."""

from __future__ import annotations

from typing import Any

from drf_spectacular.extensions import OpenApiAuthenticationExtension


class ControllerTokenScheme(OpenApiAuthenticationExtension):
    target_class = "api.authentication.ControllerTokenAuthentication"
    name = "controllerToken"

    def get_security_definition(self, auto_schema: Any) -> dict[str, Any]:
        return {
            "type": "http",
            "scheme": "bearer",
            "description": (
                "A controller token for one cluster (`manage.py create_controller_token`). "
                "It sees and claims only that cluster's recommendations; job and hook tokens "
                "are refused here."
            ),
        }


class IngestTokenScheme(OpenApiAuthenticationExtension):
    target_class = "api.authentication.IngestTokenAuthentication"
    name = "ingestToken"

    def get_security_definition(self, auto_schema: Any) -> dict[str, Any]:
        return {
            "type": "http",
            "scheme": "bearer",
            "description": (
                "A job token (`wrj_…`: heartbeats and logs of the one job or user it names) or a "
                "hook token (`wrh_…`: the scheduler hooks' job ends and node failures), for one "
                "cluster (`manage.py issue_ingest_token`, or POST "
                "/api/v1/clusters/{id}/job-tokens/ for job tokens). Controller tokens are refused."
            ),
        }
