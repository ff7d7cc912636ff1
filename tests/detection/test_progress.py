"""Progress and checkpoint lines as the frameworks print them. Pure Python: no Django."""

from __future__ import annotations

import dataclasses
import math

import pytest

from recovery.detection.linear_regex import PatternError, compile_linear
from recovery.detection.progress import (
    CHECKPOINT_HINT,
    PROGRESS_HINT,
    Checkpoint,
    Progress,
    ProgressParser,
    parse_checkpoint,
    parse_checkpoint_started,
    parse_progress,
)

MEGATRON = (
    " iteration      122/  250000 | consumed samples:       124928 | elapsed time per iteration "
    "(ms): 86545.2 | learning rate: 1.499E-04 | global batch size:  1024 | lm loss: 2.504220E+00 "
    "| loss scale: 1.0 | grad norm: 0.312 | number of skipped iterations:   0 | number of nan "
    "iterations:   0 | throughput per GPU (TFLOP/s/GPU): 402.1 |"
)
MEGATRON_DEEPSPEED = (
    " iteration      100/  500000 | consumed samples:        51200 | consumed tokens:    104857600 "
    "| elapsed time per iteration (ms): 2034.5 | learning rate: 3.000E-04 | global batch size:   "
    "512 | lm loss: 7.460000E+00 | loss scale: 1.0 | grad norm: 1.200 | samples per second: "
    "251.655 | tokens per gpu per second (tgs): 2013.2 | TFLOPs: 120.50 |"
)
NEMO_LOG = (
    "Training epoch 0, iteration 3/9 | lr: 0.0006 | consumed_samples: 128 | global_batch_size: 32 "
    "| global_step: 3 | reduced_train_loss: 8.595 | train_step_timing in s: 1.23"
)
NEMO_BAR = (
    "Epoch 0: :   0%|          | 10/250000 [00:48<337:34:06, v_num=0, reduced_train_loss=11.00, "
    "global_step=3.2e+4, consumed_samples=320.0, train_step_timing in s=4.220]"
)
NEMO_BAR_NO_TOTAL = (
    "Epoch 0: : 3200it [1:02:34, 1.17s/it, loss=2.34, v_num=0, reduced_train_loss=2.340, "
    "global_step=3199.0]"
)
LIGHTNING_BAR = (
    "Epoch 10:  93%|█████████▎| 18625/20000 [5:43:21<25:20,  0.90it/s, v_num=0txx, "
    "train_loss=3.400]"
)
LIGHTNING_RICH = (
    "Epoch 3/9  ━━━━━━━━━━━━━━━━━━━━━ 25/25 0:00:01 • 0:00:00 27.44it/s v_num: 0 train_loss: 0.123"
)
HF_DICT_WITH_STEP = (
    "{'loss': 1.2345, 'grad_norm': 0.5, 'learning_rate': 4.9e-05, 'epoch': 0.01, 'step': 50}"
)
HF_BAR = "  5%|▌         | 50/1000 [00:30<09:30,  1.66it/s]"
DEEPSPEED_STEP = "[Rank 0] step=100, skipped=0, lr=[0.0001], mom=[(0.9, 0.999)]"
DEEPSPEED_PIPELINE = "steps: 100 loss: 2.3000 iter time (s): 0.500 samples/sec: 64.000"
DEEPSPEED_TIMER = (
    "[Rank 0] epoch=0/micro_step=800/global_step=100, RunningAvgSamplesPerSec=33.4, "
    "CurrSamplesPerSec=35.1, MemAllocated=4.2GB, MaxMemAllocated=8.1GB"
)
TORCHTITAN = (
    "step:  10  loss:  9.8000  memory: 30.10GiB(38.00%)  tps: 5,231  tflops: 120.30  mfu: 38%"
)
FAIRSEQ_INNER = (
    "epoch 003:      5 / 356 loss=9.44, nll_loss=9.1, ppl=550.2, wps=12345.6, ups=1.2, wpb=8000, "
    "bsz=256, num_updates=700, lr=0.0005, gnorm=1.2, train_wall=30, gb_free=10.2, wall=600"
)
FAIRSEQ_HYDRA_INNER = "| INFO | train_inner | " + FAIRSEQ_INNER
FAIRSEQ_SUMMARY = (
    "epoch 001 | loss 13.024 | ppl 8331.68 | wps 17183.3 | ups 5.12 | wpb 3360 | bsz 128 | "
    "num_updates 125 | lr 1.5625e-05 | gnorm 2.5 | train_wall 23 | wall 27"
)
FAIRSEQ_JSON = '{"epoch": 1, "update": 0.5, "loss": "9.44", "wps": "12345", "num_updates": "700"}'
LLAMA_RECIPES_BAR = (
    "Training Epoch: 2/3, step 49/50 completed (loss: 1.03):  98%|█████████▊| 49/50 "
    "[00:40<00:00,  1.20it/s]"
)
LLAMA_RECIPES_TENSOR = (
    "Training Epoch: 2/3, step 49/50 completed (loss: tensor(1.0312, device='cuda:0'))"
)

# (line, expected fields) for every built-in shape.
PROGRESS_EXAMPLES = [
    pytest.param(
        MEGATRON,
        {
            "step": 122,
            "total_steps": 250000,
            "loss": 2.50422,
            "step_time_seconds": 86.5452,
            "throughput_unit": "samples/s",
            "framework": "megatron",
        },
        id="megatron",
    ),
    pytest.param(
        MEGATRON_DEEPSPEED,
        {"step": 100, "loss": 7.46, "throughput": 251.655, "throughput_unit": "samples/s"},
        id="megatron-deepspeed",
    ),
    pytest.param(
        NEMO_LOG,
        {
            "step": 3,
            "total_steps": 9,
            "loss": 8.595,
            "epoch": 0,
            "step_time_seconds": 1.23,
            "framework": "nemo",
        },
        id="nemo-log",
    ),
    pytest.param(
        NEMO_BAR,
        {"step": 32000, "loss": 11.0, "step_time_seconds": 4.22, "epoch": 0, "framework": "nemo"},
        id="nemo-bar-scientific-global-step",
    ),
    pytest.param(
        NEMO_BAR_NO_TOTAL,
        {"step": 3199, "total_steps": None, "step_time_seconds": 1.17, "framework": "nemo"},
        id="nemo-bar-unknown-total",
    ),
    pytest.param(
        LIGHTNING_BAR,
        {
            "step": 18625,
            "total_steps": 20000,
            "loss": 3.4,
            "throughput": 0.9,
            "throughput_unit": "it/s",
            "epoch": 10,
            "framework": "lightning",
        },
        id="lightning-tqdm",
    ),
    pytest.param(
        LIGHTNING_RICH,
        {"step": 25, "epoch": 3, "loss": 0.123, "throughput": 27.44, "framework": "lightning"},
        id="lightning-rich",
    ),
    pytest.param(
        HF_DICT_WITH_STEP,
        {"step": 50, "loss": 1.2345, "epoch": 0, "framework": "huggingface"},
        id="huggingface-log-dict-with-step",
    ),
    pytest.param(
        HF_BAR,
        {
            "step": 50,
            "total_steps": 1000,
            "throughput": 1.66,
            "throughput_unit": "it/s",
            "framework": "huggingface",
        },
        id="huggingface-tqdm",
    ),
    pytest.param(DEEPSPEED_STEP, {"step": 100, "framework": "deepspeed"}, id="deepspeed-step"),
    pytest.param(
        DEEPSPEED_PIPELINE,
        {
            "step": 100,
            "loss": 2.3,
            "step_time_seconds": 0.5,
            "throughput": 64.0,
            "throughput_unit": "samples/s",
            "framework": "deepspeed",
        },
        id="deepspeed-pipeline",
    ),
    pytest.param(
        DEEPSPEED_TIMER,
        {"step": 100, "throughput": 35.1, "throughput_unit": "samples/s", "epoch": 0},
        id="deepspeed-throughput-timer",
    ),
    pytest.param(
        TORCHTITAN,
        {
            "step": 10,
            "loss": 9.8,
            "throughput": 5231.0,
            "throughput_unit": "tokens/s",
            "framework": "torchtitan",
        },
        id="torchtitan",
    ),
    pytest.param(
        FAIRSEQ_INNER,
        {
            "step": 700,
            "loss": 9.44,
            "epoch": 3,
            "throughput": 12345.6,
            "throughput_unit": "tokens/s",
            "framework": "fairseq",
        },
        id="fairseq-simple",
    ),
    pytest.param(FAIRSEQ_HYDRA_INNER, {"step": 700, "epoch": 3}, id="fairseq-hydra-prefix"),
    pytest.param(
        FAIRSEQ_SUMMARY, {"step": 125, "loss": 13.024, "epoch": 1}, id="fairseq-epoch-summary"
    ),
    pytest.param(FAIRSEQ_JSON, {"step": 700, "loss": 9.44, "epoch": 1}, id="fairseq-json"),
    pytest.param(
        LLAMA_RECIPES_BAR,
        {"step": 49, "total_steps": 50, "loss": 1.03, "epoch": 2, "framework": "llama-recipes"},
        id="llama-recipes",
    ),
    pytest.param(LLAMA_RECIPES_TENSOR, {"step": 49, "loss": 1.0312}, id="llama-recipes-tensor"),
    pytest.param("step 120", {"step": 120, "framework": "generic"}, id="plain-step"),
    pytest.param("Step 120/1000", {"step": 120, "total_steps": 1000}, id="plain-step-of-total"),
    pytest.param("iter 120", {"step": 120}, id="plain-iter"),
    pytest.param("Iteration 120 | loss 2.31", {"step": 120, "loss": 2.31}, id="plain-iteration"),
    pytest.param("global_step: 120", {"step": 120}, id="plain-global-step"),
    pytest.param("Epoch 3 Step 120 loss 2.1", {"step": 120, "epoch": 3}, id="plain-epoch-step"),
    pytest.param("[step 120] loss=2.0", {"step": 120, "loss": 2.0}, id="plain-bracketed"),
    pytest.param("Training: 40%|████      | 40/100 [00:10<00:15, 4.00it/s]", {"step": 40}),
    pytest.param("Steps:  12%|█▏        | 120/1000 [02:00<14:40,  1.00s/it]", {"step": 120}),
]

NOT_PROGRESS = [
    "Starting training step on epoch 3",
    "learning rate: 1.0E-04",
    "Epoch 00003: adjusting learning rate of group 0 to 1.0000e-04.",
    "checkpoint saved at step 100",
    "saving checkpoint at iteration    2000 to /ckpt in torch format",
    "loading checkpoint from /ckpt at iteration 2000",
    "Resuming training from step 500",
    "node01:1234:1234 [0] NCCL INFO Channel 00/02 :    0   1   2   3 step 4",
    "NCCL INFO comm 0x5612 rank 0 nranks 8 cudaDev 0 busId 7000 commId 0x1 - Init COMPLETE",
    "Downloading shards:  50%|█████     | 1/2 [00:30<00:30, 30.0s/it]",
    "Loading checkpoint shards: 100%|██████████| 4/4 [00:05<00:00,  1.3s/it]",
    "Map: 100%|██████████| 1000/1000 [00:01<00:00, 800.00it/s]",
    "Validation DataLoader 0: 100%|██████████| 63/63 [00:05<00:00, 11.2it/s]",
    "Sanity Checking DataLoader 0: 100%|██████████| 2/2 [00:01<00:00,  1.9it/s]",
    "Loading train split: 100%|██████████| 10/10 [00:01<00:00,  9.1it/s]",
    "{'loss': 1.2345, 'grad_norm': 0.5, 'learning_rate': 4.9e-05, 'epoch': 0.01}",
    "{'train_runtime': 120.5, 'train_samples_per_second': 33.2, 'train_loss': 1.5, 'epoch': 3.0}",
    "  Total optimization steps = 1,000",
    "  Gradient Accumulation steps = 4",
    "max_steps=1000",
    "warmup_steps: 500",
    "--train-iters 250000 --eval-iters 10",
    "  train_iters ..................................... 250000",
    "  steps_per_print ................ 10",
    "[before the start of training step] datetime: 2024-05-01 12:00:00",
    "exiting program at iteration 1000",
    "epoch 001 | valid on 'valid' subset | loss 11.7 | ppl 3300 | wps 40000 | num_updates 125",
    "step 1.5",
    "",
]

CHECKPOINT_SAVED = [
    pytest.param(
        "  successfully saved checkpoint from iteration    2000 to /ckpt [ t 1/8, p 1/1 ]",
        Checkpoint(step=2000, path="/ckpt", framework="megatron"),
        id="megatron",
    ),
    pytest.param(
        "  successfully saved checkpoint at iteration    2000 to /ckpt",
        Checkpoint(step=2000, path="/ckpt", framework="megatron"),
        id="megatron-older",
    ),
    pytest.param(
        "Epoch 0, global step 500: 'val_loss' reached 2.10000 (best 2.10000), saving model to "
        "'/ckpt/epoch=0-step=500.ckpt' as top 1",
        Checkpoint(step=500, path="/ckpt/epoch=0-step=500.ckpt", framework="lightning"),
        id="lightning-model-checkpoint",
    ),
    pytest.param(
        "Saving checkpoint to /ckpt/megatron_gpt--step=500.ckpt",
        Checkpoint(step=500, path="/ckpt/megatron_gpt--step=500.ckpt", framework="generic"),
        id="nemo-saving-checkpoint-to",
    ),
    pytest.param(
        "Async checkpoint save for step 500 (/ckpt/step=500.ckpt) finalized successfully.",
        Checkpoint(step=500, path="/ckpt/step=500.ckpt", framework="nemo"),
        id="nemo-async-finalized",
    ),
    pytest.param(
        "Saving model checkpoint to /out/checkpoint-500",
        Checkpoint(step=500, path="/out/checkpoint-500", framework="huggingface"),
        id="huggingface",
    ),
    pytest.param(
        "[Torch] Checkpoint global_step500 is ready now!",
        Checkpoint(step=500, path=None, framework="deepspeed"),
        id="deepspeed-ready",
    ),
    pytest.param(
        "zero checkpoint saved /ckpt/global_step500/zero_pp_rank_0_mp_rank_00_optim_states.pt",
        Checkpoint(
            step=500,
            path="/ckpt/global_step500/zero_pp_rank_0_mp_rank_00_optim_states.pt",
            framework="deepspeed",
        ),
        id="deepspeed-zero",
    ),
    pytest.param(
        "Finished saving the checkpoint (or staging if async is enabled)in 3.21 seconds.",
        Checkpoint(step=None, path=None, framework="torchtitan"),
        id="torchtitan",
    ),
    pytest.param(
        "saved checkpoint checkpoints/checkpoint2.pt (epoch 2 @ 695 updates, score 9.393) "
        "(writing took 5.76 seconds)",
        Checkpoint(step=695, path="checkpoints/checkpoint2.pt", framework="fairseq"),
        id="fairseq",
    ),
    pytest.param("checkpoint saved", Checkpoint(), id="plain-checkpoint-saved"),
    pytest.param(
        "checkpoint saved at step 100", Checkpoint(step=100), id="plain-checkpoint-saved-at-step"
    ),
    pytest.param(
        "Saved checkpoint to /ckpt/iter_0002000",
        Checkpoint(step=2000, path="/ckpt/iter_0002000"),
        id="plain-saved-checkpoint-to",
    ),
    pytest.param(
        "saving checkpoint for global step 100", Checkpoint(step=100), id="plain-saving-step"
    ),
]

CHECKPOINT_STARTED = [
    pytest.param(
        "saving checkpoint at iteration    2000 to /ckpt in torch format",
        Checkpoint(step=2000, path="/ckpt", framework="megatron"),
        id="megatron",
    ),
    pytest.param(
        "[Rank 0] Saving model checkpoint: /ckpt/global_step500/mp_rank_00_model_states.pt",
        Checkpoint(
            step=500,
            path="/ckpt/global_step500/mp_rank_00_model_states.pt",
            framework="deepspeed",
        ),
        id="deepspeed",
    ),
    pytest.param(
        "Saving the checkpoint (or staging if async is enabled).",
        Checkpoint(framework="torchtitan"),
        id="torchtitan",
    ),
    pytest.param(
        "Preparing to save checkpoint for epoch 2 @ 695 updates",
        Checkpoint(step=695, framework="fairseq"),
        id="fairseq",
    ),
    pytest.param(
        "Scheduled async checkpoint save for /ckpt/step=500.ckpt",
        Checkpoint(step=500, path="/ckpt/step=500.ckpt", framework="nemo"),
        id="nemo-async",
    ),
]

NOT_CHECKPOINT = [
    "Loading checkpoint from /ckpt/iter_0002000",
    "loading checkpoint /ckpt at iteration 2000",
    "resuming from checkpoint /ckpt/checkpoint-500",
    "Restoring states from the checkpoint path at /ckpt/last.ckpt",
    "checkpoint_interval=500",
    "save_interval: 1000",
    "checkpoint_dir = /ckpt",
    "Epoch 0, global step 500: 'val_loss' was not in top 1",
    "Failed to save checkpoint to /ckpt: No space left on device",
    "Checkpoints will be saved every 500 steps",
    "[Torch] Saving checkpoints/global_step500/mp_rank_00_model_states.pt...",
    "[Torch] Saved checkpoints/global_step500/mp_rank_00_model_states.pt.",
    "step 120 loss 2.3",
    "",
]


def _line(param: pytest.ParameterSet) -> str:
    line = param.values[0]
    assert isinstance(line, str)
    return line


# --- progress: built-in shapes -----------------------------------------------------------


@pytest.mark.parametrize(("line", "expected"), PROGRESS_EXAMPLES)
def test_it_reads_each_frameworks_progress_line(line: str, expected: dict[str, object]) -> None:
    progress = parse_progress(line)

    assert progress is not None, line
    for field, value in expected.items():
        actual = getattr(progress, field)
        if isinstance(value, float):
            assert actual == pytest.approx(value), field
        else:
            assert actual == value, field


@pytest.mark.parametrize("line", NOT_PROGRESS)
def test_it_does_not_read_progress_from_lines_that_are_not_training_steps(line: str) -> None:
    assert parse_progress(line) is None


def test_it_derives_megatron_samples_per_second_from_batch_size_and_iteration_time() -> None:
    progress = parse_progress(MEGATRON)

    assert progress is not None
    assert progress.throughput == pytest.approx(1024 / 86.5452)
    assert progress.throughput_unit == "samples/s"


def test_it_derives_nemo_samples_per_second_from_batch_size_and_step_timing() -> None:
    progress = parse_progress(NEMO_LOG)

    assert progress is not None
    assert progress.throughput == pytest.approx(32 / 1.23)


def test_it_turns_seconds_per_iteration_into_iterations_per_second() -> None:
    progress = parse_progress("Training:  12%|█▏        | 120/1000 [02:00<14:40,  4.00s/it]")

    assert progress is not None
    assert progress.throughput == pytest.approx(0.25)
    assert progress.throughput_unit == "it/s"
    assert progress.step_time_seconds == pytest.approx(4.0)


def test_it_prefers_the_global_step_over_the_bar_counter_in_a_nemo_bar() -> None:
    progress = parse_progress(NEMO_BAR)

    assert progress is not None
    assert progress.step == 32000  # global_step=3.2e+4, not the bar's 10


def test_it_uses_deepspeeds_current_rate_rather_than_the_running_average() -> None:
    progress = parse_progress(DEEPSPEED_TIMER)

    assert progress is not None
    assert progress.throughput == pytest.approx(35.1)


def test_it_reads_a_nan_loss_as_nan() -> None:
    progress = parse_progress("step 120 loss: nan")

    assert progress is not None
    assert progress.loss is not None and math.isnan(progress.loss)


def test_it_reads_the_training_loss_and_not_the_nll_loss_in_fairseq_lines() -> None:
    progress = parse_progress(
        "epoch 001:     10 / 100 nll_loss=1.5, loss=9.44, num_updates=10, wps=100"
    )

    assert progress is not None
    assert progress.loss == pytest.approx(9.44)


def test_progress_values_are_frozen() -> None:
    progress = Progress(step=1)

    with pytest.raises(dataclasses.FrozenInstanceError):
        progress.step = 2  # type: ignore[misc]


# --- progress: per-policy overrides ------------------------------------------------------


def test_it_tries_an_override_before_the_built_ins() -> None:
    parser = ProgressParser(
        progress_patterns=[
            r"consumed samples:\s*(?P<step>\d+).*lm loss: (?P<loss>[\d.E+-]+)",
        ]
    )

    progress = parser.parse_progress(MEGATRON)

    assert progress is not None
    assert progress.step == 124928
    assert progress.loss == pytest.approx(2.50422)
    assert progress.framework == "custom"


def test_it_reads_total_and_throughput_from_an_override() -> None:
    parser = ProgressParser(
        progress_patterns=[
            r"MYTRAIN s=(?P<step>\d+)/(?P<total>\d+) rate=(?P<throughput>[\d.]+)",
        ]
    )

    progress = parser.parse_progress("MYTRAIN s=42/100 rate=12.5")

    assert progress == Progress(step=42, total_steps=100, throughput=12.5, framework="custom")


def test_it_falls_back_to_the_built_ins_when_no_override_matches() -> None:
    parser = ProgressParser(progress_patterns=[r"MYTRAIN s=(?P<step>\d+)"])

    progress = parser.parse_progress(TORCHTITAN)

    assert progress is not None
    assert progress.framework == "torchtitan"


def test_it_refuses_an_override_without_a_step_group() -> None:
    with pytest.raises(PatternError, match="step"):
        ProgressParser(progress_patterns=[r"loss=(?P<loss>[\d.]+)"])


def test_it_refuses_an_override_with_an_unknown_group_name() -> None:
    with pytest.raises(PatternError, match="los"):
        ProgressParser(progress_patterns=[r"s=(?P<step>\d+) l=(?P<los>[\d.]+)"])


def test_it_refuses_an_override_that_needs_a_backtracking_engine() -> None:
    with pytest.raises(PatternError, match="RE2"):
        ProgressParser(progress_patterns=[r"(?P<step>\d+)(?=x)"])


def test_it_reads_a_checkpoint_with_an_override() -> None:
    parser = ProgressParser(checkpoint_patterns=[r"SNAPSHOT (?P<path>\S+) @(?P<step>\d+)"])

    assert parser.parse_checkpoint("SNAPSHOT /s/x @77") == Checkpoint(
        step=77, path="/s/x", framework="custom"
    )
    assert parser.parse_progress("SNAPSHOT /s/x @77 step 77") is None


def test_it_refuses_a_checkpoint_override_with_an_unknown_group_name() -> None:
    with pytest.raises(PatternError):
        ProgressParser(checkpoint_patterns=[r"saved (?P<file>\S+)"])


def test_an_override_never_turns_a_checkpoint_line_into_progress() -> None:
    parser = ProgressParser(progress_patterns=[r"step (?P<step>\d+)"])

    assert parser.parse_progress("checkpoint saved at step 100") is None


# --- checkpoints -------------------------------------------------------------------------


@pytest.mark.parametrize(("line", "expected"), CHECKPOINT_SAVED)
def test_it_reads_each_frameworks_finished_checkpoint(line: str, expected: Checkpoint) -> None:
    assert parse_checkpoint(line) == expected
    assert parse_checkpoint_started(line) is None


@pytest.mark.parametrize(("line", "expected"), CHECKPOINT_STARTED)
def test_it_reads_a_save_that_has_only_begun_as_started(line: str, expected: Checkpoint) -> None:
    assert parse_checkpoint_started(line) == expected
    assert parse_checkpoint(line) is None


@pytest.mark.parametrize("line", NOT_CHECKPOINT)
def test_it_does_not_read_loads_resumes_settings_or_failures_as_saves(line: str) -> None:
    assert parse_checkpoint(line) is None
    assert parse_checkpoint_started(line) is None


def test_checkpoint_lines_are_not_progress_lines() -> None:
    for param in CHECKPOINT_SAVED + CHECKPOINT_STARTED:
        assert parse_progress(_line(param)) is None, _line(param)


# --- hints -------------------------------------------------------------------------------


def _progress_lines() -> list[str]:
    return [_line(param) for param in PROGRESS_EXAMPLES]


def _checkpoint_lines() -> list[str]:
    return [_line(param) for param in CHECKPOINT_SAVED + CHECKPOINT_STARTED]


def test_the_progress_hint_matches_every_line_the_parser_accepts() -> None:
    hint = compile_linear(PROGRESS_HINT)

    missed = [line for line in _progress_lines() if hint.search(line) is None]

    assert missed == []


def test_the_checkpoint_hint_matches_every_line_the_parsers_accept() -> None:
    hint = compile_linear(CHECKPOINT_HINT)

    missed = [line for line in _checkpoint_lines() if hint.search(line) is None]

    assert missed == []


def test_the_hints_compile_with_hyperscan() -> None:
    hyperscan = pytest.importorskip("hyperscan")
    lines = _progress_lines() + _checkpoint_lines()
    for hint, expected in (
        (PROGRESS_HINT, _progress_lines()),
        (CHECKPOINT_HINT, _checkpoint_lines()),
    ):
        database = hyperscan.Database()
        database.compile(
            expressions=[hint.encode()], ids=[0], flags=[hyperscan.HS_FLAG_SINGLEMATCH]
        )
        matched = []
        for line in lines:
            hits: list[int] = []
            database.scan(
                line.encode(), match_event_handler=lambda *args, hits=hits: hits.append(1)
            )
            if hits:
                matched.append(line)
        assert set(expected) <= set(matched)


def test_the_parsers_hints_include_its_overrides() -> None:
    parser = ProgressParser(
        progress_patterns=[r"MYTRAIN s=(?P<step>\d+)"], checkpoint_patterns=[r"SNAPSHOT \S+"]
    )

    assert parser.progress_hints == (PROGRESS_HINT, r"MYTRAIN s=(?P<step>\d+)")
    assert parser.checkpoint_hints == (CHECKPOINT_HINT, r"SNAPSHOT \S+")
