"""Families of messages read by what they mean, not by the phrases of one framework: CUDA's error
codes, NCCL's result codes, how a process ended, the fabric's and the driver's own reports, the
schedulers and orchestrators that end jobs, and losses printed in any progress format."""

from __future__ import annotations

import pytest

from recovery.detection.classify import classify_text
from recovery.detection.facts.cuda_errors import CUDA_ERRORS, CudaErrorMeaning, cuda_error_meaning
from recovery.detection.progress import ProgressParser


def verdict(log: str) -> tuple[str, str]:
    found = classify_text(log)
    return found.category, found.attribution


@pytest.mark.parametrize("meaning", CUDA_ERRORS, ids=lambda m: m.names[0])
def test_every_cuda_error_is_known_by_each_of_its_names_and_its_sentence(
    meaning: CudaErrorMeaning,
) -> None:
    for name in meaning.names:
        assert cuda_error_meaning(f"custom call failed: {name}: details") is meaning
    if meaning.sentence:
        assert cuda_error_meaning(f"reason: {meaning.sentence}") is meaning


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        # The name decides in a wrapper no signature phrase knows.
        (
            "E1103 allocator.cc:361] cuMemAllocAsync failed to allocate 1225195446464 bytes: "
            "RESOURCE_EXHAUSTED: : CUDA_ERROR_OUT_OF_MEMORY: out of memory",
            ("gpu_oom", "application"),
        ),
        (
            "cupy.cuda.runtime.CUDARuntimeError: cudaErrorIllegalAddress: an illegal memory access was encountered",
            ("cuda_error_app", "unknown"),
        ),
        ("what():  reason: invalid device function", ("cuda_error_app", "unknown")),
        ("XlaRuntimeError: INTERNAL: CUDA_ERROR_ECC_UNCORRECTABLE", ("gpu_hardware", "hardware")),
        (
            "E0101 status: CUDA_ERROR_NO_DEVICE: no CUDA-capable device is detected",
            ("cuda_error_app", "system_software"),
        ),
    ],
)
def test_a_cuda_error_means_what_cuda_documents_whoever_wraps_it(
    line: str, expected: tuple[str, str]
) -> None:
    assert verdict(line) == expected


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        (
            "INTERNAL: nccl_utils.cc:275: NCCL operation ncclCommInitRank(&comm, nranks, id, rank) "
            "failed: unhandled cuda error",
            ("nccl_error", "unknown"),
        ),
        # ncclSystemError from a socket call: the connection between ranks.
        (
            "INTERNAL: NCCL operation ncclCommInitRank(&comm, nranks, id, rank) failed: unhandled "
            "system error. Last NCCL warning 'socketTryAccept: Accept failed: Bad file descriptor'.",
            ("interconnect", "unknown"),
        ),
        # ncclRemoteError, in PaddlePaddle's words.
        (
            "OSError: (External) NCCL error(6), remote process exited or there was a network error.",
            ("interconnect", "unknown"),
        ),
        # ncclInvalidUsage: "usually reflects invalid usage of NCCL library" (NCCL's reference).
        (
            "RuntimeError: NCCL operation ncclAllReduce(send, recv, count, type, op, comm, stream) "
            "failed: invalid usage",
            ("nccl_error", "application"),
        ),
        (
            "NCCL operation ncclGetUniqueId(&id) failed: Unable to load NCCL library.",
            ("nccl_error", "system_software"),
        ),
    ],
)
def test_an_nccl_result_means_what_nccl_documents_whoever_wraps_it(
    line: str, expected: tuple[str, str]
) -> None:
    assert verdict(line) == expected


def test_a_store_that_cannot_be_reached_is_the_connection_not_a_collective_timeout() -> None:
    reached = (
        "torch.distributed.DistNetworkError: The client socket has timed out after 300000ms "
        "while trying to connect to (node-17, 29500)."
    )
    assert verdict(reached) == ("interconnect", "unknown")
    waited = "torch.distributed.DistStoreError: Socket Timeout waiting for key rank_7"
    assert verdict(waited)[0] == "nccl_timeout"


@pytest.mark.parametrize(
    ("log", "expected"),
    [
        # SIGBUS in a DataLoader worker with its shared memory named: /dev/shm ran out.
        (
            "RuntimeError: DataLoader worker (pid 3855) is killed by signal: Bus error. It is "
            "possible that dataloader's workers are out of shared memory.",
            ("host_oom", "application"),
        ),
        ("Bus error (core dumped)", ("segfault", "unknown")),
        ("ERROR: Unexpected segmentation fault encountered in worker.", ("segfault", "unknown")),
        # An uncaught C++ exception is the program's, and std::terminate's abort only ends it.
        (
            "terminate called after throwing an instance of 'c10::Error'\n"
            "  what():  index out of range in self\nAborted (core dumped)",
            ("app_exception", "application"),
        ),
        (
            "terminate called after throwing an instance of 'std::bad_alloc'\n"
            "  what():  std::bad_alloc\nAborted (core dumped)",
            ("host_oom", "application"),
        ),
    ],
)
def test_how_a_process_ended_is_read_with_what_it_said_on_the_way(
    log: str, expected: tuple[str, str]
) -> None:
    assert verdict(log) == expected


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        (
            "libfabric:451707:1708520807::efa:cq:efa_rdm_txe_handle_error():737<warn> err: 5, "
            "message: Invalid address",
            ("interconnect", "unknown"),
        ),
        # The provider's I/O error is the fabric's, not a disk's.
        (
            "Unable to write to EQ: err: Input/output error (5) prov_errno: -12 "
            "prov/efa/src/rxr/rxr.h:1343",
            ("interconnect", "unknown"),
        ),
        # Verbs resources are locked memory: the node's limits, not the job.
        (
            "host:4016:4653 [7] misc/ibvwrap.cc:190 NCCL WARN Call to ibv_create_cq failed with "
            "error Cannot allocate memory",
            ("interconnect", "system_software"),
        ),
        ("Failed to modify QP to RTR: Connection timed out", ("interconnect", "unknown")),
        (
            "[   84.300480] NVRM: GPU6 kgmmuCheckMemSubsysError_IMPL: Memory Subsystem Error "
            "detected. kbusSendSysmembarSingle failed.",
            ("gpu_hardware", "hardware"),
        ),
    ],
)
def test_the_fabric_and_the_driver_are_read_in_their_own_words(
    line: str, expected: tuple[str, str]
) -> None:
    assert verdict(line) == expected


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        (
            "=>> PBS: job killed: walltime 1207 exceeded limit 1200",
            ("scheduler_event", "application"),
        ),
        (
            "TERM_RUNLIMIT: job killed after reaching LSF run time limit.",
            ("scheduler_event", "application"),
        ),
        (
            "TERM_MEMLIMIT: job killed after reaching LSF memory usage limit.",
            ("host_oom", "application"),
        ),
        (
            "Message: The node was low on resource: ephemeral-storage. Container w was using "
            "73712Ki, which exceeds its request of 0.",
            ("scheduler_event", "system_software"),
        ),
        # Evicted for using more memory than it requested: the pod's own doing.
        (
            "Warning Evicted pod/egg-1 The node was low on resource: memory. Container egg was "
            "using 5053216Ki, which exceeds its request of 0.",
            ("scheduler_event", "application"),
        ),
        (
            '{"level":"warn","message":"Spot interruption payload received: {\\"action\\":\\"terminate\\"}"}',
            ("scheduler_event", "system_software"),
        ),
        (
            "(raylet) node_manager.cc:3084: 4 Workers (tasks / actors) killed due to memory "
            "pressure (OOM), 0 Workers crashed due to other reasons",
            ("host_oom", "application"),
        ),
    ],
)
def test_schedulers_and_orchestrators_other_than_slurm_end_jobs_too(
    line: str, expected: tuple[str, str]
) -> None:
    assert verdict(line) == expected


@pytest.mark.parametrize(
    "line",
    [
        "0 Workers (tasks / actors) killed due to memory pressure (OOM), 0 Workers crashed",
        "W bfc_allocator.cc:237] Allocator (GPU_0_bfc) ran out of memory trying to allocate "
        "2.26GiB. The caller indicates that this is not a failure, but may mean that there could "
        "be performance gains if more memory were available.",
        "Reason:       Completed",
        "NVRM: loading NVIDIA UNIX Open Kernel Module for x86_64  595.71.05  Release Build",
    ],
)
def test_lines_that_only_look_like_a_family_are_healthy(line: str) -> None:
    assert verdict(line) == ("healthy", "none")


def test_exception_wrappers_name_the_exception_they_carry() -> None:
    ray = "ray.exceptions.RayTaskError(KeyError): ray::_Inner.train() (pid=12446, ip=127.0.0.1)"
    assert verdict(ray) == ("app_exception", "application")
    tensorflow = (
        "ResourceExhaustedError (see above for traceback): OOM when allocating tensor with "
        "shape[256,112,112,64]"
    )
    assert verdict(tensorflow) == ("gpu_oom", "application")


def test_a_loss_is_read_in_bracketed_and_tensor_fields_and_as_keras_stops_on_it() -> None:
    rows = "\n".join(
        f"| E{epoch} iter[ 14/ 15] | [Loss] nan | [step] {100 + epoch} |" for epoch in range(5)
    )
    assert verdict(rows)[0] == "nan_divergence"
    keras = (
        "  3/234 [....] - ETA: 33:37:24 - loss: 44.4110Batch 3: Invalid loss, terminating training"
    )
    assert verdict(keras) == ("nan_divergence", "application")


def test_a_per_epoch_counter_is_a_step_that_keeps_growing_across_epochs() -> None:
    parser = ProgressParser()
    last_of_one = parser.parse_progress("Train Epoch: 1 [4800/5000 (96%)]\tLoss: 0.002345")
    first_of_two = parser.parse_progress("Train Epoch: 2 [0/5000 (0%)]\tLoss: 0.003404")
    assert last_of_one is not None and first_of_two is not None
    assert first_of_two.step > last_of_one.step
    assert (first_of_two.epoch, first_of_two.loss) == (2, 0.003404)
    # Training that went on after a warning about NaN in a logged tensor recovered from it.
    log = "\n".join(
        [
            "WARNING:tensorboardX.x2num:NaN or Inf found in input tensor.",
            *(
                f"Train Epoch: 2 [{n}/5000 ({n // 50}%)]\tLoss: 0.0030"
                for n in (0, 1600, 3200, 4800)
            ),
        ]
    )
    assert verdict(log) == ("healthy", "none")


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        (
            "JobId=4242 JobName=train JobState=TIMEOUT Reason=TimeLimit",
            ("scheduler_event", "application"),
        ),
        (
            "Slurm Job_id=4242 Name=train Ended, Run time 1-00:00:12, PREEMPTED, ExitCode 0",
            ("scheduler_event", "system_software"),
        ),
        (
            "4242.batch        batch      acct         16 OUT_OF_ME+    0:125",
            ("host_oom", "application"),
        ),
        ("State: NODE_FAIL (exit code 1)", ("scheduler_event", "hardware")),
        (
            "slurmstepd: error: Exceeded step memory limit at some point.",
            ("host_oom", "application"),
        ),
        (
            "thread '<unnamed>' panicked at 'called `Result::unwrap()` on an `Err` value'",
            ("app_exception", "application"),
        ),
        (
            "distributed.nanny.memory - WARNING - Worker tcp://127.0.0.1:41235 (pid=4242) "
            "exceeded 95% memory budget. Restarting...",
            ("host_oom", "application"),
        ),
    ],
)
def test_job_states_panics_and_memory_budgets_read_where_users_paste_them(
    line: str, expected: tuple[str, str]
) -> None:
    assert verdict(line) == expected


def test_a_job_state_a_user_printed_implicates_no_node() -> None:
    found = classify_text("node-7: JobId=4242 JobState=NODE_FAIL Reason=NodeDown")
    assert found.category == "scheduler_event"
    assert found.nodes == []


@pytest.mark.parametrize(
    ("log", "expected"),
    [
        (
            "ExternalError:  Nccl error, unhandled cuda error  (at collective_helper.cc:83)",
            ("nccl_error", "unknown"),
        ),
        ("d13186ffee3a:57:75 [0] NCCL INFO init.cc:876 -> 2", ("nccl_error", "unknown")),
        (
            "Last error:\nsocketStartConnect: Connect to 10.5.0.11<44589> failed : Software caused connection abort",
            ("interconnect", "unknown"),
        ),
        (
            "RuntimeError: [gloo/transport/tcp/pair.cc:598] Connection closed by peer [10.0.1.17]:22780",
            ("interconnect", "unknown"),
        ),
        (
            "torch.distributed.elastic.rendezvous.api.RendezvousConnectionError: The connection "
            "to the C10d store has failed. See inner exception for details.",
            ("interconnect", "unknown"),
        ),
        (
            "MPIDI_CH3I_RDMA_init(446): rdma_iba_hca_init(1636)..: cannot create cq",
            ("interconnect", "unknown"),
        ),
        (
            "jaxlib.xla_extension.XlaRuntimeError: DEADLINE_EXCEEDED: Barrier timed out. "
            "Barrier_id: PjRT_Client_Connect. Timed out task names:",
            ("nccl_timeout", "unknown"),
        ),
        (
            "jax._src.traceback_util.UnfilteredStackTrace: ray.exceptions.RayTaskError(NcclError): "
            "ray::MeshHostWorker.init_p2p_communicator() (pid=16322)",
            ("nccl_error", "unknown"),
        ),
        (
            "[76914.214195] amdgpu 0000:dd:00.0: amdgpu: GPU reset begin!",
            ("gpu_hardware", "hardware"),
        ),
        ("RuntimeError: Triton Error [CUDA]: misaligned address", ("cuda_error_app", "unknown")),
        (
            "(raylet) file_system_monitor.cc:105: /tmp/ray/session_1 is over 95% full, available "
            "space: 13307080704; capacity: 270475862016.",
            ("storage_io", "system_software"),
        ),
        (
            "INFO:tensorflow:Error reported to Coordinator: <class 'InvalidArgumentError'>, "
            "LossTensor is inf or nan. : Tensor had NaN values",
            ("nan_divergence", "application"),
        ),
        (
            "start-worker 2024/12/17 16:03:58 GCP Metadata Service says termination is imminent",
            ("scheduler_event", "system_software"),
        ),
    ],
)
def test_more_families_in_their_own_words(log: str, expected: tuple[str, str]) -> None:
    assert verdict(log) == expected


def test_an_error_handled_once_and_then_not_is_a_failure() -> None:
    log = "\n".join(
        [
            "WARNING: Save model error: PytorchStreamWriter failed writing file data.pkl: file "
            "write failed, remaining retry times: 0",
            "RuntimeError: [enforce fail at inline_container.cc:764] . PytorchStreamWriter failed "
            "writing file data.pkl: file write failed",
        ]
    )
    assert verdict(log) == ("storage_io", "system_software")


PORT_ERROR = (
    "6: gpu-0001:677595:677743 [6] NCCL WARN NET/IB : mlx5_3:1 Got async event : port error"
)
PORT_ACTIVE = (
    "6: gpu-0001:677595:677743 [6] NCCL WARN NET/IB : mlx5_3:1 Got async event : port active"
)


def test_a_port_that_comes_back_was_a_flap_the_job_survived() -> None:
    assert verdict(f"{PORT_ERROR}\n{PORT_ACTIVE}") == ("healthy", "none")
    assert verdict(PORT_ERROR)[0] == "interconnect"
    # Down again after it came back, or back on another node only: still down.
    assert verdict(f"{PORT_ERROR}\n{PORT_ACTIVE}\n{PORT_ERROR}")[0] == "interconnect"
    elsewhere = PORT_ACTIVE.replace("gpu-0001:", "gpu-0002:")
    assert verdict(f"{PORT_ERROR}\n{elsewhere}")[0] == "interconnect"
