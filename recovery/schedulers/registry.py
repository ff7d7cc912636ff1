"""Scheduler adapters by connection kind: how a cluster's settings become a ``SchedulerAdapter``.

``ADAPTERS`` maps a kind (a cluster's ``connection``, a ``Connection`` member) to a builder
that takes the cluster's plain ``connection_settings`` dict; ``build_adapter`` calls it. Pure
Python, like the rest of the package: Slurm's builders are here, the simulator registers its own
(``recovery.simulator.adapter``, imported when the control plane's app is ready).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from recovery.schedulers.base import (
    Connection,
    SchedulerAdapter,
    SchedulerError,
)
from recovery.schedulers.capabilities import Capabilities
from recovery.schedulers.slurm import SlurmAdapter
from recovery.schedulers.ssh_transport import SSHTransport
from recovery.schedulers.transport import LocalTransport

AdapterBuilder = Callable[[Mapping[str, Any]], SchedulerAdapter]


class SettingsIncomplete(SchedulerError):
    """The settings lack something the adapter needs, or hold an unusable value."""


class NotPolled(SchedulerError):
    """No scheduler stands behind these settings (a recorded demo history, say)."""


# Keyed by ``Connection`` members; looked up with the plain string a cluster row holds.
ADAPTERS: dict[str, AdapterBuilder] = {}
# What the adapters each builder makes can do, by the same keys: the policy reads it without
# building an adapter (which may open a connection).
CAPABILITIES: dict[str, Capabilities] = {}


def register(
    kind: Connection, capabilities: Capabilities
) -> Callable[[AdapterBuilder], AdapterBuilder]:
    """Make the decorated builder the one for ``kind``; its adapters can do ``capabilities``."""

    def add(builder: AdapterBuilder) -> AdapterBuilder:
        ADAPTERS[kind] = builder
        CAPABILITIES[kind] = capabilities
        return builder

    return add


def capabilities_of(kind: str) -> Capabilities | None:
    """What a cluster connected by ``kind`` can have done; None when no builder is registered
    for it (nothing is polled or carried out there)."""
    return CAPABILITIES.get(str(kind))


def build_adapter(kind: str, settings: Mapping[str, Any], *, name: str = "") -> SchedulerAdapter:
    """The adapter for a cluster called ``name`` connected by ``kind`` with ``settings``.

    Raises ``SchedulerError`` naming the cluster when the kind is not polled or the settings
    are incomplete.
    """
    builder = ADAPTERS.get(str(kind))
    try:
        if builder is None:
            raise NotPolled(kind)
        return builder(settings)
    except NotPolled:
        raise SchedulerError(f"cluster {name} is {kind}: not polled over a transport") from None
    except SettingsIncomplete as exc:
        raise SchedulerError(f"cluster {name}: {exc}") from None


def slurm_env(settings: Mapping[str, Any]) -> dict[str, str]:
    """The environment Slurm's commands need: ``SLURM_CONF`` when the settings name one."""
    return {"SLURM_CONF": str(settings["slurm_conf"])} if settings.get("slurm_conf") else {}


@register(Connection.LOCAL, SlurmAdapter.capabilities)
def local_slurm(settings: Mapping[str, Any]) -> SchedulerAdapter:
    """Slurm's commands run on this host."""
    return SlurmAdapter(LocalTransport(env=slurm_env(settings)))


@register(Connection.SSH, SlurmAdapter.capabilities)
def ssh_slurm(settings: Mapping[str, Any]) -> SchedulerAdapter:
    """Slurm's commands run on a login node over SSH."""
    try:
        transport = SSHTransport(
            str(settings["host"]),
            port=int(settings.get("port", 22)),
            user=str(settings["user"]),
            key_file=str(settings["key_file"]),
            known_hosts=str(settings["known_hosts"]),
            env=slurm_env(settings),
        )
    except (KeyError, ValueError) as exc:
        raise SettingsIncomplete(f"SSH settings incomplete: {exc}") from None
    return SlurmAdapter(transport)
