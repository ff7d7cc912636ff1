"""Create or update the demo users operator, viewer and admin."""

from __future__ import annotations

import os
import secrets
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.urls import reverse

from recovery.demo.fleet import DEMO_USERS, ensure_demo_users


class Command(BaseCommand):
    help = (
        "Create or update the demo users operator, viewer and admin (one role each). The "
        "password comes from --password, else DEMO_PASSWORD, else a generated one is printed."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--password", default="", help="Password for all three users.")
        parser.add_argument(
            "--base-url",
            default="http://127.0.0.1:8000",
            help="Where the Console is served, for the login address printed at the end.",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        password = options["password"] or os.environ.get("DEMO_PASSWORD", "")
        source = "--password" if options["password"] else "DEMO_PASSWORD"
        generated = not password
        if generated:
            password = secrets.token_urlsafe(12)
        try:
            usernames = ensure_demo_users(password)
        except RuntimeError as exc:
            raise CommandError(str(exc)) from exc

        if options["verbosity"] == 0:
            return
        roles = {username: role for username, role, _ in DEMO_USERS}
        listing = ", ".join(f"{name} (role {roles.get(name, '?')})" for name in usernames)
        self.stdout.write(self.style.SUCCESS(f"Demo user names: {listing}"))
        if generated:
            self.stdout.write(f"Demo password ({', '.join(usernames)}): {password}")
        else:
            self.stdout.write(f"Demo password ({', '.join(usernames)}): as given in {source}")
        login = options["base_url"].rstrip("/") + reverse("login")
        self.stdout.write(
            f"Log in at {login} (admin may also use {options['base_url'].rstrip('/')}"
            f"{reverse('admin:index')})"
        )
