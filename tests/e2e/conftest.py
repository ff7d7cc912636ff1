"""End-to-end fault scenarios: real multi-node jobs on the local Slurm clusters, the whole loop.

Every scenario runs on each Slurm version of the ``slurm_cluster`` fixture, here a cluster of
each version for the scenarios alone (``E2E_CLUSTER_ENVS``). On 24.11 only the
scenarios in ``WR_E2E_2411_SCENARIOS`` run (default ``1 2 4 8 15``: a killed rank, a dead node,
an Xid with a hardware verdict, a controller killed mid-recovery, a handled error then a quiet
step; ``all`` runs every one); the others are skipped with that reason, to keep ``make test``
within its time on two cores.

Every scenario records one row of figures in ``var/e2e/report.json`` (``WR_E2E_REPORT`` moves
it), written at the end of the session and printed by ``tests/e2e/report.py``. The harness is
in tests/e2e/harness.py, its parts beside it (job, procs, slurm_view, loop, figures).
"""

from __future__ import annotations

import importlib.util
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.figures import REPORT, Report
from tests.e2e.harness import Harness
from tests.e2e.job import HERE
from tests.slurm_fixtures import E2E_CLUSTER_ENVS, VERSIONS, SlurmCluster, running_cluster

SCENARIOS_2411 = os.environ.get("WR_E2E_2411_SCENARIOS", "1 2 4 8 15").replace(",", " ").split()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.is_relative_to(HERE):
            item.add_marker(pytest.mark.e2e)
            item.add_marker(pytest.mark.slurm)
            callspec = getattr(item, "callspec", None)
            version = callspec.params.get("slurm_cluster") if callspec is not None else None
            number = re.match(r"test_(\d+)_", item.name)
            if (
                version == "24.11"
                and "all" not in SCENARIOS_2411
                and number is not None
                and number[1] not in SCENARIOS_2411
            ):
                item.add_marker(
                    pytest.mark.skip(
                        reason=f"on Slurm 24.11 only scenarios {' '.join(SCENARIOS_2411)} run"
                        " (WR_E2E_2411_SCENARIOS); this one runs on 22.05"
                    )
                )


@pytest.fixture(scope="session", params=VERSIONS, ids=lambda version: f"slurm-{version}")
def slurm_cluster(request: pytest.FixtureRequest) -> Iterator[SlurmCluster]:
    """The scenarios' own cluster of each version (``E2E_CLUSTER_ENVS``): they run in a test
    worker of their own, beside the one that runs tests/slurm on the others."""
    yield from running_cluster(request.param, E2E_CLUSTER_ENVS[request.param])


@pytest.fixture(scope="session")
def e2e_report() -> Iterator[Report]:
    report = Report()
    yield report
    if report.rows:
        report.write(REPORT)


@pytest.fixture(scope="session")
def _torch_installed() -> None:
    if importlib.util.find_spec("torch") is None:
        pytest.fail(
            "the e2e scenarios need torch: pip install -e '.[e2e]' (make install-e2e does it)",
            pytrace=False,
        )


OUTCOME = pytest.StashKey[pytest.TestReport]()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    report = yield
    if report.when == "call" or (report.when == "setup" and report.failed):
        item.stash[OUTCOME] = report
    return report


@pytest.fixture
def scenario(
    request: pytest.FixtureRequest,
    live_server: Any,
    slurm_cluster: SlurmCluster,
    tmp_path: Path,
    e2e_report: Report,
    _torch_installed: None,
) -> Iterator[Harness]:
    harness = Harness(
        request.node.name.removeprefix("test_"),
        live_server_url=live_server.url,
        slurm_cluster=slurm_cluster,
        workdir=tmp_path,
        report=e2e_report,
    )
    try:
        yield harness
    finally:
        outcome = request.node.stash.get(OUTCOME, None)
        if outcome is not None and outcome.passed:
            harness.finish(None)
        else:
            harness.finish(str(outcome.longrepr) if outcome is not None else "did not finish")
        harness.close()
    differences = harness.row.get("replay", {}).get("differences")
    if differences:
        pytest.fail(
            "replaying the policies in force over the run did not reproduce its decisions: "
            + "; ".join(differences)
        )
