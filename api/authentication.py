"""Authentication of what runs on the cluster, by tokens scoped to one cluster.

Three kinds, told apart by their prefix, each refused where it does not belong (403, saying
which token the endpoint takes):

- the controller's token (``wrc_``): the Advisor API only;
- a job token (``wrj_``): heartbeats and log batches of the job or user it names;
- a hook token (``wrh_``): the scheduler hooks' job ends and node failures.
"""

from __future__ import annotations

from dataclasses import dataclass

from rest_framework.authentication import BaseAuthentication, get_authorization_header
from rest_framework.exceptions import AuthenticationFailed, PermissionDenied
from rest_framework.permissions import BasePermission
from rest_framework.request import Request
from rest_framework.views import APIView

from recovery.models import Cluster, ControllerToken, IngestToken, IngestTokenKind
from recovery.models.controller import TOKEN_PREFIX as CONTROLLER_TOKEN_PREFIX
from recovery.models.ingest_token import HOOK_TOKEN_PREFIX, JOB_TOKEN_PREFIX

CONTROLLER_ONLY = (
    "The Advisor API takes the cluster's controller token (wrc_…); job (wrj_…) and hook "
    "(wrh_…) tokens may only push to /api/v1/ingest/."
)
NO_CONTROLLER_PUSH = (
    "Controller tokens (wrc_…) may not push to /api/v1/ingest/: a job holding one could act on "
    "every job of the cluster. Jobs push with a job token (wrj_…, `manage.py issue_ingest_token "
    "--kind job` or POST /api/v1/clusters/<id>/job-tokens/), scheduler hooks with a hook token "
    "(wrh_…, `manage.py issue_ingest_token --kind hook`)."
)


@dataclass(frozen=True)
class _TokenPrincipal:
    """Stands in for ``request.user`` when a program on the cluster calls: it is its token."""

    token: ControllerToken | IngestToken

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


@dataclass(frozen=True)
class ControllerPrincipal(_TokenPrincipal):
    token: ControllerToken


@dataclass(frozen=True)
class IngestPrincipal(_TokenPrincipal):
    token: IngestToken


def _bearer_key(request: Request, what: str) -> str | None:
    parts = get_authorization_header(request).split()
    if not parts or parts[0].lower() != b"bearer":
        return None
    if len(parts) != 2:
        raise AuthenticationFailed(f"Send 'Authorization: Bearer <{what}>'.")
    try:
        return parts[1].decode("ascii")
    except UnicodeDecodeError:
        raise AuthenticationFailed("The token is not ASCII.") from None


class ControllerTokenAuthentication(BaseAuthentication):
    def authenticate(self, request: Request) -> tuple[ControllerPrincipal, ControllerToken] | None:
        raw = _bearer_key(request, "controller token")
        if raw is None:
            return None
        if raw.startswith((JOB_TOKEN_PREFIX, HOOK_TOKEN_PREFIX)):
            raise PermissionDenied(CONTROLLER_ONLY)
        token = ControllerToken.authenticate(raw)
        if token is None:
            raise AuthenticationFailed("Unknown or revoked controller token.")
        return ControllerPrincipal(token), token

    def authenticate_header(self, request: Request) -> str:
        return "Bearer"


class IngestTokenAuthentication(BaseAuthentication):
    def authenticate(self, request: Request) -> tuple[IngestPrincipal, IngestToken] | None:
        raw = _bearer_key(request, "job or hook token")
        if raw is None:
            return None
        if raw.startswith(CONTROLLER_TOKEN_PREFIX):
            raise PermissionDenied(NO_CONTROLLER_PUSH)
        token = IngestToken.authenticate(raw)
        if token is None:
            raise AuthenticationFailed("Unknown, expired or revoked job or hook token.")
        return IngestPrincipal(token), token

    def authenticate_header(self, request: Request) -> str:
        return "Bearer"


class IsController(BasePermission):
    message = "This endpoint is for scheduler-side controllers (a cluster's controller token)."

    def has_permission(self, request: Request, view: APIView) -> bool:
        return isinstance(request.user, ControllerPrincipal)


class IsJobToken(BasePermission):
    message = (
        "Heartbeats and log batches take a job token (wrj_…); a hook token pushes only job ends "
        "and node failures."
    )

    def has_permission(self, request: Request, view: APIView) -> bool:
        user = request.user
        return isinstance(user, IngestPrincipal) and user.token.kind == IngestTokenKind.JOB


class IsHookToken(BasePermission):
    message = (
        "Scheduler events take a hook token (wrh_…), which lives with the scheduler's hooks; a "
        "job token pushes only its job's heartbeats and logs."
    )

    def has_permission(self, request: Request, view: APIView) -> bool:
        user = request.user
        return isinstance(user, IngestPrincipal) and user.token.kind == IngestTokenKind.HOOK
