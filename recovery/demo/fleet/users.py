"""The demo users ``operator``, ``viewer`` and ``admin``, one per role."""

from __future__ import annotations

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.db import transaction

from recovery import roles

DEMO_USERS: tuple[tuple[str, str, bool], ...] = (
    ("operator", roles.OPERATOR, False),
    ("viewer", roles.VIEWER, False),
    ("admin", roles.ADMIN, True),
)


def ensure_demo_users(password: str) -> list[str]:
    """Create or update the demo users ``operator``, ``viewer`` and ``admin``.

    Each ends up in exactly its role's group with ``password``; ``admin`` may also use the
    Django admin (staff) without being a superuser. Returns the user names.
    """
    if not password:
        raise ValueError("a demo password must not be empty")
    user_model = get_user_model()
    usernames: list[str] = []
    with transaction.atomic():
        for username, group_name, staff in DEMO_USERS:
            try:
                group = Group.objects.get(name=group_name)
            except Group.DoesNotExist:
                raise RuntimeError(
                    f"the group {group_name!r} is missing: run `manage.py migrate` first"
                ) from None
            user, _ = user_model.objects.get_or_create(username=username)
            user.set_password(password)
            user.is_active = True
            user.is_staff = staff
            user.is_superuser = False
            user.save()
            user.groups.set([group])
            usernames.append(username)
    return usernames
