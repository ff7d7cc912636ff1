"""Lines that announce a quiet phase: a checkpoint save or an evaluation pass has begun.

Training goes quiet for these on purpose, for seconds to many minutes (a 70B model's
checkpoint, an eval pass over a held-out set). A job that announced one is busy, not stuck:
its silence is judged by the hang rules (with their checkpoint grace), never as the stall of an
error printed just before. Checkpoint starts are the progress parser's
(``parse_checkpoint_started``); evaluation starts are read here.
"""

from __future__ import annotations

from recovery.detection.linear_regex import compile_linear

CHECKPOINT = "checkpoint"
EVALUATION = "evaluation"

# The literal part every evaluation announcement has, for the scanner's multi-pattern engine.
EVALUATION_HINT = r"(?i)eval|validat|running prediction"
# Announcements as trainers print them: the Hugging Face Trainer's "***** Running Evaluation
# *****", "Running evaluation", "Starting validation", "Evaluating on the validation set...",
# Lightning's "Validation: 0it" / "Validation DataLoader 0:" bars, "[eval] begin".
_EVALUATION_START = compile_linear(
    r"(?i)^\*+ ?running (?:evaluation|validation|prediction)\b"
    r"|\b(?:running|starting|start|begin(?:ning)?|launching) (?:the |an? )?"
    r"(?:eval(?:uation)?|validation|validating)\b"
    r"|^(?:evaluating|validating|evaluation|validation)(?: on\b| at\b| of\b|\s?\.\.\.|:|$)"
    r"|^validation dataloader \d|^\[(?:eval|validation)\] (?:begin|start)"
)


def parse_evaluation_start(message: str) -> bool:
    """Whether ``message`` (a line with its prefixes peeled) says an evaluation pass begins."""
    return _EVALUATION_START.search(message[:300]) is not None
