"""The soak's verdict from the simulator's own journal: false actions, and what became of real faults.

The journal is the ground truth (``recovery.simulator.cluster.journal``): every command the
scheduler received and who sent it, every fault that struck an attempt (and the node a
node-level fault blames), every attempt and how it ended, and every benign event. These
functions are plain data in, plain data out; ``bench.soak.evidence`` adds what the control plane
recorded about each false action.

**A false action** is a command from the control plane (a controller or the watchdog; never an
administrator's or a user's, ``recovery.simulator.benign.BENIGN_CALLERS``) that took effect and

* acted on a job that had no real fault: no fault of the attempt the command found, nor, when
  that attempt was not running (the job ended or already requeued by then), of the attempt
  before it, struck before the command. A restart of a running attempt whose predecessor failed
  is false: it reached a healthy attempt;
* excluded a node (``ExcNodeList=``) that no real fault had blamed before (a node-level fault
  anywhere, or any fault of the same job that showed on that node: the rank that raised or
  hung there), counted once per job and node;
* drained a node that no real fault had blamed before.

**A real fault** is judged once its time to be acted on has passed: *detected* when the control
plane recorded an anomaly of its attempt (from a little before the fault on, not a crash it saw
survived); *acted on* when a control-plane command took effect on the job at or after the fault,
on its attempt or the next. Some need no action, and say why (``not_actionable``): a slowdown
(recorded, never acted on by design), an attempt Slurm requeued itself (a node failure), an
attempt an administrator's requeue or a user's cancel ended first, and faults too close to the
end of the run for their detection window. Any other fault never acted on is *missed*.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from recovery.simulator.benign import BENIGN_CALLERS
from recovery.simulator.faults import HANG, NODE_DEATH, STRAGGLER

JOB_VERBS = frozenset(
    {
        "requeue",
        "requeuehold",
        "release",
        "hold",
        "scancel",
        "update:ExcNodeList",
        "update:Requeue",
        "update:StartTime",
    }
)
DRAIN, RESUME = "drain", "resume"
# How long before a fault an anomaly of its attempt may have been recorded: its text is printed
# up to a few seconds before the attempt ends (FAILURE_TEXT_SECONDS), the poll reads it later.
DETECTED_FROM_S = 10.0
# Benign events shown with a false action: the job's (or node's) last few before it.
PRECEDING_SHOWN = 3
PRECEDING_WINDOW_S = 900.0
# The commands of one action (a restart's hold or requeuehold, ExcNodeList and release) come
# from one controller within its lease; later ones on the job are another action.
ACTION_SPAN_S = 60.0


def command_verb(argv: list[str]) -> str:
    if argv and argv[0] == "scancel":
        return "scancel"
    if len(argv) > 2 and argv[0] == "scontrol" and argv[1] == "update":
        if argv[2].startswith("NodeName="):
            state = next((part for part in argv[3:] if part.startswith("State=")), "")
            return DRAIN if state == "State=DRAIN" else RESUME
        return "update:" + ",".join(part.split("=", 1)[0] for part in argv[3:])
    if len(argv) > 1 and argv[0] == "scontrol":
        return argv[1]
    return " ".join(argv[:2])


def excluded_nodes(argv: list[str]) -> list[str]:
    for part in argv:
        if part.startswith("ExcNodeList="):
            return [name for name in part.split("=", 1)[1].split(",") if name]
    return []


def node_of(argv: list[str]) -> str:
    for part in argv:
        if part.startswith("NodeName="):
            return part.split("=", 1)[1]
    return ""


def from_control_plane(command: Mapping[str, Any]) -> bool:
    return str(command.get("caller", "")) not in BENIGN_CALLERS


@dataclass
class JournalBook:
    """The journal gathered over the run: the simulator keeps only its newest entries, so the
    soak reads it often and keeps every entry it saw (an attempt's latest version)."""

    commands: dict[tuple[Any, ...], dict[str, Any]] = field(default_factory=dict)
    failures: dict[tuple[Any, ...], dict[str, Any]] = field(default_factory=dict)
    attempts: dict[tuple[Any, ...], dict[str, Any]] = field(default_factory=dict)
    benign: dict[tuple[Any, ...], dict[str, Any]] = field(default_factory=dict)
    benign_counts: dict[str, int] = field(default_factory=dict)
    # How many entries each list of the simulator has held in all (kept and dropped).
    totals: dict[str, int] = field(default_factory=dict)

    def add(self, journal: Mapping[str, Any], benign: Mapping[str, Any]) -> None:
        for entry in journal["commands"]:
            self.commands[(entry["at"], tuple(entry["argv"]), entry["caller"])] = dict(entry)
        for entry in journal["failures"]:
            key = (entry["job_id"], entry["attempt"], entry["at"], entry["kind"])
            self.failures[key] = dict(entry)
        for entry in journal["attempts"]:
            self.attempts[(entry["job_id"], entry["attempt"], entry["started_at"])] = dict(entry)
        for entry in benign["events"]:
            self.benign[(entry["job_id"], entry["at"], entry["kind"])] = dict(entry)
        self.benign_counts = dict(benign["counts"])
        for name in ("commands", "failures", "attempts"):
            self.totals[name] = journal["dropped"][name] + len(journal[name])
        self.totals["benign"] = benign["dropped"] + len(benign["events"])

    def dump(self) -> dict[str, Any]:
        return {
            "commands": list(self.commands.values()),
            "failures": list(self.failures.values()),
            "attempts": list(self.attempts.values()),
            "benign": list(self.benign.values()),
            "benign_counts": self.benign_counts,
            "totals": self.totals,
        }

    @classmethod
    def load(cls, dumped: Mapping[str, Any]) -> JournalBook:
        book = cls()
        book.add(
            {
                "commands": dumped["commands"],
                "failures": dumped["failures"],
                "attempts": dumped["attempts"],
                "dropped": {"commands": 0, "failures": 0, "attempts": 0},
            },
            {"events": dumped["benign"], "counts": dumped["benign_counts"], "dropped": 0},
        )
        book.totals = dict(dumped["totals"])
        return book

    @property
    def complete(self) -> bool:
        """Whether every entry the simulator journaled was seen before it was dropped."""
        return all(len(getattr(self, name)) >= total for name, total in self.totals.items())

    def sorted(self, name: str) -> list[dict[str, Any]]:
        entries = list(getattr(self, name).values())
        return sorted(entries, key=lambda entry: entry.get("at") or entry.get("started_at", 0))


def simulated_job_hours(
    attempts: Iterable[Mapping[str, Any]], *, speedup: float, until: float
) -> float:
    """Simulated running time of every attempt up to ``until``: real running time x speedup."""
    seconds = 0.0
    for attempt in attempts:
        started = float(attempt["started_at"])
        ended = attempt.get("ended_at")
        end = min(float(ended), until) if ended is not None else until
        seconds += max(0.0, end - started)
    return seconds * speedup / 3600.0


@dataclass
class FaultIndex:
    """Real faults by job and by node, for judging commands."""

    by_job: dict[int, list[dict[str, Any]]] = field(default_factory=dict)
    by_node: dict[str, list[float]] = field(default_factory=dict)

    @classmethod
    def of(cls, failures: Iterable[Mapping[str, Any]]) -> FaultIndex:
        index = cls()
        for failure in failures:
            index.by_job.setdefault(int(failure["job_id"]), []).append(dict(failure))
            if failure.get("node"):
                index.by_node.setdefault(str(failure["node"]), []).append(float(failure["at"]))
        return index

    def justifies_job_command(self, command: Mapping[str, Any]) -> bool:
        attempt = command.get("attempt")
        if attempt is None:
            return False
        attempts = {int(attempt)}
        if command.get("job_state") != "RUNNING":
            attempts.add(int(attempt) - 1)
        return any(
            failure["attempt"] in attempts and failure["at"] <= command["at"]
            for failure in self.by_job.get(int(command["job_id"]), [])
        )

    def node_had_fault(self, node: str, before: float) -> bool:
        return any(at <= before for at in self.by_node.get(node, []))

    def job_fault_showed_on(self, job_id: int, node: str, before: float) -> bool:
        """A real fault of the job showed on ``node`` (the rank that raised or hung there)."""
        return any(
            failure.get("host") == node and failure["at"] <= before
            for failure in self.by_job.get(job_id, [])
        )


def false_actions(
    commands: Iterable[Mapping[str, Any]],
    failures: Iterable[Mapping[str, Any]],
    benign: Iterable[Mapping[str, Any]],
) -> list[dict[str, Any]]:
    """Every false action (see the module docstring), oldest first, with the benign events
    that preceded it on its job or node.

    A job's false commands from one caller within ``ACTION_SPAN_S`` of the first are one action
    (a restart is a hold, an exclusion and a release); each node wrongly excluded from a job,
    and each wrong drain, is one more.
    """
    index = FaultIndex.of(failures)
    events = sorted((dict(event) for event in benign), key=lambda event: event["at"])
    found: list[dict[str, Any]] = []
    open_actions: dict[tuple[int, str], dict[str, Any]] = {}
    excluded_seen: set[tuple[int, str]] = set()
    for command in sorted(commands, key=lambda entry: entry["at"]):
        if not command.get("effective") or not from_control_plane(command):
            continue
        verb = command_verb(list(command["argv"]))
        if verb in (DRAIN, RESUME):
            node = node_of(list(command["argv"]))
            if verb == DRAIN and not index.node_had_fault(node, command["at"]):
                found.append(
                    _false(
                        [command],
                        "drain",
                        "no real fault blamed the node",
                        node=node,
                        preceding=_preceding(events, command["at"], node=node),
                    )
                )
            continue
        if verb not in JOB_VERBS or command.get("job_id") is None:
            continue
        job_id = int(command["job_id"])
        preceding = _preceding(events, command["at"], job_id=job_id)
        if not index.justifies_job_command(command):
            key = (job_id, str(command.get("caller", "")))
            action = open_actions.get(key)
            if action is not None and command["at"] - action["at"] <= ACTION_SPAN_S:
                action["commands"].append(dict(command))
            else:
                why = (
                    f"attempt {command['attempt']} was running and had no real fault"
                    if command.get("job_state") == "RUNNING"
                    else f"no real fault on attempt {command['attempt']} or the one before"
                )
                action = _false([command], "job_action", why, preceding=preceding)
                open_actions[key] = action
                found.append(action)
        for node in excluded_nodes(list(command["argv"])):
            if (
                (job_id, node) in excluded_seen
                or index.node_had_fault(node, command["at"])
                or index.job_fault_showed_on(job_id, node, command["at"])
            ):
                continue
            excluded_seen.add((job_id, node))
            found.append(
                _false(
                    [command],
                    "exclusion",
                    "no real fault blamed the node",
                    node=node,
                    preceding=preceding + _preceding(events, command["at"], node=node),
                )
            )
    return found


def _false(
    commands: list[Mapping[str, Any]],
    kind: str,
    why: str,
    *,
    node: str = "",
    preceding: list[dict[str, Any]],
) -> dict[str, Any]:
    first = commands[0]
    return {
        "kind": kind,
        "why": why,
        "at": first["at"],
        "job_id": first.get("job_id"),
        "attempt": first.get("attempt"),
        "node": node,
        "commands": [dict(command) for command in commands],
        "preceding_benign": preceding,
    }


def _preceding(
    events: list[dict[str, Any]],
    before: float,
    *,
    job_id: int | None = None,
    node: str | None = None,
) -> list[dict[str, Any]]:
    chosen = [
        event
        for event in events
        if before - PRECEDING_WINDOW_S <= event["at"] <= before
        and (job_id is None or event["job_id"] == job_id)
        and (node is None or event["node"] == node)
    ]
    return chosen[-PRECEDING_SHOWN:]


@dataclass(frozen=True)
class AnomalySeen:
    """An anomaly the control plane recorded, as the fault verdict needs it."""

    job_id: int
    attempt: int  # the simulator's numbering (restart count): the control plane's minus one
    kind: str
    confirmation: str
    detected_at: float


def judge_faults(
    failures: Iterable[Mapping[str, Any]],
    attempts: Iterable[Mapping[str, Any]],
    commands: Iterable[Mapping[str, Any]],
    anomalies: Iterable[AnomalySeen],
    *,
    recorded_actions: Iterable[tuple[int, int, float]] = (),
    judged_until: float,
    hang_judged_until: float,
) -> dict[str, Any]:
    """Real faults injected, detected and acted on by kind; those that need no action and why;
    those missed. A hang is judged only if it struck before ``hang_judged_until`` (its timeout
    and the check after it), any other fault before ``judged_until``.

    Acting is a control-plane command the scheduler accepted, or an action the control plane
    recorded as carried out (``recorded_actions``: job, the simulator's attempt, time): a stop
    of a job that already ended sends nothing, and is recorded as done.
    """
    ended: dict[tuple[int, int], Mapping[str, Any]] = {}
    for attempt in attempts:
        ended[(int(attempt["job_id"]), int(attempt["attempt"]))] = attempt
    ended_by_others: dict[tuple[int, int], str] = {}
    acted: dict[int, list[Mapping[str, Any]]] = {}
    for job_id, attempt_number, at in recorded_actions:
        acted.setdefault(job_id, []).append({"at": at, "attempt": attempt_number})
    for command in commands:
        if command.get("job_id") is None or command.get("returncode") != 0:
            continue
        key = (int(command["job_id"]), int(command.get("attempt") or 0))
        if not from_control_plane(command):
            if command_verb(list(command["argv"])) in ("requeue", "scancel"):
                ended_by_others.setdefault(key, f"{command['caller']}'s {command['argv'][1]}")
            continue
        if command_verb(list(command["argv"])) in JOB_VERBS:
            acted.setdefault(key[0], []).append(
                {"at": command["at"], "attempt": command.get("attempt") or 0}
            )
    seen: dict[tuple[int, int], list[AnomalySeen]] = {}
    for anomaly in anomalies:
        seen.setdefault((anomaly.job_id, anomaly.attempt), []).append(anomaly)

    injected: Counter[str] = Counter()
    detected: Counter[str] = Counter()
    acted_on: Counter[str] = Counter()
    not_actionable: Counter[str] = Counter()
    not_judged: Counter[str] = Counter()
    missed: list[dict[str, Any]] = []
    for failure in failures:
        kind, at = str(failure["kind"]), float(failure["at"])
        key = (int(failure["job_id"]), int(failure["attempt"]))
        injected[kind] += 1
        if at > (hang_judged_until if failure["effect"] == HANG else judged_until):
            not_judged[kind] += 1
            continue
        if any(
            a.detected_at >= at - DETECTED_FROM_S and a.confirmation != "survived"
            for a in seen.get(key, [])
        ):
            detected[kind] += 1
        on_job = acted.get(key[0], [])
        if any(c["at"] >= at and int(c["attempt"]) in (key[1], key[1] + 1) for c in on_job):
            acted_on[kind] += 1
            continue
        reason = _needs_no_action(failure, ended.get(key), ended_by_others.get(key))
        if reason:
            not_actionable[reason] += 1
        else:
            missed.append(dict(failure))
    return {
        "injected": dict(injected),
        "judged": sum(injected.values()) - sum(not_judged.values()),
        "not_judged_too_late": dict(not_judged),
        "detected": dict(detected),
        "acted_on": dict(acted_on),
        "not_actionable": dict(not_actionable),
        "missed": missed,
    }


def _needs_no_action(
    failure: Mapping[str, Any], attempt: Mapping[str, Any] | None, ended_by: str | None
) -> str:
    """Why the simulator's own record says the control plane need not act on ``failure``."""
    if failure["effect"] == STRAGGLER:
        return "a slowdown: recorded, no scheduler action by design"
    if attempt is not None and attempt.get("end") == "requeued" and not attempt.get("by_command"):
        if failure["effect"] == NODE_DEATH:
            return "Slurm requeued the attempt itself (node failure)"
        return "Slurm requeued the attempt itself"
    if ended_by:
        return f"the attempt was ended by the {ended_by} first"
    return ""
