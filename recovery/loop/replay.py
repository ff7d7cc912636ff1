"""Replay a policy over a cluster's recorded history: what it would have done, nothing done.

Each decision the loop made kept the facts it was made on (``Anomaly.decision_facts`` and
``Anomaly.drain_facts``, see ``recovery.loop.decision_facts``). A replay takes the decisions of
a window in the order they were made and runs the same pure functions over those facts
(``recovery.loop.policy_rules.choose``, ``recovery.loop.drains.drain_choice``) under the policies in
force now, one of which may be a draft that is not saved. Nothing is written and nothing is
sent to a scheduler.

What a replay cannot know, it says:

* A decision made before its facts were recorded is listed as not replayable.
* What people and controllers did after a decision (approved, rejected, carried out) is as
  recorded: a draft that restarts where the recorded policy stopped does not invent the next
  attempt. Later decisions of a job the draft would have stopped are marked as such, and
  their actions are not counted for the draft.
* Detection is not replayed: which anomalies were found, and when a crash was confirmed, is
  as recorded (a draft's hang timeout or confirmation settings show only from the next
  decisions on).

Replaying the policies in force reproduces what was decided; where it does not, the reason is
named (a policy edited or enabled since), or the difference is reported as unexplained.

A draft is made from settings by ``recovery.loop.replay_draft``; the report is printed by
``recovery.loop.replay_output`` and shown on pages by ``recovery.loop.replay_view``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from django.db.models import Q

from recovery.audit.actors import Actor
from recovery.choices import RecommendationAction, RecommendationStatus
from recovery.loop import policy as policy_engine
from recovery.loop import policy_rules
from recovery.loop.decision_facts import READABLE_FACTS_VERSIONS, facts_time, recorded_anomaly
from recovery.loop.drains import DRAIN_PROPOSED, drain_choice
from recovery.models import Anomaly, Cluster, Policy, Recommendation

# The verdicts of one decision point: the draft decides as recorded, differently, makes an
# action where none was made, makes none where one was; the job was stopped by the draft
# earlier; or the decision's facts were not recorded.
SAME, DIFFERENT, MADE, NOT_MADE = "same", "different", "made", "not made"
AFTER_DRAFT_STOP, NOT_REPLAYABLE = "after the draft's stop", "not replayable"
RESTARTS = (RecommendationAction.RESTART, RecommendationAction.RESTART_EXCLUDING)
# A draft with no primary key yet wins ties with the saved policies of its scope, as the newest.
UNSAVED_DRAFT_KEY = 2**62


@dataclass(frozen=True)
class Action:
    """One recommendation: recorded, or what the draft would make."""

    action: str
    excluded_nodes: tuple[str, ...] = ()
    node: str = ""  # a drain's node
    # Whether it waits for a person, or would run on the policy's word.
    needs_person: bool = True
    reason: str = field(default="", compare=False)
    # How long the nodes it excludes stay excluded from the job's restarts (its policy's).
    exclusion_hours: int = field(default=0, compare=False)

    def words(self) -> str:
        """As a person reads it: "restart excluding gpu-007", "drain gpu-007", "stop"."""
        if self.action == RecommendationAction.DRAIN:
            return f"drain {self.node}"
        if self.excluded_nodes:
            return f"restart excluding {', '.join(self.excluded_nodes)}"
        if self.action == RecommendationAction.RESTART_EXCLUDING:
            return "restart (no node to exclude)"
        return str(self.action).replace("_", " ")


@dataclass(frozen=True)
class ReplayedDecision:
    """One decision point of the window: what was recorded and what the draft makes of it."""

    at: datetime
    anomaly_id: int
    workload_id: int
    job_id: str
    attempt: int | None
    kind: str  # "decision" (restart, stop) or "drain"
    recorded: Action | None
    replayed: Action | None
    verdict: str
    # What the recorded recommendation became: approved, rejected by whom, executed...
    recorded_status: str = ""
    recorded_by: str = ""
    explanation: str = ""


@dataclass(frozen=True)
class Totals:
    restarts: int = 0
    stops: int = 0
    drains: int = 0
    nodes_excluded: int = 0
    # Each node excluded from a restart, for the job's policy's exclusion time.
    node_hours_excluded: float = 0.0
    without_approval: int = 0


@dataclass(frozen=True)
class ReplayReport:
    cluster: str
    since: datetime
    until: datetime
    policy: str
    decisions: list[ReplayedDecision]
    recorded: Totals
    replayed: Totals
    # The draft stops a job whose recorded decision let it run (no stop, or a stop rejected).
    stops_operators_let_run: list[ReplayedDecision] = field(default_factory=list)
    # The draft acts where an operator rejected the recorded recommendation.
    rejected_actions_taken: list[ReplayedDecision] = field(default_factory=list)

    @property
    def verdicts(self) -> Counter[str]:
        return Counter(decision.verdict for decision in self.decisions)

    @property
    def differences(self) -> list[ReplayedDecision]:
        return [d for d in self.decisions if d.verdict not in (SAME, NOT_REPLAYABLE)]

    @property
    def unexplained(self) -> list[ReplayedDecision]:
        return [d for d in self.differences if not d.explanation]


def candidate_policies(draft: Policy | None) -> list[Policy]:
    """The enabled policies, with ``draft`` in place of the one it edits (or added); a draft
    that is disabled takes the policy it edits out."""
    enabled = list(Policy.objects.filter(enabled=True))
    if draft is None:
        return enabled
    if draft.pk is None:
        draft.pk = UNSAVED_DRAFT_KEY
    others = [p for p in enabled if p.pk != draft.pk]
    return [*others, draft] if draft.enabled else others


def replay(
    cluster: Cluster, since: datetime, until: datetime, draft: Policy | None = None
) -> ReplayReport:
    """Decide again on every decision of ``cluster`` between ``since`` and ``until``."""
    decided = (
        Anomaly.objects.filter(
            workload__cluster=cluster, decided_at__gte=since, decided_at__lt=until
        )
        .select_related("workload__cluster", "attempt")
        .order_by("decided_at", "id")
    )
    anomalies = list(decided)
    recorded = _recorded_recommendations([a.pk for a in anomalies])
    state = _ReplayState()
    decisions: list[ReplayedDecision] = []
    with policy_engine.policies_chosen_from(candidate_policies(draft)):
        for anomaly in anomalies:
            decisions.extend(_replay_drains(anomaly, recorded, draft))
            decisions.append(_replay_decision(anomaly, recorded, state, draft))
    decisions.sort(key=lambda d: (d.at, d.anomaly_id, d.kind != "drain"))
    report = ReplayReport(
        cluster=cluster.name,
        since=since,
        until=until,
        policy=_label(draft),
        decisions=decisions,
        recorded=_totals(decisions, recorded=True),
        replayed=_totals(decisions, recorded=False),
        stops_operators_let_run=[
            d
            for d in decisions
            if d.replayed is not None
            and d.replayed.action == RecommendationAction.STOP
            and d.verdict in (DIFFERENT, MADE)
            and not _recorded_stop_held(d)
        ],
        rejected_actions_taken=[
            d
            for d in decisions
            if d.recorded_status == RecommendationStatus.REJECTED
            and d.replayed is not None
            and d.verdict != NOT_REPLAYABLE
        ],
    )
    return report


def _label(draft: Policy | None) -> str:
    if draft is None:
        return "the policies in force"
    saved = " (not saved)" if draft.pk in (None, UNSAVED_DRAFT_KEY) else ""
    return f"draft of {draft.name or 'a new policy'}{saved}"


def _recorded_stop_held(decision: ReplayedDecision) -> bool:
    return (
        decision.recorded is not None
        and decision.recorded.action == RecommendationAction.STOP
        and decision.recorded_status != RecommendationStatus.REJECTED
    )


def _recorded_recommendations(anomaly_ids: Sequence[int]) -> dict[int, list[Recommendation]]:
    """The policy's recommendations made on each anomaly (restarts, stops, drains; an
    operator's decision changes ``decided_by``, not the key), oldest first."""
    found: dict[int, list[Recommendation]] = {}
    rows = (
        Recommendation.objects.filter(anomaly_id__in=list(anomaly_ids))
        .filter(Q(idempotency_key__startswith="policy:") | Q(idempotency_key__startswith="drain:"))
        .select_related("node")
        .order_by("created_at", "id")
    )
    for recommendation in rows:
        assert recommendation.anomaly_id is not None
        found.setdefault(recommendation.anomaly_id, []).append(recommendation)
    return found


def _as_action(recommendation: Recommendation) -> Action:
    waits = recommendation.approved_by != "" or recommendation.status in (
        RecommendationStatus.AWAITING_APPROVAL,
        RecommendationStatus.REJECTED,
    )
    return Action(
        action=recommendation.action,
        excluded_nodes=tuple(recommendation.excluded_nodes or []),
        node=recommendation.node.name if recommendation.node else "",
        needs_person=waits,
        reason=recommendation.reason,
    )


def _status(recommendation: Recommendation | None) -> tuple[str, str]:
    """What became of the recorded recommendation, and the person who approved or rejected
    it ("" where nobody did)."""
    if recommendation is None:
        return "", ""
    person = recommendation.approved_by
    if not person and recommendation.decided_by != Actor.POLICY:
        person = recommendation.decided_by
    return recommendation.status, person


@dataclass
class _ReplayState:
    # Per attempt (workload, attempt number): the draft's latest recommendation, if it made one.
    made: dict[tuple[int, int], Action] = field(default_factory=dict)
    # Workloads the draft stopped where the record did not, and the attempt of that stop.
    stopped: dict[int, int] = field(default_factory=dict)


def _replay_decision(
    anomaly: Anomaly,
    recorded: dict[int, list[Recommendation]],
    state: _ReplayState,
    draft: Policy | None,
) -> ReplayedDecision:
    facts = anomaly.decision_facts or {}
    workload = anomaly.workload
    own = [r for r in recorded.get(anomaly.pk, []) if r.action != RecommendationAction.DRAIN]
    made = own[-1] if own else None
    status, by = _status(made)
    attempt = anomaly.attempt.number if anomaly.attempt else None
    base = ReplayedDecision(
        at=anomaly.decided_at or anomaly.detected_at,
        anomaly_id=anomaly.pk,
        workload_id=workload.pk,
        job_id=workload.job_id,
        attempt=attempt,
        kind="decision",
        recorded=_as_action(made) if made else None,
        replayed=None,
        verdict=NOT_REPLAYABLE,
        recorded_status=status,
        recorded_by=by,
    )
    if facts.get("v") not in READABLE_FACTS_VERSIONS or "result" not in facts:
        failed = (anomaly.details or {}).get("policy_error")
        if failed:
            why = f"the policy engine failed on it and gave up ({failed})"
        elif facts:
            why = f"decision facts of another version ({facts.get('v')!r})"
        else:
            why = "decided before decision facts were recorded"
        return replace(base, explanation=why)
    at = facts_time(facts)
    result = facts["result"]
    recorded_action = None
    if result["outcome"] == policy_rules.NEW:
        recorded_action = Action(
            action=result["action"],
            excluded_nodes=tuple(result["excluded_nodes"]),
            needs_person=bool(result["needs_person"]),
            reason=made.reason if made else "",
            exclusion_hours=int(facts.get("exclusion_hours") or 0),
        )
    attempt_number = int(facts["attempt_number"])
    stopped_at = state.stopped.get(workload.pk)
    if stopped_at is not None and attempt_number > stopped_at:
        return replace(
            base,
            at=at,
            recorded=recorded_action,
            verdict=AFTER_DRAFT_STOP,
            explanation=f"the draft stopped the job at attempt {stopped_at}",
        )
    own_policy = policy_engine.policy_for(workload)
    site = policy_engine.site_policy(workload, own_policy).policy
    choice = policy_rules.choose(
        _with_draft_recommendations(facts, state, workload.pk, attempt_number),
        recorded_anomaly(facts, workload),
        own_policy,
        site,
    )
    replayed_action = None
    if choice.outcome == policy_rules.NEW and choice.decision is not None:
        replayed_action = Action(
            action=choice.decision.action,
            excluded_nodes=tuple(choice.decision.excluded_nodes),
            needs_person=choice.needs_person,
            reason=choice.decision.reason,
            exclusion_hours=own_policy.exclusion_hours,
        )
        state.made[(workload.pk, attempt_number)] = replayed_action
        stops = replayed_action.action == RecommendationAction.STOP
        if stops and (recorded_action is None or recorded_action.action != replayed_action.action):
            state.stopped.setdefault(workload.pk, attempt_number)
    verdict = _verdict(recorded_action, replayed_action, result["outcome"], choice.outcome)
    explanation = ""
    if verdict != SAME:
        chosen = [(facts["policy"], own_policy), (facts["site_policy"], site)]
        explanation = _explain(chosen, draft)
    return replace(
        base,
        at=at,
        recorded=recorded_action,
        replayed=replayed_action,
        verdict=verdict,
        explanation=explanation,
    )


def _with_draft_recommendations(
    facts: dict[str, Any], state: _ReplayState, workload_id: int, attempt: int
) -> dict[str, Any]:
    """The facts, with the attempt's recommendation as the draft made it where it made one.

    Its status is the recorded one (what people and controllers did is not replayed).
    """
    mine = state.made.get((workload_id, attempt))
    if mine is None:
        return facts
    changed = dict(facts)
    for key in ("earlier", "open"):
        recorded = facts[key]
        if recorded is not None:
            changed[key] = {
                **recorded,
                "action": mine.action,
                "excluded_nodes": list(mine.excluded_nodes),
            }
    return changed


def _verdict(
    recorded: Action | None, replayed: Action | None, recorded_outcome: str, outcome: str
) -> str:
    if recorded is None and replayed is None:
        return SAME if _same_kind_of_nothing(recorded_outcome, outcome) else DIFFERENT
    if recorded is None:
        return MADE
    if replayed is None:
        return NOT_MADE
    return SAME if recorded == replayed else DIFFERENT


def _same_kind_of_nothing(recorded_outcome: str, outcome: str) -> bool:
    # Kept, same and under way each leave the attempt's recommendation as it is: one outcome.
    unchanged = {policy_rules.KEPT, policy_rules.SAME, policy_rules.UNDER_WAY}
    if recorded_outcome in unchanged and outcome in unchanged:
        return True
    return recorded_outcome == outcome


def _explain(chosen: Sequence[tuple[dict[str, Any], Policy]], draft: Policy | None) -> str:
    """Why the replay differs from the record, where a fact says so; "" otherwise.

    ``chosen``: each policy the decision read, as recorded then and as chosen now.
    """
    if draft is not None and any(draft.pk == now.pk for _, now in chosen):
        return f"the draft ({draft.name or 'new policy'}) decides differently"
    reasons = []
    for then, now in chosen:
        if then["id"] != now.pk:
            reasons.append(
                f"{now.name!r} applies now; {then['name']!r} applied then "
                "(a policy was enabled, disabled or rescoped since)"
            )
        elif _edited_since(now, then["updated_at"]):
            reasons.append(f"{now.name!r} was edited at {now.updated_at:%Y-%m-%d %H:%M}")
    return "; ".join(dict.fromkeys(reasons))


def _edited_since(policy: Policy, then: str | None) -> bool:
    if not then or policy.updated_at is None:
        return False
    return policy.updated_at > datetime.fromisoformat(then)


def _replay_drains(
    anomaly: Anomaly, recorded: dict[int, list[Recommendation]], draft: Policy | None
) -> list[ReplayedDecision]:
    facts = anomaly.drain_facts or {}
    if facts.get("v") not in READABLE_FACTS_VERSIONS:
        return []
    workload = anomaly.workload
    site = policy_engine.site_policy_for(workload)
    drains = {
        r.node.name: r
        for r in recorded.get(anomaly.pk, [])
        if r.action == RecommendationAction.DRAIN and r.node is not None
    }
    at = facts_time(facts)
    automatic = bool(facts["automatic"])
    ready: set[str] = set()
    found = []
    for name in sorted(facts["nodes"]):
        outcome, why = drain_choice(facts, name, site, ready)
        drain = Action(RecommendationAction.DRAIN, node=name, needs_person=not automatic)
        replayed = drain if outcome == DRAIN_PROPOSED else None
        if replayed is not None and automatic:
            ready.add(name)
        made = drains.get(name)
        recorded_action = drain if facts["result"].get(name) == DRAIN_PROPOSED else None
        if recorded_action is None and replayed is None:
            continue  # no drain either way: not a decision anyone would look for
        status, by = _status(made)
        verdict = _verdict(recorded_action, replayed, "", "")
        explanation = ""
        if verdict != SAME:
            explanation = _explain([(facts["site_policy"], site)], draft)
            if explanation and why:
                explanation = f"{explanation}: {why}"
        found.append(
            ReplayedDecision(
                at=at,
                anomaly_id=anomaly.pk,
                workload_id=workload.pk,
                job_id=workload.job_id,
                attempt=anomaly.attempt.number if anomaly.attempt else None,
                kind="drain",
                recorded=recorded_action,
                replayed=replayed,
                verdict=verdict,
                recorded_status=status,
                recorded_by=by,
                explanation=explanation,
            )
        )
    return found


def _totals(decisions: Sequence[ReplayedDecision], *, recorded: bool) -> Totals:
    """The actions of the last recommendation of each attempt, and each drain."""
    last: dict[tuple[int, int | None], Action] = {}
    drains = 0
    without_approval = 0
    for decision in decisions:
        if decision.verdict in (NOT_REPLAYABLE, AFTER_DRAFT_STOP) and not recorded:
            continue
        action = decision.recorded if recorded else decision.replayed
        if action is None:
            continue
        if decision.kind == "drain":
            drains += 1
            without_approval += not action.needs_person
            continue
        last[(decision.workload_id, decision.attempt)] = action
    excluded: set[str] = set()
    node_hours = 0.0
    for action in last.values():
        without_approval += not action.needs_person
        excluded.update(action.excluded_nodes)
        node_hours += len(action.excluded_nodes) * action.exclusion_hours
    return Totals(
        restarts=sum(a.action in RESTARTS for a in last.values()),
        stops=sum(a.action == RecommendationAction.STOP for a in last.values()),
        drains=drains,
        nodes_excluded=len(excluded),
        node_hours_excluded=node_hours,
        without_approval=without_approval,
    )
