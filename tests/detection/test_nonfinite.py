"""A loss that is not a number: one skipped fp16 step is not a failure, a run of them is."""

from __future__ import annotations

import pytest

from recovery.detection.classify import classify_scan, classify_text
from recovery.detection.scanner.log_scanner import LogScanner, scan_text
from recovery.detection.scanner.results import ScanResult
from recovery.detection.taxonomy import FailureCategory, Severity

HF = "{{'loss': {loss}, 'grad_norm': {norm}, 'learning_rate': 2e-05, 'epoch': {epoch}}}\n"
MEGATRON = (
    " iteration {step:8d}/   50000 | lm loss: {loss} | loss scale: {scale} | grad norm: {norm} |\n"
)


def hf(epoch: float, loss: str = "1.93", norm: str = "0.71") -> str:
    return HF.format(loss=loss, norm=norm, epoch=epoch)


def megatron(step: int, loss: str = "2.5E+00", norm: str = "0.8", scale: str = "4096.0") -> str:
    return MEGATRON.format(step=step, loss=loss, norm=norm, scale=scale)


def failures(result: ScanResult) -> list[str]:
    return [f.signature for f in result.findings if f.severity != Severity.WARNING]


def test_one_skipped_fp16_step_is_not_a_failure() -> None:
    log = hf(0.01, norm="nan") + "".join(hf(0.02 + i / 100) for i in range(5))
    verdict = classify_text(log)
    assert verdict.healthy
    assert [s["signature"] for s in verdict.secondary] == ["nonfinite-progress-value"]


def test_a_loss_that_stays_nan_for_two_logged_steps_is_a_divergence() -> None:
    log = hf(0.01) + hf(0.02, loss="nan", norm="nan") + hf(0.03, loss="nan", norm="nan")
    verdict = classify_text(log)
    assert verdict.category == FailureCategory.NAN_DIVERGENCE
    assert verdict.signature == "nonfinite-progress-value"
    assert verdict.kind == "divergence"  # training went on: no process died of it
    assert verdict.first_line == 3


def test_a_gradient_norm_that_stays_nan_is_a_divergence_too() -> None:
    log = "".join(hf(0.01 * i, norm="nan") for i in range(1, 4))
    assert classify_text(log).category == FailureCategory.NAN_DIVERGENCE


def test_the_same_line_from_several_processes_is_one_step() -> None:
    log = hf(0.01) + hf(0.02, loss="nan") * 8
    assert failures(scan_text(log)) == []


def test_runs_are_counted_per_rank() -> None:
    one_each = "".join(f"[rank{rank}]: " + megatron(7, loss="nan") for rank in range(4))
    assert failures(scan_text(one_each)) == []
    two_on_rank_3 = one_each + "[rank3]: " + megatron(8, loss="nan")
    assert failures(scan_text(two_on_rank_3)) == ["nonfinite-progress-value"]


def test_a_finite_loss_in_between_ends_the_run() -> None:
    log = megatron(1, loss="nan") + megatron(2) + megatron(3, loss="nan") + megatron(4)
    assert failures(scan_text(log)) == []


def test_with_the_loss_scale_at_one_a_single_nan_is_a_failure() -> None:
    # No scaler to skip the step: bf16 or fp32 training, or a scale that already collapsed.
    log = megatron(5, norm="nan", scale="1.0")
    assert failures(scan_text(log)) == ["nonfinite-progress-value"]
    assert failures(scan_text(megatron(5, norm="nan", scale="16.0"))) == []


@pytest.mark.parametrize(("steps", "failed"), [(2, True), (3, False)])
def test_the_count_is_a_setting(steps: int, failed: bool) -> None:
    log = megatron(1, loss="nan") + megatron(2, loss="nan")
    assert bool(failures(scan_text(log, nonfinite_steps=steps))) is failed


def test_the_count_is_carried_from_one_read_to_the_next() -> None:
    first = scan_text(megatron(1) + megatron(2, loss="nan"))
    assert failures(first) == []
    assert list(first.nonfinite_state) == [""]
    second = scan_text(megatron(3, loss="nan"), nonfinite_state=first.nonfinite_state)
    assert failures(second) == ["nonfinite-progress-value"]
    fresh = scan_text(megatron(3, loss="nan"))
    assert failures(fresh) == []


@pytest.mark.parametrize(
    "state",
    [None, [], "junk", {"": "x"}, {"": [1]}, {"": ["1", "a"]}, {7: [1, "a"]}],
)
def test_a_carried_state_that_is_not_one_is_ignored(state: object) -> None:
    scanner = LogScanner(nonfinite_state=state)  # type: ignore[arg-type]
    scanner.feed(megatron(1, loss="nan").encode())
    assert failures(scanner.finish()) == []


def test_progress_without_a_loss_does_not_show_a_nan_run_recovered() -> None:
    bars = "".join(f" 1%|          | {i}/1233 [07:54<14:12:16, 41.81s/it]\n" for i in range(10, 20))
    log = hf(0.01, loss="nan") + hf(0.02, loss="nan") + bars
    verdict = classify_text(log)
    assert verdict.category == FailureCategory.NAN_DIVERGENCE
    assert not verdict.recovered
    finite = "".join(megatron(step) for step in range(100, 105))
    assert classify_scan(scan_text(log + finite)).recovered


def test_a_program_saying_its_loss_is_nan_fails_at_once() -> None:
    log = "FloatingPointError: Loss became infinite or NaN at iteration=1200!\n"
    assert classify_text(log).category == FailureCategory.NAN_DIVERGENCE
