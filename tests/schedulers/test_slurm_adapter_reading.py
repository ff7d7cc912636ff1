"""How the Slurm adapter reads jobs, nodes, its version and cluster, with scripted commands."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from recovery.schedulers.base import CommandResult, SchedulerError
from recovery.schedulers.compat import UTC
from recovery.schedulers.output_files import OutputAccess, OutputFile, OutputRefused
from recovery.schedulers.slurm import (
    FALLBACK_FIELDS,
    NODE_FORMAT,
    SEPARATOR,
    SlurmAdapter,
)

DATA = Path(__file__).parent / "data" / "slurm"
SQUEUE_JSON = ("squeue", "--json", "-t", "all")


class ScriptedTransport:
    """Answers each command with the next scripted result for it; records every call."""

    name = "scripted"

    def __init__(self, answers: dict[tuple[str, ...], list[tuple[int, str, str]]]) -> None:
        self.answers = answers
        self.calls: list[tuple[str, ...]] = []

    def run(self, argv: Sequence[str], *, timeout: float = 30.0) -> CommandResult:
        command = tuple(argv)
        self.calls.append(command)
        queue = self.answers.get(command)
        if not queue:
            raise AssertionError(f"unexpected command {command}")
        returncode, stdout, stderr = queue.pop(0) if len(queue) > 1 else queue[0]
        return CommandResult(command, returncode, stdout, stderr)

    def read_file(self, path: str, offset: int, limit: int) -> bytes:
        return b""

    def file_size(self, path: str) -> int | None:
        return None

    def open_output(self, path: str, access: OutputAccess) -> OutputFile | None:
        raise AssertionError("reading the scheduler opens no job output")

    def output_sizes(self, paths: Sequence[str]) -> dict[str, int | None]:
        raise AssertionError("reading the scheduler stats no job output")

    def open_outputs(
        self,
        wanted: Mapping[str, int],
        access: OutputAccess | Mapping[str, OutputAccess],
        limit: int,
    ) -> dict[str, OutputFile | OutputRefused | None]:
        raise AssertionError("reading the scheduler opens no job output")


def document(*jobs: dict[str, Any], version: str = "24.11.5", **extra: Any) -> str:
    major, minor, micro = version.split(".")
    meta = {"slurm": {"version": {"major": major, "minor": minor, "micro": micro}}}
    meta["slurm"]["release"] = version  # type: ignore[assignment]
    meta["slurm"]["cluster"] = "lab"  # type: ignore[assignment]
    return json.dumps({"meta": meta, "errors": [], "warnings": [], "jobs": list(jobs), **extra})


def job(job_id: int = 42, **overrides: Any) -> dict[str, Any]:
    number = {"set": True, "infinite": False, "number": 1796134355}
    record = {
        "job_id": job_id,
        "name": "train",
        "user_name": "alice",
        "partition": "debug",
        "job_state": ["RUNNING"],
        "state_reason": "None",
        "comment": "",
        "nodes": "node001",
        "excluded_nodes": "",
        "restart_cnt": 0,
        "requeue": True,
        "priority": {"set": True, "infinite": False, "number": 1},
        "exit_code": {"status": ["SUCCESS"], "return_code": {"set": True, "number": 0}},
        "submit_time": number,
        "current_working_directory": "/work",
        "standard_output": "",
        "flags": [],
    }
    record.update(overrides)
    return record


def fixed_line(
    job_id: str = "42", state: str = "RUNNING", priority: str = "0.99", uid: str = "1000"
) -> str:
    values = {
        "%i": job_id,
        "%j": "train",
        "%u": "alice",
        "%U": uid,
        "%P": "debug",
        "%T": state,
        "%r": "None",
        "%N": "node001",
        "%V": "2026-12-01T14:12:35",
        "%S": "2026-12-01T14:12:36",
        "%e": "N/A",
        "%Z": "/work",
        "%p": priority,
        "%E": "(null)",
        "%k": "(null)",
    }
    return SEPARATOR.join(values[code] for code in FALLBACK_FIELDS)


FIXED = ("squeue", "-h", "-t", "all", "-o", SEPARATOR.join(FALLBACK_FIELDS))


def adapter(
    answers: dict[tuple[str, ...], list[tuple[int, str, str]]],
) -> tuple[SlurmAdapter, ScriptedTransport]:
    transport = ScriptedTransport(answers)
    return SlurmAdapter(transport), transport


SINFO_NODES = ("sinfo", "-h", "-a", "-N", "-O", NODE_FORMAT)
NOW = "2026-12-03T22:22:32"


def sinfo_lines(*nodes: tuple[str, str, str, str, str]) -> str:
    """sinfo -N -O NODE_FORMAT's lines: each field followed by the separator."""
    return "".join("".join(f"{field}{SEPARATOR}" for field in node) + "\n" for node in nodes)


def fixed_format_only(stdout: str, returncode: int = 0) -> tuple[SlurmAdapter, ScriptedTransport]:
    return adapter(
        {
            ("scontrol", "--json", "show", "nodes"): [(1, "", "unrecognized option '--json'")],
            ("sinfo", "--json"): [(1, "", "sinfo: unrecognized option '--json'")],
            SINFO_NODES: [(returncode, stdout, "" if returncode == 0 else "slurm_load_node")],
        }
    )


class TestListingJobs:
    def test_it_lists_every_job_including_finished_ones(self) -> None:
        slurm, transport = adapter({SQUEUE_JSON: [(0, document(job()), "")]})
        [listed] = slurm.list_jobs()
        assert listed.native_state == "RUNNING" and listed.unknown() == {}
        assert transport.calls == [SQUEUE_JSON]

    def test_one_failed_json_read_falls_back_for_that_call_only(self) -> None:
        slurm, transport = adapter(
            {
                SQUEUE_JSON: [
                    (1, "", "squeue: error: slurm_receive_msg"),
                    (0, document(job()), ""),
                ],
                FIXED: [(0, fixed_line() + "\n", "")],
            }
        )
        [fallback] = slurm.list_jobs()
        assert fallback.job_id == "42" and fallback.native_state == "RUNNING"
        [again] = slurm.list_jobs()
        assert again.restart_count == 0
        assert transport.calls == [SQUEUE_JSON, FIXED, SQUEUE_JSON]

    @pytest.mark.parametrize(
        "stdout", [document(job())[:120], "", json.dumps({"errors": ["x"], "jobs": []})]
    )
    def test_a_truncated_or_failed_document_falls_back(self, stdout: str) -> None:
        slurm, transport = adapter(
            {SQUEUE_JSON: [(0, stdout, "")], FIXED: [(0, fixed_line() + "\n", "")]}
        )
        assert [j.job_id for j in slurm.list_jobs()] == ["42"]
        assert transport.calls == [SQUEUE_JSON, FIXED]

    def test_the_fixed_format_leaves_what_it_cannot_read_unknown(self) -> None:
        slurm, _ = adapter({SQUEUE_JSON: [(1, "", "no")], FIXED: [(0, fixed_line() + "\n", "")]})
        [fallback] = slurm.list_jobs()
        assert fallback.restart_count is None
        assert fallback.excluded_nodes is None
        assert fallback.requeue_allowed is None
        assert set(fallback.unknown()) == {"restart_count", "excluded_nodes", "requeue_allowed"}
        assert "fixed squeue format" in fallback.unknown()["restart_count"]
        assert fallback.held is False
        assert fallback.submit_time is not None

    def test_the_fixed_format_reads_the_user_id_or_says_why_not(self) -> None:
        slurm, _ = adapter({SQUEUE_JSON: [(1, "", "no")], FIXED: [(0, fixed_line() + "\n", "")]})
        assert slurm.list_jobs()[0].user_uid == 1000
        slurm, _ = adapter(
            {SQUEUE_JSON: [(1, "", "no")], FIXED: [(0, fixed_line(uid="4294967294"), "")]}
        )
        [job] = slurm.list_jobs()
        assert job.user_uid is None
        assert job.unreadable["user_uid"] == "%U: '4294967294' is not a user id"

    def test_the_fixed_format_reads_a_hold(self) -> None:
        slurm, _ = adapter(
            {SQUEUE_JSON: [(1, "", "no")], FIXED: [(0, fixed_line(priority="0.00000000"), "")]}
        )
        assert slurm.list_jobs()[0].held is True

    def test_a_failed_fixed_format_read_raises(self) -> None:
        slurm, _ = adapter({SQUEUE_JSON: [(1, "", "no")], FIXED: [(1, "", "timed out")]})
        with pytest.raises(SchedulerError, match="timed out"):
            slurm.list_jobs()


SHOW_JOB = ("scontrol", "--json", "show", "job", "42")


class TestGettingOneJob:
    def test_scontrol_json_reads_one_job(self) -> None:
        slurm, transport = adapter({SHOW_JOB: [(0, document(job()), "")]})
        found = slurm.get_job("42")
        assert found is not None and found.job_id == "42"
        assert transport.calls == [SHOW_JOB]

    def test_22_05_has_no_scontrol_json_which_is_remembered(self) -> None:
        v2205 = json.dumps({"meta": {}, "errors": [], "jobs": [job(job_state="RUNNING")]})
        slurm, transport = adapter(
            {
                SHOW_JOB: [
                    (1, "", "scontrol: unrecognized option '--json'\nTry \"scontrol --help\"")
                ],
                SQUEUE_JSON: [(0, v2205, "")],
            }
        )
        assert slurm.get_job("42") is not None
        assert slurm.get_job("42") is not None
        assert transport.calls == [SHOW_JOB, SQUEUE_JSON, SQUEUE_JSON]

    def test_an_old_version_skips_scontrol_json(self) -> None:
        v2205 = json.dumps(
            {
                "meta": {"Slurm": {"version": {"major": 22, "minor": 5, "micro": 8}}},
                "jobs": [job()],
            }
        )
        slurm, transport = adapter({SQUEUE_JSON: [(0, v2205, "")]})
        slurm.list_jobs()
        assert slurm.get_job("42") is not None
        assert transport.calls == [SQUEUE_JSON, SQUEUE_JSON]

    def test_an_invalid_job_id_means_the_job_is_gone(self) -> None:
        slurm, _ = adapter({SHOW_JOB: [(1, "", "slurm_load_jobs error: Invalid job id specified")]})
        assert slurm.get_job("42") is None

    def test_an_invalid_job_id_in_the_documents_errors(self) -> None:
        answer = json.dumps(
            {"jobs": [], "errors": [{"description": "Invalid job id specified", "error": ""}]}
        )
        slurm, _ = adapter({SHOW_JOB: [(0, answer, "")]})
        assert slurm.get_job("42") is None

    def test_an_empty_answer_means_the_job_is_gone(self) -> None:
        slurm, _ = adapter({SHOW_JOB: [(0, document(), "")]})
        assert slurm.get_job("42") is None

    @pytest.mark.parametrize(
        "stderr", ["Unable to contact slurm controller (connect failure)", "Access denied"]
    )
    def test_any_other_failure_is_an_error_not_gone(self, stderr: str) -> None:
        slurm, _ = adapter({SHOW_JOB: [(1, "", stderr)]})
        with pytest.raises(SchedulerError, match=stderr.split()[0]):
            slurm.get_job("42")

    def test_other_errors_in_the_document_are_an_error(self) -> None:
        answer = json.dumps(
            {"jobs": [], "errors": [{"description": "Zero Bytes were transmitted"}]}
        )
        slurm, _ = adapter({SHOW_JOB: [(0, answer, "")]})
        with pytest.raises(SchedulerError, match="Zero Bytes"):
            slurm.get_job("42")

    def test_a_truncated_answer_falls_back_to_listing(self) -> None:
        slurm, transport = adapter(
            {SHOW_JOB: [(0, document(job())[:50], "")], SQUEUE_JSON: [(0, document(job()), "")]}
        )
        assert slurm.get_job("42") is not None
        assert transport.calls == [SHOW_JOB, SQUEUE_JSON]

    def test_listing_with_an_unreadable_record_cannot_say_gone(self) -> None:
        slurm, _ = adapter(
            {
                SHOW_JOB: [(1, "", "unrecognized option '--json'")],
                SQUEUE_JSON: [(0, document(job(7), {"name": "no id"}), "")],
            }
        )
        with pytest.raises(SchedulerError, match="could not be read"):
            slurm.get_job("42")

    def test_the_fixed_format_tells_gone_from_failed(self) -> None:
        fixed_42 = (*FIXED, "-j", "42")
        gone, _ = adapter(
            {
                SHOW_JOB: [(1, "", "unrecognized option '--json'")],
                SQUEUE_JSON: [(1, "", "no")],
                fixed_42: [(1, "", "slurm_load_jobs error: Invalid job id specified")],
            }
        )
        assert gone.get_job("42") is None
        failed, _ = adapter(
            {
                SHOW_JOB: [(1, "", "unrecognized option '--json'")],
                SQUEUE_JSON: [(1, "", "no")],
                fixed_42: [(1, "", "Socket timed out on send/recv operation")],
            }
        )
        with pytest.raises(SchedulerError, match="Socket timed out"):
            failed.get_job("42")


class TestNodes:
    def test_scontrol_json_node_records(self) -> None:
        nodes = json.dumps({"nodes": [{"name": "node001", "state": ["IDLE", "DRAIN"]}]})
        slurm, _ = adapter({("scontrol", "--json", "show", "nodes"): [(0, nodes, "")]})
        [node] = slurm.list_nodes()
        assert (node.name, node.state, node.flags) == ("node001", "IDLE", ["DRAIN"])

    def test_22_05_sinfo_json(self) -> None:
        path = DATA / "22.05" / "sinfo-drained-down.json"
        slurm, transport = adapter(
            {
                ("scontrol", "--json", "show", "nodes"): [(1, "", "unrecognized option '--json'")],
                ("sinfo", "--json"): [(0, path.read_text(), "")],
            }
        )
        assert {n.name for n in slurm.list_nodes()} >= {"node001", "node003"}
        slurm.list_nodes()
        assert transport.calls.count(("scontrol", "--json", "show", "nodes")) == 1

    def test_sinfo_groups_are_not_read_for_nodes(self) -> None:
        """23.02+ sinfo --json gives a group of nodes one reason: the nodes are read one by
        one from sinfo's fixed format instead."""
        path = DATA / "24.11" / "sinfo-drained-down.json"
        slurm, transport = adapter(
            {
                ("scontrol", "--json", "show", "nodes"): [(1, "", "slurm_load_node error")],
                ("sinfo", "--json"): [(0, path.read_text(), "")],
                SINFO_NODES: [(0, sinfo_lines(("node003", "idle+drain", "root", NOW, "x")), "")],
            }
        )
        [node] = slurm.list_nodes()
        assert (node.name, node.state, node.flags, node.reason) == (
            "node003",
            "IDLE",
            ["DRAIN"],
            "x",
        )
        assert transport.calls[-1] == SINFO_NODES

    def test_sinfos_fixed_format_per_node(self) -> None:
        """Lines as 22.05's and 24.11's sinfo print them, once per partition a node is in."""
        slurm, _ = fixed_format_only(
            sinfo_lines(
                ("node001", "idle", "Unknown", "Unknown", "none"),
                ("node001", "idle", "Unknown", "Unknown", "none"),
                ("node002", "idle+drain", "root", NOW, "admin: swap PSU"),
                ("node003", "down+not_responding", "root", NOW, "RMA 4411 | do not resume"),
                ("node004", "down+drain", "root", NOW, "RMA later"),
                ("node005", "idle", "root", "Unknown", "none"),  # 24.11: a user, no reason
            )
        )
        nodes = {node.name: node for node in slurm.list_nodes()}
        assert list(nodes) == ["node001", "node002", "node003", "node004", "node005"]
        assert (nodes["node001"].state, nodes["node001"].reason) == ("IDLE", "")
        assert nodes["node001"].unknown() == {} and nodes["node001"].unreadable == {}
        assert (nodes["node002"].state, nodes["node002"].flags) == ("IDLE", ["DRAIN"])
        assert nodes["node002"].reason_set_by == "root"
        assert nodes["node002"].reason_set_at == datetime(2026, 12, 3, 22, 22, 32, tzinfo=UTC)
        assert nodes["node003"].flags == ["NOT_RESPONDING"]
        assert nodes["node003"].reason == "RMA 4411 | do not resume"
        # %T would have said "drained": the DOWN under the drain is kept.
        assert (nodes["node004"].state, nodes["node004"].flags) == ("DOWN", ["DRAIN"])
        assert (nodes["node005"].reason, nodes["node005"].reason_set_by) == ("", "")

    @pytest.mark.parametrize("state", ["drained", "", "idle+", "weird+drain"])
    def test_an_unreadable_state_in_the_fixed_format_is_unknown(self, state: str) -> None:
        slurm, _ = fixed_format_only(sinfo_lines(("node001", state, "root", NOW, "disk")))
        [node] = slurm.list_nodes()
        assert node.state is None
        assert node.unknown()["state"].startswith("StateComplete: ")

    def test_the_fixed_format_failing_is_an_error_not_no_nodes(self) -> None:
        slurm, _ = fixed_format_only("", returncode=1)
        with pytest.raises(SchedulerError):
            slurm.list_nodes()


class TestVersionAndCluster:
    @pytest.mark.parametrize("version", ["22.05", "24.11"])
    def test_the_version_from_scontrol_version(self, version: str) -> None:
        text = (DATA / version / "scontrol-version.txt").read_text()
        slurm, transport = adapter({("scontrol", "version"): [(0, text, "")]})
        assert slurm.scheduler_version() is not None
        assert slurm.scheduler_version().startswith(version)  # type: ignore[union-attr]
        assert transport.calls == [("scontrol", "version")]

    def test_the_version_from_a_json_meta(self) -> None:
        slurm, transport = adapter({SQUEUE_JSON: [(0, document(job(), version="25.11.1"), "")]})
        slurm.list_jobs()
        assert slurm.scheduler_version() == "25.11.1"
        assert transport.calls == [SQUEUE_JSON]

    def test_an_unknown_version(self) -> None:
        slurm, _ = adapter({("scontrol", "version"): [(1, "", "not found")]})
        assert slurm.scheduler_version() is None

    def test_the_cluster_name(self) -> None:
        config = (
            "Configuration data as of 2026-12-01T14:12:00\n"
            "AccountingStorageType   = (null)\n"
            "ClusterName             = lab\n"
        )
        slurm, _ = adapter({("scontrol", "show", "config"): [(0, config, "")]})
        assert slurm.cluster_name() == "lab"

    def test_an_unreadable_cluster_name_is_unknown(self) -> None:
        slurm, _ = adapter({("scontrol", "show", "config"): [(1, "", "Unable to contact")]})
        assert slurm.cluster_name() is None


CONFIG_2511 = (
    "ClusterName = lab\nSlurmctldParameters     = enable_configless,enable_expedited_requeue\n"
)


class TestExpeditedRequeue:
    def answers(self, version: str, config: str, flags: list[str]) -> dict[tuple[str, ...], Any]:
        return {
            ("scontrol", "version"): [(0, f"slurm {version}\n", "")],
            ("scontrol", "show", "config"): [(0, config, "")],
            SHOW_JOB: [(0, document(job(flags=flags), version=version), "")],
            ("scontrol", "requeue", "42"): [(0, "", "")],
            ("scontrol", "requeuehold", "42"): [(0, "", "")],
        }

    def test_it_is_supported_from_25_11_when_enabled(self) -> None:
        slurm, _ = adapter(self.answers("25.11.0", CONFIG_2511, []))
        assert slurm.supports_expedited_requeue()
        slurm, _ = adapter(self.answers("25.11.0", "ClusterName = lab\n", []))
        assert not slurm.supports_expedited_requeue()
        slurm, transport = adapter(self.answers("24.11.5", CONFIG_2511, []))
        assert not slurm.supports_expedited_requeue()
        assert ("scontrol", "show", "config") not in transport.calls

    def test_it_requeues_a_job_submitted_with_requeue_expedite(self) -> None:
        slurm, transport = adapter(self.answers("25.11.0", CONFIG_2511, ["EXPEDITED_REQUEUE"]))
        result = slurm.requeue("42", expedite=True)
        assert result.argv == ("scontrol", "requeue", "42")
        assert transport.calls[-2:] == [SHOW_JOB, ("scontrol", "requeue", "42")]

    def test_it_refuses_a_job_without_the_flag(self) -> None:
        slurm, transport = adapter(self.answers("25.11.0", CONFIG_2511, []))
        with pytest.raises(SchedulerError, match="--requeue=expedite"):
            slurm.requeue("42", expedite=True)
        assert ("scontrol", "requeue", "42") not in transport.calls

    def test_it_refuses_where_slurm_has_none(self) -> None:
        slurm, transport = adapter(self.answers("24.11.5", CONFIG_2511, ["EXPEDITED_REQUEUE"]))
        with pytest.raises(SchedulerError, match=r"25\.11"):
            slurm.requeue("42", expedite=True)
        assert ("scontrol", "requeue", "42") not in transport.calls

    def test_expedite_cannot_hold(self) -> None:
        slurm, _ = adapter(self.answers("25.11.0", CONFIG_2511, ["EXPEDITED_REQUEUE"]))
        with pytest.raises(ValueError, match="cannot hold"):
            slurm.requeue("42", hold=True, expedite=True)

    def test_the_plain_requeue_is_unchanged(self) -> None:
        slurm, transport = adapter(self.answers("22.05.8", "", []))
        assert slurm.requeue("42").argv == ("scontrol", "requeue", "42")
        assert slurm.requeue("42", hold=True).argv == ("scontrol", "requeuehold", "42")
        assert transport.calls == [("scontrol", "requeue", "42"), ("scontrol", "requeuehold", "42")]
