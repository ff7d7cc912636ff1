"""What a recommendation asks a controller to do (``Action``), and what a scheduler's adapter
can do (``Capabilities``): the policy recommends only what the cluster's adapter can carry out,
and the controller checks again before any command.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass

from recovery.schedulers.compat import StrEnum


class Action(StrEnum):
    """What a recommendation asks a controller to do: the one definition of these values
    (``recovery.choices.RecommendationAction`` wraps it for the models and forms). Stored with
    every recommendation: the values must not change."""

    RESTART = "restart"
    RESTART_EXCLUDING = "restart_excluding"
    STOP = "stop"
    NONE = "none"
    # Node actions: the recommendation names a node, not a job to restart.
    DRAIN = "drain"
    RESUME = "resume"


RESTARTS = frozenset({Action.RESTART, Action.RESTART_EXCLUDING})
NODE_ACTIONS = frozenset({Action.DRAIN, Action.RESUME})


@dataclass(frozen=True)
class Capabilities:
    """What a scheduler's adapter can do to a job or a node.

    The policy recommends only what the cluster's adapter can carry out (a decision it cannot
    becomes a record, with the reason), and the controller checks again before any command.
    Everything is off unless an adapter says otherwise: a missing capability is never assumed.
    """

    # Restart a job in place: the same job, its next attempt from its last checkpoint.
    requeue: bool = False
    # Keep named nodes out of the job's next attempt.
    exclude_on_restart: bool = False
    # Keep a job from starting until it is released (a restart's exclusions are set meanwhile).
    hold: bool = False
    # Take a node out of service and return it (drain, resume).
    drain: bool = False

    def missing_for(self, action: str, *, excluding: bool = False) -> str:
        """What is missing to carry out ``action`` (a recommendation's), or "" when nothing."""
        if action in RESTARTS:
            if not self.requeue:
                return "restart a job in place"
            if (excluding or action == Action.RESTART_EXCLUDING) and not self.exclude_on_restart:
                return "keep nodes out of a restarted job"
        if action in NODE_ACTIONS and not self.drain:
            return "drain or resume a node"
        return ""

    def as_facts(self) -> dict[str, bool]:
        return dataclasses.asdict(self)

    @classmethod
    def from_facts(cls, recorded: Mapping[str, object]) -> Capabilities:
        """``as_facts`` read back: only a recorded ``true`` is a capability."""
        return cls(
            **{each.name: recorded.get(each.name) is True for each in dataclasses.fields(cls)}
        )
