"""A draft policy to replay (``recovery.loop.replay``): settings checked, nothing saved.

A draft comes from people (a policy file given to ``manage.py replay_policy``, the overrides
of the Console's replay page and of the admin's preview), so what is wrong with it is said in
their words. Apart from the replay because it is about a policy's settings, not its decisions.
"""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ValidationError

from recovery.models import Cluster, Policy

# Settings a draft may not set: what identifies a policy or is kept by the database.
NOT_SETTINGS = frozenset({"id", "updated_at"})


class DraftError(ValueError):
    """A draft policy that cannot be replayed, with what is wrong in people's words."""


def draft_policy(fields: object, base: Policy | None = None) -> Policy:
    """A policy not saved: ``base`` (a copy) or a new one, with ``fields`` set and checked.

    ``fields`` is a JSON object of policy settings, e.g. ``{"max_attempts": 20}``; a name or id
    in it chooses the saved policy it edits when ``base`` is not given.
    """
    if not isinstance(fields, dict):
        raise DraftError("a draft policy is a JSON object of settings")
    known = {f.name for f in Policy._meta.concrete_fields} | {"cluster"}
    unknown = sorted(set(fields) - known)
    if unknown:
        raise DraftError(f"not a policy setting: {', '.join(map(str, unknown))}")
    if base is None:
        base = _saved_policy_named(fields)
    # A saved policy is read again, so that the caller's copy stays as it is.
    saved = base is not None and base.pk
    draft = Policy.objects.get(pk=base.pk) if base is not None and saved else base or Policy()
    for name, value in fields.items():
        if name in NOT_SETTINGS:
            continue
        if name == "cluster":
            cluster = Cluster.objects.filter(name=str(value)).first() if value else None
            if value and cluster is None:
                raise DraftError(f"cluster: no cluster is called {value!r}")
            draft.cluster = cluster
            continue
        setattr(draft, name, value)
    if not draft.name:
        draft.name = "draft"
    try:
        draft.full_clean(validate_unique=False)
    except ValidationError as exc:
        problems = "; ".join(
            f"{field}: {' '.join(messages)}" for field, messages in exc.message_dict.items()
        )
        raise DraftError(problems) from None
    return draft


def _saved_policy_named(fields: dict[str, Any]) -> Policy | None:
    if "id" in fields:
        found = Policy.objects.filter(pk=fields["id"]).first() if _is_id(fields["id"]) else None
        if found is None:
            raise DraftError(f"id: no saved policy has id {fields['id']!r}")
        return found
    if "name" in fields:
        return Policy.objects.filter(name=str(fields["name"])).first()
    return None


def _is_id(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0
