"""Checkpoint lines: which report a finished save, which a save begun, which are neither."""

from __future__ import annotations

from typing import TYPE_CHECKING

from recovery.detection.linear_regex import compile_linear
from recovery.detection.progress.fields import search_value, to_int
from recovery.detection.progress.records import CHECKPOINT_HINT, Checkpoint

if TYPE_CHECKING:
    from re2 import _Regexp as CompiledPattern

_CHECKPOINT_HINT_COMPILED = compile_linear(CHECKPOINT_HINT)

# Lines that mention a checkpoint without a save having happened: loads, resumes, failures,
# configuration keys, announcements of a future save.
_CHECKPOINT_NEGATIVE = compile_linear(
    r"(?i)(?:^|[^\w])(?:load(?:s|ing|ed)?|resum(?:e|es|ing|ed)|restor(?:e|es|ing|ed)|"
    r"fail(?:s|ed|ure)?|error|unable|could not|cannot|can't|not in top|no checkpoint|every|"
    r"will be|will save|skip(?:s|ping|ped)?)(?:[^\w]|$)"
    r"|(?:checkpoint|ckpt|save)s?[_ -]?(?:interval|every|freq(?:uency)?|steps|dir(?:ectory)?|"
    r"path|format|_?iters)['\"]?\s*[:=]"
)

STARTED = "started"
SAVED = "saved"
IGNORED = "ignored"

# (pattern, outcome, framework), tried in order; the first that matches decides. A save that the
# framework later confirms with its own line is "started" here, so that a job killed in the
# middle of a save is not credited with that checkpoint.
_CHECKPOINT_SHAPES: tuple[tuple[CompiledPattern[str], str, str], ...] = (
    (
        compile_linear(
            r"(?i)successfully saved checkpoint (?:from|at) iteration\s+(?P<step>\d+)\s+to\s+"
            r"(?P<path>\S+)"
        ),
        SAVED,
        "megatron",
    ),
    (
        compile_linear(r"(?i)saving checkpoint at iteration\s+(?P<step>\d+)\s+to\s+(?P<path>\S+)"),
        STARTED,
        "megatron",
    ),
    # torchtitan; with async checkpointing "finished" means staged, which is what it reports.
    (compile_linear(r"(?i)finished saving the checkpoint"), SAVED, "torchtitan"),
    (compile_linear(r"(?i)(?:^|[^\w])saving the checkpoint"), STARTED, "torchtitan"),
    # DeepSpeed: "Saving model checkpoint: PATH" opens the save, "[Torch] Checkpoint TAG is ready
    # now!" commits it; "zero checkpoint saved PATH" ends the ZeRO optimizer part. Per-file
    # "[Torch] Saving/Saved FILE" lines are neither.
    (
        compile_linear(r"(?i)checkpoint\s+(?P<tag>\S+)\s+is ready now"),
        SAVED,
        "deepspeed",
    ),
    (compile_linear(r"(?i)zero checkpoint saved\s+(?P<path>\S+)"), SAVED, "deepspeed"),
    (compile_linear(r"(?i)saving model checkpoint:\s*(?P<path>\S+)"), STARTED, "deepspeed"),
    (compile_linear(r"(?i)\[torch\]\s+sav(?:ing|ed)\s"), IGNORED, "deepspeed"),
    # fairseq
    (
        compile_linear(
            r"(?i)saved checkpoint\s+(?P<path>\S+)\s+\(epoch\s+\d+\s*@\s*(?P<step>\d+)\s+updates"
        ),
        SAVED,
        "fairseq",
    ),
    (
        compile_linear(
            r"(?i)preparing to save checkpoint for epoch\s+\d+\s*@\s*(?P<step>\d+)\s+updates"
        ),
        STARTED,
        "fairseq",
    ),
    # NeMo asynchronous saves
    (
        compile_linear(
            r"(?i)async checkpoint save for step\s+(?P<step>\d+)\s+\((?P<path>[^)]*)\)\s*"
            r"finalized successfully"
        ),
        SAVED,
        "nemo",
    ),
    (
        compile_linear(r"(?i)scheduled async checkpoint save for\s+(?P<path>\S+)"),
        STARTED,
        "nemo",
    ),
    # Lightning's ModelCheckpoint prints this just before a synchronous save and nothing after,
    # so it is the only evidence of the save there is.
    (
        compile_linear(
            r"(?i)epoch\s+\d+,\s*global step\s+(?P<step>\d+):.*saving model to\s+['\"]?"
            r"(?P<path>[^'\"\s]+)"
        ),
        SAVED,
        "lightning",
    ),
    # Hugging Face Trainer: logged as the save begins, with no line after it.
    (
        compile_linear(r"(?i)saving model checkpoint to\s+(?P<path>\S+)"),
        SAVED,
        "huggingface",
    ),
    # Plain wording. "Saving checkpoint ..." counts as a save here: an unknown framework gives
    # no later line to wait for.
    (
        compile_linear(
            r"(?i)(?:^|[^\w])(?:checkpoint|ckpt)s?\s+(?:(?:was|is|has|have|been|successfully)\s+)*"
            r"(?:saved|written|stored|persisted)(?:[^\w]|$)"
        ),
        SAVED,
        "generic",
    ),
    (
        compile_linear(
            r"(?i)(?:^|[^\w])(?:successfully\s+)?(?:saved|wrote|written|stored|saving|writing)\s+"
            r"(?:(?:the|a|new|model|best|last|latest|final|distributed|sharded)\s+)*"
            r"(?:checkpoint|ckpt)"
        ),
        SAVED,
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


def clean_path(path: str | None) -> str | None:
    if not path:
        return None
    cleaned = path.strip().strip("'\"").rstrip(".,;:)]'\"")
    return cleaned or None


def _path_in_text(message: str) -> str | None:
    return clean_path(search_value(_CHECKPOINT_PATH_IN_TEXT, message, "path"))


def _step_in_text(text: str) -> int | None:
    for pattern in (_CHECKPOINT_STEP_IN_TEXT, _CHECKPOINT_STEP_IN_DIRNAME):
        step = to_int(search_value(pattern, text))
        if step is not None:
            return step
    return None


def classify_builtin_checkpoint(message: str) -> tuple[str, Checkpoint] | None:
    """(outcome, checkpoint) for a line the built-in shapes recognise, else None."""
    if not _CHECKPOINT_HINT_COMPILED.search(message) or _CHECKPOINT_NEGATIVE.search(message):
        return None
    for compiled, outcome, framework in _CHECKPOINT_SHAPES:
        match = compiled.search(message)
        if match is None:
            continue
        if outcome == IGNORED:
            return None
        groups = match.groupdict()
        path = clean_path(groups.get("path")) or _path_in_text(message)
        step = to_int(groups.get("step"))
        if step is None:
            step = _step_in_text(groups.get("tag") or message)
        return outcome, Checkpoint(step=step, path=path, framework=framework)
    return None
