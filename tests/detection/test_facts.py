"""Slurm states and DCGM samples become findings. Pure Python: no Django."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from recovery.detection.facts import (
    ECC_DBE_METRIC,
    GPU_UTIL_METRIC,
    ROW_REMAP_FAILURE_METRIC,
    XID_MEANINGS,
    XID_METRIC,
    MetricSample,
    finding_from_job_ending,
    findings_from_gpu_metrics,
    latest_values,
    node_state_finding,
    xid_meaning,
)
from recovery.detection.findings import ATTRIBUTIONS, CATEGORIES, SEVERITIES, Finding
from recovery.schedulers.phase import ENDED_PHASES, Phase
from recovery.schedulers.slurm_phase import SLURM_PHASES, slurm_phase

T0 = datetime(2025, 3, 1, 12, 0, 0, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


# --- Slurm job states --------------------------------------------------------------------


def from_slurm(state: str, **facts: Any) -> Finding | None:
    """What the loop judges of a Slurm job that ended in ``state``: its phase, Slurm's word
    beside it."""
    phase = slurm_phase(state)
    assert phase is not None
    return finding_from_job_ending(phase, native_state=state, **facts)


def test_node_fail_blames_hardware_and_names_the_nodes() -> None:
    finding = from_slurm("NODE_FAIL", nodes=["gpu-002", "gpu-001", "gpu-001"], at=T0)

    assert finding is not None
    assert (finding.kind, finding.category, finding.attribution) == (
        "crash",
        "scheduler_event",
        "hardware",
    )
    assert finding.source == "scheduler"
    assert finding.severity == "fatal"
    assert finding.signature == "slurm-node-fail"
    assert finding.nodes == ["gpu-001", "gpu-002"]
    assert finding.at == T0


@pytest.mark.parametrize("state", ["OUT_OF_MEMORY"])
def test_out_of_memory_is_a_host_oom_of_the_application(state: str) -> None:
    finding = from_slurm(state, exit_code=0, signal=9, nodes=["gpu-001"])

    assert finding is not None
    assert (finding.category, finding.attribution) == ("host_oom", "application")
    assert finding.signature == "slurm-out-of-memory"
    assert finding.nodes == []  # the allocation is not to blame
    assert finding.detail["allocation_nodes"] == ["gpu-001"]


@pytest.mark.parametrize(
    ("state", "signature"), [("TIMEOUT", "slurm-timeout"), ("DEADLINE", "slurm-deadline")]
)
def test_a_time_limit_is_the_applications_request(state: str, signature: str) -> None:
    finding = from_slurm(state)

    assert finding is not None
    assert (finding.category, finding.attribution) == ("scheduler_event", "application")
    assert finding.signature == signature


def test_a_cancel_due_to_the_time_limit_is_a_timeout() -> None:
    finding = from_slurm(
        "CANCELLED",
        reason="*** JOB 1234 ON gpu-001 CANCELLED AT 2025-03-01T12:00:00 DUE TO TIME LIMIT ***",
    )

    assert finding is not None
    assert finding.signature == "slurm-timeout"
    assert finding.category == "scheduler_event"


def test_preemption_blames_system_software() -> None:
    finding = from_slurm("PREEMPTED")

    assert finding is not None
    assert (finding.category, finding.attribution) == ("scheduler_event", "system_software")


def test_failed_with_an_exit_code_has_no_category_from_the_scheduler_alone() -> None:
    finding = from_slurm("FAILED", exit_code=1, reason="NonZeroExitCode")

    assert finding is not None
    assert (finding.kind, finding.category, finding.attribution) == ("crash", "", "unknown")
    assert finding.signature == "slurm-failed-exit-1"
    assert finding.evidence == "Slurm job state FAILED, exit code 1: NonZeroExitCode"


def test_failed_by_sigkill_notes_a_possible_oom_kill() -> None:
    finding = from_slurm("FAILED", exit_code=0, signal=9)

    assert finding is not None
    assert finding.signature == "slurm-failed-signal-9"
    assert finding.detail["possible_oom_kill"] is True
    assert "out-of-memory" in finding.detail["signal_note"]


def test_an_exit_code_above_128_is_read_as_a_signal() -> None:
    finding = from_slurm("FAILED", exit_code=137)

    assert finding is not None
    assert finding.signature == "slurm-failed-exit-137"
    assert finding.detail["signal"] == 9
    assert finding.detail["signal_inferred_from_exit_code"] is True
    assert finding.detail["possible_oom_kill"] is True


@pytest.mark.parametrize(("exit_code", "signal"), [(0, 11), (139, None)])
def test_a_segfault_is_categorised_as_such(exit_code: int, signal: int | None) -> None:
    finding = from_slurm("FAILED", exit_code=exit_code, signal=signal)

    assert finding is not None
    assert finding.category == "segfault"


@pytest.mark.parametrize(
    "state",
    [
        "COMPLETED",
        "RUNNING",
        "PENDING",
        "REQUEUED",
        "CANCELLED",
        "CANCELLED by 1234",
        "CANCELLED+",
        "COMPLETING",
        "SUSPENDED",
        "WIBBLE",
        "",
        "   ",
    ],
)
def test_states_that_are_not_anomalies_give_nothing(state: str) -> None:
    assert from_slurm(state, exit_code=0) is None


def test_boot_fail_blames_hardware() -> None:
    finding = from_slurm("BOOT_FAIL", nodes=["gpu-003"])

    assert finding is not None
    assert finding.attribution == "hardware"
    assert finding.nodes == ["gpu-003"]


def test_only_an_abnormal_ending_is_a_finding_whatever_the_scheduler() -> None:
    """The phase decides, not the scheduler's word: another scheduler's ending of the same phase
    is judged alike, under a signature of its own."""
    judged = {
        phase: finding_from_job_ending(phase, native_state="Whatever", scheduler="kubernetes")
        for phase in Phase
    }

    assert {phase for phase, finding in judged.items() if finding is not None} == {
        Phase.FAILED,
        Phase.NODE_FAILED,
        Phase.OUT_OF_MEMORY,
        Phase.TIMED_OUT,
        Phase.PREEMPTED,
    }
    node_failed = judged[Phase.NODE_FAILED]
    assert node_failed is not None
    assert (node_failed.category, node_failed.attribution) == ("scheduler_event", "hardware")
    assert node_failed.signature == "kubernetes-whatever"
    assert node_failed.evidence == "Kubernetes job state Whatever"


def test_every_slurm_state_the_reader_gives_has_a_phase_of_its_own() -> None:
    from recovery.schedulers.slurm_json import JOB_BASE_STATES

    assert JOB_BASE_STATES | {"COMPLETING"} <= set(SLURM_PHASES)
    assert slurm_phase("SOMETHING_NEW") == Phase.UNKNOWN
    assert slurm_phase(None) is None
    assert {slurm_phase(state) for state in JOB_BASE_STATES} >= ENDED_PHASES


# --- Slurm node states -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("state", "reason", "problem", "category", "attribution", "severity"),
    [
        ("DOWN+DRAIN", "GPU Xid 79 fallen off bus", "down", "gpu_hardware", "hardware", "error"),
        ("down*", "Not responding", "down", "scheduler_event", "hardware", "error"),
        (
            "IDLE+DRAIN",
            "NHC: check_hw_ib: No IB port mlx5_0:1 is ACTIVE",
            "drained",
            "interconnect",
            "hardware",
            "warning",
        ),
        ("drained*", "ECC errors on gpu 3", "drained", "gpu_hardware", "hardware", "warning"),
        (
            "MIXED+DRAIN",
            "Kill task failed",
            "draining",
            "scheduler_event",
            "system_software",
            "warning",
        ),
        (
            "drng",
            "NHC: check_fs_mount: /lustre not mounted",
            "draining",
            "storage_io",
            "system_software",
            "warning",
        ),
        ("FAIL", "NVLink errors", "fail", "interconnect", "hardware", "error"),
        ("FAILING", "xid=13", "failing", "cuda_error_app", "application", "warning"),
        ("DRAIN", "NHC: check failed", "drained", "scheduler_event", "unknown", "warning"),
        (
            "IDLE+DRAIN",
            "admin: planned maintenance",
            "drained",
            "scheduler_event",
            "unknown",
            "warning",
        ),
        ("DOWN", "", "down", "scheduler_event", "hardware", "error"),
    ],
)
def test_a_node_taken_out_of_service_is_a_finding(
    state: str, reason: str, problem: str, category: str, attribution: str, severity: str
) -> None:
    finding = node_state_finding("gpu-017", state, reason, at=T0)

    assert finding is not None
    assert finding.nodes == ["gpu-017"]
    assert finding.source == "scheduler"
    assert finding.detail["problem"] == problem
    assert finding.signature == f"slurm-node-{problem}"
    assert (finding.category, finding.attribution, finding.severity) == (
        category,
        attribution,
        severity,
    )


def test_a_node_state_with_an_xid_carries_the_xid() -> None:
    finding = node_state_finding("gpu-017", "DRAIN", "Xid 48 double bit ECC")

    assert finding is not None
    assert finding.detail["xid"] == 48
    assert finding.detail["xid_description"] == XID_MEANINGS[48].description


def test_a_not_responding_node_says_so() -> None:
    finding = node_state_finding("gpu-017", "DOWN+NOT_RESPONDING", "Not responding")

    assert finding is not None
    assert finding.detail["not_responding"] is True


@pytest.mark.parametrize(
    "state", ["IDLE", "ALLOCATED", "MIXED", "mix", "alloc", "idle*", "idle~", "COMPLETING", ""]
)
def test_a_working_node_gives_nothing(state: str) -> None:
    assert node_state_finding("gpu-017", state, "") is None


# --- Xid table ---------------------------------------------------------------------------


def test_the_xid_table_uses_the_shared_taxonomy() -> None:
    for code, meaning in XID_MEANINGS.items():
        assert meaning.category in CATEGORIES, code
        assert meaning.attribution in ATTRIBUTIONS, code
        assert meaning.severity in SEVERITIES, code
        assert meaning.description, code


@pytest.mark.parametrize(
    ("code", "category", "attribution"),
    [
        (79, "gpu_hardware", "hardware"),
        (48, "gpu_hardware", "hardware"),
        (63, "gpu_hardware", "hardware"),
        (64, "gpu_hardware", "hardware"),
        (92, "gpu_hardware", "hardware"),
        (94, "gpu_hardware", "hardware"),
        (95, "gpu_hardware", "hardware"),
        (119, "gpu_hardware", "hardware"),
        (120, "gpu_hardware", "hardware"),
        (74, "interconnect", "hardware"),
        (13, "cuda_error_app", "application"),
        (31, "cuda_error_app", "application"),
        (43, "cuda_error_app", "application"),
        (45, "cuda_error_app", "unknown"),
        (61, "gpu_hardware", "hardware"),
        (62, "gpu_hardware", "hardware"),
    ],
)
def test_the_xid_table_maps_the_codes_seen_on_training_clusters(
    code: int, category: str, attribution: str
) -> None:
    assert (XID_MEANINGS[code].category, XID_MEANINGS[code].attribution) == (
        category,
        attribution,
    )


def test_an_unlisted_xid_is_gpu_hardware_of_unknown_blame() -> None:
    meaning = xid_meaning(9999)

    assert (meaning.category, meaning.attribution) == ("gpu_hardware", "unknown")


# --- GPU metrics: Xid --------------------------------------------------------------------


def xid(seconds: float, value: float, node: str = "gpu-001", gpu: str = "0") -> MetricSample:
    return MetricSample(at=at(seconds), node=node, gpu=gpu, name=XID_METRIC, value=value)


def test_a_change_of_xid_from_the_previous_value_is_an_event() -> None:
    findings = findings_from_gpu_metrics(
        [xid(0, 13), xid(15, 79)], previous_xid={("gpu-001", "0"): 13}
    )

    assert len(findings) == 1
    finding = findings[0]
    assert finding.signature == "xid-79"
    assert (finding.category, finding.attribution, finding.severity) == (
        "gpu_hardware",
        "hardware",
        "fatal",
    )
    assert finding.source == "metrics"
    assert finding.nodes == ["gpu-001"]
    assert finding.at == at(15)
    assert finding.detail["gpu"] == "0"
    assert finding.evidence.startswith("Xid 79 on gpu-001 GPU 0: GPU has fallen off the bus")


def test_a_nonzero_first_value_without_history_is_an_event() -> None:
    findings = findings_from_gpu_metrics([xid(0, 74), xid(15, 74), xid(30, 74)])

    assert [(f.signature, f.count, f.category) for f in findings] == [("xid-74", 1, "interconnect")]


def test_an_unchanged_xid_is_not_a_new_event() -> None:
    findings = findings_from_gpu_metrics(
        [xid(0, 79), xid(15, 79)], previous_xid={("gpu-001", "0"): 79}
    )

    assert findings == []


def test_zero_is_not_an_xid() -> None:
    assert findings_from_gpu_metrics([xid(0, 0), xid(15, 0)]) == []


def test_the_same_xid_returning_is_one_finding_with_a_count() -> None:
    findings = findings_from_gpu_metrics(
        [xid(0, 79), xid(15, 0), xid(30, 79), xid(45, 79), xid(60, 0), xid(75, 79)]
    )

    assert len(findings) == 1
    assert findings[0].count == 3
    assert findings[0].detail["first_at"] == at(0).isoformat()
    assert findings[0].detail["last_at"] == at(75).isoformat()
    assert "(3 times)" in findings[0].evidence


def test_there_is_one_xid_finding_per_node_gpu_and_code() -> None:
    findings = findings_from_gpu_metrics(
        [
            xid(0, 13, gpu="0"),
            xid(15, 45, gpu="0"),
            xid(0, 79, gpu="3"),
            xid(0, 79, node="gpu-002", gpu="3"),
        ]
    )

    assert sorted((f.nodes[0], f.detail["gpu"], f.signature) for f in findings) == [
        ("gpu-001", "0", "xid-13"),
        ("gpu-001", "0", "xid-45"),
        ("gpu-001", "3", "xid-79"),
        ("gpu-002", "3", "xid-79"),
    ]
    preemptive_cleanup = next(f for f in findings if f.signature == "xid-45")
    assert (preemptive_cleanup.attribution, preemptive_cleanup.severity) == ("unknown", "warning")


def test_an_unknown_xid_is_still_reported() -> None:
    findings = findings_from_gpu_metrics([xid(0, 9999)])

    assert [(f.signature, f.category, f.attribution) for f in findings] == [
        ("xid-9999", "gpu_hardware", "unknown")
    ]
    assert findings[0].detail["known_xid"] is False


def test_latest_values_carry_the_xid_state_to_the_next_call() -> None:
    first = [xid(0, 0), xid(15, 79), xid(0, 13, gpu="1")]
    second = [xid(30, 79), xid(30, 13, gpu="1")]

    previous = latest_values(first, XID_METRIC)

    assert previous == {("gpu-001", "0"): 79, ("gpu-001", "1"): 13}
    assert findings_from_gpu_metrics(second, previous_xid=previous) == []


def test_non_finite_samples_are_ignored() -> None:
    assert findings_from_gpu_metrics([xid(0, float("nan"))]) == []


# --- GPU metrics: ECC and row remapping --------------------------------------------------


def metric(name: str, seconds: float, value: float, gpu: str = "2") -> MetricSample:
    return MetricSample(at=at(seconds), node="gpu-005", gpu=gpu, name=name, value=value)


def test_an_increase_of_the_double_bit_ecc_counter_is_gpu_hardware() -> None:
    findings = findings_from_gpu_metrics(
        [metric(ECC_DBE_METRIC, 0, 0), metric(ECC_DBE_METRIC, 15, 2), metric(ECC_DBE_METRIC, 30, 3)]
    )

    assert len(findings) == 1
    finding = findings[0]
    assert (finding.category, finding.attribution) == ("gpu_hardware", "hardware")
    assert finding.signature == "ecc-dbe-increase"
    assert finding.count == 2
    assert finding.detail["new_errors"] == 3
    assert finding.at == at(15)


def test_a_steady_or_reset_ecc_counter_is_not_an_event() -> None:
    samples = [
        metric(ECC_DBE_METRIC, 0, 4),
        metric(ECC_DBE_METRIC, 15, 4),
        metric(ECC_DBE_METRIC, 30, 0),
    ]

    assert findings_from_gpu_metrics(samples) == []


def test_the_previous_ecc_value_counts_as_the_baseline() -> None:
    findings = findings_from_gpu_metrics(
        [metric(ECC_DBE_METRIC, 0, 5)], previous_ecc_dbe={("gpu-005", "2"): 4}
    )

    assert [f.detail["new_errors"] for f in findings] == [1]


def test_a_row_remap_failure_is_one_finding_with_a_count() -> None:
    findings = findings_from_gpu_metrics(
        [metric(ROW_REMAP_FAILURE_METRIC, seconds, 1) for seconds in (0, 15, 30)]
        + [metric(ROW_REMAP_FAILURE_METRIC, 0, 0, gpu="3")]
    )

    assert len(findings) == 1
    assert findings[0].signature == "row-remap-failure"
    assert (findings[0].category, findings[0].attribution) == ("gpu_hardware", "hardware")
    assert findings[0].count == 3
    assert findings[0].detail["gpu"] == "2"


# --- GPU metrics: utilisation ------------------------------------------------------------


def utilisation(node: str, gpu: str, values: list[float]) -> list[MetricSample]:
    return [
        MetricSample(at=at(15 * index), node=node, gpu=gpu, name=GPU_UTIL_METRIC, value=value)
        for index, value in enumerate(values)
    ]


def busy_peers(count: int = 7, samples: int = 8) -> list[MetricSample]:
    peers = []
    for index in range(count):
        peers += utilisation(f"gpu-{index // 4 + 1:03d}", str(index % 4), [97.0] * samples)
    return peers


def test_a_gpu_stuck_at_zero_while_its_peers_work_is_a_straggler() -> None:
    samples = busy_peers() + utilisation("gpu-002", "3", [95, 96, 0, 0, 0, 0, 0, 0])

    findings = findings_from_gpu_metrics(samples)

    assert len(findings) == 1
    finding = findings[0]
    assert (finding.kind, finding.category, finding.attribution) == ("straggler", "", "unknown")
    assert finding.signature == "gpu-stuck-idle"
    assert finding.nodes == ["gpu-002"]
    assert finding.detail["gpu"] == "3"
    assert finding.count == 6
    assert finding.detail["peer_median"] == 97
    assert finding.at == at(30)
    assert finding.evidence.startswith("gpu-002 GPU 3 stuck at 0% utilisation for 6 consecutive")


def test_a_whole_job_at_zero_is_not_a_straggler() -> None:
    samples = []
    for gpu in range(8):
        samples += utilisation("gpu-001", str(gpu), [0.0] * 8)

    assert findings_from_gpu_metrics(samples) == []


def test_a_short_idle_moment_is_not_stuck() -> None:
    samples = busy_peers() + utilisation("gpu-002", "3", [95, 0, 0, 96, 0, 0, 97, 97])

    assert findings_from_gpu_metrics(samples) == []


def test_the_idle_and_busy_thresholds_can_be_tuned() -> None:
    samples = busy_peers() + utilisation("gpu-002", "3", [3, 3, 3, 3, 97, 97, 97, 97])

    assert findings_from_gpu_metrics(samples) == []
    assert len(findings_from_gpu_metrics(samples, idle_threshold=5.0)) == 1
    assert findings_from_gpu_metrics(samples, idle_threshold=5.0, busy_threshold=99.0) == []
    assert findings_from_gpu_metrics(samples, idle_threshold=5.0, min_idle_samples=5) == []


def test_unrelated_metrics_are_ignored() -> None:
    samples = [
        MetricSample(at=T0, node="gpu-001", gpu="0", name="DCGM_FI_DEV_POWER_USAGE", value=0)
    ]

    assert findings_from_gpu_metrics(samples) == []


# --- Xids caused by earlier ones -----------------------------------------------------------


def test_an_xid_caused_by_a_previous_one_takes_the_earlier_ones_meaning() -> None:
    from recovery.detection.classify import classify_text

    line = (
        "kernel: NVRM: Xid (PCI:0000:dc:00): 45, pid=1818990, name=python3, Ch 00000001 "
        "caused by previous Xid 149\n"
    )
    verdict = classify_text(line)
    assert (verdict.category, verdict.attribution) == ("gpu_hardware", "hardware")
    assert "NVLINK NETIR" in XID_MEANINGS[149].description
    alone = classify_text("kernel: NVRM: Xid (PCI:0000:dc:00): 45, pid=1, name=python3, Ch 1\n")
    assert alone.healthy  # Xid 45 on its own is the cleanup of a killed context


@pytest.mark.parametrize("code", range(144, 151))
def test_the_nvlink_xids_of_recent_gpus_are_hardware(code: int) -> None:
    meaning = xid_meaning(code)
    assert (meaning.category, meaning.attribution) == ("gpu_hardware", "hardware")
