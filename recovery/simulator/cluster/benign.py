"""Benign events at work: what healthy jobs, their administrators and their nodes do that can
look like trouble (``recovery.simulator.benign`` lists the kinds and says why rates and pauses
are in real seconds).

Each running attempt has its own next benign event (``SimJob.benign_at``), drawn from the
cluster's benign generator. Events are journaled (``ClusterState.benign``) when they happen;
one that cannot happen at its moment (a pause during a pause, a stall before the attempt has
been quiet for long enough to be shorter than something, a drain of a node already drained) is
skipped and not journaled. Nothing here journals a failure: these are not faults.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from datetime import datetime
from typing import Any

from recovery.simulator import benign, logtext
from recovery.simulator.cluster.config import GPUS, SimConfig
from recovery.simulator.cluster.journal import BenignEntry
from recovery.simulator.cluster.records import SimJob
from recovery.simulator.cluster.state import ClusterState
from recovery.simulator.faults import KINDS as FAULT_KINDS
from recovery.simulator.logtext.benign import BenignCorpus, CorpusText, load_corpus

NEEDS_CORPUS = frozenset({"handled_traceback", "warning", "traceback_then_pause"})
# How soon after a handled traceback the pause that follows it begins.
PAUSE_AFTER_TRACEBACK_SECONDS = 0.3
# Routine maintenance, naming no failing component: a reason such as "replace fan tray" says
# the node has a hardware problem, which is a fault, not a benign event.
ADMIN_DRAIN_REASONS = (
    "firmware update",
    "scheduled maintenance",
    "BIOS settings change",
    "kernel upgrade",
)


class BenignEvents(ClusterState):
    """Makes benign events happen to running attempts (see the module docstring)."""

    corpus: BenignCorpus

    def __init__(
        self, config: SimConfig, state: dict[str, Any] | None = None, *, now: datetime
    ) -> None:
        super().__init__(config, state, now=now)
        wanted = NEEDS_CORPUS & set(self.benign_table.rates)
        if wanted and not config.benign_corpus:
            raise ValueError(
                f"benign events {', '.join(sorted(wanted))} print real text: give benign_corpus"
            )
        self.corpus = load_corpus(config.benign_corpus) if wanted else BenignCorpus()
        if wanted and not (self.corpus.tracebacks and self.corpus.warnings):
            raise ValueError(f"{config.benign_corpus} holds no tracebacks or no warnings")

    # ------------------------------------------------------------------ the schedule

    def _draw_next_benign(self, job: SimJob, after: float) -> None:
        if not self.benign_table.enabled:
            job.benign_at = None
            return
        job.benign_at = after + self.benign_table.next_in(self.benign_rng)

    def _next_benign_moment(self, job: SimJob) -> float | None:
        """The earliest benign thing due for ``job``: an event or a pause's closing output."""
        moments = [entry[0] for entry in job.benign_due]
        if job.benign_at is not None:
            moments.append(job.benign_at)
        return min(moments) if moments else None

    def _benign_step(self, job: SimJob, at: float) -> None:
        """Do what is due at ``at`` (``_next_benign_moment``): close a pause or run an event."""
        due = [entry for entry in job.benign_due if entry[0] <= at]
        if due:
            for closing in sorted(due, key=lambda item: item[0]):
                job.benign_due.remove(closing)
                _, lines, checkpoint = closing
                self._log(job.job_id, list(lines))
                if checkpoint >= 0:
                    job.checkpoint = checkpoint
            return
        job.benign_at = None
        kind = self.benign_table.draw(self.benign_rng)
        # The job may end or be requeued by its event: the next one is drawn first.
        self._draw_next_benign(job, at)
        handlers: dict[str, Callable[[SimJob, float], BenignEntry | None]] = {
            "handled_traceback": self._handled_traceback,
            "warning": self._warning,
            "nccl_warning": self._nccl_warning,
            "loss_scale_overflow": self._loss_scale_overflow,
            "eval_pause": self._eval_pause,
            "checkpoint_pause": self._checkpoint_pause,
            "dataloader_stall": self._dataloader_stall,
            "traceback_then_pause": self._traceback_then_pause,
            "slow_rank": self._slow_rank,
            "admin_requeue": self._admin_requeue,
            "preemption": self._preemption,
            "user_cancel": self._user_cancel,
            "admin_drain": self._admin_drain,
            "kernel_nvrm": self._kernel_nvrm,
            "kernel_app_xid": self._kernel_app_xid,
        }
        entry = handlers[kind.name](job, at)
        if entry is not None:
            self._record_benign(entry)

    def _entry(
        self,
        job: SimJob,
        kind: str,
        at: float,
        *,
        node: str = "",
        until: float | None = None,
        **detail: Any,
    ) -> BenignEntry:
        return {
            "job_id": job.job_id,
            "attempt": job.restart_count,
            "at": at,
            "kind": kind,
            "node": node,
            "until": until,
            "detail": detail,
        }

    def _where(self, job: SimJob, at: float, rng: random.Random) -> logtext.FailureContext:
        return self._context(job, rng.randrange(len(job.nodes)), at, rng=rng)

    # ------------------------------------------------------------------ the job's output

    def _print_traceback(
        self, job: SimJob, at: float
    ) -> tuple[CorpusText, int, logtext.FailureContext]:
        rng = self.benign_rng
        text = rng.choice(self.corpus.tracebacks)
        context = self._where(job, at, rng)
        rank = context.rank_of(rng.randrange(GPUS))
        self._log(job.job_id, logtext.handled_traceback(context, text, rank=rank))
        return text, rank, context

    def _handled_traceback(self, job: SimJob, at: float) -> BenignEntry:
        text, rank, context = self._print_traceback(job, at)
        return self._entry(
            job,
            "handled_traceback",
            at,
            node=context.host,
            corpus=text.id,
            source=text.source,
            category=text.category,
            rank=rank,
        )

    def _warning(self, job: SimJob, at: float) -> BenignEntry:
        rng = self.benign_rng
        text = rng.choice(self.corpus.warnings)
        node = rng.randrange(len(job.nodes))
        rank = node * GPUS + rng.randrange(GPUS)
        lines = logtext.warning_lines(text, rank=rank, host=job.nodes[node], at=at)
        self._log(job.job_id, lines)
        return self._entry(
            job, "warning", at, node=job.nodes[node], corpus=text.id, source=text.source, rank=rank
        )

    def _nccl_warning(self, job: SimJob, at: float) -> BenignEntry:
        context = self._where(job, at, self.benign_rng)
        lines = logtext.nccl_warning(context)
        self._log(job.job_id, lines)
        return self._entry(job, "nccl_warning", at, node=context.host, lines=len(lines))

    def _loss_scale_overflow(self, job: SimJob, at: float) -> BenignEntry:
        rng = self.benign_rng
        skips = rng.choice((1, 1, 1, 2, 3))
        # The scaler has grown back since the last overflow (it doubles every 2,000 good steps).
        scale = float(2 ** rng.randint(13, 17))
        self._log(job.job_id, logtext.loss_scale_overflow(scale, skips=skips))
        return self._entry(job, "loss_scale_overflow", at, skips=skips, from_scale=scale)

    def _pause(self, job: SimJob, at: float, seconds: float) -> None:
        """No step completes for ``seconds`` from ``at``."""
        job.step_at = max(job.step_at, at) + seconds
        job.paused_until = at + seconds
        job.longest_quiet = max(job.longest_quiet, seconds)

    def _paused(self, job: SimJob, at: float) -> bool:
        return job.paused_until is not None and job.paused_until > at

    def _eval_pause(
        self, job: SimJob, at: float, *, kind: str = "eval_pause"
    ) -> BenignEntry | None:
        if self._paused(job, at):
            return None
        rng = self.benign_rng
        seconds = round(rng.uniform(*self.config.benign_pause_seconds), 1)
        context = self._context(job, 0, at, rng=rng)
        self._log(job.job_id, logtext.eval_started(context))
        ended = self._context(job, 0, at + seconds, rng=rng)
        loss = logtext.training_loss(job.step, rng) + 0.05
        job.benign_due.append(
            [at + seconds, logtext.eval_finished(ended, seconds=seconds, loss=loss), -1]
        )
        self._pause(job, at, seconds)
        return self._entry(job, kind, at, until=at + seconds, seconds=seconds, announced="eval")

    def _checkpoint_pause(
        self, job: SimJob, at: float, *, kind: str = "checkpoint_pause"
    ) -> BenignEntry | None:
        if self._paused(job, at):
            return None
        seconds = round(self.benign_rng.uniform(*self.config.benign_pause_seconds), 1)
        host, directory = job.nodes[0], self._checkpoint_dir(job)
        started = logtext.checkpoint_started_line(
            host=host, at=at, step=job.step, checkpoint_dir=directory
        )
        self._log(job.job_id, [started])
        saved = logtext.checkpoint_saved_line(
            host=host, at=at + seconds, step=job.step, checkpoint_dir=directory
        )
        job.benign_due.append([at + seconds, [saved], job.step])
        self._pause(job, at, seconds)
        return self._entry(
            job, kind, at, until=at + seconds, seconds=seconds, announced="checkpoint"
        )

    def _dataloader_stall(
        self, job: SimJob, at: float, *, kind: str = "dataloader_stall"
    ) -> BenignEntry | None:
        if self._paused(job, at) or job.longest_quiet < benign.SHORTEST_QUIET_FOR_A_STALL:
            return None
        share = self.benign_rng.uniform(*benign.STALL_SHARE_OF_LONGEST)
        seconds = round(share * job.longest_quiet, 1)
        longest = job.longest_quiet
        self._pause(job, at, seconds)
        return self._entry(
            job,
            kind,
            at,
            until=at + seconds,
            seconds=seconds,
            announced="none",
            longest_before=longest,
        )

    def _traceback_then_pause(self, job: SimJob, at: float) -> BenignEntry | None:
        if self._paused(job, at):
            return None
        text, rank, context = self._print_traceback(job, at)
        start = at + PAUSE_AFTER_TRACEBACK_SECONDS
        choices = ["eval", "checkpoint"]
        if job.longest_quiet >= benign.SHORTEST_QUIET_FOR_A_STALL:
            choices.append("stall")
        then = self.benign_rng.choice(choices)
        kind = "traceback_then_pause"
        pause = {
            "eval": self._eval_pause,
            "checkpoint": self._checkpoint_pause,
            "stall": self._dataloader_stall,
        }[then](job, start, kind=kind)
        assert pause is not None
        pause["at"] = at
        pause["node"] = context.host
        pause["detail"].update(
            corpus=text.id, source=text.source, category=text.category, rank=rank, then=then
        )
        return pause

    def _slow_rank(self, job: SimJob, at: float) -> BenignEntry | None:
        if job.slow_node:
            return None
        rng = self.benign_rng
        node = rng.choice(job.nodes)
        job.slow_node = node
        job.slow_factor = round(rng.uniform(*benign.SLOW_RANK_FACTOR), 2)
        job.slow_until = at + rng.uniform(*benign.SLOW_RANK_SECONDS)
        job.pace *= job.slow_factor
        return self._entry(
            job, "slow_rank", at, node=node, until=job.slow_until, factor=job.slow_factor
        )

    def _recover_slow_rank(self, job: SimJob, at: float) -> None:
        if job.slow_until is not None and at >= job.slow_until:
            job.slow_node, job.slow_factor, job.slow_until = "", 1.0, None

    # ------------------------------------------------------------------ the scheduler

    def _admin_requeue(self, job: SimJob, at: float) -> BenignEntry:
        argv = ("scontrol", "requeue", str(job.job_id))
        entry = self._entry(job, "admin_requeue", at)
        with self._receiving(argv, str(job.job_id), benign.ADMINISTRATOR):
            self.commands[-1]["at"] = at
            notice = logtext.requeue_notice(job_id=job.job_id, batch_host=job.nodes[0], at=at)
            self._log(job.job_id, [notice])
            self._requeue(job, at, hold=False)
        return entry

    def _preemption(self, job: SimJob, at: float) -> BenignEntry:
        entry = self._entry(job, "preemption", at)
        context = self._context(job, 0, at, rng=self.benign_rng)
        self._log(job.job_id, logtext.failure_lines(FAULT_KINDS["preemption"], context))
        if job.requeue:
            self._requeue(job, at, hold=False)  # PreemptMode=REQUEUE
        else:
            self._end(job, at, "PREEMPTED", reason="None", signal=15)
        return entry

    def _user_cancel(self, job: SimJob, at: float) -> BenignEntry:
        entry = self._entry(job, "user_cancel", at, user=job.user)
        with self._receiving(("scancel", str(job.job_id)), str(job.job_id), benign.USER):
            self.commands[-1]["at"] = at
            notice = logtext.cancel_notice(job_id=job.job_id, batch_host=job.nodes[0], at=at)
            self._log(job.job_id, [notice])
            self._end(job, at, "CANCELLED", reason="None", signal=15)
        return entry

    def _admin_drain(self, job: SimJob, at: float) -> BenignEntry | None:
        rng = self.benign_rng
        node = self.nodes_by_name[rng.choice(job.nodes)]
        if node.drain or node.state == "DOWN":
            return None
        reason = rng.choice(ADMIN_DRAIN_REASONS)
        argv = ("scontrol", "update", f"NodeName={node.name}", "State=DRAIN", f"Reason={reason}")
        with self._receiving(argv, "", benign.ADMINISTRATOR):
            self.commands[-1]["at"] = at
            node.drain, node.reason = True, reason
        until = at + rng.uniform(*benign.ADMIN_DRAIN_SECONDS)
        self.admin_resumes.append([until, node.name, reason])
        return self._entry(job, "admin_drain", at, node=node.name, until=until, reason=reason)

    def _resume_admin_drains(self, until: float) -> None:
        """An administrator's maintenance is over: the node reboots and takes jobs again."""
        remaining = []
        for entry in sorted(self.admin_resumes):
            at, name, reason = entry
            if at > until:
                remaining.append(entry)
                continue
            node = self.nodes_by_name[name]
            if not (node.drain and node.reason == reason):
                continue  # someone else changed it meanwhile: not the administrator's to undo
            argv = ("scontrol", "update", f"NodeName={name}", "State=RESUME")
            with self._receiving(argv, "", benign.ADMINISTRATOR):
                self.commands[-1]["at"] = at
                node.drain, node.reason = False, ""
            self._log_kernel(name, logtext.module_load_lines(name, at, self.benign_rng))
        self.admin_resumes = remaining

    # ------------------------------------------------------------------ the node's kernel log

    def _kernel_nvrm(self, job: SimJob, at: float) -> BenignEntry:
        node = self.benign_rng.choice(job.nodes)
        self._log_kernel(node, logtext.persistence_mode_lines(node, at))
        return self._entry(job, "kernel_nvrm", at, node=node, message="persistence mode")

    def _kernel_app_xid(self, job: SimJob, at: float) -> BenignEntry:
        node = self.benign_rng.choice(job.nodes)
        code, lines = logtext.application_xid_lines(node, at, self.benign_rng)
        self._log_kernel(node, lines)
        return self._entry(job, "kernel_app_xid", at, node=node, xid=code)
