"""The Slurm Advisor Controller: carries out claimed recommendations, exactly once.

Every step is decided from the scheduler's state read *now*, never from memory of what this
or another controller meant to do: a controller killed half-way and restarted (or a second
controller taking over an expired lease) reads the job, sees what already happened, and does
only what is left. A restart of attempt N is done when Slurm's restart count has reached N,
the excluded nodes are set and the job is no longer held; a stop is done when further requeue
is disabled and the job has ended, and is not for this job any more once it was requeued into
a later attempt (nobody judged that one).

Nothing is done on a guess. Before any command the job must be the recommendation's job (same
user, a submit time that fits) and every fact the action depends on must have been read; a
read that fails or a fact that is unknown gives the recommendation back (``retry``) to be taken
up again from the scheduler's state, by this controller or another. So does a half-done action:
a requeued job that is still held or still lacks its exclusions is finished on the next pass.

Every command is written ahead: before it runs, its exact command line is recorded in the
trail through the Advisor API (``dispatch``, a ``dispatched`` event). A controller killed right
after a command, or one whose command timed out after it took effect, leaves the command in
the trail all the same. The dispatch is also the last check of the lease before each command:
refused, or not answered, nothing runs. The requeue, the one command that must not run twice,
is preceded by one more read of the job after its dispatch, so that a controller paused since
it read the job does not restart an attempt that was restarted meanwhile.

The lease is short (``DEFAULT_LEASE_SECONDS``) so that a standby controller of the same cluster
finishes what a killed or frozen one started within seconds. It is renewed at every step and,
in between, from a thread of its own (``recovery.controller.lease``), so that a long command or
wait does not lose it; a renewal refused stops the action at its next step.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Protocol, TypeVar

from recovery.controller.client import AdvisorAPIError, ControllerIdentity, ReadyRecommendation
from recovery.controller.lease import Lease, LeaseLost
from recovery.schedulers.base import (
    Command,
    CommandResult,
    ExpeditedRequeueUnavailable,
    JobInfo,
    NodeInfo,
    SchedulerAdapter,
    SchedulerError,
    describe_unknown,
    drain_reason,
    drain_refusal,
    drained_by_recovery,
    resume_refusal,
)
from recovery.schedulers.nodelist import NodeListError, compress_nodelist
from recovery.schedulers.optin import OptInMode
from recovery.schedulers.validation import validate_job_id, validate_node_names

logger = logging.getLogger(__name__)

Read = TypeVar("Read")

FINISHED_STATES = frozenset(
    {
        "COMPLETED",
        "CANCELLED",
        "FAILED",
        "TIMEOUT",
        "NODE_FAIL",
        "OUT_OF_MEMORY",
        "BOOT_FAIL",
        "DEADLINE",
        "PREEMPTED",
    }
)
CANCELLED = "CANCELLED"
RESTART = {"restart", "restart_excluding"}
DRAIN = "drain"
RESUME = "resume"
# A report's job snapshot stays below the API's 16 KiB limit on ``state_before``.
MAX_SNAPSHOT_BYTES = 12 * 1024
NODE_LIST_KEYS = ("nodes", "excluded_nodes")
STOP = "stop"
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


class MisconfiguredController(Exception):
    """The controller's token, ``--cluster`` and scheduler do not belong together."""


class Retry(Exception):
    """Not finished now; the recommendation goes back to be taken up from the scheduler's state."""


class NotRestarted(Exception):
    """The job runs an attempt after the recommendation's: there is nothing to restart."""


class EffectUnknown(SchedulerError):
    """A command timed out or lost its connection: it may or may not have taken effect."""


class NotOwned(Exception):
    """The node, as read, is not recovery's to drain or resume: nothing is run on it."""


# A job's submit time as Slurm reports it and as the control plane stored it may differ by
# rounding; a requeue sets it to the moment of the requeue.
SUBMIT_TIME_TOLERANCE = timedelta(seconds=1)


@dataclass
class Outcome:
    outcome: str  # executed, skipped, failed or retry
    state_before: dict[str, Any]
    commands: list[dict[str, Any]] = field(default_factory=list)
    converged: bool | None = None
    detail: str = ""

    def body(self) -> dict[str, Any]:
        return {
            "outcome": self.outcome,
            "state_before": self.state_before,
            "commands": self.commands,
            "converged": self.converged,
            "detail": self.detail[:2000],
        }

    @property
    def acted(self) -> bool:
        return any(command["returncode"] == 0 for command in self.commands)


def job_snapshot(job: JobInfo | None) -> dict[str, Any]:
    if job is None:
        return {"known": False}
    snapshot: dict[str, Any] = {
        "known": True,
        "job_state": job.state,
        "reason": job.reason,
        "user": job.user,
        "submit_time": job.submit_time.isoformat() if job.submit_time else None,
        "restart_count": job.restart_count,
        "nodes": job.nodes,
        "excluded_nodes": job.excluded_nodes,
        "held": job.held,
        "requeue_allowed": job.requeue_allowed,
    }
    if job.unreadable:
        snapshot["unreadable"] = dict(job.unreadable)
    return fit_snapshot(snapshot)


def node_snapshot(node: NodeInfo | None) -> dict[str, Any]:
    """The node as read, for the report: state, flags, reason (and who set it when, where
    Slurm says), and what could not be read."""
    if node is None:
        return {"known": False}
    return {"known": True, **node.facts()}


def fit_snapshot(snapshot: dict[str, Any]) -> dict[str, Any]:
    """``snapshot`` small enough for the report: node lists compressed, or only counted.

    The Advisor API refuses a ``state_before`` larger than 16 KiB as JSON
    (``recovery/audit/limits.py``, which this process does not load); a job on thousands of
    nodes would exceed it with its node list spelled out.
    """
    if _json_bytes(snapshot) <= MAX_SNAPSHOT_BYTES:
        return snapshot
    fitted = dict(snapshot)
    lists = {key: fitted[key] for key in NODE_LIST_KEYS if isinstance(fitted.get(key), list)}
    for key, names in lists.items():
        try:
            fitted[key] = compress_nodelist(names)
        except NodeListError:
            fitted[key] = f"{len(names)} nodes"
    if _json_bytes(fitted) > MAX_SNAPSHOT_BYTES:
        for key, names in lists.items():
            fitted[key] = f"{len(names)} nodes, too many to list"
    return fitted


def _json_bytes(value: Any) -> int:
    return len(json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=str).encode())


def identity_problem(recommendation: ReadyRecommendation, job: JobInfo) -> str | None:
    """Why ``job`` is not the job the recommendation was made for, or None when it is.

    Slurm hands job ids out again (after MaxJobId, or when its state was reset): the id alone
    may name another user's job. A requeue sets the submit time to the requeue's moment, so a
    later submit time fits only a job that was restarted since.
    """
    if not recommendation.user or recommendation.submit_time is None:
        return "the recommendation does not say whose job it is (no user or submit time)"
    if job.user != recommendation.user:
        return f"job {job.job_id} belongs to {job.user!r}, not {recommendation.user!r}"
    assert job.submit_time is not None and job.restart_count is not None  # checked as known
    drift = job.submit_time - recommendation.submit_time
    if abs(drift) <= SUBMIT_TIME_TOLERANCE:
        return None
    if drift > SUBMIT_TIME_TOLERANCE and job.restart_count > 0:
        return None
    return (
        f"job {job.job_id} was submitted at {job.submit_time.isoformat()}, not at "
        f"{recommendation.submit_time.isoformat()}: the id names another job now"
    )


def owner_problem(recommendation: ReadyRecommendation, job: JobInfo) -> str | None:
    """Why the job's owner, as its comment reads now, has not left this action to the loop.

    A job that is no longer opted in, or opted in to be observed only, is acted on only with an
    operator's approval: the owner may have changed the comment after the decision was made.
    """
    if recommendation.approved_by:
        return None
    if not job.opt_in.opted_in:
        return f"job {job.job_id} is no longer opted in ({job.opt_in.reason}) and nobody approved"
    if job.opt_in.mode != OptInMode.ACT:
        return f"job {job.job_id} is opted in to be observed only and nobody approved the action"
    return None


def started_since(recommendation: ReadyRecommendation, job: JobInfo) -> str | None:
    """Why the job's current allocation is not the attempt the recommendation is about.

    The restart count alone cannot tell a failed attempt N from attempt N's successor started by
    Slurm or a person while the recommendation waited: requeueing then would throw away a
    healthy new attempt. The job's start time must be the attempt's own.
    """
    if recommendation.attempt_started_at is None:
        return f"attempt {recommendation.attempt} never started, so there is nothing to restart"
    if job.start_time is None:
        raise Retry(f"the start time of job {job.job_id} is unknown")
    if job.start_time - recommendation.attempt_started_at > SUBMIT_TIME_TOLERANCE:
        return (
            f"job {job.job_id} started again at {job.start_time.isoformat()}, after attempt "
            f"{recommendation.attempt} (started {recommendation.attempt_started_at.isoformat()})"
        )
    return None


def restarted_past(recommendation: ReadyRecommendation, job: JobInfo) -> str | None:
    """Why a restart decided for attempt N has nothing left to do on the job as read, or None
    while it still has: the job not yet requeued, or requeued and still pending (this
    restart's own requeue, or Slurm's, waiting for its exclusions and release).

    Once attempt N+1 started, Slurm takes no exclusions until the job is pending again, and
    a later requeue (attempt N+2 or beyond) belongs to a later failure with a recommendation
    of its own: its hold is that one's, and releasing it, or setting this one's exclusions,
    would start the job without that one's.
    """
    attempt = recommendation.attempt
    assert attempt is not None and job.restart_count is not None  # checked as known
    if job.restart_count > attempt:
        return (
            f"job {job.job_id} is at attempt {job.restart_count + 1} ({job.state}): restarted "
            f"again after attempt {attempt + 1}, the restart this recommendation asked for"
        )
    if job.restart_count == attempt and not job.is_pending and job.state != "COMPLETING":
        missing = sorted(set(recommendation.excluded_nodes) - set(job.excluded_nodes or []))
        if missing:
            return (
                f"job {job.job_id} started attempt {attempt + 1} ({job.state}) without "
                f"excluding {', '.join(missing)}; Slurm takes exclusions only while a job is "
                "pending"
            )
    return None


def cancelled_since(job: JobInfo) -> str:
    """Why a cancelled job is not restarted: Slurm requeues a cancelled job that is still in
    memory, so a restart decided while the attempt ran or failed would bring back a job its
    owner, an administrator or a stop ended on purpose meanwhile. A failure never ends a job
    as CANCELLED (a crash is FAILED, a dead node NODE_FAIL, a time limit TIMEOUT): the policy
    leaves a cancelled job alone, and the controller keeps to that on the state it reads."""
    return f"job {job.job_id} was cancelled since the decision (scancel); a cancel is not undone"


def newer_attempt(recommendation: ReadyRecommendation, job: JobInfo) -> str | None:
    """Why a stop decided for attempt N is not this job's to carry out now.

    The decision was about attempt N's failure; when Slurm (its own requeue after a node
    failure, a preemption) or a person started attempt N+1 meanwhile, stopping would end an
    attempt nobody judged, maybe one that is training. Its own failure, if it comes, is decided
    afresh.
    """
    attempt = recommendation.attempt
    assert job.restart_count is not None  # checked as known
    if attempt is None or job.restart_count < attempt or job.state in FINISHED_STATES:
        return None
    return (
        f"job {job.job_id} is at attempt {job.restart_count + 1} ({job.state}), restarted "
        f"after attempt {attempt} that the stop was decided for"
    )


def _already_done(action: str, node: NodeInfo) -> str:
    """Why ``action`` has nothing left to do on ``node`` as read, or "": drained with recovery's
    reason (a drain), not drained (a resume: no drain of recovery's is left to lift, whatever
    else keeps the node out). Never said of a node whose state is unknown."""
    if node.unknown():
        return ""
    if action == DRAIN and drained_by_recovery(node):
        return f"{node.name} is already drained by recovery: {node.reason}"
    if action == RESUME and not node.drained:
        return f"{node.name} is not drained ({node.describe()})"
    return ""


def _require_ownable(action: str, node: NodeInfo) -> None:
    """Raise ``Retry`` while the node's state or reason is unknown (it is read again on the
    next pass), ``NotOwned`` when recovery may not ``action`` the node as read."""
    unknown = node.unknown()
    if unknown:
        raise Retry(
            f"not acting on node {node.name} while these are unknown: {describe_unknown(unknown)}"
        )
    refusal = drain_refusal(node) if action == DRAIN else resume_refusal(node)
    if refusal:
        raise NotOwned(refusal)


class AdvisorController:
    def __init__(
        self,
        api: AdvisorAPI,
        adapter: SchedulerAdapter,
        *,
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
        self.partitions = set(partitions)
        self.lease_seconds = lease_seconds
        self.longest_step_seconds = longest_step_seconds
        self.settle_seconds = settle_seconds
        self.poll_seconds = poll_seconds
        self.read_attempts = read_attempts
        self.backoff_seconds = backoff_seconds
        self.sleep = sleep
        self.clock = clock
        self._lease: Lease | None = None  # of the recommendation being carried out
        self._acting_on: int | None = None  # the recommendation the commands are dispatched for
        self._dispatched = 0  # commands dispatched for it so far

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

    # ------------------------------------------------------------------ one recommendation

    def carry_out(self, recommendation: ReadyRecommendation) -> Outcome:
        self._acting_on = recommendation.id
        self._dispatched = 0
        if recommendation.action in (DRAIN, RESUME):
            return self._carry_out_on_node(recommendation)
        try:
            job_id = validate_job_id(recommendation.job_id)
            validate_node_names(recommendation.excluded_nodes)
        except ValueError as exc:  # InvalidIdentifier
            return Outcome("failed", {"known": None}, detail=f"refused before any command: {exc}")
        outcome = Outcome("skipped", {"known": None})
        try:
            job = self._read(job_id)
            outcome.state_before = job_snapshot(job)
            if job is None:
                outcome.outcome = "failed"
                outcome.detail = "the scheduler no longer knows the job"
                return outcome
            self._require_known(job)
            problem = identity_problem(recommendation, job) or owner_problem(recommendation, job)
            if problem is not None:
                outcome.outcome = "failed"
                outcome.detail = f"refused before any command: {problem}"
                return outcome
            if recommendation.action in RESTART:
                self._restart(recommendation, job, outcome)
            elif recommendation.action == STOP:
                self._stop(recommendation, job, outcome)
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
                self._record(outcome, exc.result)
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

    def _restart(self, recommendation: ReadyRecommendation, job: JobInfo, outcome: Outcome) -> None:
        attempt = recommendation.attempt
        if attempt is None:
            outcome.outcome = "failed"
            outcome.detail = "the recommendation names no attempt: cannot tell if it is done"
            return
        assert job.restart_count is not None and job.excluded_nodes is not None
        if job.restart_count < attempt and job.state == CANCELLED:
            outcome.converged = False
            outcome.detail = f"nothing restarted: {cancelled_since(job)}"
            return
        if job.restart_count < attempt and not job.requeue_allowed:
            outcome.outcome = "failed"
            outcome.converged = False
            outcome.detail = f"abandoned: the job is {job.state} and Slurm will not requeue it"
            return
        if job.restart_count < attempt and job.state == "COMPLETING":
            # Winding down: the failed attempt ending, or an allocation left over from a
            # restart. Which one shows once it has ended; until then nothing is done.
            job = self._wait(job.job_id, lambda j: j.state != "COMPLETING")
            if job.state == "COMPLETING":
                raise Retry(f"job {job.job_id} is still completing")
        assert job.restart_count is not None and job.excluded_nodes is not None
        job_id = job.job_id
        moved_on = restarted_past(recommendation, job)
        if moved_on is not None:
            outcome.converged = set(recommendation.excluded_nodes) <= set(job.excluded_nodes)
            outcome.detail = f"nothing to do: {moved_on}"
            return
        requeue = job.restart_count < attempt and job.state != "PENDING"
        if requeue:
            problem = started_since(recommendation, job)
            if problem is not None:
                outcome.converged = False
                outcome.detail = f"nothing restarted: {problem}"
                return
        wanted_exclusions = sorted(set(job.excluded_nodes) | set(recommendation.excluded_nodes))
        missing_exclusions = not set(recommendation.excluded_nodes) <= set(job.excluded_nodes)
        if requeue:
            try:
                if not missing_exclusions and self._requeued_expedited(
                    recommendation, job_id, outcome
                ):
                    missing_exclusions = False
                else:
                    self._command(
                        outcome,
                        Command.REQUEUE_HOLD,
                        job_id,
                        lambda: self.adapter.requeue(job_id, hold=True),
                        recheck=lambda: self._still_to_restart(recommendation, job_id),
                    )
            except NotRestarted as exc:
                outcome.converged = False
                outcome.detail = f"nothing restarted: {exc}"
                return
            job = self._wait(
                job_id,
                lambda j: (
                    j.state in {"PENDING", "COMPLETING"} and (j.restart_count or 0) >= attempt
                ),
            )
        elif missing_exclusions and job.is_pending and not job.held:
            # Keep it from starting on an excluded node while the exclusion is set.
            self._command(outcome, Command.HOLD, job_id, lambda: self.adapter.hold(job_id))
        if missing_exclusions:
            self._exclude(outcome, job_id, wanted_exclusions)
        current = self._read_known(job_id)
        if current.held:
            self._command(outcome, Command.RELEASE, job_id, lambda: self.adapter.release(job_id))
        final = self._read(job_id)
        outcome.converged = bool(
            final is not None
            and not final.unknown()
            and (final.restart_count or 0) >= attempt
            and set(recommendation.excluded_nodes) <= set(final.excluded_nodes or [])
            and final.held is False
            and final.state not in FINISHED_STATES
        )
        if not outcome.converged:
            reason = (
                "abandoned" if final is None or final.state in FINISHED_STATES else "not converged"
            )
            outcome.detail = outcome.detail or f"{reason}: {job_snapshot(final)}"

    def _requeued_expedited(
        self, recommendation: ReadyRecommendation, job_id: str, outcome: Outcome
    ) -> bool:
        """Slurm 25.11's fast path, where the site and the job have it: restarted at once, at
        top priority, with no hold to lift. Nothing else to set, so nothing is lost by it.

        Where the job turns out not to have it, its dispatch stays in the trail with no command
        after it, and the ordinary requeue is dispatched next.
        """
        if not self.adapter.supports_expedited_requeue():
            return False
        self._keep_lease()
        try:
            self._command(
                outcome,
                Command.REQUEUE_EXPEDITED,
                job_id,
                lambda: self.adapter.requeue_expedited(job_id),
                recheck=lambda: self._still_to_restart(recommendation, job_id),
            )
        except ExpeditedRequeueUnavailable as exc:
            logger.info("ordinary requeue for job %s: %s", job_id, exc)
            return False
        return True

    def _still_to_restart(self, recommendation: ReadyRecommendation, job_id: str) -> None:
        """Read the job once more after the requeue's dispatch, right before the requeue.

        A controller paused since it read the job (SIGSTOP, a frozen VM) may come back to an
        attempt that Slurm, a person or another controller restarted meanwhile; a second
        requeue would throw away that new attempt. Raises ``Retry`` when the job moved on (the
        next pass decides from its state) and ``NotRestarted`` when a newer attempt runs.
        """
        job = self._read_known(job_id)
        attempt = recommendation.attempt
        assert attempt is not None and job.restart_count is not None  # checked as known
        if job.restart_count >= attempt or job.state in {"PENDING", "COMPLETING"}:
            raise Retry(
                f"job {job_id} changed since it was read (restart count {job.restart_count}, "
                f"{job.state}): not requeued"
            )
        if job.state == CANCELLED:
            raise NotRestarted(cancelled_since(job))
        problem = started_since(recommendation, job)
        if problem is not None:
            raise NotRestarted(problem)

    def _exclude(self, outcome: Outcome, job_id: str, nodes: list[str]) -> None:
        """Set the exclusions; Slurm accepts them only once the requeued job is pending."""
        deadline = self.clock() + self.settle_seconds
        while True:
            self._keep_lease()
            try:
                self._command(
                    outcome,
                    Command.SET_EXCLUDED_NODES,
                    job_id,
                    lambda: self.adapter.set_excluded_nodes(job_id, nodes),
                    nodes,
                )
                return
            except SchedulerError as exc:
                if "no longer pending" not in str(exc) or self.clock() > deadline:
                    raise
            self.sleep(self.poll_seconds)

    def _stop(self, recommendation: ReadyRecommendation, job: JobInfo, outcome: Outcome) -> None:
        job_id = job.job_id
        problem = newer_attempt(recommendation, job)
        if problem is not None:
            outcome.converged = False
            outcome.detail = f"nothing stopped: {problem}"
            return
        if job.state == "COMPLETING":
            # The failed attempt is still winding down; Slurm refuses updates until it ends.
            job = self._wait(job_id, lambda j: j.state != "COMPLETING")
        if job.requeue_allowed and job.state not in FINISHED_STATES:
            try:
                self._command(
                    outcome,
                    Command.DISABLE_REQUEUE,
                    job_id,
                    lambda: self.adapter.disable_requeue(job_id),
                )
            except SchedulerError:
                current = self._read(job_id)
                if current is None or current.state not in FINISHED_STATES:
                    raise
                job = current  # it ended meanwhile: nothing left that could restart it
        if job.state not in FINISHED_STATES:
            self._command(outcome, Command.CANCEL, job_id, lambda: self.adapter.cancel(job_id))
            job = self._wait(job_id, lambda j: j.state in FINISHED_STATES)
        outcome.converged = job.state in FINISHED_STATES

    # ------------------------------------------------------------------ nodes

    def _carry_out_on_node(self, recommendation: ReadyRecommendation) -> Outcome:
        """Drain or resume the recommendation's node, from the node's state read now.

        A node already as wanted by recovery is skipped: drained with recovery's reason (a drain
        is done once however many recommendations or approvals ask for it), or not drained (a
        resume). Otherwise recovery acts only on a node it may own (``drain_refusal``,
        ``resume_refusal``): a drain only of a node in service, a resume only of recovery's own
        drain with nothing else keeping the node out.
        Anything else is refused before any command and reported with the node as read. A node
        whose state or reason is unknown is not acted on; it is read again on the next pass.
        The node is read once more after the command's dispatch, right before the command, and
        the command is called off when that read no longer allows it.
        """
        outcome = Outcome("skipped", {"known": None})
        try:
            name = validate_node_names([recommendation.node])[0]
            reason = drain_reason(recommendation.reason)
            node = self._read_node(name)
            outcome.state_before = node_snapshot(node)
            if node is None:
                outcome.outcome = "failed"
                outcome.detail = f"refused before any command: the scheduler does not know {name}"
                return outcome
            done = _already_done(recommendation.action, node)
            if done:
                outcome.converged = True
                outcome.detail = done
                return outcome
            _require_ownable(recommendation.action, node)
            drain = recommendation.action == DRAIN

            def run() -> CommandResult:
                return (
                    self.adapter.drain_node(name, reason)
                    if drain
                    else self.adapter.resume_node(name)
                )

            self._node_command(
                outcome,
                Command.DRAIN_NODE if drain else Command.RESUME_NODE,
                name,
                run,
                reason if drain else "",
                recheck=lambda: self._still_to_change(recommendation.action, name, outcome),
            )
            after = self._read_node(name)
            # Done as ``_already_done`` says: for a resume, recovery's drain lifted (Slurm may
            # list the node as not responding until its next ping).
            outcome.converged = after is not None and bool(
                _already_done(recommendation.action, after)
            )
            if not outcome.converged:
                outcome.detail = f"not converged: {node_snapshot(after)}"
        except NotOwned as exc:
            outcome.outcome = "failed"
            outcome.converged = False
            outcome.detail = f"refused before any command: {exc}"
        except ValueError as exc:  # InvalidIdentifier, or a reason recovery does not write
            outcome.outcome = "failed"
            outcome.detail = f"refused before any command: {exc}"
        except (Retry, LeaseLost) as exc:
            outcome.outcome = "retry"
            outcome.converged = False
            outcome.detail = f"to be continued from the scheduler's state: {exc}"
        except SchedulerError as exc:
            if exc.result is not None:
                self._record(outcome, exc.result)
            # Unreachable, or a command whose effect is unknown: the node's state decides next.
            outcome.outcome = "retry" if exc.result is None else "failed"
            outcome.converged = False if exc.result is None else None
            outcome.detail = str(exc)
        return outcome

    def _still_to_change(self, action: str, name: str, outcome: Outcome) -> None:
        """Read the node once more after the command's dispatch, right before the command.

        An administrator may have taken the node out (or Slurm itself) since it was read, or a
        controller paused since then may come back to a node another one already changed.
        Raises ``NotOwned`` when recovery may no longer change it (the report then shows the
        node as read now) and ``Retry`` when it is already as wanted (the next pass says so).
        """
        node = self._read_node(name)
        outcome.state_before = node_snapshot(node)
        if node is None:
            raise NotOwned(f"the scheduler no longer knows {name}")
        if _already_done(action, node):
            raise Retry(f"{name} changed since it was read ({node.describe()}): not run")
        _require_ownable(action, node)

    def _read_node(self, name: str) -> NodeInfo | None:
        """The node as the scheduler reports it now, read as a job is (``_read``)."""
        return self._read_retrying(f"node {name}", lambda: self.adapter.get_node(name))

    def _node_command(
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

    # ------------------------------------------------------------------ reading the scheduler

    def _read(self, job_id: str) -> JobInfo | None:
        """The job as the scheduler reports it now; a failed read is retried with backoff.

        Raises ``Retry`` when it still fails: a read error says nothing about the job, and
        is never taken as "the job is gone".
        """
        return self._read_retrying(f"job {job_id}", lambda: self.adapter.get_job(job_id))

    def _read_retrying(self, what: str, read: Callable[[], Read]) -> Read:
        delay = self.backoff_seconds
        for attempt in range(1, self.read_attempts + 1):
            self._keep_lease()
            try:
                return read()
            except SchedulerError as exc:
                if attempt == self.read_attempts:
                    raise Retry(f"cannot read {what}: {exc}") from None
                logger.info("reading %s failed (%s); again in %.1f s", what, exc, delay)
            self.sleep(delay)
            delay *= 2
        raise AssertionError("unreachable")

    def _read_known(self, job_id: str) -> JobInfo:
        job = self._read(job_id)
        if job is None:
            raise SchedulerError(f"job {job_id} disappeared while being acted on")
        self._require_known(job)
        return job

    @staticmethod
    def _require_known(job: JobInfo) -> None:
        unknown = job.unknown()
        if unknown:
            raise Retry(
                f"not acting on job {job.job_id} while these are unknown: "
                f"{describe_unknown(unknown)}"
            )

    def _wait(self, job_id: str, reached: Callable[[JobInfo], bool]) -> JobInfo:
        deadline = self.clock() + self.settle_seconds
        while True:
            job = self._read_known(job_id)
            if reached(job) or self.clock() > deadline:
                return job
            self.sleep(self.poll_seconds)

    # ------------------------------------------------------------------ the lease

    def _keep_lease(self) -> None:
        """Stop when the lease is lost (``LeaseLost``); renew it when a third has gone by."""
        if self._lease is not None:
            self._lease.check()

    # ------------------------------------------------------------------ acting

    def _command(
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
        self._keep_lease()  # a lease known to be lost is not even asked about
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
        self._record(outcome, result)

    @staticmethod
    def _record(outcome: Outcome, result: CommandResult) -> None:
        outcome.commands.append(
            {
                "argv": list(result.argv),
                "returncode": result.returncode,
                "output": (result.stdout + result.stderr)[-2000:],
            }
        )
