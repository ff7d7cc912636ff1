"""Attribution: which layer is to blame for an anomaly, and how sure we are.

The built-in rules start from the detector's evidence (its category and default attribution)
and add what the scheduler knows: hardware evidence that names a node is firm, a category
whose default is "unknown" stays unsure.

An external provider (``ATTRIBUTION_PROVIDER_URL``, contract in docs/attribution-provider.md)
may then give its own verdict. Its verdict decides when its confidence is at least the built-in
one. Without a provider, or when it fails, the built-in verdict stands and the system runs in
degraded mode: every ATTRIBUTED event says so, and why.

The provider is never asked while a transaction holds a row lock: a read records each new
anomaly with its built-in verdict (``attribute_builtin``, inside the read's transaction) and,
when a provider is configured, marks it as awaiting the provider's verdict
(``Anomaly.provider_due_at``); the policy waits for it. Once the read is committed,
``complete_attribution`` claims the anomaly, asks the provider (with a hard deadline) and
records both verdicts and the ATTRIBUTED event in a short transaction of its own. A worker
killed in between leaves the anomaly awaiting; the next poll claims it again once the claim
has lapsed. No provider problem ever raises out of it.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings
from django.core.cache import cache
from django.db import transaction
from django.utils import timezone

from recovery.audit.actors import Actor, attribution_actor
from recovery.audit.record import record_event
from recovery.choices import Attribution, AuditKind, Confirmation, FailureCategory
from recovery.detection.signatures.base import SignatureRole
from recovery.detection.taxonomy import NO_CATEGORY
from recovery.models import Anomaly, Verdict
from recovery.sources import provider_status
from recovery.sources.attribution_provider import (
    ProviderError,
    ProviderVerdict,
    parse_reply,
    post_with_deadline,
    provider_request,
)

logger = logging.getLogger(__name__)

EXTERNAL_PROVIDER = "external"

MAX_REASON_CHARS = 200
# A claim on an awaited verdict lasts the provider's deadline and this margin: past it, the
# worker that claimed it is taken for dead and another may ask again.
PROVIDER_CLAIM_MARGIN = timedelta(seconds=30)

# Set while a failing provider has been announced in the audit trail, so a provider that stays
# down yields one ATTRIBUTION_DEGRADED event, not one per anomaly. ``cache.add`` makes the
# announcement a claim when the cache is shared between processes.
_ANNOUNCED_KEY = "wr:attribution:degraded-announced"
# Categories a failing GPU, link or node shows up as in the program's own output.
HARDWARE_SHOWS_AS = frozenset(
    {
        FailureCategory.CUDA_ERROR_APP,
        FailureCategory.NCCL_ERROR,
        FailureCategory.NCCL_TIMEOUT,
        FailureCategory.SEGFAULT,
        FailureCategory.INTERCONNECT,
        NO_CATEGORY,
        # A death nothing explained: an Xid on its node in the same attempt explains it.
        FailureCategory.UNEXPLAINED,
    }
)


# The program's own checks failing (a device-side assert, an index out of bounds): the same on
# any GPU, whatever hardware evidence the attempt also showed.
PROGRAM_OWN_CHECKS = frozenset({"cuda-device-assert"})


def builtin_confidence(anomaly: Anomaly) -> float:
    if anomaly.attribution == Attribution.UNKNOWN:
        return 0.4
    if anomaly.attribution == Attribution.HARDWARE and anomaly.implicated_nodes:
        return 0.9
    if anomaly.details.get("role") == SignatureRole.WRAPPER:
        return 0.5
    return 0.75


def hardware_behind(anomaly: Anomaly) -> tuple[list[str], str] | None:
    """Nodes whose hardware evidence explains ``anomaly``, and that evidence, or None.

    A CUDA error, a collective failure or a segfault on a node that showed an Xid, an ECC
    error or went down in the same attempt is that node's hardware failing, not the program:
    the node must be left out of the restart.
    """
    if anomaly.category not in HARDWARE_SHOWS_AS or anomaly.attribution == Attribution.HARDWARE:
        return None
    if anomaly.signature in PROGRAM_OWN_CHECKS:
        return None
    if anomaly.attempt_id is None:
        return None
    # Hardware evidence the job printed and went on from (or that is not yet seen to have
    # ended anything) explains nothing: a port error an hour ago that the job survived.
    others = (
        Anomaly.objects.filter(
            workload_id=anomaly.workload_id,
            attempt_id=anomaly.attempt_id,
            attribution=Attribution.HARDWARE,
        )
        .exclude(pk=anomaly.pk)
        .exclude(confirmation__in=(Confirmation.SURVIVED, Confirmation.SUSPECTED))
    )
    named = set(anomaly.implicated_nodes)
    for other in others.order_by("detected_at", "id"):
        nodes = sorted(set(other.implicated_nodes) & named if named else other.implicated_nodes)
        if nodes:
            return nodes, f"{other.signature or other.category} ({other.evidence_line[:120]})"
    return None


@dataclass(frozen=True)
class ProviderOutcome:
    host: str | None
    verdict: ProviderVerdict | None
    reason: str
    elapsed_s: float = 0.0

    @property
    def degraded(self) -> bool:
        return self.verdict is None


def attribute(anomaly: Anomaly) -> Verdict:
    """Attribute ``anomaly`` once, asking the provider now, and return the verdict that decides.

    Records the built-in verdict, asks the provider when one is configured, records its verdict
    too when the reply is valid, and writes one ATTRIBUTED event. Calling it again for the same
    anomaly returns the verdict that decided the first time, without asking the provider again.
    It makes the provider's HTTP call itself: never call it inside a transaction that holds a
    row lock (the loop uses ``attribute_builtin`` there, and ``complete_attribution`` after).
    """
    verdict = attribute_builtin(anomaly, ask_provider=True)
    if anomaly.provider_due_at is None:
        return verdict
    return complete_attribution(anomaly) or _deciding_verdict(anomaly) or verdict


def attribute_builtin(
    anomaly: Anomaly, *, ask_provider: bool, created_now: bool = False
) -> Verdict:
    """Record the built-in verdict of ``anomaly``; no call is made.

    Runs inside the read's transaction. With a provider configured and ``ask_provider``, the
    anomaly is marked as awaiting the provider's verdict, and the ATTRIBUTED event waits for
    ``complete_attribution``. Otherwise the built-in verdict decides now and the event says why
    no provider was asked. Returns the verdict that decides so far. ``created_now``: the
    anomaly was inserted by this transaction, so no verdict can exist yet to look for.
    """
    earlier = None if created_now else _deciding_verdict(anomaly)
    if earlier is not None:
        return earlier
    rule = f"{anomaly.signature or anomaly.kind} → {anomaly.attribution}"
    hardware = hardware_behind(anomaly)
    if hardware is not None:
        nodes, evidence = hardware
        rule = (
            f"{anomaly.signature or anomaly.kind} on {', '.join(nodes)}, where {evidence} "
            "was seen in the same attempt → hardware"
        )
        anomaly.attribution = Attribution.HARDWARE
        anomaly.implicated_nodes = nodes
        anomaly.save(update_fields=["attribution", "implicated_nodes"])
    builtin = Verdict(
        anomaly=anomaly,
        provider=Verdict.BUILTIN_PROVIDER,
        attribution=anomaly.attribution,
        confidence=builtin_confidence(anomaly),
        implicated_nodes=anomaly.implicated_nodes,
        detail={"rule": rule},
    )
    configured = bool(settings.ATTRIBUTION_PROVIDER_URL)
    # No savepoint: a failure here fails the read's transaction, which rolls back as a whole.
    with transaction.atomic(savepoint=False):
        builtin.save(force_insert=True)
        if configured and ask_provider:
            anomaly.provider_due_at = timezone.now()
            anomaly.save(update_fields=["provider_due_at"])
        else:
            reason = provider_status.NO_PROVIDER_REASON if not configured else not_asked_reason()
            outcome = ProviderOutcome(None, None, reason)
            _record_attributed(anomaly, builtin, builtin, None, outcome)
    return builtin


def not_asked_reason() -> str:
    limit = settings.MAX_PROVIDER_CALLS_PER_READ
    return f"provider not asked: at most {limit} provider calls follow one read"


def complete_attribution(anomaly: Anomaly) -> Verdict | None:
    """Ask the provider for the verdict ``anomaly`` awaits, and record it; outside any lock.

    Claims the anomaly first (a conditional UPDATE, so two workers never both ask), makes the
    call with no transaction open, then records the verdicts and the ATTRIBUTED event in one
    short transaction, only if no other worker recorded them meanwhile. Returns the deciding
    verdict, or None when the anomaly awaits nothing or another worker holds the claim.
    ``anomaly`` is updated in place.
    """
    now = timezone.now()
    claim_until = (
        now
        + timedelta(seconds=float(settings.ATTRIBUTION_PROVIDER_TIMEOUT))
        + PROVIDER_CLAIM_MARGIN
    )
    claimed = Anomaly.objects.filter(pk=anomaly.pk, provider_due_at__lte=now).update(
        provider_due_at=claim_until
    )
    if claimed != 1:
        return None
    builtin = (
        Verdict.objects.filter(anomaly=anomaly, provider=Verdict.BUILTIN_PROVIDER)
        .order_by("id")
        .first()
    )
    if builtin is None:  # awaiting with no built-in verdict: nothing to compare the reply with
        Anomaly.objects.filter(pk=anomaly.pk).update(provider_due_at=None)
        anomaly.provider_due_at = None
        return None
    outcome = consult_provider(anomaly, builtin)
    with transaction.atomic():
        locked = (
            Anomaly.objects.select_for_update()
            .select_related("workload__cluster", "attempt")
            .filter(pk=anomaly.pk, provider_due_at__isnull=False)
            .first()
        )
        if locked is None:
            return None  # another worker, whose claim lapsed into ours, recorded it first
        decided = _record_verdicts(locked, builtin, outcome)
        locked.provider_due_at = None
        locked.save(update_fields=["provider_due_at"])
    anomaly.attribution = locked.attribution
    anomaly.implicated_nodes = locked.implicated_nodes
    anomaly.provider_due_at = None
    return decided


def awaiting_provider(cluster_id: int, limit: int) -> list[int]:
    """Anomalies of the cluster whose provider verdict is due and unclaimed, oldest first."""
    return list(
        Anomaly.objects.filter(workload__cluster_id=cluster_id, provider_due_at__lte=timezone.now())
        .order_by("provider_due_at", "id")
        .values_list("pk", flat=True)[:limit]
    )


def _record_verdicts(anomaly: Anomaly, builtin: Verdict, outcome: ProviderOutcome) -> Verdict:
    """The provider's verdict beside the built-in one, and the ATTRIBUTED event; returns the
    verdict that decides."""
    decided = builtin
    external: Verdict | None = None
    if outcome.verdict is not None:
        reply = outcome.verdict
        decides = reply.confidence >= builtin.confidence
        external = Verdict.objects.create(
            anomaly=anomaly,
            provider=EXTERNAL_PROVIDER,
            attribution=reply.attribution,
            confidence=reply.confidence,
            implicated_nodes=reply.implicated_nodes,
            detail={
                "explanation": reply.explanation,
                "provider_host": outcome.host,
                "elapsed_s": round(outcome.elapsed_s, 3),
                "decided": decides,
            },
        )
        if decides:
            decided = external
            anomaly.attribution = reply.attribution
            anomaly.implicated_nodes = reply.implicated_nodes
            anomaly.save(update_fields=["attribution", "implicated_nodes"])
    if outcome.host is not None:
        # Before the ATTRIBUTED event: the previous outcome may be read from the trail.
        _track_provider_health(anomaly, outcome)
    _record_attributed(anomaly, decided, builtin, external, outcome)
    return decided


def _deciding_verdict(anomaly: Anomaly) -> Verdict | None:
    verdicts = list(
        anomaly.verdicts.filter(provider__in=[Verdict.BUILTIN_PROVIDER, EXTERNAL_PROVIDER])
    )
    builtin = next((v for v in verdicts if v.provider == Verdict.BUILTIN_PROVIDER), None)
    if builtin is None:
        return None
    external = next(
        (v for v in verdicts if v.provider == EXTERNAL_PROVIDER and v.detail.get("decided")), None
    )
    return external or builtin


def _record_attributed(
    anomaly: Anomaly,
    decided: Verdict,
    builtin: Verdict,
    external: Verdict | None,
    outcome: ProviderOutcome,
) -> None:
    payload: dict[str, Any] = {
        "anomaly": anomaly.pk,
        "attribution": decided.attribution,
        "confidence": decided.confidence,
        "nodes": decided.implicated_nodes,
        "provider": decided.provider,
        "degraded": outcome.degraded,
    }
    if outcome.degraded:
        payload["degraded_reason"] = outcome.reason
    if outcome.host is not None:
        # Also how a process without the cached outcome finds the provider's last result.
        payload["provider_host"] = outcome.host
    if external is not None:
        payload["builtin"] = {"attribution": builtin.attribution, "confidence": builtin.confidence}
        payload["external"] = {
            "attribution": external.attribution,
            "confidence": external.confidence,
            "nodes": external.implicated_nodes,
            "explanation": external.detail.get("explanation", ""),
        }
    workload = anomaly.workload
    record_event(
        cluster=workload.cluster,
        workload=workload,
        attempt=anomaly.attempt.number if anomaly.attempt else None,
        kind=AuditKind.ATTRIBUTED,
        actor=attribution_actor(decided.provider),
        payload=payload,
    )


def _track_provider_health(anomaly: Anomaly, outcome: ProviderOutcome) -> None:
    assert outcome.host is not None
    previous = provider_status.remember_provider_outcome(
        host=outcome.host, ok=not outcome.degraded, reason=outcome.reason, at=timezone.now()
    )
    if not outcome.degraded:
        cache.delete(_ANNOUNCED_KEY)
        return
    was_healthy = previous is None or not previous.degraded
    if was_healthy and cache.add(_ANNOUNCED_KEY, outcome.reason, timeout=None):
        record_event(
            cluster=anomaly.workload.cluster,
            kind=AuditKind.ATTRIBUTION_DEGRADED,
            actor=Actor.ATTRIBUTION,
            payload={
                "provider_host": outcome.host,
                "reason": outcome.reason,
                "anomaly": anomaly.pk,
                "workload": anomaly.workload_id,
            },
        )


def consult_provider(anomaly: Anomaly, builtin: Verdict) -> ProviderOutcome:
    """Ask the configured provider for its verdict; any failure becomes the degraded reason."""
    url = settings.ATTRIBUTION_PROVIDER_URL or ""
    if not url:
        return ProviderOutcome(None, None, provider_status.NO_PROVIDER_REASON)
    host = provider_status.attribution_provider_host()
    started = time.monotonic()
    try:
        if urlsplit(url).scheme not in ("http", "https"):
            raise ProviderError("provider URL must start with http:// or https://")
        body = json.dumps(provider_request(anomaly, builtin), default=str).encode()
        data = post_with_deadline(
            url,
            body,
            token=settings.ATTRIBUTION_PROVIDER_TOKEN or "",
            timeout=float(settings.ATTRIBUTION_PROVIDER_TIMEOUT),
        )
        verdict = parse_reply(data, allowed_nodes=_known_nodes(anomaly))
    except ProviderError as exc:
        reason = str(exc)[:MAX_REASON_CHARS]
        logger.warning("attribution provider %s: %s (anomaly %s)", host, reason, anomaly.pk)
        return ProviderOutcome(host, None, reason, time.monotonic() - started)
    except Exception as exc:  # a defect here must not fail the read that found it
        logger.exception("attribution provider %s: unexpected failure", host)
        reason = f"provider call failed: {type(exc).__name__}"
        return ProviderOutcome(host, None, reason, time.monotonic() - started)
    elapsed = time.monotonic() - started
    return ProviderOutcome(host, verdict, f"provider answered in {elapsed:.2f} s", elapsed)


def _known_nodes(anomaly: Anomaly) -> set[str]:
    nodes = set(anomaly.implicated_nodes)
    if anomaly.attempt is not None:
        nodes.update(anomaly.attempt.nodes)
    return nodes
