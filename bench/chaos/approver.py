"""An operator at the Console, as a process: approves and rejects what awaits approval, over the API.

It knows the control plane only through the REST API and a person's token (``wrp_``), as a
script of an operator's would. Which recommendations it rejects is decided by the run's seed and
the recommendation's id, so a replay with the same seed decides the same way; a web process
killed under it costs it that round, nothing else.

    python -m bench.chaos.approver --url http://127.0.0.1:8000 --token-file T --seed 7
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

# One in five is rejected: enough to exercise the path, few enough that most failures recover.
REJECT_SHARE = 0.2


def rejects(seed: int, recommendation_id: int) -> bool:
    digest = hashlib.sha256(f"{seed}:{recommendation_id}".encode()).digest()
    return digest[0] / 256 < REJECT_SHARE


class Operator:
    def __init__(self, url: str, token: str, seed: int, clusters: list[str]) -> None:
        self.url = url.rstrip("/")
        self.token = token
        self.seed = seed
        self.clusters = clusters

    def _call(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(
            f"{self.url}{path}",
            data=data,
            method=method,
            headers={"Authorization": f"Bearer {self.token}", "Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            return json.loads(response.read() or b"{}")

    def awaiting(self) -> list[dict[str, Any]]:
        found = []
        for cluster in self.clusters:
            page = self._call(
                "GET", f"/api/v1/recommendations/?status=awaiting_approval&cluster={cluster}"
            )
            found.extend(page.get("results", []))
        return found

    def decide_all(self) -> list[str]:
        said = []
        for recommendation in self.awaiting():
            recommendation_id = int(recommendation["id"])
            verb = "reject" if rejects(self.seed, recommendation_id) else "approve"
            try:
                self._call(
                    "POST",
                    f"/api/v1/recommendations/{recommendation_id}/{verb}/",
                    {"note": f"chaos operator, seed {self.seed}"},
                )
            except urllib.error.HTTPError as exc:
                if exc.code not in {404, 409}:
                    raise
                continue  # decided meanwhile, or gone: nothing to do
            said.append(f"{verb} {recommendation_id}")
        return said


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.chaos.approver")
    parser.add_argument("--url", required=True)
    parser.add_argument("--token-file", required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--clusters", required=True, help="comma-separated cluster names")
    parser.add_argument("--interval", type=float, default=1.0)
    options = parser.parse_args(argv)
    token = Path(options.token_file).read_text().strip()
    operator = Operator(options.url, token, options.seed, options.clusters.split(","))
    while True:
        try:
            for line in operator.decide_all():
                print(line, flush=True)
        except (OSError, ValueError, urllib.error.URLError) as exc:
            # The web process or the database is away: an operator would click again later.
            print(f"approver: {exc}", file=sys.stderr, flush=True)
        time.sleep(options.interval)


if __name__ == "__main__":
    raise SystemExit(main())
