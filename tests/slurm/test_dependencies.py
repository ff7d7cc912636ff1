"""A pending job's dependency, read from the real test clusters: the jobs it is chained after."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from recovery.schedulers.slurm import SlurmAdapter
from tests.slurm.conftest import SlurmCluster
from tests.slurm.test_adapter import wait_for

pytestmark = pytest.mark.slurm


@pytest.fixture
def adapter(slurm_cluster: SlurmCluster) -> Iterator[SlurmAdapter]:
    adapter = slurm_cluster.adapter()
    yield adapter
    close = getattr(adapter.transport, "close", None)
    if close is not None:
        close()


def test_a_job_waiting_on_another_names_it_in_json_and_in_the_fixed_format(
    adapter: SlurmAdapter, submit_job: Any
) -> None:
    first = submit_job(sbatch_args=["--hold"])
    chained = f"afterany:{first.job_id}?afternotok:{first.job_id}"
    second = submit_job(sbatch_args=[f"--dependency={chained}"])
    third = submit_job(sbatch_args=[f"--dependency=afterok:{first.job_id}"])
    job = wait_for(adapter, str(second.job_id), lambda j: j.is_pending)
    assert job.chained_after == (str(first.job_id),), job.unreadable
    other = wait_for(adapter, str(third.job_id), lambda j: j.is_pending)
    assert other.chained_after == ()  # afterok does not chain a workflow
    (fixed,) = adapter._list_jobs_fixed_format(str(second.job_id))
    assert fixed.chained_after == (str(first.job_id),), fixed.unreadable
