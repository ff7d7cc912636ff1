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
                "It sees and claims only that cluster's recommendations."
            ),
        }
