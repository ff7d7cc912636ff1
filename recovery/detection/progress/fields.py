"""Numbers and fields several frameworks print: loss, step time, batch size, epoch, throughput."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from recovery.detection.linear_regex import compile_linear

if TYPE_CHECKING:
    from re2 import _Regexp as CompiledPattern

NUM = r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?"
LOSS_VALUE = rf"(?:{NUM}|nan|inf)"

# "lm loss: 2.5E+00", "'loss': 1.23", "loss=9.44", "(loss: tensor(1.03, device='cuda:0'))",
# "train_loss=3.400", "reduced_train_loss: 8.6". The character before the key must not be a word
# character, so "nll_loss" and "val_loss" are not read as the training loss.
LOSS = compile_linear(
    r"(?i)(?:^|[^\w])['\"]?(?:lm[ _]|train[ _]|training[ _]|reduced_train_|avg[ _]|mean[ _])?"
    rf"loss(?:['\"]|\])?\s*[:=]?\s*['\"]?(?:tensor\()?(?P<loss>{LOSS_VALUE})"
)
# Megatron "elapsed time per iteration (ms): 86545.2", DeepSpeed "iter time (s): 0.5",
# NeMo "train_step_timing in s: 1.23", plain "step_time: 0.5".
STEP_TIME = compile_linear(
    r"(?i)(?:elapsed time per iteration|iter(?:ation)?[ _]time|step[ _]time|"
    r"time[ _]per[ _](?:step|iter(?:ation)?)|train_step_timing)"
    r"(?:\s+in\s+(?P<unit_in>ms|s))?\s*(?:\((?P<unit_paren>ms|s)\))?\s*[:=]\s*"
    rf"(?P<value>{NUM})(?:\s*(?P<unit_after>ms)(?:[^a-z]|$))?"
)
GLOBAL_BATCH_SIZE = compile_linear(r"(?i)global[ _]batch[ _]size\s*[:=]\s*(?P<value>\d+)")
GLOBAL_STEP = compile_linear(rf"(?i)(?:^|[^\w])global_step['\"]?\s*[:=]\s*(?P<value>{NUM})")
EPOCH = compile_linear(rf"(?i)(?:^|[^\w])['\"]?epoch['\"]?\s*[:=]?\s*\[?(?P<value>{NUM})")

# Throughput, most specific unit first: samples, then tokens, then iterations.
SAMPLES_RATE = compile_linear(
    r"(?i)(?:samples?[ _]?(?:per[ _]?)?sec(?:ond)?|samples?/s(?:ec)?)['\"]?\s*[:=]?\s*['\"]?"
    rf"(?P<value>{NUM})"
)
TOKENS_RATE = compile_linear(
    r"(?i)(?:^|[^\w])(?:tps|tgs|wps|tok/s|tokens?/s(?:ec)?|"
    r"tokens?[ _]per[ _](?:gpu[ _]per[ _])?sec(?:ond)?)['\"]?\s*(?:\([^)]*\))?\s*[:=]?\s*['\"]?"
    r"(?P<value>\d[\d,]*(?:\.\d+)?)"
)
TOKENS_RATE_AFTER = compile_linear(rf"(?i)(?P<value>{NUM})\s*(?:tokens?|tok)/s")
SAMPLES_RATE_AFTER = compile_linear(rf"(?i)(?P<value>{NUM})\s*(?:samples?|ex|examples)/s")
# tqdm's rate: "0.90it/s" or "1.17s/it" (slower than one iteration a second).
RATE = compile_linear(
    r"(?i)(?:^|[\s,])(?P<value>\d+(?:\.\d+)?)\s*(?P<unit>[a-z]+/s|s/[a-z]+)(?:[\s,\]]|$)"
)
TFLOPS_PER_GPU = compile_linear(rf"(?i)throughput per GPU \(TFLOP/s/GPU\):\s*(?P<value>{NUM})")


def to_float(text: str | None) -> float | None:
    if text is None:
        return None
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return None


def to_int(text: str | None) -> int | None:
    # Steps may arrive as "3199.0" or "3.2e+4" (NeMo logs global_step as a float).
    value = to_float(text)
    if value is None or not math.isfinite(value):
        return None
    return int(value)


def search_value(pattern: CompiledPattern[str], text: str, group: str = "value") -> str | None:
    match = pattern.search(text)
    return match.group(group) if match else None


def read_loss(text: str) -> float | None:
    return to_float(search_value(LOSS, text, "loss"))


def read_epoch(text: str) -> int | None:
    return to_int(search_value(EPOCH, text))


def read_step_time(text: str) -> float | None:
    match = STEP_TIME.search(text)
    if not match:
        return None
    value = to_float(match.group("value"))
    if value is None:
        return None
    unit = match.group("unit_in") or match.group("unit_paren") or match.group("unit_after") or "s"
    return value / 1000.0 if unit.lower() == "ms" else value


def read_throughput(text: str) -> tuple[float | None, str | None]:
    """The best throughput figure in ``text``: samples, then tokens, then iterations a second."""
    for pattern, unit in (
        (SAMPLES_RATE, "samples/s"),
        (SAMPLES_RATE_AFTER, "samples/s"),
        (TOKENS_RATE, "tokens/s"),
        (TOKENS_RATE_AFTER, "tokens/s"),
    ):
        value = to_float(search_value(pattern, text))
        if value is not None:
            return value, unit
    rate, _ = read_tqdm_rate(text)
    if rate is not None:
        return rate
    return None, None


def read_tqdm_rate(text: str) -> tuple[tuple[float | None, str | None] | None, float | None]:
    """tqdm's rate as (throughput, unit) and the seconds per iteration it implies."""
    match = RATE.search(text)
    if not match:
        return None, None
    value = to_float(match.group("value"))
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
