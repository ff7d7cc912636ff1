"""The Console roles, backed by Django groups: viewer, operator and admin.

``ROLE_PERMISSIONS`` is the one definition of what each role may do. Migration 0003 applied
the roles as they were then, and a migration adding a viewable model adds its permission;
``sync_roles`` applies them as they are now (in a freshly flushed database).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from django.contrib.auth.models import AbstractBaseUser, AbstractUser, AnonymousUser

from recovery.audit.actors import operator_actor

VIEWER = "viewer"
OPERATOR = "operator"
ADMIN = "admin"
ROLES = (VIEWER, OPERATOR, ADMIN)

DECIDE_PERMISSION = "recovery.decide_recommendation"

_VIEWABLE = [
    "cluster",
    "node",
    "workload",
    "workflow",
    "attempt",
    "anomaly",
    "verdict",
    "recommendation",
    "auditevent",
    "policy",
    "environmentbinding",
    "detectionpattern",
]
_ADMIN_EDITABLE = [
    "cluster",
    "node",
    "workload",
    "policy",
    "environmentbinding",
    "detectionpattern",
]
_VIEW = [f"view_{model}" for model in _VIEWABLE]
_DECIDE = ["decide_recommendation"]
_EDIT = [f"{verb}_{model}" for model in _ADMIN_EDITABLE for verb in ("add", "change", "delete")]

# Codenames of permissions in the ``recovery`` app, per role.
ROLE_PERMISSIONS: dict[str, list[str]] = {
    VIEWER: _VIEW,
    OPERATOR: _VIEW + _DECIDE,
    ADMIN: _VIEW + _DECIDE + _EDIT,
}


def sync_roles(
    group_model: Any,
    permission_model: Any,
    role_permissions: Mapping[str, list[str]] = ROLE_PERMISSIONS,
) -> None:
    """Create the role groups and give each exactly its permissions.

    Takes the model classes so a migration can pass its historical models, and the
    permissions as they were at that migration.
    """
    for role, codenames in role_permissions.items():
        permissions = list(
            permission_model.objects.filter(
                content_type__app_label="recovery", codename__in=codenames
            )
        )
        missing = set(codenames) - {permission.codename for permission in permissions}
        if missing:
            raise RuntimeError(f"permissions missing for role {role}: {sorted(missing)}")
        group, _ = group_model.objects.get_or_create(name=role)
        group.permissions.set(permissions)


def can_decide(user: AbstractUser | AnonymousUser) -> bool:
    """Whether the user may approve or reject recommendations."""
    return bool(user.is_authenticated and user.has_perm(DECIDE_PERMISSION))


def actor_name(user: AbstractBaseUser | AnonymousUser) -> str:
    return operator_actor(user.get_username())
