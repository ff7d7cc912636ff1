"""The controller's side of the Advisor API, over HTTP (standard library only).

The controller runs next to the scheduler, possibly far from the control plane's database:
it knows the control plane only through this API. Each client is one controller process to the
control plane: it makes an instance id when it is made and sends it with every call
(``X-Controller-Instance``), and a lease it claims is held by that instance. Another process
with the same token, or this one restarted, is another holder.
"""

from __future__ import annotations

import http.client
import json
import urllib.error
import urllib.request
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any


class AdvisorAPIError(Exception):
    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class ReadyRecommendation:
    id: int
    job_id: str
    partition: str
    attempt: int | None
    action: str
    excluded_nodes: list[str]
    reason: str
    # The job's identity as the control plane recorded it: a job id alone may name another job
    # once Slurm hands the id out again. None or "" when the control plane did not send it.
    submit_time: datetime | None = None
    user: str = ""
    # When the attempt the recommendation is about started; None if it never did.
    attempt_started_at: datetime | None = None
    # The operator who approved it; "" when the policy made it ready on its own.
    approved_by: str = ""
    # The node a drain or resume is for; "" for a job's restart or stop.
    node: str = ""

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ReadyRecommendation:
        return cls(
            id=int(data["id"]),
            job_id=str(data["job_id"]),
            partition=str(data.get("partition") or ""),
            attempt=data.get("attempt"),
            action=str(data["action"]),
            excluded_nodes=[str(n) for n in data.get("excluded_nodes") or []],
            reason=str(data.get("reason") or ""),
            submit_time=_datetime(data.get("submit_time")),
            user=str(data.get("user") or ""),
            attempt_started_at=_datetime(data.get("attempt_started_at")),
            approved_by=str(data.get("approved_by") or ""),
            node=str(data.get("node") or ""),
        )


def _datetime(value: object) -> datetime | None:
    if not isinstance(value, str) or not value:
        return None
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo is not None else None


@dataclass(frozen=True)
class ControllerIdentity:
    cluster: str
    scheduler_cluster_name: str
    actor: str
    # The instance id the control plane recorded for this process; "" from a control plane
    # that does not hold leases by instance.
    instance: str = ""
    # What the control plane lets the policy's recommendations do without an approval (its
    # canary); "" from a control plane that does not say.
    acts_without_approval: str = ""


INSTANCE_HEADER = "X-Controller-Instance"


class AdvisorClient:
    def __init__(
        self, base_url: str, token: str, *, timeout: float = 10.0, instance: str = ""
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.token = token
        self.timeout = timeout
        # Made here, once per process: never written down, so a restarted controller is a new
        # holder and waits for its predecessor's leases to lapse like any other controller.
        self.instance = instance or str(uuid.uuid4())

    def ready(self) -> list[ReadyRecommendation]:
        data = self._call("GET", "/api/v1/advisor/recommendations/")
        return [ReadyRecommendation.from_json(item) for item in data["results"]]

    def claim(self, recommendation_id: int, lease_seconds: int) -> ReadyRecommendation:
        data = self._call(
            "POST",
            f"/api/v1/advisor/recommendations/{recommendation_id}/claim/",
            {"lease_seconds": lease_seconds},
        )
        return ReadyRecommendation.from_json(data)

    def renew(self, recommendation_id: int, lease_seconds: int) -> None:
        self._call(
            "POST",
            f"/api/v1/advisor/recommendations/{recommendation_id}/renew/",
            {"lease_seconds": lease_seconds},
        )

    def dispatch(self, recommendation_id: int, argv: Sequence[str], sequence: int) -> None:
        """Record in the trail the command about to run; refused (409) once the lease is lost."""
        self._call(
            "POST",
            f"/api/v1/advisor/recommendations/{recommendation_id}/dispatch/",
            {"argv": list(argv), "sequence": sequence},
        )

    def report(self, recommendation_id: int, body: dict[str, Any]) -> None:
        self._call("POST", f"/api/v1/advisor/recommendations/{recommendation_id}/report/", body)

    def identity(self) -> ControllerIdentity:
        data = self._call("GET", "/api/v1/advisor/identity/")
        return ControllerIdentity(
            cluster=str(data["cluster"]),
            scheduler_cluster_name=str(data["scheduler_cluster_name"]),
            actor=str(data["actor"]),
            instance=str(data.get("instance") or ""),
            acts_without_approval=str(data.get("acts_without_approval") or ""),
        )

    def headers(self) -> dict[str, str]:
        """What every call sends besides its body: the token, and this process's instance id."""
        return {
            "Authorization": f"Bearer {self.token}",
            INSTANCE_HEADER: self.instance,
            "Content-Type": "application/json",
            "Accept": "application/json",
        }

    def _call(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        request = urllib.request.Request(
            self.base_url + path,
            method=method,
            data=None if body is None else json.dumps(body).encode(),
            headers=self.headers(),
        )
        # A web process killed mid-answer cuts the body short (IncompleteRead, a reset, JSON
        # that ends early): that call failed like one that found nobody listening, and is
        # tried again as such, never a crash of the controller.
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                return json.loads(response.read() or b"null")
        except urllib.error.HTTPError as exc:
            try:
                said = json.loads(exc.read()).get("error") or exc.reason
            except (ValueError, AttributeError, http.client.HTTPException, OSError):
                said = exc.reason
            raise AdvisorAPIError(f"{method} {path}: {exc.code} {said}", exc.code) from None
        except (urllib.error.URLError, TimeoutError, OSError, http.client.HTTPException) as exc:
            raise AdvisorAPIError(f"{method} {path}: control plane unreachable: {exc}") from None
        except ValueError as exc:
            raise AdvisorAPIError(f"{method} {path}: an answer cut short: {exc}") from None
