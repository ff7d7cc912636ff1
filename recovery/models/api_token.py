"""Personal API tokens: how a person (a script, a dashboard) calls the REST API without a session.

Kept apart from controller tokens: a person's token acts with that person's Console role and
starts with ``wrp_``; a controller's token is scoped to one cluster and starts with ``wrc_``.

Through the web (the admin) a person mints only their own tokens: ``web_minting_refusal`` says
why any other is refused. On the server, ``manage.py create_api_token USER`` mints for anyone,
since whoever can run it holds the database and the settings already.
"""

from __future__ import annotations

import secrets
from datetime import timedelta
from typing import TYPE_CHECKING

from django.conf import settings
from django.db import models
from django.utils import timezone

from recovery.models.controller import hash_token

if TYPE_CHECKING:
    from django.contrib.auth.models import User

PERSONAL_TOKEN_PREFIX = "wrp_"
# Marking every request as "used" would write a row per request; a minute is precise enough.
_LAST_USED_RESOLUTION = timedelta(minutes=1)
_MAX_TOKEN_LENGTH = 200


class ApiToken(models.Model):
    """A person's credential for the REST API, with that person's permissions.

    Only a hash of the key is stored; the key itself is shown once, when it is issued.
    """

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens"
    )
    name = models.CharField(max_length=100, help_text="What the token is for, e.g. grafana.")
    key_prefix = models.CharField(max_length=12, editable=False)
    key_hash = models.CharField(max_length=64, unique=True, editable=False)
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True, editable=False)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["user", "name"]
        verbose_name = "personal API token"
        constraints = [
            models.UniqueConstraint(fields=["user", "name"], name="api_token_name_unique")
        ]

    def __str__(self) -> str:
        return f"{self.user}/{self.name} ({self.key_prefix}…)"

    @property
    def is_active(self) -> bool:
        return self.revoked_at is None

    @staticmethod
    def new_key() -> str:
        return PERSONAL_TOKEN_PREFIX + secrets.token_urlsafe(32)

    def set_key(self, raw: str) -> None:
        self.key_prefix = raw[:12]
        self.key_hash = hash_token(raw)

    @classmethod
    def issue(cls, user: User, name: str) -> tuple[ApiToken, str]:
        """Create a token and return it with its key, which is not stored anywhere."""
        raw = cls.new_key()
        token = cls(user=user, name=name)
        token.set_key(raw)
        token.save()
        return token, raw

    @classmethod
    def authenticate(cls, raw: str) -> ApiToken | None:
        """The active token with this key (its user loaded), or None."""
        if not raw.startswith(PERSONAL_TOKEN_PREFIX) or len(raw) > _MAX_TOKEN_LENGTH:
            return None
        token = (
            cls.objects.select_related("user")
            .filter(key_hash=hash_token(raw), revoked_at__isnull=True)
            .first()
        )
        if token is not None:
            now = timezone.now()
            if token.last_used_at is None or now - token.last_used_at >= _LAST_USED_RESOLUTION:
                cls.objects.filter(pk=token.pk).update(last_used_at=now)
                token.last_used_at = now
        return token

    def revoke(self) -> bool:
        """Revoke the token; False when it already was (revoking twice changes nothing)."""
        now = timezone.now()
        changed = ApiToken.objects.filter(pk=self.pk, revoked_at__isnull=True).update(
            revoked_at=now
        )
        if changed:
            self.revoked_at = now
        return bool(changed)


def web_minting_refusal(minter: User, owner: User) -> str | None:
    """Why ``minter`` may not mint a token for ``owner`` through the web, or None when they may.

    A token acts as its owner, with all the owner's permissions, and the trail names the owner
    for what it does; its key is shown once, to whoever mints it. So a person mints only their
    own: for anyone else the key would be shown to someone other than its owner, and for an
    account with more permissions than the minter (a superuser above all) it would hand those
    permissions over. The more specific reasons come first.
    """
    if not minter.is_active:
        return "Your account is disabled."
    if owner.pk == minter.pk:
        return None
    if owner.is_superuser and not minter.is_superuser:
        return f"{owner} is a superuser: only a superuser may mint a token for a superuser."
    if not minter.is_superuser:
        lacking = sorted(owner.get_all_permissions() - minter.get_all_permissions())
        if lacking:
            shown = ", ".join(lacking[:3]) + (", …" if len(lacking) > 3 else "")
            return (
                f"{owner} has permissions you lack ({shown}): a token of theirs would give them "
                "to you."
            )
    return (
        f"A token acts as {owner}, and its key is shown once, to whoever mints it: {owner} mints "
        f"their own here, or an administrator runs `manage.py create_api_token {owner}` on the "
        "server."
    )
