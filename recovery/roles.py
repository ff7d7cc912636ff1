"""The Console roles, backed by Django groups created in a migration."""

from __future__ import annotations

from django.contrib.auth.models import AbstractBaseUser, AnonymousUser

VIEWER = "viewer"
OPERATOR = "operator"
ADMIN = "admin"
ROLES = (VIEWER, OPERATOR, ADMIN)

DECIDE_PERMISSION = "recovery.decide_recommendation"


def can_decide(user: AbstractBaseUser | AnonymousUser) -> bool:
    """Whether the user may approve or reject recommendations."""
    return bool(user.is_authenticated and user.has_perm(DECIDE_PERMISSION))


def actor_name(user: AbstractBaseUser) -> str:
    return user.get_username()
