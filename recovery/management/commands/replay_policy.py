"""``manage.py replay_policy --cluster NAME --since WHEN [--until WHEN] [--policy ID |
--policy-file F] [--json] [--all]``: what a policy would have done on recorded history."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils import timezone

from recovery.loop.replay import replay
from recovery.loop.replay_draft import DraftError, draft_policy
from recovery.loop.replay_output import report_json, report_lines
from recovery.models import Cluster, Policy

AGO = re.compile(r"^(\d{1,5})([dhm])$")
UNITS = {"d": "days", "h": "hours", "m": "minutes"}
# A policy file is a few hundred bytes of settings; anything far larger is a mistake.
MAX_POLICY_FILE_BYTES = 64 * 1024


def when(value: str, now: datetime) -> datetime:
    """An ISO 8601 time (UTC unless it says), or a time ago: 7d, 12h, 30m."""
    ago = AGO.match(value.strip())
    if ago:
        return now - timedelta(**{UNITS[ago.group(2)]: int(ago.group(1))})
    try:
        parsed = datetime.fromisoformat(value.strip())
    except ValueError:
        raise CommandError(
            f"{value!r} is neither an ISO 8601 time (2026-11-01T00:00) nor a time ago (7d, 12h)"
        ) from None
    return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=UTC)


class Command(BaseCommand):
    help = (
        "Decide again on a cluster's recorded decisions of a window, under the policies in "
        "force or with one of them replaced by a draft (a saved policy by id, enabled or not, "
        "or a JSON file of settings). Shows what the draft would do versus what happened and "
        "the totals both ways. Nothing is written and nothing reaches a scheduler."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--cluster", required=True, metavar="NAME")
        parser.add_argument("--since", required=True, help="ISO 8601 time, or 7d, 12h, 30m ago")
        parser.add_argument("--until", help="ISO 8601 time, or a time ago (default: now)")
        draft = parser.add_mutually_exclusive_group()
        draft.add_argument("--policy", type=int, metavar="ID", help="a saved policy as the draft")
        draft.add_argument(
            "--policy-file",
            metavar="F",
            help='a JSON object of settings, e.g. {"name": "lab", "max_attempts": 20}: edits '
            "the saved policy it names (by id or name), or is a new one",
        )
        parser.add_argument("--json", action="store_true", help="one JSON object on stdout")
        parser.add_argument("--all", action="store_true", help="every decision, not only changes")

    def handle(self, *args: Any, **options: Any) -> None:
        cluster = Cluster.objects.filter(name=options["cluster"]).first()
        if cluster is None:
            raise CommandError(f"no cluster is called {options['cluster']!r}")
        now = timezone.now()
        since = when(options["since"], now)
        until = when(options["until"], now) if options["until"] else now
        if since >= until:
            raise CommandError("--since must be before --until")
        report = replay(cluster, since, until, self._draft(options))
        if options["json"]:
            self.stdout.write(json.dumps(report_json(report, every_decision=options["all"])))
            return
        for line in report_lines(report, every_decision=options["all"]):
            self.stdout.write(line)

    def _draft(self, options: dict[str, Any]) -> Policy | None:
        if options["policy"] is not None:
            saved = Policy.objects.filter(pk=options["policy"]).first()
            if saved is None:
                raise CommandError(f"no policy has id {options['policy']}")
            saved.enabled = True  # replayed as if in force, whether it is enabled or not
            return saved
        if not options["policy_file"]:
            return None
        path = Path(options["policy_file"])
        try:
            raw = path.read_bytes()[: MAX_POLICY_FILE_BYTES + 1]
        except OSError as exc:
            raise CommandError(f"cannot read {path}: {exc.strerror}") from None
        if len(raw) > MAX_POLICY_FILE_BYTES:
            raise CommandError(f"{path} is over {MAX_POLICY_FILE_BYTES} bytes: not a policy")
        try:
            fields = json.loads(raw)
        except (ValueError, UnicodeDecodeError) as exc:
            raise CommandError(f"{path} is not JSON: {exc}") from None
        try:
            return draft_policy(fields)
        except DraftError as exc:
            raise CommandError(f"{path}: {exc}") from None
