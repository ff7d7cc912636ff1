"""The systemd units in deploy/systemd: systemd accepts them, and they run what the project runs.

``systemd-analyze verify`` reads the real files, unchanged, from a root built in a temporary
directory: the host's own units (sysinit.target, network-online.target…), ours, and an
executable stub for every program the project installs (the virtualenv's scripts; the
controller distribution's console script). A unit that names a program the installation does
not have, a directive systemd does not know or a value it cannot parse fails here; the broken
copies below prove that the check can fail. The rest reads the files as systemd does and
compares their command lines with ``workload_recovery.stack``, deploy/Procfile and the
controller's own argument parser.

Systemd is not PID 1 here, so the units are not started by systemd. Instead their command lines,
with their environment, working directory, state and cache directories, run as systemd would
run them, inside a sandbox that does what matters of theirs: the file system read-only except
the state, cache and temporary directories (ProtectSystem=strict, PrivateTmp=yes), no new
privileges, and no writable executable memory (MemoryDenyWriteExecute=yes, through the kernel's
own PR_SET_MDWE). They are stopped the way systemd stops them (KillMode=, TimeoutStopSec=).
"""

from __future__ import annotations

import argparse
import ctypes
import os
import re
import secrets
import shlex
import shutil
import signal
import stat
import subprocess
import sys
import time
import tomllib
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

import pytest
import redis
from django.conf import settings

from recovery.controller.cli import add_arguments
from workload_recovery.stack import free_port, redis_answers, web_command

pytestmark = pytest.mark.deploy

REPO = Path(settings.BASE_DIR)
UNITS_DIR = REPO / "deploy" / "systemd"
SYSUSERS = UNITS_DIR / "workload-recovery.sysusers.conf"
CONTROLLER_PYPROJECT = REPO / "deploy" / "controller-wheel" / "pyproject.toml"

# The installation the units assume.
CODE_DIR = "/opt/workload-recovery"
VENV_BIN = f"{CODE_DIR}/.venv/bin"
CONTROLLER_BIN = "/opt/workload-recovery-controller/bin"
SERVICE_USER = "workload-recovery"
ENV_FILE = "/etc/workload-recovery/workload-recovery.env"
CONTROLLER_ENV_FILE = "/etc/workload-recovery/controller.env"

MIGRATE = "workload-recovery-migrate.service"
WEB = "workload-recovery-web.service"
WORKER = "workload-recovery-worker.service"
BEAT = "workload-recovery-beat.service"
ROLES = (WEB, WORKER, BEAT)
CONTROL_PLANE = (MIGRATE, *ROLES)
TARGET = "workload-recovery.target"
CONTROLLER = "workload-recovery-controller@.service"
CLUSTER = "gpu-a"
CONTROLLER_INSTANCE = f"workload-recovery-controller@{CLUSTER}.service"

# What the specifiers the units use stand for in a system unit.
SYSTEM_SPECIFIERS = {"S": "/var/lib", "C": "/var/cache"}
HOST_UNITS = Path("/usr/lib/systemd/system")
# systemd's PATH for system services (Debian 12, merged /usr).
SERVICE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin"
# How long a command may take that runs to completion (a migration, collectstatic, a scan).
RUN_TIMEOUT = 300.0
# How long a started role may take to show it is up.
START_TIMEOUT = 60.0


# --------------------------------------------------------------------------- reading units


@dataclass(frozen=True)
class Unit:
    """A unit file read as systemd reads it: sections of ``Key=value`` lines, in order."""

    name: str
    entries: tuple[tuple[str, str, str], ...]

    @classmethod
    def read(cls, path: Path) -> Unit:
        entries: list[tuple[str, str, str]] = []
        section = ""
        pending = ""
        for raw in path.read_text(encoding="utf-8").splitlines():
            line = raw.strip()
            if not line or line[0] in "#;":
                continue
            if line.endswith("\\"):
                pending += line[:-1].strip() + " "
                continue
            line, pending = pending + line, ""
            if line.startswith("[") and line.endswith("]"):
                section = line[1:-1]
                continue
            key, equals, value = line.partition("=")
            assert equals, f"{path.name}: not a Key=value line: {line!r}"
            entries.append((section, key.strip(), value.strip()))
        assert not pending, f"{path.name}: ends in a continued line"
        return cls(path.name, tuple(entries))

    def values(self, key: str, section: str = "Service") -> list[str]:
        return [value for where, name, value in self.entries if (where, name) == (section, key)]

    def value(self, key: str, section: str = "Service") -> str | None:
        found = self.values(key, section)
        return found[-1] if found else None

    def words(self, key: str, section: str = "Unit") -> set[str]:
        return {word for value in self.values(key, section) for word in value.split()}

    def environment(self, specifiers: Mapping[str, str]) -> dict[str, str]:
        """The Environment= assignments, specifiers expanded."""
        assigned: dict[str, str] = {}
        for value in self.values("Environment"):
            for assignment in shlex.split(expand_specifiers(value, specifiers)):
                name, _, setting = assignment.partition("=")
                assigned[name] = setting
        return assigned

    def commands(
        self, env: Mapping[str, str], specifiers: Mapping[str, str], key: str = "ExecStart"
    ) -> list[list[str]]:
        """Each ExecStart= line as argv: specifiers, then ``${VAR}`` expanded, as systemd does."""
        commands = []
        for line in self.values(key):
            assert not re.search(r"\$(?!\{)", line), f"{self.name}: only ${{VAR}} is modelled"
            words = shlex.split(expand_specifiers(line, specifiers))
            assert words[0].startswith("/"), f"{self.name}: {key} takes an absolute path"
            commands.append([VARIABLE.sub(lambda m: env.get(m[1], ""), w) for w in words])
        return commands


VARIABLE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


def expand_specifiers(text: str, specifiers: Mapping[str, str]) -> str:
    def one(match: re.Match[str]) -> str:
        letter = match[1]
        if letter == "%":
            return "%"
        assert letter in specifiers, f"specifier %{letter} is not modelled here"
        return specifiers[letter]

    return re.sub(r"%(.)", one, text)


def unit_files() -> list[Path]:
    return sorted(p for p in UNITS_DIR.iterdir() if p.suffix in {".service", ".target"})


def unit(name: str) -> Unit:
    return Unit.read(UNITS_DIR / name)


def controller_specifiers() -> dict[str, str]:
    return {
        **SYSTEM_SPECIFIERS,
        "i": CLUSTER,
        "d": f"/run/credentials/{CONTROLLER_INSTANCE}",
    }


def procfile_command(role: str) -> list[str]:
    """deploy/Procfile's line for ``role``, with its shell defaults (``${NAME:-default}``)."""
    for line in (REPO / "deploy" / "Procfile").read_text(encoding="utf-8").splitlines():
        name, colon, command = line.partition(":")
        if colon and name.strip() == role:
            defaults = re.sub(r"\$\{[A-Za-z_][A-Za-z0-9_]*:-([^}]*)\}", r"\1", command)
            return shlex.split(defaults)
    raise AssertionError(f"deploy/Procfile has no {role} line")


def controller_scripts() -> list[str]:
    project = tomllib.loads(CONTROLLER_PYPROJECT.read_text(encoding="utf-8"))["project"]
    return sorted(project["scripts"])


# --------------------------------------------------------------------------- systemd-analyze


def systemd_tool(name: str) -> str:
    found = shutil.which(name)
    if found is None:
        pytest.fail(f"{name} is not installed (Debian: apt-get install systemd)")
    return found


def stub(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\nexit 0\n", encoding="utf-8")
    path.chmod(0o755)


def build_root(base: Path) -> Path:
    """A file system root holding the host's units, ours unchanged, and the installed programs.

    The programs are stubs named after what the installation really has: every executable of
    the project's virtualenv, and the controller distribution's console scripts.
    """
    root = base / "root"
    shutil.copytree(HOST_UNITS, root / HOST_UNITS.relative_to("/"), symlinks=True)
    system = root / "etc" / "systemd" / "system"
    system.mkdir(parents=True)
    for path in unit_files():
        shutil.copyfile(path, system / path.name)
    venv_bin = Path(sys.executable).parent
    for program in venv_bin.iterdir():
        if program.is_file() and os.access(program, os.X_OK):
            stub(root / VENV_BIN.lstrip("/") / program.name)
    for script in [*controller_scripts(), "python", "python3"]:
        stub(root / CONTROLLER_BIN.lstrip("/") / script)
    (root / CODE_DIR.lstrip("/")).mkdir(parents=True, exist_ok=True)
    return root


def verified_names() -> list[str]:
    """Every unit file by the name systemd loads it under; a template as one instance."""
    return [
        path.name.replace("@.", f"@{CLUSTER}.") if "@." in path.name else path.name
        for path in unit_files()
    ]


def verify_problems(root: Path, names: list[str]) -> list[str]:
    """What ``systemd-analyze verify`` says about our units: a failure, or any line naming one.

    It exits 0 on an unknown directive or a value it cannot parse, only saying so, so every
    line it prints about our units counts as a problem.
    """
    completed = subprocess.run(
        [systemd_tool("systemd-analyze"), "verify", f"--root={root}", *names],
        capture_output=True,
        text=True,
        cwd=root,
        timeout=120,
        check=False,
    )
    lines = (completed.stdout + completed.stderr).splitlines()
    if completed.returncode != 0:
        return [f"exit status {completed.returncode}", *lines]
    return [line for line in lines if "workload-recovery" in line]


@pytest.fixture
def verify_root(tmp_path: Path) -> Path:
    if not HOST_UNITS.is_dir():
        pytest.fail(f"{HOST_UNITS} is missing (Debian: apt-get install systemd)")
    return build_root(tmp_path)


def test_it_verifies_every_unit_unchanged(verify_root: Path) -> None:
    names = verified_names()
    assert {TARGET, *CONTROL_PLANE, CONTROLLER_INSTANCE} <= set(names)
    system = verify_root / "etc" / "systemd" / "system"
    for path in unit_files():
        assert (system / path.name).read_bytes() == path.read_bytes()
    assert verify_problems(verify_root, names) == []


def misspell_a_directive(text: str) -> str:
    return text.replace("\nProtectSystem=strict\n", "\nProtectSytem=strict\n")


def unparsable_value(text: str) -> str:
    return text.replace("\nProtectSystem=strict\n", "\nProtectSystem=strictly\n")


def missing_program(text: str) -> str:
    return text.replace(f"{VENV_BIN}/celery ", f"{VENV_BIN}/celeryd ")


def missing_dependency(text: str) -> str:
    return text.replace(f"Requires={MIGRATE}", "Requires=workload-recovery-migration.service")


def missing_controller_program(text: str) -> str:
    return text.replace(f"{CONTROLLER_BIN}/workload-recovery-controller ", f"{CONTROLLER_BIN}/wrc ")


@pytest.mark.parametrize(
    ("name", "break_it"),
    [
        (WEB, misspell_a_directive),
        (MIGRATE, unparsable_value),
        (WORKER, missing_program),
        (BEAT, missing_dependency),
        (CONTROLLER, missing_controller_program),
    ],
)
def test_it_fails_on_a_broken_copy(
    verify_root: Path, name: str, break_it: Callable[[str], str]
) -> None:
    """GIVEN one unit changed the way a typo would change it
    WHEN the same check runs over the root
    THEN it reports the problem, so the check above cannot pass by saying nothing."""
    copy = verify_root / "etc" / "systemd" / "system" / name
    original = copy.read_text(encoding="utf-8")
    broken = break_it(original)
    assert broken != original, "the breakage no longer applies to the unit"
    copy.write_text(broken, encoding="utf-8")
    problems = verify_problems(verify_root, verified_names())
    loaded = name.replace("@.", f"@{CLUSTER}.")
    assert any(name in line or loaded in line for line in problems), problems


def test_it_keeps_the_services_exposure_low(verify_root: Path) -> None:
    # systemd's own review of the sandbox, 0 (locked down) to 10; 2.0 and under reads "OK".
    for name in [n for n in verified_names() if n.endswith(".service")]:
        completed = subprocess.run(
            [
                systemd_tool("systemd-analyze"), "security", "--offline=true",
                f"--root={verify_root}", "--threshold=20", name,
            ],
            capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        assert completed.returncode == 0, completed.stdout[-2000:] + completed.stderr


def test_it_declares_the_service_user_for_sysusers(tmp_path: Path) -> None:
    (tmp_path / "etc").mkdir()
    completed = subprocess.run(
        [systemd_tool("systemd-sysusers"), f"--root={tmp_path}", "--dry-run", str(SYSUSERS)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr
    assert f"Creating user '{SERVICE_USER}'" in completed.stderr


# --------------------------------------------------------------------------- what they declare


@pytest.mark.parametrize("name", CONTROL_PLANE)
def test_it_runs_the_control_plane_as_its_user_in_a_sandbox(name: str) -> None:
    service = unit(name)
    expected = {
        "User": SERVICE_USER,
        "Group": SERVICE_USER,
        "WorkingDirectory": CODE_DIR,
        "NoNewPrivileges": "yes",
        "ProtectSystem": "strict",
        "PrivateTmp": "yes",
        "PrivateDevices": "yes",
        "CapabilityBoundingSet": "",
        "MemoryDenyWriteExecute": "yes",
        "RestrictAddressFamilies": "AF_UNIX AF_INET AF_INET6",
        "SystemCallFilter": "@system-service",
        "UMask": "0027",
        "StateDirectory": "workload-recovery",
        "CacheDirectory": "workload-recovery",
    }
    assert {key: service.value(key) for key in expected} == expected
    assert service.values("EnvironmentFile") == [ENV_FILE]
    assert service.value("ProtectHome") in {"yes", "read-only"}
    assert service.value("RemoveIPC") is None, "the four units share the user's IPC objects"
    environment = service.environment(SYSTEM_SPECIFIERS)
    assert environment["WR_VAR_DIR"] == "/var/lib/workload-recovery"
    assert environment["WR_CACHE_DIR"] == "/var/cache/workload-recovery"
    assert service.words("PartOf") == {TARGET}


def test_it_creates_the_user_the_units_run_as() -> None:
    users = [
        line.split()[1]
        for line in SYSUSERS.read_text(encoding="utf-8").splitlines()
        if line.startswith("u ")
    ]
    assert users == [SERVICE_USER]


@pytest.mark.parametrize("name", ROLES)
def test_it_starts_each_role_after_the_migrations(name: str) -> None:
    role = unit(name)
    assert MIGRATE in role.words("Requires")
    assert MIGRATE in role.words("After")
    assert name in unit(MIGRATE).words("Before")
    assert role.value("Restart") == "on-failure"


def test_it_migrates_once_then_collects_the_static_files() -> None:
    migrate = unit(MIGRATE)
    assert migrate.value("Type") == "oneshot"
    assert migrate.value("RemainAfterExit") == "yes"
    python = f"{VENV_BIN}/python"
    assert migrate.commands({}, SYSTEM_SPECIFIERS) == [
        [python, "manage.py", "migrate", "--noinput"],
        [python, "manage.py", "collectstatic", "--noinput"],
    ]
    # collectstatic writes under WR_VAR_DIR, the state directory.
    assert Path(settings.STATIC_ROOT).parent == Path(settings.VAR_DIR)
    # No database cache, so no createcachetable.
    backends = [
        str(cache["BACKEND"]) for cache in settings.CACHES.values() if isinstance(cache, dict)
    ]
    assert len(backends) == len(settings.CACHES)
    assert "django.core.cache.backends.db.DatabaseCache" not in backends


def test_it_serves_with_the_stacks_web_command() -> None:
    web = unit(WEB)
    env = web.environment(SYSTEM_SPECIFIERS)
    [command] = web.commands(env, SYSTEM_SPECIFIERS)
    assert command == web_command(env["WR_WEB_HOST"], int(env["PORT"]), f"{VENV_BIN}/python")


def test_it_runs_the_procfiles_worker_on_both_queues() -> None:
    worker = unit(WORKER)
    [command] = worker.commands(worker.environment(SYSTEM_SPECIFIERS), SYSTEM_SPECIFIERS)
    procfile = procfile_command("worker")
    assert command == [f"{VENV_BIN}/{procfile[0]}", *procfile[1:]]
    # Without -Q a worker consumes every queue settings declare: the default and the workloads'.
    assert {"-Q", "--queues"}.isdisjoint(command)
    queues = {queue.name for queue in settings.CELERY_TASK_QUEUES}
    assert queues == {settings.CELERY_TASK_DEFAULT_QUEUE, settings.WORKLOAD_QUEUE}


def test_it_stops_the_worker_warmly() -> None:
    worker = unit(WORKER)
    assert settings.CELERY_TASK_ACKS_LATE
    # SIGTERM to the main process alone, which then waits for the pool's running tasks.
    assert worker.value("KillMode") == "mixed"
    assert worker.value("KillSignal") in {None, "SIGTERM"}
    assert seconds(worker.value("TimeoutStopSec")) >= 60


def test_it_runs_the_procfiles_beat_with_its_schedule_in_the_state_directory() -> None:
    beat = unit(BEAT)
    [command] = beat.commands(beat.environment(SYSTEM_SPECIFIERS), SYSTEM_SPECIFIERS)
    procfile = procfile_command("beat")
    assert command[: len(procfile)] == [f"{VENV_BIN}/{procfile[0]}", *procfile[1:]]
    extra = command[len(procfile) :]
    assert extra[0] == "--schedule"
    assert Path(extra[1]).parent == Path("/var/lib/workload-recovery")
    assert len(extra) == 2


def test_it_groups_the_control_plane_in_one_target() -> None:
    target = unit(TARGET)
    assert target.words("Wants") == set(CONTROL_PLANE)
    assert target.value("WantedBy", "Install") == "multi-user.target"


class RefusingParser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise AssertionError(f"the controller would refuse its command line: {message}")


def controller_parser() -> RefusingParser:
    # Abbreviations off: each option in the unit must be one the controller declares.
    parser = RefusingParser(prog="workload-recovery-controller", allow_abbrev=False)
    add_arguments(parser)
    return parser


def test_it_gives_the_controller_only_options_it_accepts() -> None:
    controller = unit(CONTROLLER)
    specifiers = controller_specifiers()
    env = {
        **controller.environment(specifiers),
        "WR_ADVISOR_URL": "https://recovery.example.org",
    }
    [command] = controller.commands(env, specifiers)
    assert command[0] in {f"{CONTROLLER_BIN}/{script}" for script in controller_scripts()}
    parsed = controller_parser().parse_args(command[1:])
    assert parsed.cluster == CLUSTER
    assert parsed.url == "https://recovery.example.org"
    # The token comes from the credential systemd loads, never from the environment.
    [credential] = controller.values("LoadCredential")
    name, _, source = credential.partition(":")
    assert parsed.token_file == f"{specifiers['d']}/{name}"
    assert (
        expand_specifiers(source, specifiers)
        == f"/etc/workload-recovery/controller-{CLUSTER}.token"
    )
    # The unit's defaults are the controller's own.
    defaults = controller_parser().parse_args(["--cluster", CLUSTER])
    for option in ("partitions", "interval", "lease_seconds"):
        assert getattr(parsed, option) == getattr(defaults, option), option


def test_it_runs_the_controller_as_a_slurm_account_with_its_own_settings() -> None:
    controller = unit(CONTROLLER)
    assert controller.value("User") not in {None, "root", "0", SERVICE_USER}
    assert controller.values("EnvironmentFile")[0] == CONTROLLER_ENV_FILE
    for key, expected in {
        "NoNewPrivileges": "yes",
        "ProtectSystem": "strict",
        "PrivateTmp": "yes",
        "CapabilityBoundingSet": "",
    }.items():
        assert controller.value(key) == expected, key
    # Slurm's commands reach munge over a Unix socket and slurmctld over IP.
    assert {"AF_UNIX", "AF_INET", "AF_INET6"} <= set(
        (controller.value("RestrictAddressFamilies") or "").split()
    )


def seconds(value: str | None) -> float:
    match = re.fullmatch(r"(\d+)(s|min)?", value or "")
    assert match, f"not a time span this test reads: {value!r}"
    return float(match[1]) * (60 if match[2] == "min" else 1)


# --------------------------------------------------------------------------- running them

# Runs a command as the units' sandbox would: in a mount namespace of its own (`unshare`) with
# every file system read-only but the ones named, in the working directory, with the unit's
# umask, no new privileges and no writable executable memory, then execs it (same process).
LAUNCHER = """
import ctypes, os, subprocess, sys

arguments = sys.argv[1:]
split = arguments.index("--")
(workdir, umask, *writable), argv = arguments[:split], arguments[split + 1 :]
subprocess.run(["mount", "-o", "remount,bind,ro", "/"], check=True)
for path in writable:
    subprocess.run(["mount", "--bind", path, path], check=True)
    subprocess.run(["mount", "-o", "remount,bind,rw", path], check=True)
os.chdir(workdir)
os.umask(int(umask, 8))
libc = ctypes.CDLL(None, use_errno=True)
for option, value in ((38, 1), (65, 1)):  # PR_SET_NO_NEW_PRIVS; PR_SET_MDWE, refuse exec gain
    if libc.prctl(option, value, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), f"prctl({option}) failed")
os.execv(argv[0], argv)
"""


@dataclass
class Site:
    """One host's installation for the real run: directories, environment file, launcher."""

    base: Path
    state: Path
    cache: Path
    launcher: Path
    env_file: dict[str, str]
    token: str

    @property
    def specifiers(self) -> dict[str, str]:
        return {"S": str(self.base / "var-lib"), "C": str(self.base / "var-cache")}

    def environment(self, service: Unit) -> dict[str, str]:
        """What systemd gives the process: its own variables, Environment=, EnvironmentFile=."""
        return {
            "PATH": SERVICE_PATH,
            "HOME": str(self.state),
            "USER": SERVICE_USER,
            "LOGNAME": SERVICE_USER,
            "SHELL": "/usr/sbin/nologin",
            "STATE_DIRECTORY": str(self.state),
            "CACHE_DIRECTORY": str(self.cache),
            **service.environment(self.specifiers),
            **self.env_file,
        }

    def argv(self, service: Unit, command: list[str]) -> list[str]:
        """``command`` wrapped in the sandbox, the installed paths mapped onto this checkout."""
        program = command[0]
        if program.startswith(f"{VENV_BIN}/"):
            program = str(Path(sys.executable).parent / Path(program).name)
        workdir = service.value("WorkingDirectory")
        assert workdir == CODE_DIR
        return [
            shutil.which("unshare") or "unshare", "--mount", "--propagation", "private", "--",
            sys.executable, str(self.launcher), str(REPO), service.value("UMask") or "0022",
            "/tmp", str(self.state), str(self.cache), "--", program, *command[1:],
        ]  # fmt: skip

    def run(self, service: Unit, command: list[str]) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            self.argv(service, command),
            env=self.environment(service),
            capture_output=True,
            text=True,
            timeout=RUN_TIMEOUT,
            check=False,
        )


@dataclass
class Running:
    name: str
    unit: Unit
    popen: subprocess.Popen[bytes]
    log: Path

    def output(self) -> str:
        return self.log.read_text(encoding="utf-8", errors="replace")

    def wait_for(self, pattern: str, timeout: float = START_TIMEOUT) -> None:
        deadline = time.monotonic() + timeout
        while not re.search(pattern, self.output()):
            code = self.popen.poll()
            assert code is None, f"{self.name} exited with {code}:\n{self.output()[-4000:]}"
            assert time.monotonic() < deadline, f"{self.name}: no {pattern!r}:\n{self.output()}"
            time.sleep(0.2)

    def stop(self) -> int:
        """Stop it as systemd would; return its exit status (negative: the signal)."""
        kill_mode = self.unit.value("KillMode") or "control-group"
        pid = self.popen.pid
        if kill_mode == "mixed":
            os.kill(pid, signal.SIGTERM)
        else:
            os.killpg(pid, signal.SIGTERM)
        timeout = seconds(self.unit.value("TimeoutStopSec"))
        try:
            return self.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            pytest.fail(f"{self.name} did not stop within {timeout:g} s:\n{self.output()[-4000:]}")

    def group_alive(self) -> bool:
        try:
            os.killpg(self.popen.pid, 0)
        except ProcessLookupError:
            return False
        return True


def sandbox_missing() -> str | None:
    """Why the sandbox cannot be built on this host, or None."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return "needs root, for a mount namespace"
    unshare = shutil.which("unshare")
    if unshare is None:
        return "unshare (util-linux) is not installed"
    probe = subprocess.run(
        [unshare, "--mount", "--propagation", "private", "--", "mount", "-o",
         "remount,bind,ro", "/"],
        capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip
    if probe.returncode != 0:
        return f"no private read-only mount here: {probe.stderr.strip()}"
    # PR_GET_MDWE (Linux 6.3) answers -1 with EINVAL on an older kernel.
    if ctypes.CDLL(None, use_errno=True).prctl(66, 0, 0, 0, 0) < 0:
        return "the kernel has no PR_SET_MDWE (Linux 6.3 and later)"
    return None


@pytest.fixture
def site(tmp_path: Path) -> Iterator[Site]:
    reason = sandbox_missing()
    if reason is not None:
        pytest.skip(f"cannot run the units' commands in their sandbox: {reason}")
    if not redis_answers(settings.REDIS_URL):
        pytest.skip(f"no Redis answers at {settings.REDIS_URL}")
    launcher = tmp_path / "launcher.py"
    launcher.write_text(LAUNCHER, encoding="utf-8")
    state = tmp_path / "var-lib" / "workload-recovery"
    cache = tmp_path / "var-cache" / "workload-recovery"
    for directory in (state, cache):
        directory.mkdir(parents=True, mode=0o750)
    metrics_token = tmp_path / "etc" / "metrics-token"
    metrics_token.parent.mkdir()
    metrics_token.write_text(uuid.uuid4().hex, encoding="utf-8")
    token = f"wr-deploy-{uuid.uuid4().hex[:12]}"
    env_file = {
        "DJANGO_SETTINGS_MODULE": "workload_recovery.production",
        # Production settings require it; every host's environment file gives the same one.
        "SECRET_KEY": secrets.token_urlsafe(64),
        "DATABASE_URL": f"sqlite:///{state / 'workload_recovery.sqlite3'}",
        "REDIS_URL": settings.REDIS_URL,
        "ALLOWED_HOSTS": "127.0.0.1",
        # Plain HTTP here; behind the proxy the production default redirects to HTTPS.
        "SECURE_SSL_REDIRECT": "false",
        "WR_METRICS_TOKEN_FILE": str(metrics_token),
        # Queues, channel and throttle keys of this run only, on the shared Redis.
        "WR_CELERY_QUEUE": token,
        "WR_CHANNEL_PREFIX": token,
        "WR_THROTTLE_KEY_PREFIX": token,
        "WR_POLL_SECONDS": "2",
        "WR_WEB_HOST": "127.0.0.1",
        "PORT": str(free_port()),
    }
    yield Site(tmp_path, state, cache, launcher, env_file, token)
    client = redis.Redis.from_url(settings.REDIS_URL)
    try:
        keys = list(client.scan_iter(match=f"*{token}*"))
        if keys:
            client.delete(*keys)
    finally:
        client.close()


def test_the_sandbox_is_as_strict_as_the_units(site: Site) -> None:
    """GIVEN the sandbox the real run below uses
    WHEN a process in it maps writable executable memory or writes outside its directories
    THEN both are refused, so the run below shows the roles need neither."""
    probe = (
        "import mmap, pathlib, sys\n"
        "try:\n"
        "    mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)\n"
        "    sys.exit('writable executable memory was allowed')\n"
        "except PermissionError:\n"
        "    pass\n"
        "for name in sys.argv[1:]:\n"
        "    try:\n"
        "        pathlib.Path(name).write_text('x')\n"
        "        sys.exit(f'{name} was writable')\n"
        "    except OSError:\n"
        "        pass\n"
    )
    worker = unit(WORKER)
    outside = [str(REPO / f"sandbox-probe-{site.token}"), str(Path.home() / site.token)]
    try:
        completed = site.run(worker, [sys.executable, "-c", probe, *outside])
    finally:
        for name in outside:
            Path(name).unlink(missing_ok=True)
    assert completed.returncode == 0, completed.stdout + completed.stderr
    inside = site.run(
        worker, [sys.executable, "-c", f"open({str(site.state / 'probe')!r}, 'w').write('x')"]
    )
    assert inside.returncode == 0, inside.stderr
    assert stat.S_IMODE((site.state / "probe").stat().st_mode) == 0o640


def test_the_worker_scans_logs_without_writable_executable_memory(site: Site) -> None:
    """GIVEN a job log with a CUDA out-of-memory crash
    WHEN the detection engine scans it with Hyperscan, then RE2, in the worker's sandbox
    THEN both find it, and Hyperscan's compiled database is cached in the cache directory."""
    log = site.base / "job.log"
    log.write_text(
        "step 10 loss 2.31\n"
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n",
        encoding="utf-8",
    )
    worker = unit(WORKER)
    for engine in ("hyperscan", "re2"):
        command = [f"{VENV_BIN}/python", "-m", "recovery.detection", "scan", str(log)]
        completed = site.run(worker, [*command, "--json", "--engine", engine])
        assert completed.returncode == 0, completed.stderr
        assert '"category": "gpu_oom"' in completed.stdout, engine
    assert list(site.cache.rglob("hyperscan-*.db")) != []


def test_the_units_refuse_to_start_without_a_secret_key(site: Site) -> None:
    """GIVEN an environment file without SECRET_KEY or SECRET_KEY_FILE
    WHEN migrate's first command runs as its unit runs it
    THEN it stops, saying what to set, and the state directory stays empty."""
    del site.env_file["SECRET_KEY"]
    migrate = unit(MIGRATE)
    [first, _] = migrate.commands(site.environment(migrate), site.specifiers)
    completed = site.run(migrate, first)
    assert completed.returncode != 0
    assert "SECRET_KEY is not set" in completed.stderr
    assert list(site.state.iterdir()) == []


def test_the_units_commands_run_the_stack(site: Site) -> None:
    """GIVEN an empty state directory, production settings and the units' environment
    WHEN migrate's commands run, then web, worker and beat start as their units start them
    THEN pages and static files are served, beat's tasks reach the worker through the queues,
    nothing is written outside the state and cache directories, and each role stops cleanly
    within its TimeoutStopSec (the worker by a warm shutdown of its main process alone)."""
    migrate = unit(MIGRATE)
    for command in migrate.commands(site.environment(migrate), site.specifiers):
        completed = site.run(migrate, command)
        assert completed.returncode == 0, completed.stdout[-4000:] + completed.stderr[-4000:]
    # The key comes from the environment file: no host generates one of its own.
    assert not (site.state / "secret_key").exists()
    assert (site.state / "staticfiles" / "staticfiles.json").is_file()

    running: list[Running] = []
    try:
        for name in ROLES:
            service = unit(name)
            env = site.environment(service)
            [command] = service.commands(env, site.specifiers)
            log = site.base / f"{name}.log"
            with log.open("wb") as output:
                popen = subprocess.Popen(
                    site.argv(service, command),
                    env=env,
                    stdout=output,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            running.append(Running(name, service, popen, log))
        web, worker, beat = running

        base = f"http://127.0.0.1:{site.env_file['PORT']}"
        page = get_when_up(f"{base}/accounts/login/", web)
        stylesheet = re.search(r'/static/[^"]+\.[0-9a-f]{12}\.css', page)
        assert stylesheet, "the page names no hashed static file"
        get_when_up(base + stylesheet[0], web)

        beat.wait_for(r"beat: Starting")
        worker.wait_for(r"ready\.")
        worker.wait_for(r"Task tasks\.\w+\.\w+\[[0-9a-f-]+\] succeeded")

        for role in running:
            status = role.stop()
            # systemd counts an exit on SIGTERM as clean, as it does 0.
            assert status in {0, -signal.SIGTERM}, f"{role.name}: {status}\n{role.output()}"
        deadline = time.monotonic() + 5
        while worker.group_alive() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not worker.group_alive(), "the worker left pool processes behind"
        for role in running:
            assert "Traceback" not in role.output(), role.output()
        assert list(site.state.glob("celerybeat-schedule*")) == []
    finally:
        for role in running:
            if role.popen.poll() is None:
                os.killpg(role.popen.pid, signal.SIGKILL)
                role.popen.wait()


def get_when_up(url: str, web: Running) -> str:
    deadline = time.monotonic() + START_TIMEOUT
    while True:
        assert web.popen.poll() is None, f"web exited:\n{web.output()[-4000:]}"
        try:
            with urllib.request.urlopen(url, timeout=10) as response:
                assert response.status == 200
                return str(response.read().decode("utf-8", errors="replace"))
        except urllib.error.HTTPError as exc:
            pytest.fail(f"{url}: {exc.code}\n{web.output()[-4000:]}")
        except (urllib.error.URLError, ConnectionError):
            assert time.monotonic() < deadline, f"{url} never answered:\n{web.output()}"
            time.sleep(0.3)
