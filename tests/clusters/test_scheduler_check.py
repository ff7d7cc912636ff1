"""``scheduler_check`` shows what the adapter reads and every fact it could not read.

The scheduler is scripted here; tests/slurm/test_scheduler_check.py runs the command against
real Slurm 22.05 and 24.11.
"""

from __future__ import annotations

import json
from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from recovery.clusters.scheduler_check import check_scheduler
from recovery.schedulers.base import NodeInfo
from tests.factories import ClusterFactory
from tests.fakes import SUBMITTED, Scripted, job

pytestmark = pytest.mark.django_db


class Named(Scripted):
    def __init__(self, *args: object, name: str | None = "lab", version: str | None = "24.11.5"):
        super().__init__(*args)  # type: ignore[arg-type]
        self.name = name
        self.version = version

    def cluster_name(self) -> str | None:
        return self.name

    def scheduler_version(self) -> str | None:
        return self.version


def test_every_job_node_and_unreadable_fact_is_shown() -> None:
    cluster = ClusterFactory(name="lab")
    readable = job()
    fallback = job(
        job_id="4243",
        comment="{not json",
        restart_count=None,
        excluded_nodes=None,
        unreadable={
            "restart_count": "the fixed squeue format has no restart count",
            "excluded_nodes": "the fixed squeue format has no excluded nodes",
        },
    )
    adapter = Named([readable, fallback], [NodeInfo("node001", "IDLE", ["DRAIN"], "bad gpu")])
    check = check_scheduler(cluster, adapter).as_json()
    assert check["slurm_version"] == "24.11.5"
    assert check["cluster_name"] == "lab"
    first, second = check["jobs"]
    assert first["state"] == "RUNNING"
    assert first["submit_time"] == SUBMITTED.isoformat()
    assert (first["restart_count"], first["excluded_nodes"], first["opted_in"]) == (0, [], True)
    assert (second["restart_count"], second["excluded_nodes"]) == (None, None)
    assert second["opted_in"] is False and second["opt_in"]  # says why not
    assert check["unreadable"] == [
        "job 4243: excluded_nodes: the fixed squeue format has no excluded nodes",
        "job 4243: restart_count: the fixed squeue format has no restart count",
    ]
    assert check["nodes"] == [
        {"name": "node001", "state": "IDLE", "flags": ["DRAIN"], "reason": "bad gpu"}
    ]


def test_a_cluster_name_that_does_not_match_is_an_error_and_an_unknown_one_is_listed() -> None:
    cluster = ClusterFactory(name="lab")
    assert check_scheduler(cluster, Named([], name="prod")).errors
    unknown = check_scheduler(cluster, Named([], name=None, version=None))
    assert not unknown.errors
    assert len(unknown.unreadable) == 2


def test_the_command_prints_json_or_lines_and_fails_on_an_unknown_cluster(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cluster = ClusterFactory(name="lab")
    monkeypatch.setattr(
        "recovery.management.commands.scheduler_check.adapter_for",
        lambda c: Named([job()], name=c.name),
    )
    out = StringIO()
    call_command("scheduler_check", "--cluster", cluster.name, "--json", stdout=out)
    assert json.loads(out.getvalue())["jobs"][0]["job_id"] == "4242"
    text = StringIO()
    call_command("scheduler_check", "--cluster", cluster.name, stdout=text)
    assert "4242" in text.getvalue() and "opted in" in text.getvalue()
    with pytest.raises(CommandError, match="no cluster is called"):
        call_command("scheduler_check", "--cluster", "nowhere")
