"""Authentication of scheduler-side controllers by a token scoped to one cluster."""

from __future__ import annotations

from dataclasses import dataclass

from rest_framework.authentication import BaseAuthentication, get_authorization_header
from rest_framework.exceptions import AuthenticationFailed
from rest_framework.permissions import BasePermission
from rest_framework.request import Request
from rest_framework.views import APIView

from recovery.models import Cluster, ControllerToken


@dataclass(frozen=True)
class ControllerPrincipal:
    """Stands in for ``request.user`` when a controller calls: it is its token."""

    token: ControllerToken

    is_authenticated = True
    is_active = True

    @property
    def cluster(self) -> Cluster:
        return self.token.cluster

    @property
    def actor(self) -> str:
        return self.token.actor

    def get_username(self) -> str:
        return self.actor


class ControllerTokenAuthentication(BaseAuthentication):
    keyword = b"bearer"

    def authenticate(self, request: Request) -> tuple[ControllerPrincipal, ControllerToken] | None:
        parts = get_authorization_header(request).split()
        if not parts or parts[0].lower() != self.keyword:
            return None
        if len(parts) != 2:
            raise AuthenticationFailed("Send 'Authorization: Bearer <controller token>'.")
        try:
            raw = parts[1].decode("ascii")
        except UnicodeDecodeError:
            raise AuthenticationFailed("The token is not ASCII.") from None
        token = ControllerToken.authenticate(raw)
        if token is None:
            raise AuthenticationFailed("Unknown or revoked controller token.")
        return ControllerPrincipal(token), token

    def authenticate_header(self, request: Request) -> str:
        return "Bearer"


class IsController(BasePermission):
    message = "This endpoint is for scheduler-side controllers (a cluster's controller token)."

    def has_permission(self, request: Request, view: APIView) -> bool:
        return isinstance(request.user, ControllerPrincipal)
