"""A job's output files are read with the job's rights, not the service's.

The tenant is a user with a job (uid ``TENANT``). It names its job's output files itself, and
tries to make the poller read what it may not: another user's file, through a symbolic link,
outside its directories, a FIFO that would block the poller, a directory, a device. Each attempt
reads no byte, stores no anomaly or evidence, leaves what is stored as it was, and is recorded
once as ``input_ignored`` with the reason. The same rules hold over SFTP, against the real sshd
of the SSH tests.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse

from recovery.audit.payloads import payload_problems
from recovery.choices import AuditKind
from recovery.loop.logs import IngestSummary, ingest_workload_logs
from recovery.loop.poll import poll_cluster
from recovery.models import Anomaly, Attempt, AuditEvent, Cluster, LogCursor, Workload
from recovery.schedulers.base import Transport
from recovery.schedulers.output_files import OutputRefusal
from recovery.schedulers.transport import LocalTransport
from tests.conftest import TEST_PASSWORD
from tests.factories import ClusterFactory, WorkloadFactory
from tests.fakes import Scripted, job
from tests.slurm_fixtures import SSHServer

pytestmark = pytest.mark.django_db

TENANT = 12345  # the job's user
OTHER = 23456  # another user of the cluster
# What another user's file holds: a crash line the detectors would store as evidence.
SECRET = (
    "Nov 29 03:14:15 node002 kernel: NVRM: Xid (PCI:0000:3b:00): 79, pid=1, "
    "GPU has fallen off the bus. API_TOKEN=victor-secret\n"
)
# The tenant's own output.
OWN = "NVRM: Xid (PCI:0000:3b:00): 79, pid=7, GPU has fallen off the bus.\n"


def put(path: Path, text: str = SECRET, *, owner: int = TENANT) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    os.chown(path, owner, owner)
    return path


@dataclass
class Tenant:
    """The tenant's home and job directory, and another user's home beside it."""

    root: Path
    run: Path  # the job's working directory
    victim: Path  # another user's home
    cluster: Cluster

    def job(self, stdout: Path | str, *, uid: int | None = TENANT, **fields: Any) -> Workload:
        """A running opted-in workload whose output is ``stdout``, run by ``uid``."""
        workload = WorkloadFactory(
            cluster=self.cluster,
            stdout_path=str(stdout),
            work_dir=str(fields.pop("work_dir", self.run)),
            user_uid=uid,
            **fields,
        )
        Attempt.objects.create(workload=workload, number=1)
        return workload


@pytest.fixture
def tenant(tmp_path: Path) -> Tenant:
    home = tmp_path / "home"
    run = home / "mallory" / "run"
    run.mkdir(parents=True)
    os.chown(home / "mallory", TENANT, TENANT)
    os.chown(run, TENANT, TENANT)
    victim = home / "victor"
    put(victim / "secret.log", owner=OTHER)
    return Tenant(root=tmp_path, run=run, victim=victim, cluster=ClusterFactory())


def read_as_poller(workload: Workload, transport: Transport | None = None) -> IngestSummary:
    fresh = Workload.objects.select_related("cluster").get(pk=workload.pk)
    return ingest_workload_logs(fresh, transport or LocalTransport())


def ignored(workload: Workload) -> list[AuditEvent]:
    return list(
        AuditEvent.objects.filter(workload=workload, kind=AuditKind.INPUT_IGNORED).order_by("id")
    )


def assert_refused(
    workload: Workload, summary: IngestSummary, reason: OutputRefusal, *words: str
) -> None:
    assert summary.bytes_read == 0
    assert not Anomaly.objects.filter(workload=workload).exists()
    assert not LogCursor.objects.filter(workload=workload).exists()
    [event] = ignored(workload)
    assert event.payload["path"] == workload.stdout_path
    assert event.payload["reason"] == reason
    assert payload_problems(event.kind, event.payload) == []
    for word in words:
        assert word in event.payload["detail"], event.payload["detail"]
    assert "victor-secret" not in str(event.payload)


def test_the_tenants_own_file_in_its_working_directory_is_read(tenant: Tenant) -> None:
    workload = tenant.job(put(tenant.run / "train.log", OWN))
    summary = read_as_poller(workload)
    assert summary.bytes_read == len(OWN)
    assert Anomaly.objects.get(workload=workload).evidence_line.strip() == OWN.strip()
    assert ignored(workload) == []


def test_a_symlink_as_the_output_file_is_refused(tenant: Tenant) -> None:
    link = tenant.run / "train.log"
    link.symlink_to(tenant.victim / "secret.log")
    workload = tenant.job(link)
    assert_refused(workload, read_as_poller(workload), OutputRefusal.SYMLINK, str(link))


def test_a_symlink_as_a_directory_on_the_way_is_refused(tenant: Tenant) -> None:
    (tenant.run / "logs").symlink_to(tenant.victim)
    workload = tenant.job(tenant.run / "logs" / "secret.log")
    summary = read_as_poller(workload)
    assert_refused(workload, summary, OutputRefusal.SYMLINK, f"{tenant.run / 'logs'} is a")


def test_a_working_directory_reached_through_a_symlink_admits_nothing(tenant: Tenant) -> None:
    """The tenant's own file, but the directory it names is a link (to the victim's home)."""
    alias = tenant.run.parent / "alias"
    alias.symlink_to(tenant.victim)
    workload = tenant.job(alias / "secret.log", work_dir=alias)
    assert_refused(workload, read_as_poller(workload), OutputRefusal.SYMLINK, str(alias))


def test_a_path_outside_the_working_directory_and_the_prefixes_is_refused(tenant: Tenant) -> None:
    # Even a file the tenant owns: it lies where no rule lets the poller read.
    planted = put(tenant.root / "elsewhere" / "planted.log")
    workload = tenant.job(planted)
    assert_refused(workload, read_as_poller(workload), OutputRefusal.OUTSIDE, str(tenant.run))


def test_a_prefix_admits_whole_directories_not_names_that_start_alike(tenant: Tenant) -> None:
    scratch = tenant.root / "scratch"
    tenant.cluster.connection_settings = {"output_prefixes": [str(scratch / "a")]}
    tenant.cluster.save()
    workload = tenant.job(
        put(scratch / "ab" / "train.log"), stderr_path=str(put(scratch / "a" / "train.err", OWN))
    )
    summary = read_as_poller(workload)
    assert summary.bytes_read == len(OWN)  # only the file under scratch/a
    [event] = ignored(workload)
    assert (event.payload["path"], event.payload["reason"]) == (
        str(scratch / "ab" / "train.log"),
        OutputRefusal.OUTSIDE,
    )
    assert str(scratch / "a") in event.payload["detail"]


@pytest.mark.parametrize(
    ("path", "says"),
    [
        ("{run}/../../victor/secret.log", "'..'"),
        ("{run}/./sub/../../../victor/secret.log", "'..'"),
        ("victor/secret.log", "not an absolute path"),
    ],
)
def test_a_path_that_is_not_plain_and_absolute_is_refused(
    tenant: Tenant, path: str, says: str
) -> None:
    workload = tenant.job(path.format(run=tenant.run))
    assert_refused(workload, read_as_poller(workload), OutputRefusal.BAD_PATH, says)


def test_another_users_file_in_the_working_directory_is_refused(tenant: Tenant) -> None:
    workload = tenant.job(put(tenant.run / "train.log", owner=OTHER))
    assert_refused(
        workload,
        read_as_poller(workload),
        OutputRefusal.OTHER_OWNER,
        f"uid {OTHER}",
        f"uid {TENANT}",
    )


def test_a_fifo_is_refused_without_opening_it(tenant: Tenant) -> None:
    fifo = tenant.run / "train.log"
    os.mkfifo(fifo)
    os.chown(fifo, TENANT, TENANT)
    workload = tenant.job(fifo)
    assert_refused(workload, read_as_poller(workload), OutputRefusal.NOT_A_FILE, "a FIFO")


def test_a_directory_is_refused(tenant: Tenant) -> None:
    directory = tenant.run / "train.log"
    directory.mkdir()
    os.chown(directory, TENANT, TENANT)
    workload = tenant.job(directory)
    assert_refused(workload, read_as_poller(workload), OutputRefusal.NOT_A_FILE, "a directory")


def test_a_device_is_refused(tenant: Tenant) -> None:
    # sbatch --chdir=/dev -o /dev/zero, by a job running as the device's owner.
    workload = tenant.job("/dev/zero", work_dir="/dev", uid=Path("/dev/zero").stat().st_uid)
    summary = read_as_poller(workload)
    assert_refused(workload, summary, OutputRefusal.NOT_A_FILE, "a character device")


def test_an_unknown_uid_reads_nothing(tenant: Tenant) -> None:
    workload = tenant.job(put(tenant.run / "train.log", OWN), uid=None)
    assert_refused(workload, read_as_poller(workload), OutputRefusal.OWNER_UNKNOWN)


def test_a_refusal_is_recorded_once_per_path_and_reason(tenant: Tenant) -> None:
    link = tenant.run / "train.log"
    link.symlink_to(tenant.victim / "secret.log")
    workload = tenant.job(link)
    for _ in range(3):
        read_as_poller(workload)
    assert [e.payload["reason"] for e in ignored(workload)] == [OutputRefusal.SYMLINK]
    link.unlink()
    put(link, owner=OTHER)
    read_as_poller(workload)
    read_as_poller(workload)
    assert [e.payload["reason"] for e in ignored(workload)] == [
        OutputRefusal.SYMLINK,
        OutputRefusal.OTHER_OWNER,
    ]


def test_a_file_swapped_for_a_symlink_changes_nothing_already_stored(tenant: Tenant) -> None:
    output = put(tenant.run / "train.log", OWN)
    workload = tenant.job(output)
    read_as_poller(workload)
    anomaly = Anomaly.objects.get(workload=workload)
    cursor = LogCursor.objects.get(workload=workload)
    stored = Workload.objects.filter(pk=workload.pk).values().get()

    output.unlink()
    output.symlink_to(tenant.victim / "secret.log")
    summary = read_as_poller(workload)

    assert summary.bytes_read == 0
    [kept] = Anomaly.objects.filter(workload=workload)
    assert (kept.pk, kept.evidence_line, kept.evidence_excerpt, kept.occurrences) == (
        anomaly.pk,
        anomaly.evidence_line,
        anomaly.evidence_excerpt,
        anomaly.occurrences,
    )
    assert LogCursor.objects.get(workload=workload).offset == cursor.offset == len(OWN)
    assert Workload.objects.filter(pk=workload.pk).values().get() == stored
    assert [e.payload["reason"] for e in ignored(workload)] == [OutputRefusal.SYMLINK]


def test_a_poll_refuses_the_abusive_jobs_and_reads_the_others(tenant: Tenant) -> None:
    """
    GIVEN three opted-in jobs: one whose output links to another user's file, one whose user
          id the scheduler did not report, and an honest one
    WHEN the cluster is polled (twice)
    THEN only the honest job's output is read; each refusal is recorded once, with its reason
    """
    link = tenant.run / "train.log"
    link.symlink_to(tenant.victim / "secret.log")
    own = put(tenant.run / "own.log", OWN)
    scheduler = Scripted(
        [
            job(job_id="1", stdout_path=str(link), work_dir=str(tenant.run), user_uid=TENANT),
            job(job_id="2", stdout_path=str(own), work_dir=str(tenant.run), user_uid=None),
            job(job_id="3", stdout_path=str(own), work_dir=str(tenant.run), user_uid=TENANT),
        ]
    )
    scheduler.transport = LocalTransport()
    summary = poll_cluster(tenant.cluster, scheduler)
    poll_cluster(tenant.cluster, scheduler)

    workloads = {w.job_id: w for w in Workload.objects.filter(cluster=tenant.cluster)}
    assert [w.job_id for w in Workload.objects.filter(anomalies__isnull=False)] == ["3"]
    assert [e.payload["reason"] for e in ignored(workloads["1"])] == [OutputRefusal.SYMLINK]
    assert [e.payload["reason"] for e in ignored(workloads["2"])] == [OutputRefusal.OWNER_UNKNOWN]
    assert ignored(workloads["3"]) == []
    assert not AuditEvent.objects.filter(payload__icontains="victor-secret").exists()
    assert (summary.outputs_refused, summary.log_bytes) == (2, len(OWN))


def test_a_viewer_sees_the_refusal_in_the_workloads_trail_escaped(
    tenant: Tenant, viewer: User
) -> None:
    link = tenant.run / "<img src=x onerror=alert(1)>.log"
    link.symlink_to(tenant.victim / "secret.log")
    workload = tenant.job(link)
    read_as_poller(workload)
    client = Client()
    client.login(username=viewer.username, password=TEST_PASSWORD)
    body = client.get(reverse("console:workload", args=[workload.pk])).content.decode()
    trail = body[body.index('id="audit-trail"') :]
    assert "Input ignored" in trail
    assert str(OutputRefusal.SYMLINK) in trail
    assert "&lt;img src=x onerror=alert(1)&gt;.log is a symbolic link" in trail
    assert "<img src=x" not in body
    assert "victor-secret" not in body


# ---------------------------------------------------------------------- over SFTP


@pytest.fixture
def sftp(ssh_server: SSHServer) -> Iterator[Transport]:
    transport = ssh_server.transport()
    yield transport
    transport.close()


@pytest.mark.slurm
def test_sftp_reads_the_tenants_own_file(tenant: Tenant, sftp: Transport) -> None:
    workload = tenant.job(put(tenant.run / "train.log", OWN))
    summary = read_as_poller(workload, sftp)
    assert summary.bytes_read == len(OWN)
    assert Anomaly.objects.filter(workload=workload).count() == 1
    assert ignored(workload) == []


@pytest.mark.slurm
def test_sftp_refuses_a_symlink_as_the_file(tenant: Tenant, sftp: Transport) -> None:
    link = tenant.run / "train.log"
    link.symlink_to(tenant.victim / "secret.log")
    workload = tenant.job(link)
    assert_refused(workload, read_as_poller(workload, sftp), OutputRefusal.SYMLINK, str(link))


@pytest.mark.slurm
def test_sftp_refuses_a_symlink_on_the_way(tenant: Tenant, sftp: Transport) -> None:
    (tenant.run / "logs").symlink_to(tenant.victim)
    workload = tenant.job(tenant.run / "logs" / "secret.log")
    summary = read_as_poller(workload, sftp)
    assert_refused(workload, summary, OutputRefusal.SYMLINK, f"{tenant.run / 'logs'} is a")


@pytest.mark.slurm
def test_sftp_refuses_another_users_file(tenant: Tenant, sftp: Transport) -> None:
    workload = tenant.job(put(tenant.run / "train.log", owner=OTHER))
    summary = read_as_poller(workload, sftp)
    assert_refused(workload, summary, OutputRefusal.OTHER_OWNER, f"uid {OTHER}")


@pytest.mark.slurm
def test_sftp_refuses_a_fifo(tenant: Tenant, sftp: Transport) -> None:
    fifo = tenant.run / "train.log"
    os.mkfifo(fifo)
    os.chown(fifo, TENANT, TENANT)
    workload = tenant.job(fifo)
    assert_refused(workload, read_as_poller(workload, sftp), OutputRefusal.NOT_A_FILE, "a FIFO")
