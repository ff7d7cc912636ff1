"""Authentication of people by a personal API token (``Authorization: Bearer wrp_…``).

Controllers send ``Bearer wrc_…`` to the Advisor API (``api.authentication``); the prefix
tells the two apart, so each authenticator refuses the other's tokens with a message that says
where they belong instead of a bare "invalid token".
"""

from __future__ import annotations

from typing import Any

from django.contrib.auth.models import AbstractBaseUser
from drf_spectacular.extensions import OpenApiAuthenticationExtension
from rest_framework.authentication import BaseAuthentication, get_authorization_header
from rest_framework.exceptions import AuthenticationFailed
from rest_framework.request import Request

from recovery.models import ApiToken
from recovery.models.api_token import PERSONAL_TOKEN_PREFIX
from recovery.models.controller import TOKEN_PREFIX as CONTROLLER_TOKEN_PREFIX


class PersonalTokenAuthentication(BaseAuthentication):
    keyword = b"bearer"

    def authenticate(self, request: Request) -> tuple[AbstractBaseUser, ApiToken] | None:
        parts = get_authorization_header(request).split()
        if not parts or parts[0].lower() != self.keyword:
            return None
        if len(parts) != 2:
            raise AuthenticationFailed("Send 'Authorization: Bearer <personal API token>'.")
        try:
            raw = parts[1].decode("ascii")
        except UnicodeDecodeError:
            raise AuthenticationFailed("The token is not ASCII.") from None
        if raw.startswith(CONTROLLER_TOKEN_PREFIX):
            raise AuthenticationFailed(
                "This is a controller token; it works only on the Advisor API "
                "(/api/v1/advisor/). People use a personal token (wrp_…)."
            )
        if not raw.startswith(PERSONAL_TOKEN_PREFIX):
            raise AuthenticationFailed(
                f"Not a personal API token (they start with {PERSONAL_TOKEN_PREFIX})."
            )
        token = ApiToken.authenticate(raw)
        if token is None:
            raise AuthenticationFailed("Unknown or revoked API token.")
        if not token.user.is_active:
            raise AuthenticationFailed("The token's user account is disabled.")
        return token.user, token

    def authenticate_header(self, request: Request) -> str:
        return 'Bearer realm="api"'


class PersonalTokenScheme(OpenApiAuthenticationExtension):
    target_class = "api.tokens.PersonalTokenAuthentication"
    name = "personalToken"

    def get_security_definition(self, auto_schema: Any) -> dict[str, Any]:
        return {
            "type": "http",
            "scheme": "bearer",
            "description": (
                "A person's API token (`wrp_…`, from `manage.py create_api_token USER` or the "
                "admin). It acts with that person's Console role: viewers read, operators also "
                "approve and reject."
            ),
        }
