"""What GPU failures write: Xid reports, CUDA errors they surface as, GSP faults."""

from __future__ import annotations

from recovery.simulator.logtext.context import (
    TORCH_DIR,
    FailureContext,
    rank_block,
    srun_exit,
    traceback_lines,
    train_frames,
    watchdog_timeouts,
)
from recovery.simulator.logtext.layout import host_line, pci_bus, random_pid


def xid_line(context: FailureContext, gpu: int, code: int) -> str:
    bus = pci_bus(context.host, gpu)
    pid = random_pid(context.rng)
    texts = {
        48: f"An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer "
        f"at partition {context.rng.randrange(12)}, subpartition {context.rng.randrange(2)}.",
        62: f"{context.rng.getrandbits(32):08x} {context.rng.getrandbits(32):08x} "
        f"{context.rng.getrandbits(32):08x} {context.rng.getrandbits(32):08x}",
        79: "GPU has fallen off the bus.",
        94: "Contained: SM (0x1). RST: No, D-RST: No",
        95: "Uncontained: FBHUB. RST: Yes, D-RST: No",
        119: f"Timeout after 6s of waiting for RPC response from GPU{gpu} GSP! Expected function "
        f"76 (GSP_RM_CONTROL) (0x20802a02 0x{context.rng.choice((8, 16, 48)):x}).",
        120: f"GSP task exception: (cpuid={context.rng.randrange(4)} "
        f"pc=0x{context.rng.getrandbits(24):x}) ilp={context.rng.randrange(8)}.",
        31: f"Ch 0000000{context.rng.randrange(8)}, intr 00000000. MMU Fault: ENGINE GRAPHICS "
        f"GPCCLIENT_T1_{context.rng.randrange(4)} faulted @ 0x7f{context.rng.getrandbits(28):07x}_"
        f"{context.rng.getrandbits(16):04x}0000. Fault is of type FAULT_PDE ACCESS_TYPE_VIRT_READ",
    }
    return host_line(
        context.at,
        context.host,
        f"NVRM: Xid (PCI:0000:{bus}:00): {code}, pid={pid}, name=python, {texts[code]}",
    )


def gpu_crash(context: FailureContext, exception: str) -> list[str]:
    gpu = context.gpu()
    rank = context.rank_of(gpu)
    code = context.xid or 79
    lines = [xid_line(context, gpu, code)]
    if code == 79 and context.rng.random() < 0.5:
        lines.append(
            host_line(
                context.at + 0.5,
                context.host,
                "Unable to determine the device handle for GPU "
                f"0000:{pci_bus(context.host, gpu).upper()}:00.0: GPU is lost.  Reboot the "
                "system to recover this GPU",
            )
        )
    frames = [
        *train_frames(context.rng),
        (f"{TORCH_DIR}/_tensor.py", 648, "backward", "torch.autograd.backward("),
    ]
    lines += rank_block(
        context, rank, context.host, [*traceback_lines(frames), exception], context.at + 0.2
    )
    lines += watchdog_timeouts(context, context.rng.randint(1, 3), context.at + 1.0)
    lines += srun_exit(context, rank, context.host)
    return lines


def gpu_faulty(context: FailureContext) -> list[str]:
    return gpu_crash(context, "RuntimeError: CUDA error: unspecified launch failure")


def gpu_memory(context: FailureContext) -> list[str]:
    return gpu_crash(
        context,
        context.rng.choice(
            (
                "torch.AcceleratorError: CUDA error: uncorrectable ECC error encountered",
                "RuntimeError: CUDA error: uncorrectable ECC error encountered",
            )
        ),
    )


def gpu_gsp(context: FailureContext) -> list[str]:
    return gpu_crash(context, "RuntimeError: CUDA error: unspecified launch failure")
