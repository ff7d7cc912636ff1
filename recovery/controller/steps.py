"""The steps every action is made of, whatever the scheduler: reading it with retries, keeping
the lease, and running each command written ahead (its ``dispatched`` event first).

``AdvisorController`` is made of these; an executor (``slurm_executor.py``) composes them into a
scheduler's restart and stop, and ``nodes.py`` into a drain or resume.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any, Protocol, TypeVar

from recovery.controller.client import AdvisorAPIError, ControllerIdentity, ReadyRecommendation
from recovery.controller.lease import Lease, LeaseLost
from recovery.controller.outcome import EffectUnknown, Outcome, Retry
from recovery.schedulers.base import (
    Command,
    CommandResult,
    ExpeditedRequeueUnavailable,
    JobInfo,
    NodeInfo,
    SchedulerAdapter,
    SchedulerError,
    describe_unknown,
)

logger = logging.getLogger(__name__)

Read = TypeVar("Read")

# A killed controller's claim is taken over by a standby once its lease lapses: within this
# plus the standby's pause between passes (``cli.DEFAULT_INTERVAL_SECONDS``) and one claim, so
# within 15 s. The Advisor API accepts no shorter lease. Renewed every third, it outlasts a
# control plane that does not answer for about 5 s (a web process restarting) before the
# controller gives the recommendation up.
DEFAULT_LEASE_SECONDS = 10
# No step of an action takes this long: a scheduler command's timeout (30 s), an SSH connection
# (10 s), a read retried with backoff (about 10 s). A controller whose action has not reached a
# step for longer is stuck, and lets its lease lapse.
LONGEST_STEP_SECONDS = 120.0


class AdvisorAPI(Protocol):
    def ready(self) -> list[ReadyRecommendation]: ...

    def claim(self, recommendation_id: int, lease_seconds: int) -> ReadyRecommendation: ...

    def renew(self, recommendation_id: int, lease_seconds: int) -> None: ...

    def dispatch(self, recommendation_id: int, argv: Sequence[str], sequence: int) -> None: ...

    def report(self, recommendation_id: int, body: dict[str, Any]) -> None: ...

    def identity(self) -> ControllerIdentity: ...


class Steps:
    """Reading the scheduler, keeping the lease, running commands written ahead: for the
    recommendation being carried out (``_acting_on``), under its lease."""

    # Set by ``AdvisorController.__init__``, whose options they are.
    api: AdvisorAPI
    adapter: SchedulerAdapter
    lease_seconds: int
    longest_step_seconds: float
    settle_seconds: float
    poll_seconds: float
    read_attempts: int
    backoff_seconds: float
    sleep: Callable[[float], None]
    clock: Callable[[], float]
    _lease: Lease | None  # of the recommendation being carried out
    _acting_on: int | None  # the recommendation the commands are dispatched for
    _dispatched: int  # commands dispatched for it so far

    # ------------------------------------------------------------------ reading the scheduler

    def read_job(self, job_id: str) -> JobInfo | None:
        """The job as the scheduler reports it now; a failed read is retried with backoff.

        Raises ``Retry`` when it still fails: a read error says nothing about the job, and
        is never taken as "the job is gone".
        """
        return self._read_retrying(f"job {job_id}", lambda: self.adapter.get_job(job_id))

    def _read_retrying(self, what: str, read: Callable[[], Read]) -> Read:
        delay = self.backoff_seconds
        for attempt in range(1, self.read_attempts + 1):
            self.keep_lease()
            try:
                return read()
            except SchedulerError as exc:
                if attempt == self.read_attempts:
                    raise Retry(f"cannot read {what}: {exc}") from None
                logger.info("reading %s failed (%s); again in %.1f s", what, exc, delay)
            self.sleep(delay)
            delay *= 2
        raise AssertionError("unreachable")

    def read_known(self, job_id: str) -> JobInfo:
        job = self.read_job(job_id)
        if job is None:
            raise SchedulerError(f"job {job_id} disappeared while being acted on")
        self.require_known(job)
        return job

    @staticmethod
    def require_known(job: JobInfo) -> None:
        unknown = job.unknown()
        if unknown:
            raise Retry(
                f"not acting on job {job.job_id} while these are unknown: "
                f"{describe_unknown(unknown)}"
            )

    def wait_for(self, job_id: str, reached: Callable[[JobInfo], bool]) -> JobInfo:
        deadline = self.clock() + self.settle_seconds
        while True:
            job = self.read_known(job_id)
            if reached(job) or self.clock() > deadline:
                return job
            self.sleep(self.poll_seconds)

    def read_node(self, name: str) -> NodeInfo | None:
        """The node as the scheduler reports it now, read as a job is (``_read``)."""
        return self._read_retrying(f"node {name}", lambda: self.adapter.get_node(name))

    # ------------------------------------------------------------------ the lease

    def keep_lease(self) -> None:
        """Stop when the lease is lost (``LeaseLost``); renew it when a third has gone by."""
        if self._lease is not None:
            self._lease.check()

    # ------------------------------------------------------------------ acting

    def command(
        self,
        outcome: Outcome,
        command: Command,
        job_id: str,
        run: Callable[[], CommandResult],
        nodes: Sequence[str] = (),
        *,
        recheck: Callable[[], None] | None = None,
    ) -> CommandResult:
        """Run one scheduler command, written ahead: its ``dispatched`` event is recorded first.

        ``run`` must run exactly ``planned_argv(command, job_id, nodes)``. ``recheck``, called
        between the dispatch and the command, may still call it off by raising. A command that
        timed out or lost its connection raises ``EffectUnknown``, which names it.
        """
        argv = self.adapter.planned_argv(command, job_id, nodes)
        return self._run_written_ahead(outcome, argv, run, recheck)

    def node_command(
        self,
        outcome: Outcome,
        command: Command,
        name: str,
        run: Callable[[], CommandResult],
        reason: str = "",
        *,
        recheck: Callable[[], None] | None = None,
    ) -> None:
        """Run one node command, written ahead like a job's (``_command``)."""
        argv = self.adapter.planned_node_argv(command, name, reason)
        self._run_written_ahead(outcome, argv, run, recheck)

    def _run_written_ahead(
        self,
        outcome: Outcome,
        argv: tuple[str, ...],
        run: Callable[[], CommandResult],
        recheck: Callable[[], None] | None = None,
    ) -> CommandResult:
        self._dispatch(argv)
        if recheck is not None:
            recheck()
        try:
            result = run()
        except ExpeditedRequeueUnavailable:
            raise  # refused before anything ran
        except SchedulerError as exc:
            if exc.result is None:
                raise EffectUnknown(
                    f"the effect of `{' '.join(argv)}` is unknown (it may or may not have "
                    f"run): {exc}"
                ) from exc
            raise
        if tuple(result.argv) != argv:
            logger.warning(
                "ran `%s` but dispatched `%s`: the adapter's planned_argv is wrong",
                " ".join(result.argv),
                " ".join(argv),
            )
        self._act(outcome, result)
        return result

    def _dispatch(self, argv: tuple[str, ...]) -> None:
        """Record the command about to run in the trail; the last check of the lease before it.

        Refused (404, 409: the lease is lost or ran out), nothing runs and the controller stops
        acting. Not answered (unreachable, 5xx, 429...), nothing runs either: the
        recommendation goes back, and the scheduler's state decides the next time.
        """
        assert self._acting_on is not None
        self.keep_lease()  # a lease known to be lost is not even asked about
        self._dispatched += 1
        shown = " ".join(argv)
        try:
            self.api.dispatch(self._acting_on, argv, self._dispatched)
        except AdvisorAPIError as exc:
            if exc.status in {404, 409}:
                raise LeaseLost(
                    f"`{shown}` not run: the lease of recommendation {self._acting_on} is "
                    f"lost: {exc}"
                ) from None
            raise Retry(f"`{shown}` not run: the control plane did not record it: {exc}") from None

    def _act(self, outcome: Outcome, result: CommandResult) -> None:
        outcome.outcome = "executed"
        self.record(outcome, result)

    @staticmethod
    def record(outcome: Outcome, result: CommandResult) -> None:
        outcome.commands.append(
            {
                "argv": list(result.argv),
                "returncode": result.returncode,
                "output": (result.stdout + result.stderr)[-2000:],
            }
        )
