"""One chaos run: private services, the production process layout, the schedule, the verdict.

The layout is production's, on loopback: the web process (uvicorn: the HTTP and WebSocket
server every stack runs, see ``workload_recovery.stack.web_command``), two Celery workers, beat,
two Advisor Controllers per cluster over the Advisor API, an operator approving and rejecting
over the REST API, and one simulated cluster clock per cluster. Two clusters: one in
acknowledged action mode, one in monitor mode.

First a reference phase without faults (its own two clusters) gives the recovery time the
chaos is compared with; then the schedule's faults strike the chaos clusters' run; then a quiet
period with every process up; then the checks (``bench.chaos.checks``).
"""

from __future__ import annotations

import json
import sys
import threading
import time
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, cast

from bench.chaos import schedule as faults
from bench.chaos.checks import (
    ClusterVerdict,
    Recovery,
    Strike,
    check_records,
    summarise_phases,
    summarise_times,
    times_by_fault,
    times_from_detectable,
    times_scheduler_reachable,
)
from bench.chaos.layout import LayoutRun, finished_run_database
from bench.chaos.roles import Role
from bench.chaos.services import Service
from recovery.controller.controller import DEFAULT_LEASE_SECONDS

ROOT = Path(__file__).resolve().parents[2]
WORK = ROOT / "var" / "chaos"
ACTION, MONITOR = "action", "monitor"
# Armed faults wait for a command; more than a few waiting would strike one action after another.
MAX_ARMED = 3


# The chaos clusters' hang timeout, and how long after a hang began it can first be recorded:
# the timeout, then the loop's next hang check (every 30 s, every poll near the allowance).
HANG_TIMEOUT_MINUTES = 1
HANG_DETECTION_S = HANG_TIMEOUT_MINUTES * 60 + 30


@dataclass(frozen=True)
class ChaosOptions:
    seed: int = 1
    faults: int = 1400
    duration_s: float = 850.0
    quiet_s: float = 90.0
    reference_s: float = 60.0
    jobs: int = 10
    nodes: int = 40
    speedup: float = 30.0
    faults_per_job_hour: float = 3.0
    # The controllers' own default, so that the run measures what a killed one costs a site.
    lease_s: int = DEFAULT_LEASE_SECONDS
    poll_s: int = 2
    controllers_per_cluster: int = 2
    workers: int = 2
    label: str = "full"
    # Fault kinds left out of the schedule (``schedule.SCHEDULER_FAULTS`` for the control
    # plane's own faults only).
    without: tuple[str, ...] = ()


@dataclass
class Landed:
    """What the schedule did, kind by kind: struck, armed (lands when a command comes), or found
    nothing to strike."""

    struck: dict[str, int] = field(default_factory=dict)
    armed: dict[str, int] = field(default_factory=dict)
    missed: dict[str, int] = field(default_factory=dict)
    log: list[str] = field(default_factory=list)
    strikes: list[Strike] = field(default_factory=list)

    def add(
        self,
        fault: faults.Fault,
        outcome: str,
        note: str = "",
        *,
        target: str = "",
        lasting_s: float | None = None,
    ) -> None:
        """``target``: the role, service or cluster struck; ``lasting_s``: how long the fault
        keeps it away, the fault's delay unless said."""
        book = {"struck": self.struck, "armed": self.armed, "missed": self.missed}[outcome]
        book[fault.kind] = book.get(fault.kind, 0) + 1
        now = time.time()
        if outcome == "struck":
            lasting = fault.delay_s if lasting_s is None else lasting_s
            if fault.kind == faults.SCHEDULER_UNREACHABLE:
                # A new outage replaces the end of the one under way (``set_chaos``).
                self.strikes = [
                    replace(s, until=now)
                    if s.kind == fault.kind and s.target == target and s.until > now
                    else s
                    for s in self.strikes
                ]
            self.strikes.append(Strike(fault.kind, now, now + lasting, target))
        self.log.append(f"{now:.3f} {fault.describe()} {outcome} {note}".rstrip())


def verdict_counts(verdicts: list[ClusterVerdict]) -> dict[str, int]:
    """The counts that must be zero, over every cluster."""
    return {
        "duplicate_actions": sum(len(v.duplicate_actions) for v in verdicts),
        "acted_on_healthy_attempt": sum(len(v.acted_on_healthy_attempt) for v in verdicts),
        "lost": sum(len(v.lost) for v in verdicts),
        "unfinished": sum(len(v.unfinished) for v in verdicts),
        "audit_gaps": sum(len(v.unrecorded_commands) + len(v.phantom_commands) for v in verdicts),
    }


def cluster_details(verdicts: list[ClusterVerdict]) -> list[dict[str, Any]]:
    return [
        {
            "cluster": v.cluster,
            "failures": v.failures,
            "failures_checked": v.failures_checked,
            "accounted_by": dict(v.accounted_by),
            "commands": v.commands,
            "duplicate_actions": v.duplicate_actions[:20],
            "acted_on_healthy_attempt": v.acted_on_healthy_attempt[:20],
            "lost": v.lost[:20],
            "unfinished": v.unfinished[:20],
            "unrecorded_commands": v.unrecorded_commands[:20],
            "phantom_commands": v.phantom_commands[:20],
        }
        for v in verdicts
    ]


def _struck(done: bool) -> str:
    return "struck" if done else "missed"


class ChaosRun(LayoutRun):
    campaign = "chaos"

    def __init__(self, options: ChaosOptions) -> None:
        super().__init__(options, WORK)
        self.options = options
        self.stores: dict[str, Any] = {}
        self.landed = Landed()
        self.restarting: set[str] = set()
        self.reference_recoveries: list[Recovery] = []

    def prepare_clusters(self, names: dict[str, str]) -> dict[str, list[Path]]:
        """Cluster rows, policies, simulations and one controller token per controller."""
        from django.utils import timezone

        from recovery.choices import ClusterMode
        from recovery.demo.live import ensure_simulated_cluster
        from recovery.models import ControllerToken, Policy
        from recovery.simulator.cluster import SimConfig
        from recovery.simulator.store import simulation_store

        options = self.options
        tokens: dict[str, list[Path]] = {}
        for index, (name, mode) in enumerate(names.items()):
            config = SimConfig(
                name=name,
                nodes=options.nodes,
                jobs=options.jobs,
                seed=options.seed * 100 + index,
                speedup=options.speedup,
                log_dir=str(self.work / "var" / "sim"),
                faults_per_job_hour=options.faults_per_job_hour,
                # Every kind the simulator knows, application errors on every attempt included,
                # at shares that make each of them happen within minutes.
                fault_weights=(
                    ("app_exception", 8.0), ("cuda_error_app", 4.0), ("gpu_oom", 4.0),
                    ("nan_divergence", 3.0), ("segfault", 3.0), ("host_oom", 3.0),
                    ("nccl_error", 3.0), ("nccl_timeout", 4.0), ("hang", 6.0),
                    ("storage_io", 3.0), ("preemption", 3.0), ("time_limit", 2.0),
                    ("node_death", 8.0),
                ),
                bad_node_fraction=0.05,
                repair_after_seconds=60.0,
                requeue_delay_seconds=3.0,
                min_job_age_seconds=600.0,
            )  # fmt: skip
            cluster_mode = ClusterMode.ACTION if mode == ACTION else ClusterMode.MONITOR
            cluster = ensure_simulated_cluster(config, cluster_mode)
            store = simulation_store(config, redis_url="", state_dir=str(self.state_dir))
            store.reset()
            store.publish_config()
            store.advance(datetime.now(UTC))
            self.stores[name] = store
            Policy.objects.update_or_create(
                name=f"{name} chaos",
                defaults={
                    "cluster": cluster,
                    "blast_radius_percent": 50,
                    "blast_radius_window_minutes": 10,
                    "hang_timeout_minutes": HANG_TIMEOUT_MINUTES,
                    "decision_timeout_seconds": 60,
                    "recommendation_ttl_minutes": 10,
                    "decision_grace_seconds": 5,
                    "crash_confirmation_seconds": 5,
                },
            )
            tokens[name] = []
            for number in range(1, options.controllers_per_cluster + 1):
                _, key = ControllerToken.issue(
                    cluster, f"{name}-controller-{number}-{timezone.now():%H%M%S%f}"
                )
                path = self.work / "tokens" / f"{name}-{number}.token"
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(key)
                tokens[name].append(path)
        return tokens

    def operator_token(self) -> Path:
        from django.contrib.auth.models import Group, Permission, User

        from recovery.models import ApiToken
        from recovery.roles import OPERATOR, sync_roles

        sync_roles(Group, Permission)
        user, _ = User.objects.get_or_create(username="chaos-operator")
        user.groups.add(Group.objects.get(name=OPERATOR))
        _, key = ApiToken.issue(user, f"chaos-{time.time_ns()}")
        path = self.work / "tokens" / "operator.token"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(key)
        return path

    # ------------------------------------------------------------------ the process layout

    def add_cluster_roles(self, tokens: dict[str, list[Path]]) -> list[Role]:
        added = []
        for name, token_files in tokens.items():
            added.append(self.add_clock(f"clock-{name}", name))
            for number, token_file in enumerate(token_files, start=1):
                role = f"controller-{name}-{number}"
                added.append(self.add_controller(role, name, token_file, {"WR_SIM_KILLABLE": "1"}))
        return added

    def add_approver(self, clusters: list[str], token_file: Path) -> Role:
        return self.supervisor.add(
            "approver",
            "approver",
            [sys.executable, "-m", "bench.chaos.approver", "--url", self.url,
             "--token-file", str(token_file), "--seed", str(self.options.seed),
             "--clusters", ",".join(clusters)],
            self.env(),
        )  # fmt: skip

    def wait(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            self.supervisor.tick()
            time.sleep(0.1)

    # ------------------------------------------------------------------ faults

    def strike(self, fault: faults.Fault) -> None:
        kind = fault.kind
        supervisor = self.supervisor
        if kind in {faults.KILL_WORKER, faults.KILL_BEAT, faults.KILL_WEB, faults.KILL_CONTROLLER}:
            role_kind = {
                faults.KILL_WORKER: "worker",
                faults.KILL_BEAT: "beat",
                faults.KILL_WEB: "web",
                faults.KILL_CONTROLLER: "controller",
            }[kind]
            targets = [r for r in supervisor.of_kind(role_kind) if r.alive and not r.paused_until]
            if not targets:
                self.landed.add(fault, "missed", "nothing alive to kill")
                return
            role = targets[fault.pick % len(targets)]
            self.landed.add(
                fault, _struck(supervisor.kill(role, fault.delay_s)), role.name, target=role.name
            )
        elif kind == faults.PAUSE_CONTROLLER:
            targets = [
                r for r in supervisor.of_kind("controller") if r.alive and not r.paused_until
            ]
            if not targets:
                self.landed.add(fault, "missed", "no controller to pause")
                return
            role = targets[fault.pick % len(targets)]
            seconds = self.options.lease_s + fault.delay_s
            self.landed.add(
                fault,
                _struck(supervisor.pause(role, seconds)),
                f"{role.name} {seconds:.1f}s",
                target=role.name,
                lasting_s=seconds,
            )
        elif kind in {faults.RESTART_MARIADB, faults.RESTART_REDIS}:
            service: Service = self.db if kind == faults.RESTART_MARIADB else self.redis
            if service.name in self.restarting or not service.running:
                self.landed.add(fault, "missed", f"{service.name} already down")
                return
            self.restarting.add(service.name)
            threading.Thread(
                target=self._restart_service, args=(service, fault), daemon=True
            ).start()
            self.landed.add(
                fault,
                "struck",
                f"{'killed' if fault.crash else 'stopped'} {service.name}",
                target=service.name,
            )
        else:
            name = sorted(self.chaos_clusters)[fault.pick % len(self.chaos_clusters)]
            store = self.stores[name]
            try:
                if kind == faults.SCHEDULER_UNREACHABLE:
                    store.set_chaos(unreachable_until=time.time() + fault.delay_s)
                elif kind == faults.COMMAND_TIMEOUT:
                    pending = store.chaos()["timeouts_after_effect"]
                    store.set_chaos(timeouts_after_effect=min(pending + 1, MAX_ARMED))
                else:
                    pending = store.chaos()["kills_after_command"]
                    store.set_chaos(kills_after_command=min(pending + 1, MAX_ARMED))
            except Exception as exc:  # the scheduler's lock was busy: this fault did not land
                self.landed.add(fault, "missed", f"{name}: {exc}")
                return
            self.landed.add(fault, "armed" if kind in faults.ARMED else "struck", name, target=name)

    def _restart_service(self, service: Service, fault: faults.Fault) -> None:
        try:
            service.stop(kill=fault.crash)
            time.sleep(fault.delay_s)
            service.start()
        finally:
            self.restarting.discard(service.name)

    # ------------------------------------------------------------------ the run

    def run(self) -> dict[str, Any]:
        options = self.options
        started = time.time()
        self.start_services()
        reference_names = {"ref-action": ACTION, "ref-monitor": MONITOR}
        chaos_names = {"chaos-action": ACTION, "chaos-monitor": MONITOR}
        self.chaos_clusters = list(chaos_names)
        operator = self.operator_token()
        self.add_platform_roles()
        approver = self.add_approver([*reference_names, *chaos_names], operator)
        reference: dict[str, Any] = {}
        try:
            self.supervisor.start_all()
            self.wait_for_web()
            if options.reference_s > 0:
                reference = self.reference_phase(reference_names)
            tokens = self.prepare_clusters(chaos_names)
            for role in self.add_cluster_roles(tokens):
                self.supervisor.start(role)
            schedule = faults.fault_schedule(
                options.seed, options.faults, options.duration_s, options.without
            )
            chaos_started = time.monotonic()
            print(
                f"chaos: {len(schedule)} faults over {options.duration_s:g} s, seed {options.seed}",
                flush=True,
            )
            for number, fault in enumerate(schedule, start=1):
                while time.monotonic() < chaos_started + fault.at_s:
                    self.supervisor.tick()
                    time.sleep(0.05)
                self.strike(fault)
                if number % 100 == 0:
                    print(f"  {number} faults scheduled so far", flush=True)
            schedule_end = time.time()
            (self.work / "faults.log").write_text("\n".join(self.landed.log) + "\n")
            while self.restarting:
                self.wait(0.5)
            for store in self.stores.values():
                store.set_chaos(unreachable_until=0, timeouts_after_effect=0, kills_after_command=0)
            print(f"quiet period: {options.quiet_s:g} s", flush=True)
            self.wait(options.quiet_s)
            verdicts = self.verdicts(chaos_names, failures_until=schedule_end)
        finally:
            approver.expected_exit = True
            self.supervisor.stop_all()
            self.redis.stop()
            self.db.stop()
        return self.report(verdicts, reference, started, schedule_end)

    def reference_phase(self, names: dict[str, str]) -> dict[str, Any]:
        """The same clusters and processes for a while without a single fault."""
        from recovery.models import Cluster

        print(f"reference: {self.options.reference_s:g} s without faults", flush=True)
        tokens = self.prepare_clusters(names)
        roles = self.add_cluster_roles(tokens)
        for role in roles:
            self.supervisor.start(role)
        self.wait(self.options.reference_s)
        action = next(name for name, mode in names.items() if mode == ACTION)
        self.reference_recoveries = check_records(
            action,
            self.stores[action].reading().journal(),
            failures_until=time.time(),
            now=datetime.now(UTC),
        ).recoveries
        for role in roles:
            self.supervisor.stop_role(role)
        # No longer polled: their clocks stopped, and a stopped clock would look like a hang.
        for cluster in Cluster.objects.filter(name__in=list(names)):
            cluster.connection_settings = {
                key: value
                for key, value in (cluster.connection_settings or {}).items()
                if key != "simulator"
            }
            cluster.save(update_fields=["connection_settings"])
        return summarise_times([recovery.seconds for recovery in self.reference_recoveries])

    def verdicts(self, names: dict[str, str], *, failures_until: float) -> list[ClusterVerdict]:
        from django.db import connections

        connections.close_all()  # the database was restarted under this process's connection
        now = datetime.now(UTC)
        verdicts = []
        for name in names:
            journal = self.stores[name].reading().journal()
            verdicts.append(
                check_records(
                    name,
                    journal,
                    failures_until=failures_until,
                    now=now,
                    hang_detection_s=HANG_DETECTION_S,
                )
            )
        return verdicts

    def report(
        self,
        verdicts: list[ClusterVerdict],
        reference: dict[str, Any],
        started: float,
        schedule_end: float,
    ) -> dict[str, Any]:
        by_kind = dict(self.landed.struck)
        fired = {"kills_between_commands": 0, "timeouts_after_effect": 0}
        # Armed faults land with the command they follow.
        strikes = list(self.landed.strikes)
        for verdict in verdicts:
            for command in verdict.journal["commands"]:
                at = command["at"]
                if command.get("killed_after"):
                    fired["kills_between_commands"] += 1
                    kind = faults.KILL_CONTROLLER_BETWEEN_COMMANDS
                    strikes.append(Strike(kind, at, at, verdict.cluster))
                if command.get("timed_out_after"):
                    fired["timeouts_after_effect"] += 1
                    strikes.append(Strike(faults.COMMAND_TIMEOUT, at, at, verdict.cluster))
        by_kind[faults.KILL_CONTROLLER_BETWEEN_COMMANDS] = fired["kills_between_commands"]
        by_kind[faults.COMMAND_TIMEOUT] = fired["timeouts_after_effect"]
        unexpected = [exit for exit in self.supervisor.exits if not exit.expected]
        between = sum(
            1 for exit in unexpected if exit.role.startswith("controller-") and exit.code == -9
        )
        action = next(v for v in verdicts if v.cluster.endswith("action"))
        monitor = next(v for v in verdicts if v.cluster.endswith("monitor"))
        counts = verdict_counts(verdicts)
        return {
            "seed": self.options.seed,
            "options": asdict(self.options),
            "faults_injected": sum(by_kind.values()),
            "by_kind": by_kind,
            "armed_by_kind": self.landed.armed,
            "missed_by_kind": self.landed.missed,
            **counts,
            "passed": all(value == 0 for value in counts.values()),
            "recovery_time_s": summarise_times(action.recovery_times_s),
            "recovery_time_s_monitor": summarise_times(monitor.recovery_times_s),
            "recovery_time_s_without_faults": reference or None,
            "recovery_time_s_from_detectable": summarise_times(
                times_from_detectable(action.recoveries, HANG_TIMEOUT_MINUTES * 60)
            ),
            "recovery_time_s_scheduler_reachable": summarise_times(
                times_scheduler_reachable(action.recoveries, strikes, action.cluster)
            ),
            # Where the time goes: until the recommendation is made, until a controller first
            # claims it, and from the claim to the restart (takeovers included).
            "recovery_phases_s": {
                "without_faults": summarise_phases(self.reference_recoveries),
                "with_faults": summarise_phases(action.recoveries),
            },
            "recovery_time_s_by_fault": times_by_fault(action.recoveries, strikes, action.cluster),
            "clusters": cluster_details(verdicts),
            "process_exits_not_caused_by_the_schedule": [
                {"role": e.role, "code": e.code, "log_tail": e.log_tail[-1500:]}
                for e in unexpected
                if not (e.role.startswith("controller-") and e.code == -9)
            ][:30],
            "controller_self_kills_seen": between,
            "wall_s": round(time.time() - started, 1),
            "schedule_ended_at": datetime.fromtimestamp(schedule_end, tz=UTC).isoformat(),
            "work_dir": str(self.work),
        }


def recheck(report_path: Path) -> dict[str, Any]:
    """The checks again, on what a finished run left in its folder (its database, the
    simulator's journals): the verdict of a run after the checks changed, without running the
    faults again. Fault counts and recovery times are the run's own."""
    from recovery.simulator.store import published_simulation

    previous = json.loads(report_path.read_text())
    work = Path(previous["work_dir"])
    with finished_run_database(work, ChaosRun.campaign):
        now = datetime.now(UTC)
        until = datetime.fromisoformat(previous["schedule_ended_at"]).timestamp()
        verdicts = []
        for cluster in previous["clusters"]:
            store = published_simulation(
                cluster["cluster"], redis_url="", state_dir=str(work / "sim-state")
            )
            verdicts.append(
                check_records(
                    cluster["cluster"],
                    cast("dict[str, Any]", store.reading().journal()),
                    failures_until=until,
                    now=now,
                    hang_detection_s=HANG_DETECTION_S,
                )
            )
    counts = verdict_counts(verdicts)
    return {
        **previous,
        **counts,
        "passed": all(value == 0 for value in counts.values()),
        "clusters": cluster_details(verdicts),
        "rechecked_at": now.isoformat(),
    }
