"""Reading Slurm's JSON of every version from 22.05 (openapi/v0.0.38) to 25.11 (v0.0.44).

The hand-written records carry, for each data parser, the shapes its dump functions print
(SchedMD/slurm src/plugins/openapi/v0.0.38/jobs.c and nodes.c, and
src/plugins/data_parser/v0.0.39 ... v0.0.44/parsers.c). The recorded files under data/slurm
are real outputs of the lab's 22.05 and 24.11 clusters.
"""

from __future__ import annotations

import copy
import json
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from recovery.schedulers.compat import UTC
from recovery.schedulers.slurm_json import (
    SlurmDocumentError,
    SlurmVersion,
    job_flags,
    job_from_record,
    parse_document,
    read_job_state,
)
from recovery.schedulers.slurm_nodes import node_from_record, nodes_from_sinfo_groups
from recovery.schedulers.slurm_values import decode_wait_status

DATA = Path(__file__).parent / "data" / "slurm"
SUBMIT = 1796134355
COMMENT = '{"nvidia-recovery":{"environment":"test","mode":"act"}}'


def number(value: int) -> dict[str, Any]:
    return {"set": True, "infinite": False, "number": value}


UNSET = {"set": False, "infinite": False, "number": 0}
INFINITE = {"set": False, "infinite": True, "number": 0}


def common(**overrides: Any) -> dict[str, Any]:
    record = {
        "job_id": 42,
        "name": "train",
        "user_name": "alice",
        "user_id": 1000,
        "partition": "debug",
        "account": "physics",
        "state_reason": "None",
        "comment": COMMENT,
        "nodes": "node[001-002]",
        "batch_host": "node001",
        "excluded_nodes": "",
        "dependency": "",
        "restart_cnt": 0,
        "requeue": True,
        "current_working_directory": "/work",
        "standard_output": "/work/train-%j.out",
        "standard_error": "",
    }
    record.update(overrides)
    return record


def v0038(**overrides: Any) -> dict[str, Any]:
    """22.05: flat values; priority null when unset; the raw wait status."""
    record = common(
        job_state="RUNNING",
        priority=4294901759,
        exit_code=0,
        array_job_id=0,
        array_task_id=None,
        submit_time=SUBMIT,
        eligible_time=SUBMIT,
        start_time=SUBMIT + 1,
        end_time=SUBMIT + 3600,
        flags=["JOB_WAS_RUNNING"],
    )
    record.update(overrides)
    return record


def v0039(**overrides: Any) -> dict[str, Any]:
    """23.02: one state word, plain times; number objects for priority, arrays, exit_code."""
    record = common(
        job_state="RUNNING",
        priority=number(1),
        hold=False,
        exit_code=number(0),
        array_job_id=number(0),
        array_task_id=UNSET,
        submit_time=SUBMIT,
        eligible_time=SUBMIT,
        start_time=SUBMIT + 1,
        end_time=SUBMIT + 3600,
        flags=["JOB_WAS_RUNNING"],
    )
    record.update(overrides)
    return record


def verbose_exit(status: Any, code: int | None = 0, signal: int | None = None) -> dict[str, Any]:
    return {
        "status": status,
        "return_code": number(code) if code is not None else UNSET,
        "signal": {
            "id": number(signal) if signal is not None else UNSET,
            "name": "TERM" if signal == 15 else "",
        },
    }


def v0040(status_as_list: bool = False, **overrides: Any) -> dict[str, Any]:
    """23.11 to 25.11: a state list, number objects for times, the verbose exit code."""
    record = common(
        job_state=["RUNNING"],
        priority=number(1),
        hold=False,
        exit_code=verbose_exit(["SUCCESS"] if status_as_list else "SUCCESS"),
        array_job_id=number(0),
        array_task_id=UNSET,
        submit_time=number(SUBMIT),
        eligible_time=number(SUBMIT),
        start_time=number(SUBMIT + 1),
        end_time=number(SUBMIT + 3600),
        flags=["JOB_WAS_RUNNING"],
    )
    record.update(overrides)
    return record


# v0.0.40-v0.0.42 print the exit status as one word per the parser, the 24.11 recordings show a
# list, v0.0.43 and v0.0.44 declare a list: both are read.
VERSIONS = {
    "v0.0.38 (22.05)": v0038,
    "v0.0.39 (23.02)": v0039,
    "v0.0.40 (23.11)": v0040,
    "v0.0.41 (24.05)": v0040,
    "v0.0.42 (24.11)": lambda **o: v0040(status_as_list=True, **o),
    "v0.0.43 (25.05)": lambda **o: v0040(status_as_list=True, **o),
    "v0.0.44 (25.11)": lambda **o: v0040(status_as_list=True, **o),
}


@pytest.mark.parametrize("make", VERSIONS.values(), ids=VERSIONS.keys())
def test_it_reads_a_running_job_of_every_version(make: Any) -> None:
    job = job_from_record(make())
    assert job.job_id == "42"
    assert job.native_state == "RUNNING"
    assert job.state_flags == ()
    assert job.user == "alice"
    assert job.user_uid == 1000
    assert job.nodes == ["node001", "node002"]
    assert job.excluded_nodes == []
    assert job.restart_count == 0
    assert job.requeue_allowed is True
    assert job.held is False
    assert job.exit_code == 0 and job.exit_signal is None
    assert job.submit_time == datetime.fromtimestamp(SUBMIT, tz=UTC)
    assert job.start_time == datetime.fromtimestamp(SUBMIT + 1, tz=UTC)
    assert job.stdout_path == "/work/train-42.out"
    assert job.stderr_path == "/work/slurm-42.out"
    assert job.opt_in.opted_in
    assert job.unknown() == {}
    assert job.unreadable == {}


def test_held_requeued_job_of_each_version() -> None:
    held = {
        "v0.0.38": v0038(
            job_state="PENDING", state_reason="JobHeldUser", priority=0, restart_cnt=1
        ),
        "v0.0.39": v0039(job_state="PENDING", priority=number(0), hold=True, restart_cnt=1),
        "v0.0.42": v0040(job_state=["PENDING"], priority=number(0), hold=True, restart_cnt=1),
    }
    for version, record in held.items():
        job = job_from_record(record)
        assert (job.native_state, job.held, job.restart_count) == ("PENDING", True, 1), version


@pytest.mark.parametrize(
    ("value", "state", "flags"),
    [
        ("RUNNING", "RUNNING", ()),
        ("completing", "COMPLETING", ()),
        (["PENDING", "REQUEUED"], "PENDING", ("REQUEUED",)),
        (["PENDING", "COMPLETING"], "COMPLETING", ("PENDING",)),
        (["FAILED", "COMPLETING"], "COMPLETING", ("FAILED",)),
        (["PENDING", "EXPEDITING"], "PENDING", ("EXPEDITING",)),
        (["RUNNING", "CONFIGURING"], "RUNNING", ("CONFIGURING",)),
    ],
)
def test_the_state_is_the_base_state_or_completing(
    value: Any, state: str, flags: tuple[str, ...]
) -> None:
    assert read_job_state(value) == (state, flags)


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        ("REQUEUED", "only the flag REQUEUED was given; the base state is hidden"),
        ("SLEEPING", "unknown state word 'SLEEPING'"),
        (["RUNNING", "SLEEPING"], "unknown state word 'SLEEPING'"),
        (["REQUEUED"], "0 base states"),
        (["PENDING", "RUNNING"], "2 base states"),
        ([], "unknown shape list"),
        ({"current": ["RUNNING"]}, "unknown shape dict"),
        (None, "null"),
    ],
)
def test_an_unreadable_state_is_none_with_a_reason(value: Any, reason: str) -> None:
    job = job_from_record(v0040(job_state=value))
    assert job.native_state is None
    assert reason in job.unreadable["phase"]
    assert job.unknown()["phase"].startswith("job_state: ")


def test_a_hidden_base_state_keeps_the_flag() -> None:
    job = job_from_record(v0038(job_state="REQUEUED"))
    assert job.native_state is None
    assert job.state_flags == ("REQUEUED",)


@pytest.mark.parametrize(
    ("field", "value", "reason"),
    [
        ("restart_cnt", None, "restart_cnt: null"),
        ("restart_cnt", UNSET, "restart_cnt: not set"),
        ("restart_cnt", INFINITE, "restart_cnt: infinite, not a number"),
        ("restart_cnt", "1", "restart_cnt: unknown shape str"),
        ("restart_cnt", True, "restart_cnt: unknown shape bool"),
        ("restart_cnt", {"value": 1}, "restart_cnt: unknown shape dict"),
        ("submit_time", UNSET, "submit_time: not set"),
        ("submit_time", INFINITE, "submit_time: infinite, not a number"),
        ("submit_time", "Infinity", "submit_time: infinite, not a number"),
        ("submit_time", 0, "submit_time: 0 (none)"),
        ("requeue", None, "requeue: unknown shape null"),
        ("requeue", 1, "requeue: unknown shape int"),
        ("excluded_nodes", None, "excluded_nodes: null"),
        ("excluded_nodes", ["node001"], "excluded_nodes: unknown shape list"),
        ("excluded_nodes", "node[1-", "excluded_nodes: invalid node list"),
        ("user_name", "", "user_name: empty"),
        ("user_name", None, "user_name: null"),
    ],
)
def test_an_unreadable_fact_is_none_with_a_reason_never_a_default(
    field: str, value: Any, reason: str
) -> None:
    name = {
        "restart_cnt": "restart_count",
        "requeue": "requeue_allowed",
        "user_name": "user",
    }.get(field, field)
    job = job_from_record(v0040(**{field: value}))
    assert getattr(job, name) in (None, "")
    assert job.unreadable[name].startswith(reason)
    assert job.unknown()[name] == job.unreadable[name]


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        (None, "user_id: null"),
        ("1000", "user_id: unknown shape str '1000'"),
        (-1, "user_id: -1 is not a user id"),
        (0xFFFFFFFE, "user_id: 4294967294 is not a user id"),
    ],
)
def test_an_unreadable_user_id_is_unknown_with_a_reason(value: Any, reason: str) -> None:
    job = job_from_record(v0040(user_id=value))
    assert job.user_uid is None
    assert job.unreadable["user_uid"] == reason


def test_an_absent_user_id_is_unknown_and_root_is_a_user_id() -> None:
    record = v0038()
    del record["user_id"]
    assert job_from_record(record).unreadable["user_uid"] == "user_id: absent"
    assert job_from_record(v0038(user_id=0)).user_uid == 0


@pytest.mark.parametrize(
    "field", ["job_state", "user_name", "submit_time", "restart_cnt", "excluded_nodes", "requeue"]
)
@pytest.mark.parametrize("make", VERSIONS.values(), ids=VERSIONS.keys())
def test_an_absent_field_is_unknown_in_every_version(make: Any, field: str) -> None:
    record = make()
    del record[field]
    job = job_from_record(record)
    assert job.unknown(), field
    assert any(reason == f"{field}: absent" for reason in job.unreadable.values())


def test_the_account_is_read_and_an_absent_one_is_unknown() -> None:
    """A job's account may let it choose its environment's policy (``EnvironmentBinding``)."""
    assert job_from_record(v0040()).account == "physics"
    assert job_from_record(v0038(account="")).account == ""  # the site keeps no accounts
    record = v0039()
    del record["account"]
    absent = job_from_record(record)
    assert absent.account is None
    assert absent.unreadable["account"] == "account: absent"
    assert job_from_record(v0038(account=7)).account is None


def test_the_22_05_key_exc_nodes_is_read_too() -> None:
    record = v0038(exc_nodes="node002")
    del record["excluded_nodes"]
    assert job_from_record(record).excluded_nodes == ["node002"]


class TestHeld:
    def test_a_held_reason_is_enough(self) -> None:
        job = job_from_record(v0040(state_reason="JobHeldAdmin", priority=UNSET))
        assert job.held is True

    def test_an_unset_priority_says_nothing(self) -> None:
        record = v0038(priority=None)
        job = job_from_record(record)
        assert job.held is None
        assert "priority: null" in job.unreadable["held"]

    def test_an_absent_priority_and_hold_say_nothing(self) -> None:
        record = v0040()
        del record["priority"], record["hold"]
        job = job_from_record(record)
        assert job.held is None
        assert "priority: absent" in job.unreadable["held"]

    def test_hold_is_used_when_the_priority_is_unreadable(self) -> None:
        assert job_from_record(v0040(priority=UNSET, hold=True)).held is True

    def test_a_requeue_hold_flag_is_held(self) -> None:
        job = job_from_record(v0040(job_state=["PENDING", "REQUEUE_HOLD"], priority=number(5)))
        assert job.held is True


class TestExitCode:
    @pytest.mark.parametrize(
        ("status", "expected"), [(0, (0, None)), (768, (3, None)), (15, (None, 15))]
    )
    def test_the_raw_wait_status_of_22_05_and_23_02(
        self, status: int, expected: tuple[int | None, int | None]
    ) -> None:
        assert decode_wait_status(status) == expected
        job = job_from_record(v0038(exit_code=status))
        assert (job.exit_code, job.exit_signal) == expected
        job = job_from_record(v0039(exit_code=number(status)))
        assert (job.exit_code, job.exit_signal) == expected

    @pytest.mark.parametrize("as_list", [False, True])
    def test_the_verbose_exit_code_of_23_11_and_later(self, as_list: bool) -> None:
        def status(word: str) -> Any:
            return [word] if as_list else word

        failed = job_from_record(v0040(exit_code=verbose_exit(status("ERROR"), 3)))
        assert (failed.exit_code, failed.exit_signal) == (3, None)
        killed = job_from_record(v0040(exit_code=verbose_exit(status("SIGNALED"), None, 15)))
        assert (killed.exit_code, killed.exit_signal) == (None, 15)

    def test_a_pending_exit_code_is_unknown(self) -> None:
        job = job_from_record(v0040(exit_code=verbose_exit(["PENDING"], None)))
        assert job.exit_code is None
        assert job.unreadable["exit_code"] == "exit_code: pending: the job has not ended"
        job = job_from_record(v0039(exit_code=UNSET))
        assert job.unreadable["exit_code"] == "exit_code: not set"

    def test_an_unknown_exit_shape_is_unknown(self) -> None:
        job = job_from_record(v0040(exit_code={"status": ["ERROR", "SIGNALED"]}))
        assert job.exit_code is None and job.exit_signal is None
        assert "unknown shape of status" in job.unreadable["exit_code"]


class TestArrays:
    def test_22_05(self) -> None:
        assert job_from_record(v0038(job_id=11, array_job_id=10, array_task_id=1)).job_id == "10_1"

    def test_23_02_and_later(self) -> None:
        record = v0040(job_id=11, array_job_id=number(10), array_task_id=number(1))
        job = job_from_record(record)
        assert job.job_id == "10_1"
        assert job.stdout_path == "/work/train-10_1.out"

    def test_a_pattern_with_array_codes(self) -> None:
        record = v0040(
            job_id=11,
            array_job_id=number(10),
            array_task_id=number(1),
            standard_output="out-%A_%a.log",
        )
        assert job_from_record(record).stdout_path == "/work/out-10_1.log"

    def test_not_an_array_job(self) -> None:
        assert job_from_record(v0040(array_job_id=number(0))).job_id == "42"

    def test_a_record_without_a_job_id_is_refused(self) -> None:
        record = v0040()
        del record["job_id"]
        with pytest.raises(SlurmDocumentError, match="job_id"):
            job_from_record(record)


def test_25_05_prints_the_expanded_output_path_beside_the_pattern() -> None:
    record = v0040(standard_output="%x-%j.out", stdout_expanded="/work/train-42.out")
    assert job_from_record(record).stdout_path == "/work/train-42.out"


def test_job_flags() -> None:
    assert job_flags(v0040(flags=["EXPEDITED_REQUEUE"])) == ("EXPEDITED_REQUEUE",)
    assert job_flags({"flags": None}) is None


class TestNodes:
    def test_22_05_node_record(self) -> None:
        node = node_from_record(
            {"name": "node003", "state": "idle", "state_flags": ["DRAIN"], "reason": "disk"}
        )
        assert (node.state, node.flags, node.reason) == ("IDLE", ["DRAIN"], "disk")
        assert node.unavailable

    def test_23_02_and_later_node_record(self) -> None:
        node = node_from_record({"name": "node004", "state": ["DOWN", "NOT_RESPONDING"]})
        assert (node.state, node.flags) == ("DOWN", ["NOT_RESPONDING"])

    @pytest.mark.parametrize(
        ("state", "flags", "why"),
        [
            ({"x": 1}, None, "state: unknown shape dict"),
            (None, None, "state: null"),
            ("idle", "DRAIN", "state: state_flags: unknown shape str"),
            (["DRAIN"], None, "state: 0 base states in ['DRAIN']"),
            (["IDLE", "DOWN"], None, "state: 2 base states in ['IDLE', 'DOWN']"),
            (["IDLE", 7], None, "state: unknown shape list"),
            ([], None, "state: unknown shape list"),
        ],
    )
    def test_an_unreadable_node_state_is_unknown_never_empty(
        self, state: object, flags: object, why: str
    ) -> None:
        record = {"name": "node004", "state": state, "reason": "", "state_flags": flags}
        node = node_from_record(record)
        assert node.state is None
        assert node.unreadable["state"].startswith(why)
        assert set(node.unknown()) == {"state"}
        assert not node.drained and not node.unavailable  # unknown, not "in service"

    def test_an_absent_node_state_is_unknown(self) -> None:
        node = node_from_record({"name": "node004", "reason": ""})
        assert node.state is None and node.unreadable["state"] == "state: absent"

    def test_the_words_of_an_unreadable_state_are_kept_for_showing(self) -> None:
        node = node_from_record({"name": "node004", "state": ["DRAIN", "FROBNICATED"]})
        assert node.state is None and node.flags == ["DRAIN", "FROBNICATED"]

    @pytest.mark.parametrize("reason", [None, 3, ["x"]])
    def test_an_unreadable_reason_is_unknown_never_empty(self, reason: object) -> None:
        node = node_from_record({"name": "node004", "state": ["IDLE"], "reason": reason})
        assert node.reason is None
        assert set(node.unknown()) == {"reason"}
        assert set(node_from_record({"name": "n", "state": ["IDLE"]}).unknown()) == {"reason"}

    def test_who_set_the_reason_and_when_22_05(self) -> None:
        node = node_from_record(
            {
                "name": "node003",
                "state": "down",
                "state_flags": [],
                "reason": "RMA 4411 do not resume",
                "reason_set_by_user": "root",
                "reason_changed_at": 1796336552,
            }
        )
        assert (node.state, node.reason, node.reason_set_by) == (
            "DOWN",
            "RMA 4411 do not resume",
            "root",
        )
        assert node.reason_set_at == datetime.fromtimestamp(1796336552, tz=UTC)
        assert node.unknown() == {} and node.unreadable == {}

    def test_who_set_the_reason_and_when_24_11(self) -> None:
        changed = {"set": True, "infinite": False, "number": 1796336565}
        node = node_from_record(
            {
                "name": "node004",
                "state": ["DOWN", "DRAIN"],
                "reason": "RMA later",
                "reason_set_by_user": "root",
                "reason_changed_at": changed,
            }
        )
        assert (node.state, node.flags, node.reason_set_by) == ("DOWN", ["DRAIN"], "root")
        assert node.reason_set_at == datetime.fromtimestamp(1796336565, tz=UTC)

    def test_no_reason_has_no_setter(self) -> None:
        # 24.11 names a user for a node without a reason; 22.05 says null.
        unset = {"set": True, "infinite": False, "number": 0}
        node = node_from_record(
            {
                "name": "node001",
                "state": ["IDLE"],
                "reason": "",
                "reason_set_by_user": "root",
                "reason_changed_at": unset,
            }
        )
        assert (node.reason, node.reason_set_by, node.reason_set_at) == ("", "", None)
        assert node.unreadable == {}

    def test_sinfo_groups(self) -> None:
        nodes = nodes_from_sinfo_groups(
            [
                {
                    "node": {"state": ["IDLE", "DRAIN"]},
                    "nodes": {"nodes": ["node003"]},
                    "reason": {"description": "drained"},
                },
                {
                    "node": {"state": ["MIXED"]},
                    "nodes": {"nodes": "node[001-003]"},
                    "reason": {"description": ""},
                },
            ]
        )
        assert [(n.name, n.state, n.flags, n.reason) for n in nodes] == [
            ("node003", "IDLE", ["DRAIN"], "drained"),
            ("node001", "MIXED", [], None),
            ("node002", "MIXED", [], None),
        ]

    def test_a_groups_reason_is_no_nodes_own_when_it_holds_several(self) -> None:
        """24.11 printed three drained nodes, each with its own reason, as one group."""
        [one, two, three] = nodes_from_sinfo_groups(
            [
                {
                    "node": {"state": ["IDLE", "DRAIN"]},
                    "nodes": {"nodes": ["node001", "node002", "node004"]},
                    "reason": {"description": "other reason", "time": 1796336598, "user": "root"},
                }
            ]
        )
        assert one.reason is None and two.reason is None and three.reason is None
        assert "group of 3 nodes" in one.unknown()["reason"]


class TestDocument:
    def test_22_05_meta(self) -> None:
        document = parse_document(
            json.dumps(
                {
                    "meta": {
                        "plugin": {"type": "openapi/v0.0.38", "name": "Slurm OpenAPI v0.0.38"},
                        "Slurm": {
                            "version": {"major": 22, "micro": 8, "minor": 5},
                            "release": "22.05.8",
                        },
                    },
                    "errors": [],
                    "jobs": [v0038()],
                }
            )
        )
        assert document.version == SlurmVersion(22, 5, 8)
        assert str(document.version) == "22.05.8"
        assert document.cluster is None
        assert document.data_parser == "openapi/v0.0.38"
        assert document.ok
        assert [job.job_id for job in document.jobs().jobs] == ["42"]

    def test_23_02_meta(self) -> None:
        meta = {
            "plugins": {"data_parser": "data_parser/v0.0.39", "accounting_storage": ""},
            "command": ["squeue", "--json"],
            "Slurm": {"version": {"major": 23, "micro": 7, "minor": 2}, "release": "23.02.7"},
        }
        document = parse_document(json.dumps({"meta": meta, "jobs": [], "errors": []}))
        assert document.version == SlurmVersion(23, 2, 7)
        assert document.data_parser == "data_parser/v0.0.39"

    def test_23_11_and_later_meta(self) -> None:
        meta = {
            "plugin": {"data_parser": "data_parser/v0.0.44"},
            "slurm": {
                "version": {"major": "25", "micro": "0", "minor": "11"},
                "release": "",
                "cluster": "lab",
            },
        }
        document = parse_document(json.dumps({"meta": meta, "jobs": []}))
        assert document.version == SlurmVersion(25, 11, 0)
        assert document.cluster == "lab"

    def test_errors_and_warnings(self) -> None:
        document = parse_document(
            json.dumps(
                {
                    "jobs": [],
                    "errors": [
                        {
                            "description": "Invalid job id specified",
                            "error_number": 2017,
                            "error": "Invalid job id specified",
                            "source": "slurm_load_job()",
                        }
                    ],
                    "warnings": [{"description": "stale", "source": "x"}],
                }
            )
        )
        assert not document.ok
        assert document.errors == ("Invalid job id specified (slurm_load_job())",)
        assert document.warnings == ("stale (x)",)

    @pytest.mark.parametrize(
        "text", ['{"jobs": [{"job_id": 1', "", "[]", "squeue: error: Unable to contact"]
    )
    def test_a_truncated_or_foreign_document_is_refused(self, text: str) -> None:
        with pytest.raises(SlurmDocumentError):
            parse_document(text)

    def test_a_document_without_jobs_is_refused(self) -> None:
        with pytest.raises(SlurmDocumentError, match="no list of jobs"):
            parse_document('{"meta": {}}').jobs()

    def test_an_unreadable_record_is_reported_not_dropped_silently(self) -> None:
        listing = parse_document(json.dumps({"jobs": [v0040(), {"name": "x"}, 3]})).jobs()
        assert [job.job_id for job in listing.jobs] == ["42"]
        assert len(listing.skipped) == 2


def test_versions() -> None:
    assert SlurmVersion.parse("slurm-wlm 22.05.8") == SlurmVersion(22, 5, 8)
    assert SlurmVersion.parse("slurm 25.11.0-0rc1") == SlurmVersion(25, 11, 0)
    assert SlurmVersion.parse("no version") is None
    assert SlurmVersion(23, 2) < SlurmVersion(24, 11, 5)


# ---------------------------------------------------------------------- recorded outputs


def recorded(pattern: str) -> list[Path]:
    return sorted(DATA.glob(pattern))


def jobs_in(path: Path) -> dict[str, Any]:
    document = parse_document(path.read_text())
    assert document.ok, document.errors
    listing = document.jobs()
    assert listing.skipped == []
    return {job.name: job for job in listing.jobs}


RECORDED_JSON = recorded("*/*.json")


@pytest.mark.parametrize(
    "path", RECORDED_JSON, ids=[f"{p.parent.name}/{p.name}" for p in RECORDED_JSON]
)
def test_every_recorded_document_reads_without_unknowns(path: Path) -> None:
    document = parse_document(path.read_text())
    assert document.ok
    assert document.version is not None
    assert f"{document.version.major}.{document.version.minor:02d}" == path.parent.name
    if "jobs" in document.body:
        for job in document.jobs().jobs:
            assert job.unknown() == {}, (job.job_id, job.unknown())
            assert job.submit_time is not None
    else:
        nodes = document.nodes()
        assert nodes and all(node.state for node in nodes)


@pytest.mark.parametrize("version", ["22.05", "24.11"])
class TestRecorded:
    def load(self, version: str, name: str) -> dict[str, Any]:
        path = DATA / version / name
        if not path.exists():
            pytest.skip(f"{path} is not recorded")
        return jobs_in(path)

    def test_a_running_job(self, version: str) -> None:
        job = self.load(version, "squeue-running-opted-in.json")["opted-in"]
        assert job.native_state == "RUNNING"
        assert job.submit_time is not None and job.submit_time.year >= 2024
        assert job.restart_count == 0
        assert job.excluded_nodes == []
        assert job.requeue_allowed is True
        assert job.held is False
        assert len(job.nodes) == 2
        assert job.opt_in.opted_in
        assert job.stdout_path.endswith(f"/opted-in-{job.job_id}.out")
        assert job.user_uid == 0  # recorded as root

    def test_requeue_held(self, version: str) -> None:
        job = self.load(version, "squeue-requeue-held.json")["opted-in"]
        assert (job.native_state, job.held, job.restart_count) == ("PENDING", True, 1)
        assert job.nodes == []

    def test_excluded_and_running_again(self, version: str) -> None:
        job = self.load(version, "squeue-excluded-running-again.json")["opted-in"]
        assert job.native_state == "RUNNING"
        assert job.excluded_nodes == ["node002"]
        assert "node002" not in job.nodes
        assert job.restart_count == 1
        assert job.held is False

    def test_no_requeue(self, version: str) -> None:
        assert self.load(version, "squeue-no-requeue.json")["no-requeue"].requeue_allowed is False

    def test_failed_with_exit_3(self, version: str) -> None:
        name = "squeue-all-states-failed-exit3.json"
        if version == "22.05" and not (DATA / version / name).exists():
            name = "squeue-failed-exit3.json"
        job = self.load(version, name)["fails"]
        assert (job.native_state, job.exit_code, job.exit_signal) == ("FAILED", 3, None)

    def test_cancelled(self, version: str) -> None:
        jobs = self.load(version, "squeue-all-states-cancelled.json")
        assert (jobs["cancelled"].native_state, jobs["cancelled"].exit_signal) == ("CANCELLED", 15)

    def test_array_tasks(self, version: str) -> None:
        path = DATA / version / "squeue-array.json"
        tasks = [job for job in parse_document(path.read_text()).jobs().jobs if job.name == "array"]
        assert sorted(job.job_id.split("_")[1] for job in tasks) == ["0", "1", "2"]
        assert len({job.job_id.split("_")[0] for job in tasks}) == 1
        for job in tasks:
            assert job.stdout_path.endswith(f"/array-{job.job_id}.out")

    @pytest.mark.parametrize(
        "name", ["sinfo-drained-down.json", "scontrol-show-nodes-drained-down.json"]
    )
    def test_drained_and_down_nodes(self, version: str, name: str) -> None:
        if not (DATA / version / name).exists():
            pytest.skip(f"Slurm {version} has no {name.split('-drained')[0]}")
        document = parse_document((DATA / version / name).read_text())
        nodes = {node.name: node for node in document.nodes()}
        assert nodes["node003"].flags == ["DRAIN"]
        assert nodes["node003"].unavailable
        assert nodes["node003"].reason == "recorded sample: drained"
        assert nodes["node004"].state == "DOWN" and nodes["node004"].unavailable
        assert nodes["node004"].reason == "recorded sample: down"
        assert not nodes["node001"].unavailable


def test_scontrol_show_job_of_24_11() -> None:
    running = DATA / "24.11" / "scontrol-show-job-running.json"
    held = DATA / "24.11" / "scontrol-show-job-held.json"
    if not running.exists() or not held.exists():
        pytest.skip("not recorded")
    document = parse_document(running.read_text())
    assert document.cluster == "dev"  # ClusterName in deploy/slurm-dev/slurm.conf.in
    assert document.version is not None and document.version >= SlurmVersion(24, 11)
    [job] = document.jobs().jobs
    assert job.native_state == "RUNNING"
    [job] = parse_document(held.read_text()).jobs().jobs
    assert (job.native_state, job.held, job.restart_count) == ("PENDING", True, 1)


def test_the_records_are_not_changed() -> None:
    record = v0040()
    before = copy.deepcopy(record)
    job_from_record(record)
    assert record == before


def test_a_pending_jobs_dependency_names_the_jobs_it_is_chained_after() -> None:
    job = job_from_record(v0040(dependency="afterany:40(unfulfilled)?afternotok:41(unfulfilled)"))
    assert job.chained_after == ("40", "41")
    assert "chained_after" not in job.unreadable


def test_a_dependency_it_cannot_read_is_unknown() -> None:
    job = job_from_record(v0040(dependency={"type": "afterany"}))
    assert job.chained_after is None
    assert job.unreadable["chained_after"].startswith("dependency: ")
    assert job.unknown() == {}  # nothing the loop acts on
