"""Tests against real four-node Slurm clusters (22.05 and 24.11), started by deploy/slurm-dev/up.sh.

The clusters and the ``slurm_cluster`` (parametrized over the versions) and ``submit_job``
fixtures live in tests/slurm_fixtures.py, shared with tests/e2e. Every test in this folder
carries the ``slurm`` marker. ``only_22_05`` skips a test on other versions, with the reason.
"""

from __future__ import annotations

from pathlib import Path

import pytest

# Re-exported (see __all__): the tests here import these names from this module.
from tests.slurm_fixtures import (
    CLUSTER_DIR,
    CLUSTER_DIR_2411,
    CLUSTER_ENV,
    CLUSTER_ENV_2411,
    CLUSTER_ENVS,
    DEFAULT_COMMENT,
    DOWN,
    REPO,
    START_TIMEOUT,
    TRAIN,
    UP,
    VERSIONS,
    SlurmCluster,
    SSHLogin,
    SubmittedJob,
)

__all__ = [
    "CLUSTER_DIR",
    "CLUSTER_DIR_2411",
    "CLUSTER_ENV",
    "CLUSTER_ENVS",
    "CLUSTER_ENV_2411",
    "DEFAULT_COMMENT",
    "DOWN",
    "REPO",
    "START_TIMEOUT",
    "TRAIN",
    "UP",
    "VERSIONS",
    "SSHLogin",
    "SlurmCluster",
    "SubmittedJob",
    "only_22_05",
]

HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.is_relative_to(HERE):
            item.add_marker(pytest.mark.slurm)


def only_22_05(cluster: SlurmCluster, reason: str) -> None:
    """Skip the running test unless the cluster runs Slurm 22.05."""
    if cluster.version != "22.05":
        pytest.skip(f"Slurm 22.05 only: {reason}")
