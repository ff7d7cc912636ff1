"""CUDA's error codes: what each means, whichever library wrapped it and however it phrased it.

The CUDA runtime (``cudaError_t``, ``cudaErrorIllegalAddress``) and driver (``CUresult``,
``CUDA_ERROR_ILLEGAL_ADDRESS``) name every error, and ``cudaGetErrorString`` gives each one
fixed sentence ("an illegal memory access was encountered"). PyTorch prints "CUDA error: " and
the sentence; JAX/XLA, TensorFlow, dlib, CuPy and custom extensions print the name, the
sentence or both in their own wrappers. This table maps the names and the distinctive sentences
to the design's taxonomy, from the CUDA Runtime and Driver API references. Sentences as generic
as "invalid argument" or "out of memory" are matched only through a name beside them.
"""

from __future__ import annotations

from dataclasses import dataclass

from recovery.detection.linear_regex import compile_linear, escape_literal
from recovery.detection.taxonomy import Attribution, FailureCategory


@dataclass(frozen=True)
class CudaErrorMeaning:
    category: FailureCategory
    attribution: Attribution
    description: str
    # The runtime's and the driver's names, and the distinctive sentence if it has one.
    names: tuple[str, ...]
    sentence: str = ""


_OOM = (FailureCategory.GPU_OOM, Attribution.APPLICATION)
_HARDWARE = (FailureCategory.GPU_HARDWARE, Attribution.HARDWARE)
_KERNEL = (FailureCategory.CUDA_ERROR_APP, Attribution.UNKNOWN)
_PROGRAM = (FailureCategory.CUDA_ERROR_APP, Attribution.APPLICATION)
_INSTALLATION = (FailureCategory.CUDA_ERROR_APP, Attribution.SYSTEM_SOFTWARE)

CUDA_ERRORS: tuple[CudaErrorMeaning, ...] = (
    CudaErrorMeaning(
        *_OOM,
        "the GPU's memory is exhausted",
        ("cudaErrorMemoryAllocation", "CUDA_ERROR_OUT_OF_MEMORY"),
    ),
    CudaErrorMeaning(
        *_HARDWARE,
        "uncorrectable ECC error in the GPU's memory",
        ("cudaErrorECCUncorrectable", "CUDA_ERROR_ECC_UNCORRECTABLE"),
        "uncorrectable ECC error encountered",
    ),
    CudaErrorMeaning(
        *_HARDWARE,
        "the GPU's hardware stack failed",
        ("cudaErrorHardwareStackError", "CUDA_ERROR_HARDWARE_STACK_ERROR"),
    ),
    CudaErrorMeaning(
        *_HARDWARE,
        "uncorrectable NVLink error",
        ("cudaErrorNvlinkUncorrectable", "CUDA_ERROR_NVLINK_UNCORRECTABLE"),
        "uncorrectable NVLink error",
    ),
    CudaErrorMeaning(
        *_KERNEL,
        "a kernel read or wrote memory it does not own",
        ("cudaErrorIllegalAddress", "CUDA_ERROR_ILLEGAL_ADDRESS"),
        "an illegal memory access was encountered",
    ),
    CudaErrorMeaning(
        *_KERNEL,
        "a kernel executed an illegal instruction",
        ("cudaErrorIllegalInstruction", "CUDA_ERROR_ILLEGAL_INSTRUCTION"),
        "an illegal instruction was encountered",
    ),
    CudaErrorMeaning(
        *_KERNEL,
        "a kernel accessed a misaligned address",
        ("cudaErrorMisalignedAddress", "CUDA_ERROR_MISALIGNED_ADDRESS"),
        "misaligned address",
    ),
    CudaErrorMeaning(
        *_KERNEL,
        "a kernel jumped to an invalid program counter",
        ("cudaErrorInvalidPc", "CUDA_ERROR_INVALID_PC"),
        "invalid program counter",
    ),
    CudaErrorMeaning(
        *_KERNEL,
        "a kernel failed without a more precise reason",
        ("cudaErrorLaunchFailure", "CUDA_ERROR_LAUNCH_FAILED"),
        "unspecified launch failure",
    ),
    CudaErrorMeaning(
        *_KERNEL,
        "a kernel ran longer than the display watchdog allows",
        ("cudaErrorLaunchTimeout", "CUDA_ERROR_LAUNCH_TIMEOUT"),
        "the launch timed out and was terminated",
    ),
    CudaErrorMeaning(
        *_KERNEL,
        "a kernel asked for more registers or shared memory than the GPU has",
        ("cudaErrorLaunchOutOfResources", "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES"),
        "too many resources requested for launch",
    ),
    CudaErrorMeaning(
        *_PROGRAM,
        "a device-side assertion of the program failed",
        ("cudaErrorAssert", "CUDA_ERROR_ASSERT"),
        "device-side assert triggered",
    ),
    CudaErrorMeaning(
        *_KERNEL,
        "the binary has no kernel for this GPU's architecture",
        ("cudaErrorNoKernelImageForDevice", "CUDA_ERROR_NO_BINARY_FOR_GPU"),
        "no kernel image is available for execution on the device",
    ),
    CudaErrorMeaning(
        *_KERNEL,
        "the kernel was not built for this GPU",
        ("cudaErrorInvalidDeviceFunction",),
        "invalid device function",
    ),
    CudaErrorMeaning(
        *_INSTALLATION,
        "no usable GPU is visible to the process",
        ("cudaErrorNoDevice", "CUDA_ERROR_NO_DEVICE"),
        "no CUDA-capable device is detected",
    ),
    CudaErrorMeaning(
        *_INSTALLATION,
        "the driver is older than the CUDA runtime",
        (
            "cudaErrorInsufficientDriver",
            "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH",
            "CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE",
        ),
        "CUDA driver version is insufficient for CUDA runtime version",
    ),
    CudaErrorMeaning(
        *_INSTALLATION,
        "the GPU is in exclusive use or unavailable",
        ("cudaErrorDevicesUnavailable", "CUDA_ERROR_DEVICE_UNAVAILABLE"),
        "CUDA-capable device(s) is/are busy or unavailable",
    ),
)

_BY_NAME = {name: meaning for meaning in CUDA_ERRORS for name in meaning.names}
_BY_SENTENCE = {meaning.sentence: meaning for meaning in CUDA_ERRORS if meaning.sentence}


_NAME = compile_linear(r"\b(cudaError[A-Z][A-Za-z]+|CUDA_ERROR_[A-Z_]+)\b")
_SENTENCE = compile_linear("(" + "|".join(escape_literal(s) for s in sorted(_BY_SENTENCE)) + ")")
# Every name and sentence the table knows, for a signature's pattern.
PATTERN = (
    r"\b(?:"
    + "|".join(sorted(_BY_NAME))
    + r")\b|"
    + "|".join(escape_literal(sentence) for sentence in sorted(_BY_SENTENCE))
)


def cuda_error_meaning(message: str) -> CudaErrorMeaning | None:
    """The meaning of the CUDA error a line names, by name first, then by its sentence."""
    named = _NAME.search(message)
    if named is not None and named.group(1) in _BY_NAME:
        return _BY_NAME[named.group(1)]
    said = _SENTENCE.search(message)
    return _BY_SENTENCE.get(said.group(1)) if said is not None else None
