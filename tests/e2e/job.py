"""A scenario's job: the training program it runs, its files and its fault switch.

The job is ``jobs/ddp_train.sh`` running ``jobs/ddp_train.py`` on ``NODES_PER_JOB`` nodes (unless
``Harness.submit`` asks for another count); the program reads the faults to play from its control
file while it trains.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from tests.e2e.procs import Proc, rank_procs
from tests.e2e.slurm_view import job_fields
from tests.slurm_fixtures import SlurmCluster

HERE = Path(__file__).resolve().parent
JOB_SCRIPT = HERE / "jobs" / "ddp_train.sh"
PROGRAM = HERE / "jobs" / "ddp_train.py"
NODES_PER_JOB = 3
STEP_SECONDS = 0.3
CKPT_EVERY = 5
STEP = re.compile(r"\bstep: (\d+)\b")


@dataclass
class E2EJob:
    job_id: str
    workdir: Path
    output: Path
    ckpt_dir: Path
    control: Path
    cluster: SlurmCluster

    def log(self) -> str:
        try:
            return self.output.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def last_step(self) -> int:
        """The highest step any rank has printed so far."""
        return max((int(m.group(1)) for m in STEP.finditer(self.log())), default=0)

    def set_faults(self, **faults: Any) -> None:
        partial = self.control.with_suffix(".tmp")
        partial.write_text(json.dumps(faults))
        partial.replace(self.control)  # the program never reads half a file

    def slurm_state(self) -> dict[str, str]:
        return job_fields(self.cluster, self.job_id)

    def ranks(self) -> dict[int, Proc]:
        return rank_procs(self.job_id)


@dataclass
class Injection:
    at: datetime
    attempt: int
    detail: dict[str, Any] = field(default_factory=dict)
