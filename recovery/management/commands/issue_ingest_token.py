from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from recovery.models import Cluster, IngestToken, IngestTokenKind
from recovery.models.ingest_token import validate_scope


class Command(BaseCommand):
    help = (
        "Issue a job token (wrj_: heartbeats and logs of one job or one user's jobs) or a hook "
        "token (wrh_: the scheduler hooks' job ends and node failures) for one cluster; the key "
        "is printed once and not stored."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--cluster", required=True)
        parser.add_argument(
            "--kind", required=True, choices=[kind.value for kind in IngestTokenKind]
        )
        parser.add_argument("--name", help="what it is for (default: from the job, user or kind)")
        parser.add_argument("--job-id", default="", help="job token: for this job only")
        parser.add_argument(
            "--submit-time",
            help="job token with --job-id (required with it): that job's submit time (ISO 8601), "
            "so a later job that reuses the id is not covered",
        )
        parser.add_argument("--user", default="", help="job token: for this user's jobs only")
        parser.add_argument(
            "--ttl-hours",
            type=int,
            help=f"hours until it expires (job tokens: default {settings.JOB_TOKEN_TTL_HOURS}, "
            f"at most {settings.JOB_TOKEN_MAX_TTL_HOURS}; hook tokens: never, unless given)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            cluster = Cluster.objects.get(name=options["cluster"])
        except Cluster.DoesNotExist:
            raise CommandError(f"no cluster named {options['cluster']!r}") from None
        kind = IngestTokenKind(options["kind"])
        submit_time = _submit_time(options["submit_time"])
        problem = validate_scope(kind, options["job_id"], submit_time, options["user"])
        if problem:
            raise CommandError(problem)
        ttl_hours = options["ttl_hours"]
        if kind == IngestTokenKind.JOB and ttl_hours is None:
            ttl_hours = settings.JOB_TOKEN_TTL_HOURS
        if ttl_hours is not None and not 1 <= ttl_hours <= settings.JOB_TOKEN_MAX_TTL_HOURS:
            raise CommandError(f"--ttl-hours must be 1 to {settings.JOB_TOKEN_MAX_TTL_HOURS}")
        _, key = IngestToken.issue(
            cluster,
            kind,
            name=options["name"] or _default_name(kind, options["job_id"], options["user"]),
            issued_by="manage.py issue_ingest_token",
            job_id=options["job_id"],
            job_submit_time=submit_time,
            user=options["user"],
            expires_at=None if ttl_hours is None else timezone.now() + timedelta(hours=ttl_hours),
        )
        self.stdout.write(key)


def _submit_time(text: str | None) -> datetime | None:
    if not text:
        return None
    parsed = parse_datetime(text)
    if parsed is None:
        raise CommandError(f"--submit-time {text!r} is not an ISO 8601 date and time")
    return parsed if timezone.is_aware(parsed) else timezone.make_aware(parsed)


def _default_name(kind: IngestTokenKind, job_id: str, user: str) -> str:
    if kind == IngestTokenKind.HOOK:
        return "scheduler-hooks"
    return f"job-{job_id}" if job_id else f"user-{user}"
