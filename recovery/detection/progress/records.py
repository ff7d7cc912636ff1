"""What the progress and checkpoint parsers return, and the pre-filters that pick their lines."""

from __future__ import annotations

from dataclasses import dataclass

# Cheap pre-filters the scanner runs over whole chunks to pick candidate lines. They may match
# more than the parsers accept, never less (a test checks every positive example). They use no
# capturing groups, lookaround, backreferences or \b, so both RE2 and Hyperscan compile them.
PROGRESS_HINT = (
    r"(?i)step|iter|num_updates|%\s*\||\[\d+:\d\d|\d/\d+\s+\d+:\d\d:\d\d"
    r"|epoch:?\s*\[?\d+\]?\s*\[\s*\d"
)
CHECKPOINT_HINT = r"(?i)checkpoint|ckpt|saving model|saved model"


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
