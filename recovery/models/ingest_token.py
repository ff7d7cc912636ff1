"""Credentials for what runs on the cluster and pushes to the ingest endpoints.

Two kinds, apart from the controller's token (``wrc_``), because what holds them is not trusted
alike:

- a **job token** (``wrj_``) lives in a user's job: it may push heartbeats and log batches, and
  only for the one job it names (its id and its submit time, so the later job Slurm gives the
  same id after a restart of its controller or a wraparound does not match) or for the jobs of
  the one scheduler user it names; it expires, by default after ``WR_JOB_TOKEN_TTL_HOURS``;
- a **hook token** (``wrh_``) lives in the scheduler's epilog and strigger scripts, root-owned on
  the controller host: it may push job ends and node failures, nothing else.

Neither may call the Advisor API, and the controller's token may not push: a job that held it
could act on every other job of the cluster.
"""

from __future__ import annotations

import re
import secrets
from datetime import datetime, timedelta

from django.db import models
from django.db.models import Q
from django.utils import timezone

from recovery.audit.actors import hook_actor, job_token_actor
from recovery.models.cluster import Cluster
from recovery.models.controller import hash_token

JOB_TOKEN_PREFIX = "wrj_"
HOOK_TOKEN_PREFIX = "wrh_"
_MAX_TOKEN_LENGTH = 200
# A token used by every heartbeat would write a row per request; a minute is precise enough.
_LAST_USED_RESOLUTION = timedelta(minutes=1)


# Slurm job ids (array and het-job forms included) and POSIX user names.
_JOB_ID = re.compile(r"[0-9A-Za-z_.+-]{1,64}")
_USER = re.compile(r"[A-Za-z0-9_.][A-Za-z0-9_.@-]{0,63}")


class IngestTokenKind(models.TextChoices):
    JOB = "job", "job (heartbeats and logs of one job or one user's jobs)"
    HOOK = "hook", "scheduler hook (job ends and node failures)"


PREFIX_OF_KIND = {IngestTokenKind.JOB: JOB_TOKEN_PREFIX, IngestTokenKind.HOOK: HOOK_TOKEN_PREFIX}


def validate_scope(
    kind: IngestTokenKind, job_id: str, submit_time: datetime | None, user: str
) -> str:
    """Why a token of this kind cannot have this scope, or "" when it can."""
    if kind == IngestTokenKind.HOOK:
        if job_id or user or submit_time:
            return "A hook token is for the whole cluster's scheduler events: give no job or user."
        return ""
    if bool(job_id) == bool(user):
        return "A job token names exactly one job (job id) or one user."
    if job_id and not _JOB_ID.fullmatch(job_id):
        return f"{job_id!r} is not a job id."
    if user and not _USER.fullmatch(user):
        return f"{user!r} is not a user name."
    if submit_time is not None and not job_id:
        return "A submit time goes with a job id."
    if job_id and submit_time is None:
        return UNBOUND_JOB_ID
    return ""


UNBOUND_JOB_ID = (
    "A job token for a job id names that job's submit time too (or give its workload): Slurm "
    "hands the id out again after a restart of its controller or a wraparound, and the token "
    "would cover that later job."
)


class IngestToken(models.Model):
    """A job's or a scheduler hook's credential, valid for one cluster only.

    Only a hash of the key is stored; the key itself is shown once, when it is issued.
    """

    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="ingest_tokens")
    kind = models.CharField(max_length=8, choices=IngestTokenKind.choices)
    name = models.CharField(max_length=100, help_text="What the token is for, e.g. job-48213.")
    job_id = models.CharField(
        max_length=64, blank=True, help_text="A job token for this job only (blank: see user)."
    )
    job_submit_time = models.DateTimeField(
        null=True,
        blank=True,
        help_text="With job_id: that job's submit time, so a reused id fails. Tokens issued "
        "without one (before it was required) cover no job.",
    )
    user = models.CharField(
        max_length=64, blank=True, help_text="A job token for this scheduler user's jobs only."
    )
    issued_by = models.CharField(max_length=150, help_text="Who issued it (audit actor).")
    key_prefix = models.CharField(max_length=12, editable=False)
    key_hash = models.CharField(max_length=64, unique=True, editable=False)
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField(null=True, blank=True)
    last_used_at = models.DateTimeField(null=True, blank=True, editable=False)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["cluster", "-created_at"]
        verbose_name = "job or hook token"
        constraints = [
            # A job token names exactly one job or exactly one user; a hook token names neither.
            models.CheckConstraint(
                condition=(Q(kind="job", job_id="", job_submit_time__isnull=True) & ~Q(user=""))
                | (Q(kind="job", user="") & ~Q(job_id=""))
                | Q(kind="hook", job_id="", user="", job_submit_time__isnull=True),
                name="ingest_token_scope",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.cluster.name}/{self.kind}/{self.name} ({self.key_prefix}…)"

    @property
    def actor(self) -> str:
        if self.kind == IngestTokenKind.HOOK:
            return hook_actor(self.name)
        return job_token_actor(self.name)

    @property
    def scope(self) -> str:
        """What the token may push for, in words."""
        if self.kind == IngestTokenKind.HOOK:
            return "scheduler events of the cluster"
        if self.job_id and self.job_submit_time is None:
            return f"job {self.job_id} without its submit time (covers no job)"
        if self.job_id:
            return f"job {self.job_id}"
        return f"jobs of user {self.user}"

    def is_active(self, now: datetime | None = None) -> bool:
        now = now or timezone.now()
        return self.revoked_at is None and (self.expires_at is None or self.expires_at > now)

    @property
    def unbound_problem(self) -> str:
        """Why this job token covers no job at all, or "" when it covers its own.

        A token that names a job id without its submit time was issued before the submit time
        was required. It would cover whichever job holds the id now, another user's once Slurm
        hands the id out again, so it is refused rather than guessed at.
        """
        if self.kind != IngestTokenKind.JOB or not self.job_id or self.job_submit_time:
            return ""
        return (
            f"This job token names job {self.job_id} without its submit time, so it would also "
            "cover a later job Slurm gives the same id; such tokens are no longer accepted. Ask "
            "an operator for a new one, issued for the workload (POST "
            '/api/v1/clusters/<id>/job-tokens/ with "workload") or with the job\'s submit time.'
        )

    def may_push_for(self, job_id: str, submit_time: datetime, user: str) -> bool:
        """Whether this job token covers the job with these scheduler facts."""
        if self.kind != IngestTokenKind.JOB:
            return False
        if self.job_id:
            return (
                self.job_id == job_id
                and self.job_submit_time is not None
                and self.job_submit_time == submit_time
            )
        return bool(self.user) and self.user == user

    @classmethod
    def issue(
        cls,
        cluster: Cluster,
        kind: IngestTokenKind,
        *,
        name: str,
        issued_by: str,
        job_id: str = "",
        job_submit_time: datetime | None = None,
        user: str = "",
        expires_at: datetime | None = None,
    ) -> tuple[IngestToken, str]:
        """Create a token and return it with its key, which is not stored anywhere.

        Raises ``ValueError`` for a scope the kind may not have (``validate_scope``): a job token
        for a job id without its submit time, among others.
        """
        problem = validate_scope(kind, job_id, job_submit_time, user)
        if problem:
            raise ValueError(problem)
        raw = PREFIX_OF_KIND[kind] + secrets.token_urlsafe(32)
        token = cls.objects.create(
            cluster=cluster,
            kind=kind,
            name=name,
            job_id=job_id,
            job_submit_time=job_submit_time,
            user=user,
            issued_by=issued_by,
            key_prefix=raw[:12],
            key_hash=hash_token(raw),
            expires_at=expires_at,
        )
        return token, raw

    @classmethod
    def authenticate(cls, raw: str) -> IngestToken | None:
        """The active token with this key (its cluster loaded), or None."""
        if (
            not raw.startswith((JOB_TOKEN_PREFIX, HOOK_TOKEN_PREFIX))
            or len(raw) > _MAX_TOKEN_LENGTH
        ):
            return None
        now = timezone.now()
        token = (
            cls.objects.select_related("cluster")
            .filter(key_hash=hash_token(raw), revoked_at__isnull=True)
            .filter(Q(expires_at__isnull=True) | Q(expires_at__gt=now))
            .first()
        )
        if token is not None and (
            token.last_used_at is None or now - token.last_used_at >= _LAST_USED_RESOLUTION
        ):
            cls.objects.filter(pk=token.pk).update(last_used_at=now)
        return token
