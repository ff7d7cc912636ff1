"""Signatures of CUDA errors the application meets: device-side asserts, kernel errors, driver and
library mismatches, GPUs that are busy or missing, and running out of GPU memory.
"""

from __future__ import annotations

from recovery.detection.facts.cuda_errors import PATTERN as CUDA_ERROR_PATTERN
from recovery.detection.signatures.base import Signature, define
from recovery.detection.taxonomy import Attribution, FailureCategory

SIGNATURES: tuple[Signature, ...] = (
    define(
        "cuda-device-assert",
        FailureCategory.CUDA_ERROR_APP,
        Attribution.APPLICATION,
        r"(?:device-side assert triggered|Assertion `[^`]*` failed|"
        r"CUDA error: device-side assert|cudaErrorAssert)",
        [
            "../aten/src/ATen/native/cuda/Indexing.cu:1308: indexSelectLargeIndex: block: [58,0,0], thread: [99,0,0] Assertion `srcIndex < srcSelectDimSize` failed.",
            "RuntimeError: CUDA error: device-side assert triggered",
        ],
        ["Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions."],
        priority=78,
    ),
    define(
        "cuda-error-kernel",
        FailureCategory.CUDA_ERROR_APP,
        Attribution.UNKNOWN,
        r"(?:CUDA error: (?:an illegal memory access|an illegal instruction|misaligned address|"
        r"invalid configuration argument|invalid argument|invalid device function|"
        r"no kernel image is available|unspecified launch failure|"
        r"the launch timed out|too many resources requested|operation not permitted|"
        r"invalid device ordinal|out of range|CUBLAS_STATUS|CUDNN_STATUS|"
        r"an illegal|initialization error|unknown error|operation not supported)|"
        r"CUBLAS_STATUS_(?:EXECUTION_FAILED|INTERNAL_ERROR|NOT_SUPPORTED|INVALID_VALUE|"
        r"ARCH_MISMATCH|NOT_INITIALIZED|ALLOC_FAILED)|"
        r"CUDNN_STATUS_(?:EXECUTION_FAILED|INTERNAL_ERROR|BAD_PARAM|NOT_SUPPORTED|MAPPING_ERROR)|"
        r"cudaErrorIllegalAddress|cudaErrorLaunchFailure|cudaErrorIllegalInstruction|"
        r"CUDA_ERROR_ILLEGAL_ADDRESS|CUDA_ERROR_LAUNCH_FAILED|illegal memory access|"
        r"Cuda failure (?:\d+ )?'(?:an illegal|misaligned address|unspecified launch failure|"
        r"device-side assert)|CUDA kernel launch failed|an illegal memory access was encountered)",
        [
            "torch.AcceleratorError: CUDA error: an illegal memory access was encountered",
            "RuntimeError: CUDA error: misaligned address",
            "RuntimeError: CUDA error: CUBLAS_STATUS_EXECUTION_FAILED when calling `cublasGemmEx( handle, opa, opb, m, n, k, &falpha, a, CUDA_R_16F, lda, b, CUDA_R_16F, ldb, &fbeta, c, CUDA_R_16F, ldc, CUDA_R_32F, CUBLAS_GEMM_DFALT_TENSOR_OP)`",
            "RuntimeError: CUDA error: no kernel image is available for execution on the device",
        ],
        [
            "CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace below might be incorrect.",
            "For debugging consider passing CUDA_LAUNCH_BLOCKING=1.",
        ],
    ),
    define(
        "cuda-driver-mismatch",
        FailureCategory.CUDA_ERROR_APP,
        Attribution.SYSTEM_SOFTWARE,
        r"(?:CUDA driver version is insufficient|forward compatibility was attempted|"
        r"NVIDIA driver on your system is too old|Found no NVIDIA driver|"
        r"CUDA initialization: .*(?:error|failed)|cudaErrorInsufficientDriver|"
        r"libcuda\.so.*cannot open|CUDA error: system not yet initialized|"
        r"undefined symbol: .*(?:cuda|nccl|cublas))",
        [
            "RuntimeError: The NVIDIA driver on your system is too old (found version 11040).",
            "RuntimeError: CUDA error: CUDA driver version is insufficient for CUDA runtime version",
            "UserWarning: CUDA initialization: Unexpected error from cudaGetDeviceCount(). Did you run some cuda functions before calling NumCudaDevices() that might have already set an error? Error 802: system not yet initialized",
        ],
        ["CUDA driver version: 12.2"],
        priority=77,
        printed_by="the CUDA runtime (cudaErrorInsufficientDriver) and PyTorch's driver check in torch.cuda",
    ),
    define(
        "cuda-out-of-memory",
        FailureCategory.GPU_OOM,
        Attribution.APPLICATION,
        r"(?:CUDA out of memory|OutOfMemoryError: CUDA|CUDA error: out of memory|"
        r"cudaErrorMemoryAllocation|CUBLAS_STATUS_ALLOC_FAILED|"
        r"RESOURCE_EXHAUSTED: Out of memory while trying to allocate|"
        r"HIP out of memory|NCCL WARN Cuda failure 'out of memory'|"
        r"failed to allocate \d+(?:\.\d+)? [KMG]i?B.*(?:device|GPU|CUDA)|"
        r"torch\.OutOfMemoryError|CUDNN_STATUS_ALLOC_FAILED)",
        [
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 388.00 MiB. GPU 0 has a total capacity of 9.68 GiB of which 95.75 MiB is free.",
            "torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 37631.79 GiB (GPU 3; 79.21 GiB total capacity; 50.52 GiB already allocated; 24.67 GiB free; 52.32 GiB reserved in total by PyTorch)",
            "RuntimeError: CUDA error: out of memory",
        ],
        ["max_split_size_mb:512", "memory: 30.12GiB(38.09%)  tps: 5,231"],
    ),
    define(
        "cuda-device-unavailable",
        FailureCategory.CUDA_ERROR_APP,
        Attribution.SYSTEM_SOFTWARE,
        r"(?:CUDA-capable device\(s\) is/are busy or unavailable|all CUDA-capable devices are busy|"
        r"lib(?:cudart|cublas|cublasLt|cudnn|nccl|cuda|cufft|curand|cusparse|nvrtc)[A-Za-z0-9_]*"
        r"\.so[.0-9]*: cannot open shared object file|CUDNN_STATUS_NOT_INITIALIZED)",
        [
            "RuntimeError: CUDA error: CUDA-capable device(s) is/are busy or unavailable",
            "ImportError: libcudart.so.11.0: cannot open shared object file: No such file or directory",
        ],
        ["Found libcudart.so.12 in /usr/local/cuda/lib64"],
        priority=77,
        printed_by='the CUDA runtime (cudaErrorDevicesUnavailable) and the dynamic loader ("cannot open shared object file")',
    ),
    define(
        "cuda-error-code",
        FailureCategory.CUDA_ERROR_APP,
        Attribution.UNKNOWN,
        CUDA_ERROR_PATTERN,
        [
            "E1103 18:23:55.103160 gpu_cudamallocasync_allocator.cc:361] gpu_async_1 cuMemAllocAsync failed to allocate 1225195446464 bytes: RESOURCE_EXHAUSTED: : CUDA_ERROR_OUT_OF_MEMORY: out of memory",
            "what():  Error while calling cudaOccupancyMaxPotentialBlockSize in file dlib/cuda/cuda_utils.h:186. code: 98, reason: invalid device function",
            "jaxlib.xla_extension.XlaRuntimeError: INTERNAL: CustomCall failed: CUDA_ERROR_ILLEGAL_ADDRESS",
        ],
        [
            "cudaMemcpyAsync done in 2 ms",
            "CUDA_VISIBLE_DEVICES=0,1,2,3",
            "invalid device id 9 ignored",
        ],
        priority=75,
        description="A CUDA error by its runtime or driver name or its fixed sentence, in any "
        "library's wrapper: the meaning comes from the CUDA error table.",
        printed_by="the CUDA runtime and driver (cudaGetErrorName/cudaGetErrorString, "
        "cuGetErrorName), as JAX/XLA, TensorFlow, CuPy, dlib and extensions report them",
    ),
    define(
        "framework-device-oom",
        FailureCategory.GPU_OOM,
        Attribution.APPLICATION,
        r"(?:OOM when allocating tensor|ran out of memory trying to allocate .*"
        r"Current allocation summary follows|RESOURCE_EXHAUSTED: .*(?:[Oo]ut of memory|"
        r"OOM|failed to allocate)|Resource exhausted: OOM|Failed to allocate request for "
        r"[0-9.]+[KMGT]i?B)",
        [
            "ResourceExhaustedError (see above for traceback): OOM when allocating tensor with shape[256,112,112,64]",
            "W bfc_allocator.cc:273] Allocator (GPU_0_bfc) ran out of memory trying to allocate 128.00MiB.  Current allocation summary follows.",
        ],
        [
            "W bfc_allocator.cc:237] Allocator (GPU_0_bfc) ran out of memory trying to allocate 2.26GiB. The caller indicates that this is not a failure, but may mean that there could be performance gains if more memory were available.",
        ],
        description="TensorFlow's and XLA's own words for a device allocation that failed; the "
        'BFC allocator\'s retryable warning ("not a failure") is not one.',
        printed_by='TensorFlow (ResourceExhaustedError "OOM when allocating tensor", the BFC '
        "allocator's allocation summary) and XLA (RESOURCE_EXHAUSTED)",
    ),
)
