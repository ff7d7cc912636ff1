"""Signatures of the training program itself: losses that turn NaN or diverge, loss-scale
collapse, and Python exceptions and tracebacks.
"""

from __future__ import annotations

from recovery.detection.signatures.base import (
    GENERIC_EXCEPTION,
    NONFINITE_PROGRESS_VALUE,
    WRAPPER,
    Signature,
    define,
)
from recovery.detection.taxonomy import Attribution, FailureCategory, Severity

SIGNATURES: tuple[Signature, ...] = (
    define(
        "loss-nan",
        FailureCategory.NAN_DIVERGENCE,
        Attribution.APPLICATION,
        r"[Ll]oss (?:is|became|has become) (?:nan|NaN|NAN|inf|Inf|not finite|infinite)|"
        r"[Nn]a[Nn] loss|[Dd]etected (?:nan|NaN|inf|Inf)|"
        r"(?:nan|NaN|inf|Inf) (?:or inf )?(?:detected|found) in|returned nan values|"
        r"non-finite (?:loss|value)|Invalid loss, terminating training|"
        # TensorFlow's check_numerics ("LossTensor is inf or nan. : Tensor had NaN values").
        r"Tensor had (?:NaN|Inf) values|LossTensor is inf or nan|"
        r"= (?:nan|NaN|inf|-inf) is not finite",
        [
            "RuntimeError: Function 'MulBackward0' returned nan values in its 0th output.",
            "FloatingPointError: Loss became infinite or NaN at iteration=1200!",
            "ValueError: Loss is nan, stopping training",
        ],
        ["Infinity norm clipping enabled", "no nan detected so far"],
        description="A program saying its loss is not a number (an anomaly-mode exception, a "
        "trainer stopping on it): a failure at once.",
        printed_by='PyTorch\'s autograd anomaly mode ("Function ... returned nan values") and trainers that stop on a non-finite loss (detectron2, fairseq)',
    ),
    define(
        NONFINITE_PROGRESS_VALUE,
        FailureCategory.NAN_DIVERGENCE,
        Attribution.APPLICATION,
        # The field's name may be quoted or bracketed ("[Loss] nan") and its value a tensor.
        r"(?:[Ll]oss|LOSS|[Nn]orm)(?:['\"]|\])?\s{0,3}(?:[:=|]\s{0,3})?['\"]?(?:tensor\()?"
        r"[-+]?(?:nan|NaN|NAN|inf|Inf|INF)"
        r"(?:[^A-Za-z0-9]|$)|number of nan iterations:\s{0,8}[1-9]",
        [
            "loss scale: 1.0 | grad norm: nan |",
            " iteration      500/  250000 | lm loss: NaN | loss scale: 1.0 |",
            "{'loss': nan, 'grad_norm': nan, 'learning_rate': 4.9e-05, 'epoch': 0.3}",
            "number of skipped iterations:   0 | number of nan iterations:   3 |",
            "step: 120 loss: inf",
            "| E6 iter[ 14/ 15] | [Loss] nan | [step]   104 |",
            "Epoch 3, loss=tensor(nan, device='cuda:0', grad_fn=<AddBackward0>)",
        ],
        [
            "number of skipped iterations: 0 | number of nan iterations: 0",
            "lm loss: 2.504220E+00 | grad norm: 0.231",
            "Infinity norm clipping enabled",
            "loss: 2.3 inference time 0.4s",
            "loss info: see the wandb run",
            "grad norm informative: false",
        ],
        severity=Severity.WARNING,
        description="A progress line reporting a loss or gradient norm that is not a number. "
        "One is what a loss scaler skipping an overflowing fp16 step prints; the scanner makes "
        "it a failure when the loss stays non-finite for several steps in a row "
        "(LogScanner's nonfinite_steps, the policy's non-finite steps).",
        printed_by="training loops' progress lines (Megatron-LM, Hugging Face Trainer, mmengine, DeepSpeed)",
    ),
    define(
        "loss-scale-collapse",
        FailureCategory.NAN_DIVERGENCE,
        Attribution.APPLICATION,
        r"(?:Minimum loss scale reached|Current loss scale already at minimum|"
        r"cannot decrease scale anymore|setting loss scale to: 0\.0|"
        r"loss_scale[ =:]+0(?:\.0+)?(?:\s|\||,|$)|loss scale: 0\.0+(?:\s|\||$)|"
        r"FloatingPointError: )",
        [
            "2020-03-23 11:41:18 | INFO | fairseq.trainer | NOTE: overflow detected, setting loss scale to: 0.00048828125",
            "FloatingPointError: Minimum loss scale reached (0.0001). Your loss is probably exploding.",
            "Current loss scale already at minimum - cannot decrease scale anymore. Exiting run.",
            "epoch 002 | loss 9.803 | gnorm 55.005 | loss_scale 0 | train_wall 4512",
        ],
        [
            "[deepspeed] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: 65536, reducing to 32768",
            "NOTE: overflow detected, setting loss scale to: 64.0",
            "loss_scale 128 | train_wall 30",
        ],
    ),
    define(
        GENERIC_EXCEPTION,
        FailureCategory.APP_EXCEPTION,
        Attribution.APPLICATION,
        r"(?:[A-Z][A-Za-z0-9_]*Error|[A-Z][A-Za-z0-9_]*Exception|Exception)"
        # Ray names the exception it wraps ("RayTaskError(KeyError): ..."); TensorFlow 1 points
        # back at the traceback ("ResourceExhaustedError (see above for traceback): ...").
        r"(?:\([A-Za-z_][A-Za-z0-9_.]*\))?(?: \(see above for traceback\))?(?::\s|:$|$)",
        [
            "KeyError: 'input_ids'",
            "[rank15]: AssertionError: num_layers should be divisible by pipeline_model_parallel_size",
            "ValueError: Expected input batch_size (32) to match target batch_size (64).",
            "RuntimeError: Error(s) in loading state_dict for LlamaForCausalLM:",
            "torch._dynamo.exc.InternalTorchDynamoError: 'NoneType' object is not callable",
        ],
        [
            "ERROR:root:Evaluation skipped",
            "Using sdpa attention since ErrorCorrection is disabled",
            "TypeErrors are handled by the wrapper",
        ],
        severity=Severity.ERROR,
        description="The last line of a Python traceback: the exception that ended the run.",
    ),
    define(
        "torch-state-dict-mismatch",
        FailureCategory.APP_EXCEPTION,
        Attribution.APPLICATION,
        r"(?:Error\(s\) in loading state_dict for|size mismatch for \S+: copying a param with "
        r"shape|Missing key\(s\) in state_dict|Unexpected key\(s\) in state_dict)",
        [
            "Error(s) in loading state_dict for Linear:",
            "\tsize mismatch for weight: copying a param with shape torch.Size([0, 17]) from checkpoint, the shape in current model is torch.Size([1, 17]).",
            'Missing key(s) in state_dict: "model.embed_tokens.weight".',
        ],
        ["Loaded state_dict for Linear", "load_state_dict(strict=False)"],
        priority=62,
        description="A checkpoint that does not fit the model: a restart fails the same way.",
    ),
    define(
        "python-traceback",
        FailureCategory.APP_EXCEPTION,
        Attribution.APPLICATION,
        r"Traceback \(most recent call last\):",
        ["Traceback (most recent call last):", "[rank0]: Traceback (most recent call last):"],
        ["Print the traceback of the last call", "traceback : Signal 11 (SIGSEGV)"],
        role=WRAPPER,
        severity=Severity.ERROR,
        priority=8,
        description="A Python traceback whose exception line was not captured.",
    ),
    define(
        "loss-divergence-extra",
        FailureCategory.NAN_DIVERGENCE,
        Attribution.APPLICATION,
        r"(?:NaN in local grad norm|found NaN in|[Gg]rad(?:ient)?[_ ]norm (?:is|became) (?:nan|NaN|inf)|"
        r"[Ll]oss (?:spike|diverged|exploded)|training diverged)",
        [
            "Rerun state machine: found NaN in local grad norm in backward pass before data-parallel communication collective",
            "Gradient norm is nan at step 1200, aborting",
        ],
        ["grad norm: 0.98", "no NaN found in batch"],
        printed_by='Megatron-LM\'s rerun state machine ("found NaN in local grad norm") and trainers that stop on a diverging loss',
    ),
    define(
        "python-exception-ignored",
        FailureCategory.APP_EXCEPTION,
        Attribution.APPLICATION,
        r"(?:Exception ignored in|Error in atexit\._run_exitfuncs)",
        ["Exception ignored in: <function _MultiProcessingDataLoaderIter.__del__ at 0x7f>"],
        ["Exception raised from checkTimeout"],
        severity=Severity.WARNING,
        priority=5,
        description="Python reporting an exception it ignored, usually at shutdown: not a failure.",
        printed_by='CPython ("Exception ignored in", "Error in atexit._run_exitfuncs")',
    ),
    define(
        "cpp-uncaught-exception",
        FailureCategory.APP_EXCEPTION,
        Attribution.APPLICATION,
        r"(?:terminate called after throwing an instance of|in std::terminate\(\)|"
        r"terminate called without an active exception|__cxa_throw)",
        [
            "terminate called after throwing an instance of 'c10::Error'",
            '#4    Object "/usr/lib/x86_64-linux-gnu/libstdc++.so.6.0.28", at 0x7faf2b0773e6, in std::terminate()',
        ],
        ["std::terminate handler installed"],
        role=WRAPPER,
        severity=Severity.ERROR,
        # Above an abort (25): the abort is how an uncaught C++ exception ends a process; below
        # everything its what() line can name (an NCCL or CUDA error, std::bad_alloc).
        priority=26,
        description="A C++ exception nothing caught: std::terminate aborts the process.",
        printed_by="the C++ runtime (libstdc++'s verbose terminate handler) and backtraces "
        "through std::terminate/__cxa_throw",
    ),
    define(
        "hydra-job-failed",
        FailureCategory.APP_EXCEPTION,
        Attribution.APPLICATION,
        r"(?:Error executing job with overrides:|Error locating target '[^']*'|"
        r"Error in call to target '[^']*')",
        [
            "Error executing job with overrides: []",
            "Error locating target 'src.models.xxx_module.XXXLitModule', see chained exception above.",
        ],
        ["Executing job with overrides: [trainer.max_epochs=3]"],
        severity=Severity.ERROR,
        description="Hydra's report that the task function (or a config target) raised.",
        printed_by="Hydra (hydra/_internal/utils.py run_and_report, instantiate)",
    ),
    define(
        "runtime-panic",
        FailureCategory.APP_EXCEPTION,
        Attribution.APPLICATION,
        r"(?:thread '[^']{0,80}' panicked at|\bpanic: runtime error|goroutine \d+ \[running\]:|"
        r"fatal error: all goroutines are asleep)",
        [
            "thread '<unnamed>' panicked at 'called `Result::unwrap()` on an `Err` value', src/tokenizer.rs:12:5",
            "panic: runtime error: invalid memory address or nil pointer dereference",
        ],
        ["panic mode disabled", "no thread panicked"],
        severity=Severity.ERROR,
        description="A Rust or Go component of the program (tokenizers, data loaders, "
        "launchers) panicking: the program's own error.",
        printed_by="the Rust standard library's panic handler and the Go runtime",
    ),
)
