"""The external attribution provider's client: the request it is sent, the call, its reply.

The contract is in docs/attribution-provider.md. The rules that decide whether the provider's
verdict counts, and what a failure means for the system, are in ``recovery.loop.attribution``;
this module only talks to the provider, over the shared HTTP client, and refuses anything in
its reply that is not exactly what the contract allows.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Any

from recovery.choices import Attribution
from recovery.models import Anomaly, Node, Verdict
from recovery.sources.http import ErrorKind, HttpError, describe_url, exchange

MAX_REPLY_BYTES = 64 * 1024
MAX_REPLY_NODES = 256
MAX_EXPLANATION_CHARS = 2000
MAX_EVIDENCE_LINE_CHARS = 2000
MAX_EXCERPT_CHARS = 8 * 1024
MAX_NODES_SENT = 4096
PROVIDER_ATTRIBUTIONS = (
    Attribution.HARDWARE,
    Attribution.SYSTEM_SOFTWARE,
    Attribution.APPLICATION,
    Attribution.UNKNOWN,
)
# Slurm node names: what the Node model can store, and nothing a shell or a log would trip on.
NODE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")


class ProviderError(Exception):
    """The provider gave no usable verdict; the message is the degraded reason."""


@dataclass(frozen=True)
class ProviderVerdict:
    attribution: str
    confidence: float
    implicated_nodes: list[str]
    explanation: str


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


def post_with_deadline(url: str, body: bytes, *, token: str, timeout: float) -> bytes:
    """POST ``body`` and return the reply's body, within ``timeout`` seconds in all.

    The worker that read the anomaly waits for the call before its next read, so the deadline
    is hard: a reply still arriving at the deadline (even one trickling its headers) counts as a
    timeout. A redirect is
    not followed: it would turn the POST into a GET somewhere else, so it is the answer.
    """
    headers = {"Content-Type": "application/json", "Accept": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    try:
        reply = exchange(
            "POST",
            url,
            timeout=timeout,
            max_response_bytes=MAX_REPLY_BYTES,
            where=describe_url(url),
            headers=headers,
            content=body,
            hard_deadline=True,
        )
    except HttpError as exc:
        if exc.kind == ErrorKind.TIMEOUT:
            raise ProviderError(_timed_out(timeout)) from None
        if exc.kind == ErrorKind.OVERSIZED:
            raise ProviderError(
                f"invalid reply: body larger than {MAX_REPLY_BYTES} bytes"
            ) from None
        raise ProviderError(f"provider unreachable: {exc.reason}") from None
    except Exception as exc:  # any failure of the call is the provider's: recorded, not raised on
        raise ProviderError(f"provider call failed: {type(exc).__name__}: {exc}") from exc
    if reply.status != 200:
        raise ProviderError(f"provider answered {reply.status}")
    return reply.body


def _timed_out(timeout: float) -> str:
    return f"provider timed out after {round(timeout, 3)} s"


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
