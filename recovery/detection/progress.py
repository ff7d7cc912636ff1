"""Training progress and checkpoint lines, read from one log message at a time.

The scanner has already removed colours, carriage returns, leading timestamps and rank or host
prefixes; what reaches this module is the rest of one message. Every pattern here runs on RE2
(``compile_linear``), so no line, however long or hostile, can make matching slower than linear.

The built-in shapes follow what the frameworks really print:

* Megatron-LM ``training_log``: `` iteration  122/ 250000 | ... | elapsed time per iteration (ms):
  ... | global batch size: 1024 | lm loss: 2.5E+00 | ...`` and the checkpointing messages
  ``saving checkpoint at iteration N to DIR`` / ``successfully saved checkpoint from iteration N``.
* NeMo 2 ``Training epoch 0, iteration 3/9 | ... | global_step: 3 | reduced_train_loss: 8.6`` and
  NeMo 1 / PyTorch Lightning progress bars (tqdm or Rich), with ``global_step=3.2e+4`` postfixes.
* Hugging Face Trainer: its log dictionaries (only those that carry a step) and its tqdm bar.
* DeepSpeed: ``step=N, skipped=N, lr=...``, the ThroughputTimer line and the pipeline engine's
  ``steps: N loss: ... iter time (s): ... samples/sec: ...``.
* torchtitan ``step: N  loss: ...  memory: ...  tps: 5,231  tflops: ...  mfu: ...``.
* fairseq simple, summary and JSON progress lines (the step is ``num_updates``).
* llama-recipes ``Training Epoch: 2/3, step 49/50 completed (loss: ...)``.
* plain ``step 120``, ``Step 120/1000``, ``iter 120``, ``global_step: 120`` lines.

A line is either a checkpoint line or a progress line, never both: ``checkpoint saved at step
100`` reports a save, not a training step.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from recovery.detection.linear_regex import PatternError, compile_linear

if TYPE_CHECKING:
    from re2 import _Regexp as CompiledPattern

# Cheap pre-filters the scanner runs over whole chunks to pick candidate lines. They may match
# more than the parsers accept, never less (a test checks every positive example). They use no
# capturing groups, lookaround, backreferences or \b, so both RE2 and Hyperscan compile them.
PROGRESS_HINT = r"(?i)step|iter|num_updates|%\s*\||\[\d+:\d\d|\d/\d+\s+\d+:\d\d:\d\d"
CHECKPOINT_HINT = r"(?i)checkpoint|ckpt|saving model|saved model"

_PROGRESS_OVERRIDE_GROUPS = frozenset({"step", "loss", "throughput", "total"})
_CHECKPOINT_OVERRIDE_GROUPS = frozenset({"step", "path"})


@dataclass(frozen=True)
class Progress:
    """One training progress report.

    ``step`` is the counter the framework prints (for Lightning bars without ``global_step`` it
    is the batch index within the epoch, so it may restart at each epoch: consumers should treat
    any change of step as progress, not only an increase). ``epoch`` is as printed (some
    frameworks count from 0, others from 1).
    """

    step: int
    total_steps: int | None = None
    loss: float | None = None
    throughput: float | None = None
    throughput_unit: str | None = None
    step_time_seconds: float | None = None
    epoch: int | None = None
    framework: str = "generic"


@dataclass(frozen=True)
class Checkpoint:
    """A checkpoint save, finished or (from ``parse_checkpoint_started``) begun."""

    step: int | None = None
    path: str | None = None
    framework: str = "generic"


# ---------------------------------------------------------------------------------------------
# Numbers and fields shared by several frameworks

_NUM = r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?"
_LOSS_VALUE = rf"(?:{_NUM}|nan|inf)"

# "lm loss: 2.5E+00", "'loss': 1.23", "loss=9.44", "(loss: tensor(1.03, device='cuda:0'))",
# "train_loss=3.400", "reduced_train_loss: 8.6". The character before the key must not be a word
# character, so "nll_loss" and "val_loss" are not read as the training loss.
_LOSS = compile_linear(
    r"(?i)(?:^|[^\w])['\"]?(?:lm[ _]|train[ _]|training[ _]|reduced_train_|avg[ _]|mean[ _])?"
    rf"loss['\"]?\s*[:=]?\s*['\"]?(?:tensor\()?(?P<loss>{_LOSS_VALUE})"
)
# Megatron "elapsed time per iteration (ms): 86545.2", DeepSpeed "iter time (s): 0.5",
# NeMo "train_step_timing in s: 1.23", plain "step_time: 0.5".
_STEP_TIME = compile_linear(
    r"(?i)(?:elapsed time per iteration|iter(?:ation)?[ _]time|step[ _]time|"
    r"time[ _]per[ _](?:step|iter(?:ation)?)|train_step_timing)"
    r"(?:\s+in\s+(?P<unit_in>ms|s))?\s*(?:\((?P<unit_paren>ms|s)\))?\s*[:=]\s*"
    rf"(?P<value>{_NUM})(?:\s*(?P<unit_after>ms)(?:[^a-z]|$))?"
)
_GLOBAL_BATCH_SIZE = compile_linear(r"(?i)global[ _]batch[ _]size\s*[:=]\s*(?P<value>\d+)")
_GLOBAL_STEP = compile_linear(rf"(?i)(?:^|[^\w])global_step['\"]?\s*[:=]\s*(?P<value>{_NUM})")
_EPOCH = compile_linear(rf"(?i)(?:^|[^\w])['\"]?epoch['\"]?\s*[:=]?\s*\[?(?P<value>{_NUM})")

# Throughput, most specific unit first: samples, then tokens, then iterations.
_SAMPLES_RATE = compile_linear(
    r"(?i)(?:samples?[ _]?(?:per[ _]?)?sec(?:ond)?|samples?/s(?:ec)?)['\"]?\s*[:=]?\s*['\"]?"
    rf"(?P<value>{_NUM})"
)
_TOKENS_RATE = compile_linear(
    r"(?i)(?:^|[^\w])(?:tps|tgs|wps|tok/s|tokens?/s(?:ec)?|"
    r"tokens?[ _]per[ _](?:gpu[ _]per[ _])?sec(?:ond)?)['\"]?\s*(?:\([^)]*\))?\s*[:=]?\s*['\"]?"
    r"(?P<value>\d[\d,]*(?:\.\d+)?)"
)
_TOKENS_RATE_AFTER = compile_linear(rf"(?i)(?P<value>{_NUM})\s*(?:tokens?|tok)/s")
_SAMPLES_RATE_AFTER = compile_linear(rf"(?i)(?P<value>{_NUM})\s*(?:samples?|ex|examples)/s")
# tqdm's rate: "0.90it/s" or "1.17s/it" (slower than one iteration a second).
_RATE = compile_linear(
    r"(?i)(?:^|[\s,])(?P<value>\d+(?:\.\d+)?)\s*(?P<unit>[a-z]+/s|s/[a-z]+)(?:[\s,\]]|$)"
)
_TFLOPS_PER_GPU = compile_linear(rf"(?i)throughput per GPU \(TFLOP/s/GPU\):\s*(?P<value>{_NUM})")

# A line that names a checkpoint, a resume or an NCCL log is never a built-in progress line,
# even when it carries a step number ("loading checkpoint at iteration 2000").
_NOT_PROGRESS = compile_linear(r"(?i)checkpoint|ckpt|resum|restor|nccl (?:info|warn)")
_CHECKPOINT_HINT_COMPILED = compile_linear(CHECKPOINT_HINT)

# ---------------------------------------------------------------------------------------------
# Framework shapes

_MEGATRON = compile_linear(r"(?i)(?:^|[\s\]|])iteration\s+(?P<step>\d+)\s*/\s*(?P<total>\d+)\s*\|")
_NEMO_LOG = compile_linear(
    r"(?i)training epoch\s+(?P<epoch>\d+),\s*iteration\s+(?P<n>\d+)\s*/\s*(?P<total>\d+)"
)
_DEEPSPEED_PIPELINE = compile_linear(
    rf"(?i)(?:^|[^\w])steps:\s*(?P<step>\d+)\s+loss:\s*(?P<loss>{_LOSS_VALUE})"
)
_DEEPSPEED_STEP = compile_linear(r"(?i)(?:^|[^\w])step=(?P<step>\d+),\s*skipped=\d+,\s*lr=")
_DEEPSPEED_THROUGHPUT = compile_linear(
    r"(?i)epoch=(?P<epoch>\d+)/micro_step=\d+/global_step=(?P<step>\d+),\s*"
    rf"RunningAvgSamplesPerSec=(?P<average>{_NUM}),\s*CurrSamplesPerSec=(?P<current>{_NUM})"
)
_TORCHTITAN = compile_linear(
    rf"(?i)(?:^|[^\w])step:\s*(?P<step>\d+)\s+loss:\s*(?P<loss>{_LOSS_VALUE})\s.*"
    r"(?:tps|mfu|memory):"
)
_FAIRSEQ_INNER = compile_linear(
    r"(?i)(?:^|[|\s])epoch\s+(?P<epoch>\d+)\s*:\s*\d+\s*/\s*(?P<total>\d+)\s"
)
_FAIRSEQ_SUMMARY = compile_linear(r"(?i)(?:^|[|\s])epoch\s+(?P<epoch>\d+)\s*\|")
_FAIRSEQ_JSON = compile_linear(r"(?i)^\s*\{.*['\"]epoch['\"]\s*:")
_FAIRSEQ_VALID = compile_linear(r"(?i)valid on ")
_NUM_UPDATES = compile_linear(
    r"(?i)(?:^|[^\w])['\"]?num_updates['\"]?\s*[=:]?\s*['\"]?(?P<value>\d+)"
)
_LLAMA_RECIPES = compile_linear(
    r"(?i)training epoch:\s*(?P<epoch>\d+)(?:/\d+)?,\s*step\s+(?P<step>\d+)/(?P<total>\d+)"
    r"\s+completed"
)
_HF_LOG_DICT = compile_linear(r"^\s*\{.*['\"](?:global_)?step['\"]\s*:\s*(?P<step>\d+)")
_HF_SAMPLES_RATE = compile_linear(
    rf"(?i)['\"]train_samples_per_second['\"]\s*:\s*(?P<value>{_NUM})"
)

# tqdm: "{desc}: {pct}%|{bar}| {n}/{total} [{elapsed}<{remaining}, {rate}{postfix}]" and, when the
# total is unknown, "{desc}: {n}it [{elapsed}, {rate}{postfix}]".
_TQDM_PERCENT = compile_linear(
    r"^(?P<desc>[^|]*?)\s*\d{1,3}%\s*\|[^|]*\|\s*(?P<n>\d+)/(?P<total>\d+|\?)"
    r"(?:\s*\[(?P<stats>[^\]]*))?"
)
_TQDM_NO_TOTAL = compile_linear(
    r"^(?P<desc>[^|\[]*?):?\s*(?P<n>\d+)(?:[a-z]+)?\s*\[(?P<stats>\d+:\d\d[^\]]*)"
)
# Lightning's RichProgressBar: "Epoch 3/9  ━━━━━━━━━ 25/25 0:00:01 • 0:00:00 27.44it/s v_num: 0".
_RICH_BAR = compile_linear(
    r"(?i)^\s*epoch\s+(?P<epoch>\d+)(?:/\d+)?\s+\S*\s*(?P<n>\d+)/(?P<total>\d+)\s+\d+:\d\d:\d\d"
)
# A bar with a description counts only when the description names training. Progress bars
# print for downloads, dataset maps, tokenising, shard loading, evaluation and sanity checks
# too, and their counters are not training steps. Words that name other work win over the
# training words ("Loading train split" is not training).
_TRAINING_DESCRIPTION = compile_linear(r"(?i)epoch|train|iteration|step|fit|fine-?tun")
_OTHER_WORK_DESCRIPTION = compile_linear(
    r"(?i)load|download|fetch|map|token|shard|eval|valid|test|predict|sanity|infer|generat|"
    r"process|filter|convert|extract|upload|writ|sav|read|resolv|compil|prepar|build|index|cach|"
    r"verif"
)
_NEMO_POSTFIX = compile_linear(r"(?i)reduced_train_loss|consumed_samples|global_step")

# Plain lines. The keyword must start the message or follow a separator, an epoch number,
# "train"/"training"/"global" or a log level, so that "Total optimization steps = 1,000",
# "max_steps=1000", "--train-iters 250000" or "Starting training step on epoch 3" are not read as
# progress. The number must end there: "1,000" and "1.5" are not steps.
_GENERIC = compile_linear(
    r"(?i)(?:^|[|,;:\[\(\]>*#]|\s-|\s=|epoch\s*\[?\d+(?:\s*/\s*\d+)?\]?|info|debug)\s*"
    r"(?:train(?:ing)?\s+|global[ _])?(?:step|iter(?:ation)?)s?\s*[:=#]?\s*\[?\s*"
    r"(?P<step>\d+)(?:\s*(?:/|of)\s*(?P<total>\d+))?\s*\]?(?:$|[^\w.,]|[.,](?:\s|$))"
)

# ---------------------------------------------------------------------------------------------
# Checkpoints

# Lines that mention a checkpoint without a save having happened: loads, resumes, failures,
# configuration keys, announcements of a future save.
_CHECKPOINT_NEGATIVE = compile_linear(
    r"(?i)(?:^|[^\w])(?:load(?:s|ing|ed)?|resum(?:e|es|ing|ed)|restor(?:e|es|ing|ed)|"
    r"fail(?:s|ed|ure)?|error|unable|could not|cannot|can't|not in top|no checkpoint|every|"
    r"will be|will save|skip(?:s|ping|ped)?)(?:[^\w]|$)"
    r"|(?:checkpoint|ckpt|save)s?[_ -]?(?:interval|every|freq(?:uency)?|steps|dir(?:ectory)?|"
    r"path|format|_?iters)['\"]?\s*[:=]"
)

_STARTED = "started"
_SAVED = "saved"
_IGNORED = "ignored"

# (pattern, outcome, framework), tried in order; the first that matches decides. A save that the
# framework later confirms with its own line is "started" here, so that a job killed in the
# middle of a save is not credited with that checkpoint.
_CHECKPOINT_SHAPES: tuple[tuple[CompiledPattern, str, str], ...] = (
    (
        compile_linear(
            r"(?i)successfully saved checkpoint (?:from|at) iteration\s+(?P<step>\d+)\s+to\s+"
            r"(?P<path>\S+)"
        ),
        _SAVED,
        "megatron",
    ),
    (
        compile_linear(r"(?i)saving checkpoint at iteration\s+(?P<step>\d+)\s+to\s+(?P<path>\S+)"),
        _STARTED,
        "megatron",
    ),
    # torchtitan; with async checkpointing "finished" means staged, which is what it reports.
    (compile_linear(r"(?i)finished saving the checkpoint"), _SAVED, "torchtitan"),
    (compile_linear(r"(?i)(?:^|[^\w])saving the checkpoint"), _STARTED, "torchtitan"),
    # DeepSpeed: "Saving model checkpoint: PATH" opens the save, "[Torch] Checkpoint TAG is ready
    # now!" commits it; "zero checkpoint saved PATH" ends the ZeRO optimizer part. Per-file
    # "[Torch] Saving/Saved FILE" lines are neither.
    (
        compile_linear(r"(?i)checkpoint\s+(?P<tag>\S+)\s+is ready now"),
        _SAVED,
        "deepspeed",
    ),
    (compile_linear(r"(?i)zero checkpoint saved\s+(?P<path>\S+)"), _SAVED, "deepspeed"),
    (compile_linear(r"(?i)saving model checkpoint:\s*(?P<path>\S+)"), _STARTED, "deepspeed"),
    (compile_linear(r"(?i)\[torch\]\s+sav(?:ing|ed)\s"), _IGNORED, "deepspeed"),
    # fairseq
    (
        compile_linear(
            r"(?i)saved checkpoint\s+(?P<path>\S+)\s+\(epoch\s+\d+\s*@\s*(?P<step>\d+)\s+updates"
        ),
        _SAVED,
        "fairseq",
    ),
    (
        compile_linear(
            r"(?i)preparing to save checkpoint for epoch\s+\d+\s*@\s*(?P<step>\d+)\s+updates"
        ),
        _STARTED,
        "fairseq",
    ),
    # NeMo asynchronous saves
    (
        compile_linear(
            r"(?i)async checkpoint save for step\s+(?P<step>\d+)\s+\((?P<path>[^)]*)\)\s*"
            r"finalized successfully"
        ),
        _SAVED,
        "nemo",
    ),
    (
        compile_linear(r"(?i)scheduled async checkpoint save for\s+(?P<path>\S+)"),
        _STARTED,
        "nemo",
    ),
    # Lightning's ModelCheckpoint prints this just before a synchronous save and nothing after,
    # so it is the only evidence of the save there is.
    (
        compile_linear(
            r"(?i)epoch\s+\d+,\s*global step\s+(?P<step>\d+):.*saving model to\s+['\"]?"
            r"(?P<path>[^'\"\s]+)"
        ),
        _SAVED,
        "lightning",
    ),
    # Hugging Face Trainer: logged as the save begins, with no line after it.
    (
        compile_linear(r"(?i)saving model checkpoint to\s+(?P<path>\S+)"),
        _SAVED,
        "huggingface",
    ),
    # Plain wording. "Saving checkpoint ..." counts as a save here: an unknown framework gives
    # no later line to wait for.
    (
        compile_linear(
            r"(?i)(?:^|[^\w])(?:checkpoint|ckpt)s?\s+(?:(?:was|is|has|have|been|successfully)\s+)*"
            r"(?:saved|written|stored|persisted)(?:[^\w]|$)"
        ),
        _SAVED,
        "generic",
    ),
    (
        compile_linear(
            r"(?i)(?:^|[^\w])(?:successfully\s+)?(?:saved|wrote|written|stored|saving|writing)\s+"
            r"(?:(?:the|a|new|model|best|last|latest|final|distributed|sharded)\s+)*"
            r"(?:checkpoint|ckpt)"
        ),
        _SAVED,
        "generic",
    ),
)

_CHECKPOINT_STEP_IN_TEXT = compile_linear(
    r"(?i)(?:global[_ ]?step|step|iteration|iter)s?[\s:=_#-]*(?P<value>\d+)"
)
_CHECKPOINT_STEP_IN_DIRNAME = compile_linear(r"(?i)checkpoint[-_](?P<value>\d+)(?:[^\w]|$)")
_CHECKPOINT_PATH_IN_TEXT = compile_linear(
    r"(?i)(?P<path>[~.\w-]*/[^\s'\",;\]]*|[\w.-]+\.(?:pt|pth|ckpt|bin|safetensors|distcp|nemo|pkl))"
)


# ---------------------------------------------------------------------------------------------


def _to_float(text: str | None) -> float | None:
    if text is None:
        return None
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return None


def _to_int(text: str | None) -> int | None:
    # Steps may arrive as "3199.0" or "3.2e+4" (NeMo logs global_step as a float).
    value = _to_float(text)
    if value is None or not math.isfinite(value):
        return None
    return int(value)


def _search_value(pattern: CompiledPattern, text: str, group: str = "value") -> str | None:
    match = pattern.search(text)
    return match.group(group) if match else None


def _loss(text: str) -> float | None:
    return _to_float(_search_value(_LOSS, text, "loss"))


def _epoch(text: str) -> int | None:
    return _to_int(_search_value(_EPOCH, text))


def _step_time_seconds(text: str) -> float | None:
    match = _STEP_TIME.search(text)
    if not match:
        return None
    value = _to_float(match.group("value"))
    if value is None:
        return None
    unit = match.group("unit_in") or match.group("unit_paren") or match.group("unit_after") or "s"
    return value / 1000.0 if unit.lower() == "ms" else value


def _throughput(text: str) -> tuple[float | None, str | None]:
    """The best throughput figure in ``text``: samples, then tokens, then iterations a second."""
    for pattern, unit in (
        (_SAMPLES_RATE, "samples/s"),
        (_SAMPLES_RATE_AFTER, "samples/s"),
        (_TOKENS_RATE, "tokens/s"),
        (_TOKENS_RATE_AFTER, "tokens/s"),
    ):
        value = _to_float(_search_value(pattern, text))
        if value is not None:
            return value, unit
    rate, _ = _tqdm_rate(text)
    if rate is not None:
        return rate
    return None, None


def _tqdm_rate(text: str) -> tuple[tuple[float | None, str | None] | None, float | None]:
    """tqdm's rate as (throughput, unit) and the seconds per iteration it implies."""
    match = _RATE.search(text)
    if not match:
        return None, None
    value = _to_float(match.group("value"))
    unit = match.group("unit").lower()
    if value is None or value <= 0:
        return None, None
    if unit.startswith("s/"):
        # "1.17s/it": tqdm flips the unit when one iteration takes more than a second.
        per_second = 1.0 / value
        name = unit[2:]
        step_seconds = value if name == "it" else None
    else:
        per_second = value
        name = unit[:-2]
        step_seconds = 1.0 / value if name == "it" else None
    units = {
        "it": "it/s",
        "ba": "it/s",
        "samples": "samples/s",
        "sample": "samples/s",
        "ex": "samples/s",
        "examples": "samples/s",
        "tokens": "tokens/s",
        "tok": "tokens/s",
    }
    return (per_second, units.get(name, f"{name}/s")), step_seconds


# ---------------------------------------------------------------------------------------------
# Built-in recognisers: each returns a Progress or None.


def _megatron(message: str) -> Progress | None:
    match = _MEGATRON.search(message)
    if not match:
        return None
    step_time = _step_time_seconds(message)
    throughput, unit = None, None
    explicit = _to_float(_search_value(_SAMPLES_RATE, message))  # Megatron-DeepSpeed prints it
    batch = _to_int(_search_value(_GLOBAL_BATCH_SIZE, message))
    if explicit is not None:
        throughput, unit = explicit, "samples/s"
    elif batch and step_time:
        # Megatron prints no sample rate, but the global batch per iteration time is exactly it.
        throughput, unit = batch / step_time, "samples/s"
    else:
        tflops = _to_float(_search_value(_TFLOPS_PER_GPU, message))
        if tflops is not None:
            throughput, unit = tflops, "TFLOP/s/GPU"
    return Progress(
        step=int(match.group("step")),
        total_steps=int(match.group("total")),
        loss=_loss(message),
        throughput=throughput,
        throughput_unit=unit,
        step_time_seconds=step_time,
        framework="megatron",
    )


def _nemo_log(message: str) -> Progress | None:
    match = _NEMO_LOG.search(message)
    if not match:
        return None
    global_step = _to_int(_search_value(_GLOBAL_STEP, message))
    step_time = _step_time_seconds(message)
    batch = _to_int(_search_value(_GLOBAL_BATCH_SIZE, message))
    throughput = batch / step_time if batch and step_time else None
    return Progress(
        step=global_step if global_step is not None else int(match.group("n")),
        total_steps=int(match.group("total")),
        loss=_loss(message),
        throughput=throughput,
        throughput_unit="samples/s" if throughput is not None else None,
        step_time_seconds=step_time,
        epoch=int(match.group("epoch")),
        framework="nemo",
    )


def _deepspeed(message: str) -> Progress | None:
    match = _DEEPSPEED_THROUGHPUT.search(message)
    if match:
        return Progress(
            step=int(match.group("step")),
            throughput=_to_float(match.group("current")),
            throughput_unit="samples/s",
            epoch=int(match.group("epoch")),
            framework="deepspeed",
        )
    match = _DEEPSPEED_PIPELINE.search(message)
    if match:
        throughput = _to_float(_search_value(_SAMPLES_RATE, message))
        return Progress(
            step=int(match.group("step")),
            loss=_to_float(match.group("loss")),
            throughput=throughput,
            throughput_unit="samples/s" if throughput is not None else None,
            step_time_seconds=_step_time_seconds(message),
            framework="deepspeed",
        )
    match = _DEEPSPEED_STEP.search(message)
    if match:
        return Progress(step=int(match.group("step")), framework="deepspeed")
    return None


def _torchtitan(message: str) -> Progress | None:
    match = _TORCHTITAN.search(message)
    if not match:
        return None
    tokens = _to_float(_search_value(_TOKENS_RATE, message))
    return Progress(
        step=int(match.group("step")),
        loss=_to_float(match.group("loss")),
        throughput=tokens,
        throughput_unit="tokens/s" if tokens is not None else None,
        framework="torchtitan",
    )


def _fairseq(message: str) -> Progress | None:
    updates = _to_int(_search_value(_NUM_UPDATES, message))
    if updates is None or _FAIRSEQ_VALID.search(message):
        return None
    inner = _FAIRSEQ_INNER.search(message)
    shape = inner or _FAIRSEQ_SUMMARY.search(message)
    if shape is None and not _FAIRSEQ_JSON.search(message):
        return None
    tokens = _to_float(_search_value(_TOKENS_RATE, message))  # fairseq's wps counts tokens
    return Progress(
        step=updates,
        loss=_loss(message),
        throughput=tokens,
        throughput_unit="tokens/s" if tokens is not None else None,
        epoch=int(shape.group("epoch")) if shape else _epoch(message),
        framework="fairseq",
    )


def _llama_recipes(message: str) -> Progress | None:
    match = _LLAMA_RECIPES.search(message)
    if not match:
        return None
    throughput, unit = _throughput(message)
    _, step_time = _tqdm_rate(message)
    return Progress(
        step=int(match.group("step")),
        total_steps=int(match.group("total")),
        loss=_loss(message),
        throughput=throughput,
        throughput_unit=unit,
        step_time_seconds=step_time,
        epoch=int(match.group("epoch")),
        framework="llama-recipes",
    )


def _huggingface_log_dict(message: str) -> Progress | None:
    # The Trainer's own log dictionaries carry no step; only those that do are progress.
    match = _HF_LOG_DICT.search(message)
    if not match:
        return None
    throughput = _to_float(_search_value(_HF_SAMPLES_RATE, message))
    return Progress(
        step=int(match.group("step")),
        loss=_loss(message),
        throughput=throughput,
        throughput_unit="samples/s" if throughput is not None else None,
        epoch=_epoch(message),
        framework="huggingface",
    )


def _progress_bar(message: str) -> Progress | None:
    match = _TQDM_PERCENT.search(message) or _TQDM_NO_TOTAL.search(message)
    if not match:
        return _rich_bar(message)
    description = match.group("desc").strip().rstrip(":").strip()
    stats = match.group("stats") or ""
    if not description:
        # The Hugging Face Trainer's bar has no description at all. (Its evaluation bar has
        # none either; counted as progress it still shows the job is working.)
        framework = "huggingface"
    elif _OTHER_WORK_DESCRIPTION.search(description) or not _TRAINING_DESCRIPTION.search(
        description
    ):
        return None
    elif "epoch" in description.lower():
        framework = "nemo" if _NEMO_POSTFIX.search(stats) else "lightning"
    else:
        framework = "tqdm"
    global_step = _to_int(_search_value(_GLOBAL_STEP, stats))
    total = match.groupdict().get("total")
    rate, step_time = _tqdm_rate(stats)
    throughput, unit = rate if rate else (None, None)
    return Progress(
        step=global_step if global_step is not None else int(match.group("n")),
        total_steps=int(total) if total and total.isdigit() else None,
        loss=_loss(stats),
        throughput=throughput,
        throughput_unit=unit,
        step_time_seconds=_step_time_seconds(stats) or step_time,
        epoch=_epoch(description),
        framework=framework,
    )


def _rich_bar(message: str) -> Progress | None:
    match = _RICH_BAR.search(message)
    if not match:
        return None
    rate, step_time = _tqdm_rate(message)
    throughput, unit = rate if rate else (None, None)
    global_step = _to_int(_search_value(_GLOBAL_STEP, message))
    return Progress(
        step=global_step if global_step is not None else int(match.group("n")),
        total_steps=int(match.group("total")),
        loss=_loss(message),
        throughput=throughput,
        throughput_unit=unit,
        step_time_seconds=step_time,
        epoch=int(match.group("epoch")),
        framework="lightning",
    )


def _generic(message: str) -> Progress | None:
    match = _GENERIC.search(message)
    if not match:
        return None
    total = match.group("total")
    throughput, unit = _throughput(message)
    _, seconds_per_iteration = _tqdm_rate(message)
    return Progress(
        step=int(match.group("step")),
        total_steps=int(total) if total else None,
        loss=_loss(message),
        throughput=throughput,
        throughput_unit=unit,
        step_time_seconds=_step_time_seconds(message) or seconds_per_iteration,
        epoch=_epoch(message),
        framework="generic",
    )


# Most specific shapes first: a Megatron or NeMo line also contains a plain "iteration N".
_BUILT_IN_PROGRESS = (
    _nemo_log,
    _megatron,
    _deepspeed,
    _torchtitan,
    _fairseq,
    _llama_recipes,
    _huggingface_log_dict,
    _progress_bar,
    _generic,
)


def _compile_override(
    pattern: str, allowed: frozenset[str], required: str | None
) -> CompiledPattern:
    compiled = compile_linear(pattern)
    names = set(compiled.groupindex)
    if required and required not in names:
        raise PatternError(
            f"The pattern needs a named group (?P<{required}>...) that captures the step number."
        )
    unknown = sorted(names - allowed)
    if unknown:
        raise PatternError(
            f"Unknown named group(s) {', '.join(unknown)}; allowed: {', '.join(sorted(allowed))}."
        )
    return compiled


class ProgressParser:
    """Reads progress and checkpoint lines, trying per-policy patterns before the built-ins.

    A progress override must capture ``step`` and may capture ``loss``, ``throughput`` and
    ``total``; a checkpoint override may capture ``step`` and ``path``. Anything else raises
    ``PatternError`` when the parser is built, so a bad policy fails when it is saved, not
    silently on a live log.
    """

    def __init__(
        self, progress_patterns: Sequence[str] = (), checkpoint_patterns: Sequence[str] = ()
    ) -> None:
        self._progress_patterns = tuple(progress_patterns)
        self._checkpoint_patterns = tuple(checkpoint_patterns)
        self._progress_overrides = [
            _compile_override(pattern, _PROGRESS_OVERRIDE_GROUPS, "step")
            for pattern in self._progress_patterns
        ]
        self._checkpoint_overrides = [
            _compile_override(pattern, _CHECKPOINT_OVERRIDE_GROUPS, None)
            for pattern in self._checkpoint_patterns
        ]

    @property
    def progress_hints(self) -> tuple[str, ...]:
        """Pre-filter patterns covering every line ``parse_progress`` can accept."""
        return (PROGRESS_HINT, *self._progress_patterns)

    @property
    def checkpoint_hints(self) -> tuple[str, ...]:
        """Pre-filter patterns covering every line the checkpoint parsers can accept."""
        return (CHECKPOINT_HINT, *self._checkpoint_patterns)

    def parse_progress(self, message: str) -> Progress | None:
        if self._classify_checkpoint(message) is not None:
            return None
        for compiled in self._progress_overrides:
            match = compiled.search(message)
            if match is None:
                continue
            step = _to_int(match.group("step"))
            if step is None:
                continue
            groups = match.groupdict()
            return Progress(
                step=step,
                total_steps=_to_int(groups.get("total")),
                loss=_to_float(groups.get("loss")),
                throughput=_to_float(groups.get("throughput")),
                framework="custom",
            )
        if _NOT_PROGRESS.search(message):
            return None
        for recognise in _BUILT_IN_PROGRESS:
            progress = recognise(message)
            if progress is not None:
                return progress
        return None

    def parse_checkpoint(self, message: str) -> Checkpoint | None:
        """A finished checkpoint save, or None."""
        outcome = self._classify_checkpoint(message)
        return outcome[1] if outcome and outcome[0] == _SAVED else None

    def parse_checkpoint_started(self, message: str) -> Checkpoint | None:
        """A save that has begun and will be confirmed by a later line, or None."""
        outcome = self._classify_checkpoint(message)
        return outcome[1] if outcome and outcome[0] == _STARTED else None

    def _classify_checkpoint(self, message: str) -> tuple[str, Checkpoint] | None:
        for compiled in self._checkpoint_overrides:
            match = compiled.search(message)
            if match is not None:
                groups = match.groupdict()
                return _SAVED, Checkpoint(
                    step=_to_int(groups.get("step")),
                    path=_clean_path(groups.get("path")),
                    framework="custom",
                )
        if not _CHECKPOINT_HINT_COMPILED.search(message) or _CHECKPOINT_NEGATIVE.search(message):
            return None
        for compiled, outcome, framework in _CHECKPOINT_SHAPES:
            match = compiled.search(message)
            if match is None:
                continue
            if outcome == _IGNORED:
                return None
            groups = match.groupdict()
            path = _clean_path(groups.get("path")) or _path_in_text(message)
            step = _to_int(groups.get("step"))
            if step is None:
                step = _step_in_text(groups.get("tag") or message)
            return outcome, Checkpoint(step=step, path=path, framework=framework)
        return None


def _clean_path(path: str | None) -> str | None:
    if not path:
        return None
    cleaned = path.strip().strip("'\"").rstrip(".,;:)]'\"")
    return cleaned or None


def _path_in_text(message: str) -> str | None:
    return _clean_path(_search_value(_CHECKPOINT_PATH_IN_TEXT, message, "path"))


def _step_in_text(text: str) -> int | None:
    for pattern in (_CHECKPOINT_STEP_IN_TEXT, _CHECKPOINT_STEP_IN_DIRNAME):
        step = _to_int(_search_value(pattern, text))
        if step is not None:
            return step
    return None


_DEFAULT_PARSER = ProgressParser()


def parse_progress(message: str) -> Progress | None:
    """Built-in progress parsing, for callers without per-policy patterns."""
    return _DEFAULT_PARSER.parse_progress(message)


def parse_checkpoint(message: str) -> Checkpoint | None:
    """Built-in finished-checkpoint parsing, for callers without per-policy patterns."""
    return _DEFAULT_PARSER.parse_checkpoint(message)


def parse_checkpoint_started(message: str) -> Checkpoint | None:
    """Built-in started-checkpoint parsing, for callers without per-policy patterns."""
    return _DEFAULT_PARSER.parse_checkpoint_started(message)
