"""The Slurm adapter against the real test clusters, reached as the project reaches them (local
commands for 22.05, SSH to the chroot's login node for 24.11)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import pytest

from recovery.schedulers.base import CommandResult, JobInfo, SchedulerError, Transport
from recovery.schedulers.output_files import OutputAccess, OutputFile, OutputRefused
from recovery.schedulers.slurm import SlurmAdapter
from tests.slurm.conftest import SlurmCluster

pytestmark = pytest.mark.slurm


@pytest.fixture
def adapter(slurm_cluster: SlurmCluster) -> Iterator[SlurmAdapter]:
    adapter = slurm_cluster.adapter()
    yield adapter
    close = getattr(adapter.transport, "close", None)
    if close is not None:
        close()


def wait_for(
    adapter: SlurmAdapter, job_id: str, predicate: Callable[[JobInfo], bool], seconds: float = 60
) -> JobInfo:
    deadline = time.monotonic() + seconds
    job = None
    while time.monotonic() < deadline:
        job = adapter.get_job(job_id)
        if job is not None and predicate(job):
            return job
        time.sleep(0.3)
    raise AssertionError(f"job {job_id} did not reach the state in {seconds} s: {job}")


def test_it_lists_a_running_job_with_its_opt_in_and_paths(
    adapter: SlurmAdapter, submit_job: Any
) -> None:
    submitted = submit_job()
    job = wait_for(adapter, str(submitted.job_id), lambda j: j.is_running)
    assert job.opt_in.opted_in
    assert job.opt_in.environment == "test"
    assert job.opt_in.mode == "act"
    assert job.nodes and all(n.startswith("node00") for n in job.nodes)
    assert job.partition == "debug"
    assert job.restart_count == 0
    assert job.stdout_path == str(submitted.output)
    assert job.submit_time is not None and job.start_time is not None


def test_a_malformed_comment_is_not_opted_in_with_a_reason(
    adapter: SlurmAdapter, submit_job: Any
) -> None:
    submitted = submit_job(comment="{not json")
    job = wait_for(adapter, str(submitted.job_id), lambda j: True)
    assert not job.opt_in.opted_in
    assert "not JSON" in job.opt_in.reason


def test_it_lists_nodes_with_their_states(adapter: SlurmAdapter, slurm_cluster: Any) -> None:
    nodes = {node.name: node for node in adapter.list_nodes()}
    assert set(slurm_cluster.nodes) <= set(nodes)
    assert not any(nodes[name].unavailable for name in slurm_cluster.nodes)


def test_a_held_requeue_with_exclusions_restarts_elsewhere(
    adapter: SlurmAdapter, submit_job: Any
) -> None:
    submitted = submit_job()
    running = wait_for(adapter, str(submitted.job_id), lambda j: j.is_running)
    first_nodes = running.nodes
    adapter.requeue(str(submitted.job_id), hold=True)
    pending = wait_for(
        adapter, str(submitted.job_id), lambda j: j.native_state in {"PENDING", "COMPLETING"}
    )
    assert pending.restart_count == 1
    adapter.set_excluded_nodes(str(submitted.job_id), first_nodes)
    wait_for(adapter, str(submitted.job_id), lambda j: j.is_pending and j.held is True)
    adapter.release(str(submitted.job_id))
    adapter.clear_start_delay(str(submitted.job_id))
    restarted = wait_for(adapter, str(submitted.job_id), lambda j: j.is_running, seconds=60)
    assert not set(restarted.nodes) & set(first_nodes)
    assert restarted.excluded_nodes == first_nodes
    assert restarted.restart_count == 1


def test_a_stopped_job_is_cancelled_and_cannot_be_requeued(
    adapter: SlurmAdapter, submit_job: Any
) -> None:
    submitted = submit_job()
    wait_for(adapter, str(submitted.job_id), lambda j: j.is_running)
    adapter.disable_requeue(str(submitted.job_id))
    assert not adapter.get_job(str(submitted.job_id)).requeue_allowed  # type: ignore[union-attr]
    adapter.cancel(str(submitted.job_id))
    cancelled = wait_for(adapter, str(submitted.job_id), lambda j: j.native_state == "CANCELLED")
    with pytest.raises(SchedulerError):
        adapter.requeue(cancelled.job_id)


def test_refused_actions_say_what_slurm_said(adapter: SlurmAdapter) -> None:
    with pytest.raises(SchedulerError, match="Invalid job id"):
        adapter.requeue("999999999")


@pytest.mark.parametrize("bad", ["1; rm -rf /", "-1", "", "12 34", "$(id)"])
def test_bad_job_ids_are_refused_before_any_command(bad: str) -> None:
    class Recording:
        name = "recording"
        calls: list[list[str]] = []

        def run(self, argv: list[str], *, timeout: float = 30) -> Any:
            self.calls.append(argv)
            raise AssertionError("no command may run")

    transport = Recording()
    with pytest.raises(ValueError):
        SlurmAdapter(transport).requeue(bad)  # type: ignore[arg-type]
    assert transport.calls == []


@pytest.mark.parametrize("bad", ["node[1-2]", "-x", "node 1", "a;b"])
def test_bad_node_names_are_refused_before_any_command(bad: str) -> None:
    class Refusing:
        name = "refusing"

        def run(self, argv: list[str], *, timeout: float = 30) -> Any:
            raise AssertionError("no command may run")

    with pytest.raises(ValueError):
        SlurmAdapter(Refusing()).set_excluded_nodes("42", [bad])  # type: ignore[arg-type]


class RefusingJson:
    """A Slurm whose squeue and scontrol refuse --json, as before 21.08; the rest runs."""

    def __init__(self, inner: Transport) -> None:
        self.inner = inner
        self.name = inner.name
        self.refused: list[tuple[str, ...]] = []

    def run(self, argv: Sequence[str], *, timeout: float = 30.0) -> CommandResult:
        if "--json" in argv:
            self.refused.append(tuple(argv))
            return CommandResult(tuple(argv), 1, "", f"{argv[0]}: unrecognized option '--json'")
        return self.inner.run(argv, timeout=timeout)

    def read_file(self, path: str, offset: int, limit: int) -> bytes:
        return self.inner.read_file(path, offset, limit)

    def file_size(self, path: str) -> int | None:
        return self.inner.file_size(path)

    def open_output(self, path: str, access: OutputAccess) -> OutputFile | None:
        return self.inner.open_output(path, access)

    def output_sizes(self, paths: Sequence[str]) -> dict[str, int | None]:
        return self.inner.output_sizes(paths)

    def open_outputs(
        self,
        wanted: Mapping[str, int],
        access: OutputAccess | Mapping[str, OutputAccess],
        limit: int,
    ) -> dict[str, OutputFile | OutputRefused | None]:
        return self.inner.open_outputs(wanted, access, limit)


def test_the_fixed_format_fallback_reads_the_same_job(
    adapter: SlurmAdapter, submit_job: Any, slurm_cluster: SlurmCluster
) -> None:
    """Where squeue and scontrol refuse --json (Slurm before 21.08, or a JSON answer that cannot
    be used), the fixed format (unit-separated, comment last) reads the same job."""
    submitted = submit_job(comment='{"nvidia-recovery":{"mode":"observe","note":"a b|c"}}')
    from_json = wait_for(adapter, str(submitted.job_id), lambda j: j.is_running)
    refusing = RefusingJson(adapter.transport)
    without_json = SlurmAdapter(refusing)
    from_text = without_json.get_job(str(submitted.job_id))
    assert refusing.refused, "the JSON commands were never tried"
    assert from_text is not None
    assert from_text.native_state == "RUNNING"
    assert from_text.nodes == from_json.nodes
    assert from_text.partition == from_json.partition
    assert from_text.opt_in.opted_in and from_text.opt_in.mode == "observe"
    assert from_text.comment == from_json.comment
    assert any(job.job_id == from_json.job_id for job in without_json.list_jobs())
