"""Attribution: which layer is to blame for an anomaly, and how sure we are.

The built-in rules start from the detector's evidence (its category and default attribution)
and add what the scheduler knows: hardware evidence that names a node is firm, a category
whose default is "unknown" stays unsure.

An external provider (``ATTRIBUTION_PROVIDER_URL``, contract in docs/attribution-provider.md)
may then give its own verdict. Its verdict decides when its confidence is at least the built-in
one. Without a provider, or when it fails, the built-in verdict stands and the system runs in
degraded mode: every ATTRIBUTED event says so, and why.

``attribute`` runs inside the ingestion transaction, so the provider call is bounded by a hard
deadline and no provider problem ever raises out of it.
"""

from __future__ import annotations

import http.client
import json
import logging
import math
import re
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings
from django.core.cache import cache
from django.db import transaction
from django.utils import timezone

from recovery.audit.record import record_event
from recovery.choices import Attribution, AuditKind
from recovery.models import Anomaly, Node, Verdict
from recovery.read import health

logger = logging.getLogger(__name__)

ATTRIBUTOR = "attribution:builtin"
EXTERNAL_PROVIDER = "external"

MAX_REPLY_BYTES = 64 * 1024
MAX_REPLY_NODES = 256
MAX_EXPLANATION_CHARS = 2000
MAX_EVIDENCE_LINE_CHARS = 2000
MAX_EXCERPT_CHARS = 8 * 1024
MAX_NODES_SENT = 4096
MAX_REASON_CHARS = 200
PROVIDER_ATTRIBUTIONS = (
    Attribution.HARDWARE,
    Attribution.SYSTEM_SOFTWARE,
    Attribution.APPLICATION,
    Attribution.UNKNOWN,
)
# Slurm node names: what the Node model can store, and nothing a shell or a log would trip on.
NODE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")

# Set while a failing provider has been announced in the audit trail, so a provider that stays
# down yields one ATTRIBUTION_DEGRADED event, not one per anomaly. ``cache.add`` makes the
# announcement a claim when the cache is shared between processes.
_ANNOUNCED_KEY = "wr:attribution:degraded-announced"
# Categories a failing GPU, link or node shows up as in the program's own output.
HARDWARE_SHOWS_AS = frozenset(
    {"cuda_error_app", "nccl_error", "nccl_timeout", "segfault", "interconnect", ""}
)


def builtin_confidence(anomaly: Anomaly) -> float:
    if anomaly.attribution == "unknown":
        return 0.4
    if anomaly.attribution == "hardware" and anomaly.implicated_nodes:
        return 0.9
    if anomaly.details.get("role") == "wrapper":
        return 0.5
    return 0.75


def hardware_behind(anomaly: Anomaly) -> tuple[list[str], str] | None:
    """Nodes whose hardware evidence explains ``anomaly``, and that evidence, or None.

    A CUDA error, a collective failure or a segfault on a node that showed an Xid, an ECC
    error or went down in the same attempt is that node's hardware failing, not the program:
    the node must be left out of the restart.
    """
    if anomaly.category not in HARDWARE_SHOWS_AS or anomaly.attribution == "hardware":
        return None
    if anomaly.attempt_id is None:
        return None
    others = Anomaly.objects.filter(
        workload_id=anomaly.workload_id, attempt_id=anomaly.attempt_id, attribution="hardware"
    ).exclude(pk=anomaly.pk)
    named = set(anomaly.implicated_nodes)
    for other in others.order_by("detected_at", "id"):
        nodes = sorted(set(other.implicated_nodes) & named if named else other.implicated_nodes)
        if nodes:
            return nodes, f"{other.signature or other.category} ({other.evidence_line[:120]})"
    return None


class ProviderError(Exception):
    """The provider gave no usable verdict; the message is the degraded reason."""


@dataclass(frozen=True)
class ProviderVerdict:
    attribution: str
    confidence: float
    implicated_nodes: list[str]
    explanation: str


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
    """Attribute ``anomaly`` once and return the verdict that decides.

    Records the built-in verdict, asks the provider when one is configured, records its verdict
    too when the reply is valid, and writes one ATTRIBUTED event. Calling it again for the same
    anomaly returns the verdict that decided the first time, without asking the provider again.
    """
    earlier = _deciding_verdict(anomaly)
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
    # Asked before anything is written, so the verdicts and the event land together.
    outcome = consult_provider(anomaly, builtin)
    with transaction.atomic():
        builtin.save(force_insert=True)
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
        actor=f"attribution:{decided.provider}",
        payload=payload,
    )


def _track_provider_health(anomaly: Anomaly, outcome: ProviderOutcome) -> None:
    assert outcome.host is not None
    previous = health.remember_provider_outcome(
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
            actor="attribution",
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
        return ProviderOutcome(None, None, health.NO_PROVIDER_REASON)
    host = health.attribution_provider_host()
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
    except Exception as exc:  # a defect here must not fail the ingestion around it
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


def provider_request(anomaly: Anomaly, builtin: Verdict) -> dict[str, Any]:
    """The JSON document sent to the provider (docs/attribution-provider.md)."""
    workload = anomaly.workload
    attempt = anomaly.attempt
    attempt_nodes = list(attempt.nodes) if attempt is not None else []
    names = list(dict.fromkeys([*attempt_nodes, *anomaly.implicated_nodes]))[:MAX_NODES_SENT]
    nodes = Node.objects.filter(cluster_id=workload.cluster_id, name__in=names).only(
        "name", "scheduler_state", "state_reason", "health"
    )
    return {
        "anomaly": {
            "id": anomaly.pk,
            "kind": anomaly.kind,
            "category": anomaly.category,
            "attribution": anomaly.attribution,
            "signature": anomaly.signature,
            "evidence_line": anomaly.evidence_line[:MAX_EVIDENCE_LINE_CHARS],
            "evidence_excerpt": anomaly.evidence_excerpt[-MAX_EXCERPT_CHARS:],
            "implicated_nodes": anomaly.implicated_nodes,
            "implicated_ranks": anomaly.implicated_ranks,
            "occurrences": anomaly.occurrences,
            "evidence_at": anomaly.evidence_at.isoformat(),
        },
        "workload": {
            "cluster": workload.cluster.name,
            "job_id": workload.job_id,
            "name": workload.name,
            "user": workload.user,
            "partition": workload.partition,
            "attempt": attempt.number if attempt is not None else None,
            "nodes": attempt_nodes[:MAX_NODES_SENT],
        },
        "builtin_verdict": {
            "attribution": builtin.attribution,
            "confidence": builtin.confidence,
            "implicated_nodes": builtin.implicated_nodes,
        },
        "node_states": {
            node.name: {
                "scheduler_state": node.scheduler_state,
                "state_reason": node.state_reason,
                "health": node.health,
            }
            for node in nodes
        },
    }


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    # A redirect would turn the POST into a GET somewhere else: report it as the answer.
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


_OPENER = urllib.request.build_opener(_NoRedirects)


def post_with_deadline(url: str, body: bytes, *, token: str, timeout: float) -> bytes:
    """POST ``body`` and return the reply's body, within ``timeout`` seconds in all.

    A socket timeout bounds each wait, not the whole exchange (a provider could trickle its
    reply byte by byte), so the exchange runs in a daemon thread that is abandoned at the
    deadline; its own socket timeout ends it soon after.
    """
    result: list[bytes | ProviderError] = []

    def run() -> None:
        try:
            result.append(_exchange(url, body, token=token, timeout=timeout))
        except ProviderError as exc:
            result.append(exc)
        except Exception as exc:
            result.append(ProviderError(f"provider call failed: {type(exc).__name__}: {exc}"))

    worker = threading.Thread(target=run, name="attribution-provider", daemon=True)
    worker.start()
    worker.join(timeout)
    if not result:
        raise ProviderError(_timed_out(timeout))
    outcome = result[0]
    if isinstance(outcome, ProviderError):
        raise outcome
    return outcome


def _timed_out(timeout: float) -> str:
    return f"provider timed out after {round(timeout, 3)} s"


def _exchange(url: str, body: bytes, *, token: str, timeout: float) -> bytes:
    headers = {"Content-Type": "application/json", "Accept": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    request = urllib.request.Request(url, data=body, headers=headers, method="POST")
    try:
        with _OPENER.open(request, timeout=timeout) as response:
            status = response.status
            data = response.read(MAX_REPLY_BYTES + 1)
    except urllib.error.HTTPError as exc:
        exc.close()
        raise ProviderError(f"provider answered {exc.code}") from None
    except urllib.error.URLError as exc:
        if isinstance(exc.reason, TimeoutError):
            raise ProviderError(_timed_out(timeout)) from None
        raise ProviderError(f"provider unreachable: {exc.reason}") from None
    except TimeoutError:
        raise ProviderError(_timed_out(timeout)) from None
    except (OSError, http.client.HTTPException) as exc:
        raise ProviderError(f"provider unreachable: {type(exc).__name__}: {exc}") from None
    if status != 200:
        raise ProviderError(f"provider answered {status}")
    if len(data) > MAX_REPLY_BYTES:
        raise ProviderError(f"invalid reply: body larger than {MAX_REPLY_BYTES} bytes")
    return data


def _reject_constant(name: str) -> None:
    raise ValueError(f"{name} is not a number JSON allows")


def parse_reply(data: bytes, *, allowed_nodes: set[str]) -> ProviderVerdict:
    """Validate the provider's reply strictly; anything off raises ``ProviderError``.

    ``allowed_nodes`` are the attempt's and the anomaly's nodes: a provider may narrow the blame
    to some of them, never point at a node outside the job. An empty set allows any sane name.
    """
    try:
        document = json.loads(data.decode("utf-8"), parse_constant=_reject_constant)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise ProviderError(f"invalid reply: not JSON ({str(exc)[:80]})") from None
    if not isinstance(document, dict):
        raise ProviderError("invalid reply: expected a JSON object")

    attribution = document.get("attribution")
    if attribution not in PROVIDER_ATTRIBUTIONS:
        allowed = ", ".join(PROVIDER_ATTRIBUTIONS)
        raise ProviderError(f"invalid reply: attribution must be one of {allowed}")

    confidence = document.get("confidence")
    if (
        isinstance(confidence, bool)
        or not isinstance(confidence, int | float)
        or not math.isfinite(confidence)
        or not 0.0 <= confidence <= 1.0
    ):
        raise ProviderError("invalid reply: confidence must be a number from 0 to 1")

    nodes = document.get("implicated_nodes", [])
    if not isinstance(nodes, list) or len(nodes) > MAX_REPLY_NODES:
        raise ProviderError(
            f"invalid reply: implicated_nodes must be a list of at most {MAX_REPLY_NODES} names"
        )
    for node in nodes:
        if not isinstance(node, str) or not NODE_NAME.fullmatch(node):
            raise ProviderError("invalid reply: implicated_nodes holds a malformed node name")
        if allowed_nodes and node not in allowed_nodes:
            raise ProviderError(f"invalid reply: node {node!r} is not one of the job's nodes")

    explanation = document.get("explanation", "")
    if not isinstance(explanation, str) or len(explanation) > MAX_EXPLANATION_CHARS:
        raise ProviderError(
            f"invalid reply: explanation must be text of at most {MAX_EXPLANATION_CHARS} chars"
        )
    return ProviderVerdict(
        attribution=str(attribution),
        confidence=float(confidence),
        implicated_nodes=list(dict.fromkeys(nodes)),
        explanation=explanation,
    )
