"""How a line of job output is laid out: timestamps, hosts, ranks, bus ids."""

from __future__ import annotations

import random
from datetime import UTC, datetime

GPUS_PER_NODE = 8
NCCL_VERSION = "2.21.5"
# Bus ids of the eight GPUs of an HGX H100 board, in two of the layouts vendors ship.
PCI_LAYOUTS = (
    ("18", "2a", "3a", "5d", "9a", "ab", "ba", "db"),
    ("1b", "29", "3b", "4e", "9b", "a9", "bc", "cc"),
)
NIC_BUSES = ("0c", "1f", "41", "54", "8c", "9f", "c1", "d4")


def stamp(at: float) -> str:
    """ISO 8601 with milliseconds and Z, as the e2e training program prints."""
    moment = datetime.fromtimestamp(at, tz=UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


def slurm_time(at: float) -> str:
    """Slurm's own time format in its messages (seconds, no zone)."""
    return datetime.fromtimestamp(at, tz=UTC).strftime("%Y-%m-%dT%H:%M:%S")


def node_number(host: str) -> int:
    digits = "".join(char for char in host if char.isdigit())
    return int(digits) if digits else 0


def node_ip(host: str) -> str:
    number = node_number(host)
    return f"10.{16 + number // 65536 % 200}.{number // 256 % 256}.{number % 256}"


def pci_bus(host: str, gpu: int) -> str:
    return PCI_LAYOUTS[node_number(host) % len(PCI_LAYOUTS)][gpu % GPUS_PER_NODE]


def rank_line(rank: int, at: float, host: str, message: str) -> str:
    return f"{rank}: {stamp(at)} {host}: {message}"


def host_line(at: float, host: str, message: str) -> str:
    return f"{stamp(at)} {host}: {message}"


def random_pid(rng: random.Random) -> int:
    return rng.randint(2_000, 4_000_000)
