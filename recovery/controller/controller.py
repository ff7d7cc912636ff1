"""The Advisor Controller's engine: claims recommendations and carries each out, exactly once.

Every step is decided from the scheduler's state read *now*, never from memory of what this
or another controller meant to do: a controller killed half-way and restarted (or a second
controller taking over an expired lease) reads the job, sees what already happened, and does
only what is left. The engine is the same for every scheduler: it claims, keeps the lease,
checks that the job is the recommendation's, and reports. What a restart or a stop is on a
scheduler is that scheduler's executor (``slurm_executor.py``); a drain or resume is
``nodes.py``. Both are made of the engine's ``Steps`` (``steps.py``).

Nothing is done on a guess. Before any command the job must be the recommendation's job (same
user, a submit time that fits) and every fact the action depends on must have been read; a
read that fails or a fact that is unknown gives the recommendation back (``retry``) to be taken
up again from the scheduler's state, by this controller or another. So does a half-done action:
a requeued job that is still held or still lacks its exclusions is finished on the next pass.

Every command is written ahead: before it runs, its exact command line is recorded in the
trail through the Advisor API (``dispatch``, a ``dispatched`` event). A controller killed right
after a command, or one whose command timed out after it took effect, leaves the command in
the trail all the same. The dispatch is also the last check of the lease before each command:
refused, or not answered, nothing runs. A command that must not run twice (a requeue) is
preceded by one more read after its dispatch (``recheck``), so that a controller paused since
it read the job does not restart an attempt that was restarted meanwhile.

The lease is short (``DEFAULT_LEASE_SECONDS``) so that a standby controller of the same cluster
finishes what a killed or frozen one started within seconds. It is renewed at every step and,
in between, from a thread of its own (``recovery.controller.lease``), so that a long command or
wait does not lose it; a renewal refused stops the action at its next step.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Protocol

from recovery.controller.client import AdvisorAPIError, ControllerIdentity, ReadyRecommendation
from recovery.controller.lease import Lease, LeaseLost
from recovery.controller.nodes import carry_out_on_node
from recovery.controller.outcome import (
    MisconfiguredController,
    Outcome,
    Retry,
    identity_problem,
    job_snapshot,
    owner_problem,
)
from recovery.controller.slurm_executor import SlurmExecutor
from recovery.controller.steps import (
    DEFAULT_LEASE_SECONDS,
    LONGEST_STEP_SECONDS,
    AdvisorAPI,
    Steps,
)
from recovery.schedulers.base import (
    JobInfo,
    SchedulerAdapter,
    SchedulerError,
)
from recovery.schedulers.capabilities import NODE_ACTIONS, RESTARTS, Action
from recovery.schedulers.validation import validate_job_id, validate_node_names

logger = logging.getLogger(__name__)

__all__ = [
    "DEFAULT_LEASE_SECONDS",
    "AdvisorController",
    "Executor",
    "MisconfiguredController",
    "Outcome",
    "job_snapshot",
]


class Executor(Protocol):
    """One scheduler's way of restarting and stopping a job, made of the engine's ``Steps``.

    Called with the job read, known and checked to be the recommendation's; each decides from
    the scheduler's state read now, records its commands in ``outcome`` and sets
    ``outcome.converged``. ``Retry`` gives the recommendation back, to be finished from the
    scheduler's state on the next pass.
    """

    def restart(
        self, steps: Steps, recommendation: ReadyRecommendation, job: JobInfo, outcome: Outcome
    ) -> None: ...

    def stop(
        self, steps: Steps, recommendation: ReadyRecommendation, job: JobInfo, outcome: Outcome
    ) -> None: ...


class AdvisorController(Steps):
    """Claims what is ready and carries it out: a job's restart or stop through the
    scheduler's executor (Slurm's by default, the one scheduler today), a node's drain or
    resume through the adapter's node commands."""

    def __init__(
        self,
        api: AdvisorAPI,
        adapter: SchedulerAdapter,
        *,
        executor: Executor | None = None,
        partitions: Sequence[str] = (),
        lease_seconds: int = DEFAULT_LEASE_SECONDS,
        longest_step_seconds: float = LONGEST_STEP_SECONDS,
        settle_seconds: float = 30.0,
        poll_seconds: float = 0.5,
        read_attempts: int = 4,
        backoff_seconds: float = 1.0,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.api = api
        self.adapter = adapter
        self.lease_seconds = lease_seconds
        self.longest_step_seconds = longest_step_seconds
        self.settle_seconds = settle_seconds
        self.poll_seconds = poll_seconds
        self.read_attempts = read_attempts
        self.backoff_seconds = backoff_seconds
        self.sleep = sleep
        self.clock = clock
        self._lease = None
        self._acting_on = None
        self._dispatched = 0
        self.partitions = set(partitions)
        self.executor: Executor = executor if executor is not None else SlurmExecutor()

    def check_identity(self, cluster: str) -> ControllerIdentity:
        """Refuse to start unless the token's cluster is ``cluster`` and Slurm agrees.

        Three things must name the same cluster: the ``--cluster`` it was started with, the
        cluster its token belongs to, and the ``ClusterName`` the scheduler reports (which the
        control plane records as the cluster's scheduler name). An unreadable name is no match,
        and no mismatch either: ``SchedulerError``, to be asked again, as when the scheduler is
        unreachable; ``MisconfiguredController`` only for names that were read and differ.
        """
        identity = self.api.identity()
        if identity.cluster != cluster:
            raise MisconfiguredController(
                f"the token belongs to cluster {identity.cluster!r}, not to --cluster {cluster!r}"
            )
        # An unreachable scheduler (SchedulerError) is not a misconfiguration: the caller waits
        # and asks again, as it does while the control plane is away.
        reported = self.adapter.cluster_name()
        if reported is None:
            # Unknown, not wrong: slurmctld away answers nothing. Asked again until it answers.
            raise SchedulerError(
                "the scheduler did not report its cluster name: cannot tell yet that it is "
                f"{identity.scheduler_cluster_name!r}"
            )
        if reported != identity.scheduler_cluster_name:
            raise MisconfiguredController(
                f"the scheduler here is cluster {reported!r}, but {cluster!r} expects "
                f"{identity.scheduler_cluster_name!r}"
            )
        return identity

    def run_once(self) -> list[tuple[int, str]]:
        """Claim and carry out everything ready; return (recommendation id, outcome) pairs."""
        done = []
        for recommendation in self.api.ready():
            if self.partitions and recommendation.partition not in self.partitions:
                logger.info(
                    "recommendation %s left alone: partition %r is not in the allowlist",
                    recommendation.id,
                    recommendation.partition,
                )
                continue
            try:
                claimed = self.api.claim(recommendation.id, self.lease_seconds)
            except AdvisorAPIError as exc:
                if exc.status in {404, 409}:
                    continue  # another controller got it first, or it expired meanwhile
                if exc.status is None or exc.status == 429 or exc.status >= 500:
                    # The control plane is away or busy: nothing was claimed, the next pass
                    # asks again; the other recommendations are still served.
                    logger.warning("claim of recommendation %s: %s", recommendation.id, exc)
                    continue
                raise
            outcome = self._carry_out_claimed(claimed)
            try:
                self.api.report(claimed.id, outcome.body())
            except AdvisorAPIError as exc:
                # Refused (another controller took over: the refusal is audited with what was
                # done) or the control plane is away (the lease runs out and the next pass reads
                # the scheduler): either way the others still get served.
                logger.warning("report of recommendation %s: %s", claimed.id, exc)
                done.append((claimed.id, f"unreported {outcome.outcome}"))
                continue
            done.append((claimed.id, outcome.outcome))
        return done

    def _carry_out_claimed(self, recommendation: ReadyRecommendation) -> Outcome:
        self._lease = Lease(
            self.api,
            recommendation.id,
            self.lease_seconds,
            clock=self.clock,
            longest_step_seconds=self.longest_step_seconds,
        )
        self._lease.start()
        try:
            return self.carry_out(recommendation)
        except Exception as exc:  # one bad recommendation never stops the controller
            logger.exception("recommendation %s: unexpected error", recommendation.id)
            return Outcome("retry", {"known": None}, detail=f"unexpected error: {exc!r}")
        finally:
            self._lease.stop()
            self._lease = None

    def carry_out(self, recommendation: ReadyRecommendation) -> Outcome:
        self._acting_on = recommendation.id
        self._dispatched = 0
        missing = self.adapter.capabilities.missing_for(
            recommendation.action, excluding=bool(recommendation.excluded_nodes)
        )
        if missing:
            return Outcome(
                "failed",
                {"known": None},
                detail=f"refused before any command: this scheduler's adapter cannot {missing}",
            )
        if recommendation.action in NODE_ACTIONS:
            return carry_out_on_node(self, recommendation)
        try:
            job_id = validate_job_id(recommendation.job_id)
            validate_node_names(recommendation.excluded_nodes)
        except ValueError as exc:  # InvalidIdentifier
            return Outcome("failed", {"known": None}, detail=f"refused before any command: {exc}")
        outcome = Outcome("skipped", {"known": None})
        try:
            job = self.read_job(job_id)
            outcome.state_before = job_snapshot(job)
            if job is None:
                outcome.outcome = "failed"
                outcome.detail = "the scheduler no longer knows the job"
                return outcome
            self.require_known(job)
            problem = identity_problem(recommendation, job) or owner_problem(recommendation, job)
            if problem is not None:
                outcome.outcome = "failed"
                outcome.detail = f"refused before any command: {problem}"
                return outcome
            if recommendation.action in RESTARTS:
                self.executor.restart(self, recommendation, job, outcome)
            elif recommendation.action == Action.STOP:
                self.executor.stop(self, recommendation, job, outcome)
            else:
                outcome.detail = f"nothing to do for action {recommendation.action!r}"
                outcome.converged = True
        except Retry as exc:
            outcome.outcome = "retry"
            outcome.converged = False
            outcome.detail = f"to be continued from the scheduler's state: {exc}"
        except LeaseLost as exc:
            outcome.outcome = "retry"
            outcome.converged = False
            outcome.detail = f"stopped acting: {exc}"
        except SchedulerError as exc:
            if exc.result is not None:
                self.record(outcome, exc.result)
            if exc.result is None or outcome.acted:
                # The scheduler was unreachable (the command may or may not have run), or the
                # action is half done: the next pass reads the scheduler and finishes it.
                outcome.outcome = "retry"
                outcome.converged = False
                outcome.detail = f"to be continued from the scheduler's state: {exc}"
            else:
                outcome.outcome = "failed"
                outcome.detail = str(exc)
        except ValueError as exc:  # InvalidIdentifier: a value no command may carry
            outcome.outcome = "retry" if outcome.acted else "failed"
            outcome.detail = f"bad value: {exc}"
        return outcome
