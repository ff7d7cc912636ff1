"""The progress lines of each framework, recognised one message at a time."""

from __future__ import annotations

from recovery.detection.linear_regex import compile_linear
from recovery.detection.progress.fields import (
    GLOBAL_BATCH_SIZE,
    GLOBAL_STEP,
    LOSS_VALUE,
    NUM,
    SAMPLES_RATE,
    TFLOPS_PER_GPU,
    TOKENS_RATE,
    read_epoch,
    read_loss,
    read_step_time,
    read_throughput,
    read_tqdm_rate,
    search_value,
    to_float,
    to_int,
)
from recovery.detection.progress.records import Progress

# A line that names a checkpoint, a resume or an NCCL log is never a built-in progress line,
# even when it carries a step number ("loading checkpoint at iteration 2000").
NOT_PROGRESS = compile_linear(r"(?i)checkpoint|ckpt|resum|restor|nccl (?:info|warn)")

_MEGATRON = compile_linear(r"(?i)(?:^|[\s\]|])iteration\s+(?P<step>\d+)\s*/\s*(?P<total>\d+)\s*\|")
_NEMO_LOG = compile_linear(
    r"(?i)training epoch\s+(?P<epoch>\d+),\s*iteration\s+(?P<n>\d+)\s*/\s*(?P<total>\d+)"
)
_DEEPSPEED_PIPELINE = compile_linear(
    rf"(?i)(?:^|[^\w])steps:\s*(?P<step>\d+)\s+loss:\s*(?P<loss>{LOSS_VALUE})"
)
_DEEPSPEED_STEP = compile_linear(r"(?i)(?:^|[^\w])step=(?P<step>\d+),\s*skipped=\d+,\s*lr=")
_DEEPSPEED_THROUGHPUT = compile_linear(
    r"(?i)epoch=(?P<epoch>\d+)/micro_step=\d+/global_step=(?P<step>\d+),\s*"
    rf"RunningAvgSamplesPerSec=(?P<average>{NUM}),\s*CurrSamplesPerSec=(?P<current>{NUM})"
)
_TORCHTITAN = compile_linear(
    rf"(?i)(?:^|[^\w])step:\s*(?P<step>\d+)\s+loss:\s*(?P<loss>{LOSS_VALUE})\s.*"
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
_HF_SAMPLES_RATE = compile_linear(rf"(?i)['\"]train_samples_per_second['\"]\s*:\s*(?P<value>{NUM})")

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

_EPOCH_COUNTER = compile_linear(
    r"(?i)(?:^|[\s|\]])(?:train(?:ing)?\s+)?epoch:?\s*\[?\s*(?P<epoch>\d+)\s*\]?\s*"
    r"\[\s*(?P<n>\d+)\s*/\s*(?P<total>\d+)\s*(?:\(\s*\d+(?:\.\d+)?%\))?\s*\]"
)

# Plain lines. The keyword must start the message or follow a separator, an epoch number,
# "train"/"training"/"global" or a log level, so that "Total optimization steps = 1,000",
# "max_steps=1000", "--train-iters 250000" or "Starting training step on epoch 3" are not read as
# progress. The number must end there: "1,000" and "1.5" are not steps.
_GENERIC = compile_linear(
    r"(?i)(?:^|[|,;:\[\(\]>*#]|\s-|\s=|epoch\s*\[?\d+(?:\s*/\s*\d+)?\]?|info|debug)\s*"
    r"(?:train(?:ing)?\s+|global[ _])?(?:step|iter(?:ation)?)s?\s*[:=#]?\s*\[?\s*"
    r"(?P<step>\d+)(?:\s*(?:/|of)\s*(?P<total>\d+))?\s*\]?(?:$|[^\w.,]|[.,](?:\s|$))"
)


# Built-in recognisers: each returns a Progress or None.


def _megatron(message: str) -> Progress | None:
    match = _MEGATRON.search(message)
    if not match:
        return None
    step_time = read_step_time(message)
    throughput, unit = None, None
    explicit = to_float(search_value(SAMPLES_RATE, message))  # Megatron-DeepSpeed prints it
    batch = to_int(search_value(GLOBAL_BATCH_SIZE, message))
    if explicit is not None:
        throughput, unit = explicit, "samples/s"
    elif batch and step_time:
        # Megatron prints no sample rate, but the global batch per iteration time is exactly it.
        throughput, unit = batch / step_time, "samples/s"
    else:
        tflops = to_float(search_value(TFLOPS_PER_GPU, message))
        if tflops is not None:
            throughput, unit = tflops, "TFLOP/s/GPU"
    return Progress(
        step=int(match.group("step")),
        total_steps=int(match.group("total")),
        loss=read_loss(message),
        throughput=throughput,
        throughput_unit=unit,
        step_time_seconds=step_time,
        framework="megatron",
    )


def _nemo_log(message: str) -> Progress | None:
    match = _NEMO_LOG.search(message)
    if not match:
        return None
    global_step = to_int(search_value(GLOBAL_STEP, message))
    step_time = read_step_time(message)
    batch = to_int(search_value(GLOBAL_BATCH_SIZE, message))
    throughput = batch / step_time if batch and step_time else None
    return Progress(
        step=global_step if global_step is not None else int(match.group("n")),
        total_steps=int(match.group("total")),
        loss=read_loss(message),
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
            throughput=to_float(match.group("current")),
            throughput_unit="samples/s",
            epoch=int(match.group("epoch")),
            framework="deepspeed",
        )
    match = _DEEPSPEED_PIPELINE.search(message)
    if match:
        throughput = to_float(search_value(SAMPLES_RATE, message))
        return Progress(
            step=int(match.group("step")),
            loss=to_float(match.group("loss")),
            throughput=throughput,
            throughput_unit="samples/s" if throughput is not None else None,
            step_time_seconds=read_step_time(message),
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
    tokens = to_float(search_value(TOKENS_RATE, message))
    return Progress(
        step=int(match.group("step")),
        loss=to_float(match.group("loss")),
        throughput=tokens,
        throughput_unit="tokens/s" if tokens is not None else None,
        framework="torchtitan",
    )


def _fairseq(message: str) -> Progress | None:
    updates = to_int(search_value(_NUM_UPDATES, message))
    if updates is None or _FAIRSEQ_VALID.search(message):
        return None
    inner = _FAIRSEQ_INNER.search(message)
    shape = inner or _FAIRSEQ_SUMMARY.search(message)
    if shape is None and not _FAIRSEQ_JSON.search(message):
        return None
    tokens = to_float(search_value(TOKENS_RATE, message))  # fairseq's wps counts tokens
    return Progress(
        step=updates,
        loss=read_loss(message),
        throughput=tokens,
        throughput_unit="tokens/s" if tokens is not None else None,
        epoch=int(shape.group("epoch")) if shape else read_epoch(message),
        framework="fairseq",
    )


def _llama_recipes(message: str) -> Progress | None:
    match = _LLAMA_RECIPES.search(message)
    if not match:
        return None
    throughput, unit = read_throughput(message)
    _, step_time = read_tqdm_rate(message)
    return Progress(
        step=int(match.group("step")),
        total_steps=int(match.group("total")),
        loss=read_loss(message),
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
    throughput = to_float(search_value(_HF_SAMPLES_RATE, message))
    return Progress(
        step=int(match.group("step")),
        loss=read_loss(message),
        throughput=throughput,
        throughput_unit="samples/s" if throughput is not None else None,
        epoch=read_epoch(message),
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
    global_step = to_int(search_value(GLOBAL_STEP, stats))
    total = match.groupdict().get("total")
    rate, step_time = read_tqdm_rate(stats)
    throughput, unit = rate if rate else (None, None)
    return Progress(
        step=global_step if global_step is not None else int(match.group("n")),
        total_steps=int(total) if total and total.isdigit() else None,
        loss=read_loss(stats),
        throughput=throughput,
        throughput_unit=unit,
        step_time_seconds=read_step_time(stats) or step_time,
        epoch=read_epoch(description),
        framework=framework,
    )


def _rich_bar(message: str) -> Progress | None:
    match = _RICH_BAR.search(message)
    if not match:
        return None
    rate, step_time = read_tqdm_rate(message)
    throughput, unit = rate if rate else (None, None)
    global_step = to_int(search_value(GLOBAL_STEP, message))
    return Progress(
        step=global_step if global_step is not None else int(match.group("n")),
        total_steps=int(match.group("total")),
        loss=read_loss(message),
        throughput=throughput,
        throughput_unit=unit,
        step_time_seconds=step_time,
        epoch=int(match.group("epoch")),
        framework="lightning",
    )


def _epoch_counter(message: str) -> Progress | None:
    """PyTorch's examples and the many scripts built on them count within an epoch:
    "Train Epoch: 2 [3200/5000 (64%)]  Loss: 0.003" (samples) or "Epoch: [3][ 120/5005]"
    (batches). The counter starts again each epoch, so the step is the epoch's start plus it."""
    match = _EPOCH_COUNTER.search(message)
    if not match:
        return None
    epoch, counted, total = (int(match.group(name)) for name in ("epoch", "n", "total"))
    if total <= 0 or counted > total:
        return None
    return Progress(
        step=epoch * total + counted,
        loss=read_loss(message),
        epoch=epoch,
        framework="epoch-counter",
    )


def _generic(message: str) -> Progress | None:
    match = _GENERIC.search(message)
    if not match:
        return None
    total = match.group("total")
    throughput, unit = read_throughput(message)
    _, seconds_per_iteration = read_tqdm_rate(message)
    return Progress(
        step=int(match.group("step")),
        total_steps=int(total) if total else None,
        loss=read_loss(message),
        throughput=throughput,
        throughput_unit=unit,
        step_time_seconds=read_step_time(message) or seconds_per_iteration,
        epoch=read_epoch(message),
        framework="generic",
    )


# Most specific shapes first: a Megatron or NeMo line also contains a plain "iteration N".
BUILT_IN_PROGRESS = (
    _nemo_log,
    _megatron,
    _deepspeed,
    _torchtitan,
    _fairseq,
    _llama_recipes,
    _huggingface_log_dict,
    _progress_bar,
    _epoch_counter,
    _generic,
)

# Text without which a recogniser's patterns cannot match (in an ASCII message, lower-cased
# for the case-insensitive ones): a recogniser is skipped when none of its words is there.
# Each search costs microseconds and every progress line of every job is read; most lines
# match the first or second recogniser that may apply.
_NEEDS: dict[object, tuple[tuple[str, ...], tuple[str, ...]]] = {
    # (lower-cased words, words as written)
    _nemo_log: (("training epoch",), ()),
    _megatron: (("iteration",), ()),
    _deepspeed: (("step",), ()),
    _torchtitan: (("step:",), ()),
    _fairseq: (("num_updates",), ()),
    _llama_recipes: (("training epoch:",), ()),
    _huggingface_log_dict: ((), ("step",)),
    _progress_bar: (("epoch",), ("%", "[")),
    _epoch_counter: (("epoch",), ()),
    _generic: (("step", "iter"), ()),
}


def recognise_progress(message: str) -> Progress | None:
    """The first built-in recogniser's reading of ``message``, or None."""
    if not message.isascii():
        # Case-insensitive matching folds some non-ASCII letters (the Kelvin sign, the long
        # s) onto ASCII ones that lower() leaves alone: no shortcut.
        for recognise in BUILT_IN_PROGRESS:
            progress = recognise(message)
            if progress is not None:
                return progress
        return None
    lower = message.lower()
    for recognise in BUILT_IN_PROGRESS:
        folded, exact = _NEEDS[recognise]
        if not any(word in lower for word in folded) and not any(word in message for word in exact):
            continue
        progress = recognise(message)
        if progress is not None:
            return progress
    return None
