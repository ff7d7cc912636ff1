from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import IntegrityError

from recovery.models import ApiToken


class Command(BaseCommand):
    help = (
        "Issue a personal API token for a user; the key is printed once and not stored. "
        "It acts with the user's Console role. Revoke it in the admin or with --revoke."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("username")
        parser.add_argument("--name", default="api", help="What the token is for, e.g. grafana.")
        parser.add_argument(
            "--revoke", action="store_true", help="Revoke the user's token of this name instead."
        )

    def handle(self, *args: Any, username: str, name: str, revoke: bool, **options: Any) -> None:
        user_model = get_user_model()
        try:
            user = user_model.objects.get(**{user_model.USERNAME_FIELD: username})
        except user_model.DoesNotExist:
            raise CommandError(f"no user named {username!r}") from None
        if revoke:
            token = ApiToken.objects.filter(user=user, name=name).first()
            if token is None:
                raise CommandError(f"{username} has no token named {name!r}")
            changed = token.revoke()
            self.stdout.write(f"revoked {token}" if changed else f"{token} was already revoked")
            return
        if not user.is_active:
            raise CommandError(f"user {username!r} is disabled")
        try:
            _, key = ApiToken.issue(user, name)
        except IntegrityError:
            raise CommandError(
                f"{username} already has a token named {name!r} (use --name, or --revoke it)"
            ) from None
        self.stdout.write(key)
