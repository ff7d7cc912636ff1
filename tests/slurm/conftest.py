"""Tests against a real four-node Slurm cluster, started by deploy/slurm-dev/up.sh.

The cluster and the ``slurm_cluster`` and ``submit_job`` fixtures live in tests/slurm_fixtures.py,
shared with tests/e2e. Every test in this folder carries the ``slurm`` marker.
"""

from __future__ import annotations

from pathlib import Path

import pytest

# Re-exported: the tests here import these names from this module.
from tests.slurm_fixtures import (  # noqa: F401
    CLUSTER_DIR,
    CLUSTER_ENV,
    DEFAULT_COMMENT,
    DOWN,
    REPO,
    START_TIMEOUT,
    TRAIN,
    UP,
    SlurmCluster,
    SubmittedJob,
)

HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.is_relative_to(HERE):
            item.add_marker(pytest.mark.slurm)
