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

By topic: ``records`` (what parsing returns, and the pre-filters), ``fields`` (numbers and
fields shared by frameworks), ``formats`` (each framework's progress lines), ``checkpoints``,
and ``parser`` (``ProgressParser``, which tries per-policy patterns before the built-ins).
"""

from __future__ import annotations

from recovery.detection.progress.parser import (
    ProgressParser,
    parse_checkpoint,
    parse_checkpoint_started,
    parse_progress,
)
from recovery.detection.progress.records import CHECKPOINT_HINT, PROGRESS_HINT, Checkpoint, Progress

__all__ = (
    "CHECKPOINT_HINT",
    "PROGRESS_HINT",
    "Checkpoint",
    "Progress",
    "ProgressParser",
    "parse_checkpoint",
    "parse_checkpoint_started",
    "parse_progress",
)
