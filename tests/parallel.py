"""What lets ``make test`` run its tests in several pytest-xdist workers at once.

Each worker has its own test database (pytest-django adds the worker's id to its name) and its
own Redis database: a test that empties Redis (FLUSHDB), or listens on a channel-layer group,
must not meet another worker's keys and messages. Tests that share something expensive that
exists once per machine run in one worker, as a group:

* ``slurm-22.05``, ``slurm-24.11``: the tests of one real Slurm cluster each (fixed ports,
  started once a session by the worker that runs its group), with its login node's sshd;
* ``slurm-e2e-22.05``, ``slurm-e2e-24.11``: the end-to-end scenarios, on clusters of their own
  (``tests/e2e/conftest.py``). Every cluster has ports, a directory and a slot of job ids of
  its own, so the four groups run side by side;
* ``slurm-wheel``: the controller's wheel tests that need no cluster (the wheel is built per
  worker, its venvs once per machine under a lock);
* ``browser``: the Console's stack (uvicorn, a Celery worker, a private Redis) and Chromium,
  started once for the package.

The workers' scheduler keeps a group together (``GroupScheduling``); it knows a test only by
its id, so a group is told from the id (a Slurm test's parameter names its cluster), and every
worker checks at collection that the ids tell the groups the fixtures need.
"""

from __future__ import annotations

import os
import re
from collections import Counter
from collections.abc import Iterable, MutableMapping
from pathlib import Path
from typing import Any

import pytest
from xdist.scheduler import LoadScopeScheduling

SLURM_GROUP = "slurm"
BROWSER_GROUP = "browser"
# The fixtures whose resources exist once per machine: each cluster, its login node, and the
# controller's venvs.
ONE_PER_MACHINE = frozenset({"slurm_cluster", "ssh_server", "controller_wheel", "controller_venv"})
BROWSER_TESTS = Path(__file__).resolve().parent / "browser"
_DB_NUMBER = re.compile(r"^(?P<base>redis://[^/?#]*)/(?P<number>\d+)(?P<rest>[?#].*)?$")
# Redis' default number of databases: the workers' must stay below it.
REDIS_DATABASES = 16


def worker_number(worker: str | None = None) -> int | None:
    """0, 1, ... in an xdist worker (``gw0``, ``gw1``, ...); None in a run without workers."""
    worker = os.environ.get("PYTEST_XDIST_WORKER") if worker is None else worker
    if not worker or not worker.startswith("gw") or not worker[2:].isdigit():
        return None
    return int(worker[2:])


def redis_url_of_worker(url: str, number: int) -> str:
    """``url`` moved ``number`` databases up: worker 0 keeps the run's own database."""
    found = _DB_NUMBER.match(url)
    if found is None:
        base, database, rest = url.rstrip("/"), 0, ""
    else:
        base, database, rest = found["base"], int(found["number"]), found["rest"] or ""
    moved = database + number
    if moved >= REDIS_DATABASES:
        raise pytest.UsageError(
            f"{number + 1} test workers from Redis database {database} need databases up to "
            f"{moved}; Redis has {REDIS_DATABASES}: use fewer workers or a lower REDIS_URL database"
        )
    return f"{base}/{moved}{rest}"


def use_own_redis_database(settings: Any, environ: MutableMapping[str, str]) -> str | None:
    """Point this worker's settings and the processes it starts at its own Redis database.

    Runs after Django read its settings and before anything connected (connections to Redis
    are made on first use). Only the values that were the run's REDIS_URL move.
    """
    number = worker_number()
    if number is None or number == 0:
        return None
    shared = str(settings.REDIS_URL)
    own = redis_url_of_worker(shared, number)
    settings.REDIS_URL = own
    environ["REDIS_URL"] = own
    for name in ("CELERY_BROKER_URL", "CELERY_RESULT_BACKEND"):
        if getattr(settings, name, None) == shared:
            setattr(settings, name, own)
    for cache in settings.CACHES.values():
        if cache.get("LOCATION") == shared:
            cache["LOCATION"] = own
    for layer in settings.CHANNEL_LAYERS.values():
        for host in layer.get("CONFIG", {}).get("hosts", []):
            if isinstance(host, dict) and host.get("address") == shared:
                host["address"] = own
    return own


# The id the ``slurm_cluster`` fixture gives each cluster, somewhere in a test's parameters.
_SLURM_PARAMETER = re.compile(r"\[(?:[^\]]*-)?slurm-(?P<version>\d+\.\d+)(?:-[^\]]*)?\]$")
# Tests that use the controller's wheel without a Slurm cluster.
WHEEL_MODULES = ("tests/deploy/test_controller_package.py",)
WHEEL_GROUP = f"{SLURM_GROUP}-wheel"


def group_of(nodeid: str) -> str | None:
    """The group of the test with this id, None for a test any worker may run."""
    path = nodeid.split("::", 1)[0]
    if path.startswith("tests/browser/"):
        return BROWSER_GROUP
    cluster = _SLURM_PARAMETER.search(nodeid)
    if cluster is not None and path.startswith("tests/e2e/"):
        return f"{SLURM_GROUP}-e2e-{cluster['version']}"
    if cluster is not None:
        return f"{SLURM_GROUP}-{cluster['version']}"
    if path in WHEEL_MODULES:
        return WHEEL_GROUP
    return None


def needed_group(item: pytest.Item) -> str | None:
    """The group a test's fixtures put it in: for the Slurm fixtures, what every Slurm group's
    name begins with (the test's id then says which cluster's)."""
    if ONE_PER_MACHINE & set(getattr(item, "fixturenames", ())):
        return SLURM_GROUP
    if BROWSER_TESTS in Path(str(item.path)).resolve().parents:
        return BROWSER_GROUP
    return None


def check_groups(items: Iterable[pytest.Item]) -> None:
    """Refuse a run where a test's id does not tell the group its fixtures need: two workers
    would start the same Slurm cluster on the same ports."""
    wrong = [
        item.nodeid
        for item in items
        if (needed := needed_group(item)) is not None
        and not (group_of(item.nodeid) or "").startswith(needed)
    ]
    if wrong:
        raise pytest.UsageError(
            "tests/parallel.py cannot tell the worker group of these tests from their ids (add "
            f"their module to WHEEL_MODULES, or give them the cluster's parameter): {wrong[:5]}"
        )


def check_ids_unique(items: Iterable[pytest.Item]) -> None:
    """Refuse tests that share an id in a worker: the scheduler sends tests by id, so all but
    one of them would never run."""
    if worker_number() is None:
        return
    counts = Counter(item.nodeid for item in items)
    twice = sorted(nodeid for nodeid, count in counts.items() if count > 1)
    if twice:
        raise pytest.UsageError(
            f"tests that share an id cannot run in xdist workers (run them apart): {twice[:5]}"
        )


class GroupScheduling(LoadScopeScheduling):  # type: ignore[misc]  # xdist has no types
    """xdist's scope scheduling, with a group as the scope of its tests and each other test a
    scope of its own; the largest scopes go first, so the Slurm groups start at once."""

    def _split_scope(self, nodeid: str) -> str:
        return group_of(nodeid) or nodeid
