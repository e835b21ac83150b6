"""deploy/kubernetes/, checked offline: every YAML document against the Kubernetes schemas
(kubernetes-validate, strict: unknown fields fail) of the oldest version the manifests support
and the newest the package ships, then what the schemas cannot know: environment variables the
daemon reads, secrets from Secrets only, probes on real routes, a state directory the daemon
accepts, a Service that selects the pods. tests/deploy/test_probes.py runs the probes."""

from __future__ import annotations

import os
import re
import stat
import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest

from bridges.manifest.loading import load_manifests
from sidecar.stores.state_dir import UnsafeStateDir, prepare_state_dir
from tests.deploy.daemon_facts import (
    CHILD_ENV,
    FLEET_CONTRACT_ENV,
    daemon_env_names,
    daemon_routes,
    health_probe_url,
    probe_query,
    serve_port,
)
from tests.deploy.files import (
    ROOT,
    config_maps,
    container_env,
    is_sidecar_daemon,
    kubernetes_documents,
    kubernetes_files,
    pod_containers,
)
from tests.deploy.test_probes import HAPROXY

OLDEST = "1.30.0"
"""Native sidecar containers (init containers with `restartPolicy: Always`) are on by default
from 1.29; 1.30 is the oldest release still commonly supported by managed clusters."""
SECRET_ENV = frozenset({"SIDECAR_TOKEN", "SIDECAR_DATABASE_URL", "AWS_ACCESS_KEY_ID",
                        "AWS_SECRET_ACCESS_KEY"})


def documents(kind: str) -> list[dict[str, Any]]:
    return [doc for _, doc in kubernetes_documents() if doc["kind"] == kind]


def deployment(name: str) -> dict[str, Any]:
    return next(doc for doc in documents("Deployment") if doc["metadata"]["name"] == name)


def daemon_containers() -> list[dict[str, Any]]:
    return [c for doc in documents("Deployment") for c in pod_containers(doc)
            if is_sidecar_daemon(c)]


@pytest.mark.parametrize("path", kubernetes_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_document_is_valid_for_the_kubernetes_schemas(path: Path) -> None:
    docs = [doc for p, doc in kubernetes_documents() if p == path]
    assert docs
    for doc in docs:
        for version in (OLDEST, kubernetes_validate.utils.latest_version()):
            kubernetes_validate.validate(doc, version, strict=True)


def test_strict_validation_refuses_what_kubernetes_would_refuse() -> None:
    doc = deployment("sidecar-gateway")
    broken = {**doc, "spec": {**doc["spec"], "replicas": "two"}}
    with pytest.raises(kubernetes_validate.ValidationError, match="replicas"):
        kubernetes_validate.validate(broken, OLDEST, strict=True)
    typo = {**doc, "spec": {**doc["spec"], "replica": 2}}
    with pytest.raises(kubernetes_validate.ValidationError, match="replica"):
        kubernetes_validate.validate(typo, OLDEST, strict=True)


def test_the_two_patterns_are_there() -> None:
    pod = deployment("agent")["spec"]["template"]["spec"]
    (sidecar,) = pod["initContainers"]
    assert sidecar["restartPolicy"] == "Always"  # a native sidecar: up before the agent
    assert is_sidecar_daemon(sidecar) and sidecar["command"][3] == "127.0.0.1"  # pod-local
    (agent,) = pod["containers"]
    assert container_env(agent)["SIDECAR_URL"]["value"] == (
        f"http://127.0.0.1:{serve_port(sidecar['command'])}")
    gateway = deployment("sidecar-gateway")
    assert gateway["spec"]["replicas"] == 2
    (container,) = gateway["spec"]["template"]["spec"]["containers"]
    assert is_sidecar_daemon(container)


def test_every_variable_given_to_the_daemon_is_one_it_reads() -> None:
    known = daemon_env_names() | CHILD_ENV
    for container in daemon_containers():
        names = set(container_env(container))
        assert names <= known, names - known
    for doc in documents("Deployment"):
        for container in pod_containers(doc):
            if not is_sidecar_daemon(container):  # the agent: what the `sidecar` CLI reads
                assert set(container_env(container)) <= {"SIDECAR_URL", "SIDECAR_TOKEN"}


def test_the_gateway_gets_the_fleet_configuration_and_secrets_come_from_secrets() -> None:
    (gateway,) = deployment("sidecar-gateway")["spec"]["template"]["spec"]["containers"]
    env = container_env(gateway)
    assert FLEET_CONTRACT_ENV | {"SIDECAR_TOKEN"} <= set(env)
    assert env["SIDECAR_REPLICA_ID"]["valueFrom"] == {
        "fieldRef": {"fieldPath": "metadata.name"}}  # health names the pod that answered
    for container in [c for doc in documents("Deployment") for c in pod_containers(doc)]:
        for name, entry in container_env(container).items():
            if name in SECRET_ENV:
                assert "value" not in entry and "secretKeyRef" in entry["valueFrom"], name
    for data in config_maps().values():
        assert not SECRET_ENV & set(data)


def test_probes_ask_a_real_route_on_the_daemons_own_port() -> None:
    routes = daemon_routes()
    for container in daemon_containers():
        port = serve_port(container["command"])
        assert {"startupProbe", "livenessProbe"} <= set(container), container["name"]
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            if probe in container:
                command = container[probe]["exec"]["command"]
                assert command[0] == ".venv/bin/python"  # relative to the image's WORKDIR
                host, probe_port, path = health_probe_url(command)
                assert (host, probe_port, path in routes) == ("127.0.0.1", port, True)
                assert "SIDECAR_TOKEN" in " ".join(command)  # every route needs the token
                assert "SIDECAR_TOKEN" in container_env(container)
    assert "WORKDIR /app" in (ROOT / "Dockerfile").read_text()


def test_only_readiness_turns_a_database_outage_into_a_failed_probe() -> None:
    """`/v1/health` answers 503 while the fleet database does not (not ready: out of the
    Service), `?probe=liveness` 200 as long as the process answers: startup and liveness
    probes ask for liveness, so Kubernetes never restarts a replica for a database outage
    (tests/fleet/test_health_database.py runs these probes through one)."""
    for container in daemon_containers():
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            if probe in container:
                query = probe_query(container[probe]["exec"]["command"])
                wanted = "" if probe == "readinessProbe" else "probe=liveness"
                assert query == wanted, (container["name"], probe)


def test_pods_run_unprivileged_on_a_read_only_root_with_resources_requested() -> None:
    for doc in documents("Deployment"):
        pod = doc["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["automountServiceAccountToken"] is False
        for container in pod_containers(doc):
            context = container["securityContext"]
            assert context["readOnlyRootFilesystem"] is True
            assert context["allowPrivilegeEscalation"] is False
            assert context["capabilities"]["drop"] == ["ALL"]
            assert {"cpu", "memory"} <= set(container["resources"]["requests"])


def test_the_state_directory_is_one_the_daemon_creates_inside_its_empty_dir(
    tmp_path: Path,
) -> None:
    for doc in documents("Deployment"):
        pod = doc["spec"]["template"]["spec"]
        empty_dirs = {v["name"] for v in pod["volumes"] if "emptyDir" in v}
        for container in [c for c in pod_containers(doc) if is_sidecar_daemon(c)]:
            state = Path(container_env(container)["SIDECAR_STATE_DIR"]["value"])
            mounts = {Path(m["mountPath"]): m["name"] for m in container["volumeMounts"]}
            assert mounts[state.parent] in empty_dirs and state not in mounts
            assert mounts[Path("/tmp")] in empty_dirs  # writable scratch on a read-only root
    # why: an emptyDir's root is world-writable, which the daemon refuses as its state
    # directory; a directory it creates inside one is 0700
    volume = tmp_path / "empty-dir"
    volume.mkdir()
    volume.chmod(0o777)
    with pytest.raises(UnsafeStateDir, match="writable by other users"):
        prepare_state_dir(volume)
    assert prepare_state_dir(volume / "state") is None
    assert stat.S_IMODE(os.stat(volume / "state").st_mode) == 0o700


def test_the_services_select_the_gateway_pods_on_their_named_port() -> None:
    gateway = deployment("sidecar-gateway")
    labels = gateway["spec"]["template"]["metadata"]["labels"]
    assert gateway["spec"]["selector"]["matchLabels"] == labels
    (container,) = gateway["spec"]["template"]["spec"]["containers"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports["http"] == serve_port(container["command"])
    services = {doc["metadata"]["name"]: doc["spec"] for doc in documents("Service")}
    assert set(services) == {"sidecar-gateway", "sidecar-gateway-replicas"}
    for spec in services.values():
        assert spec["selector"] == labels
        assert [p["targetPort"] for p in spec["ports"]] == ["http"]
    # handshake-era /mcp sessions: a Service cannot stick on Mcp-Session-Id, ClientIP can
    assert services["sidecar-gateway"]["sessionAffinity"] == "ClientIP"
    assert services["sidecar-gateway-replicas"]["clusterIP"] == "None"  # one record per pod
    # clients use the Service's name as Host: the daemon must accept it
    assert "sidecar-gateway" in container["command"][container["command"].index(
        "--allowed-host") + 1:]
    (budget,) = documents("PodDisruptionBudget")
    assert budget["spec"]["selector"]["matchLabels"] == labels


def test_the_manifests_in_config_maps_load_without_errors(tmp_path: Path) -> None:
    mounted = {v["configMap"]["name"] for doc in documents("Deployment")
               for v in doc["spec"]["template"]["spec"]["volumes"] if "configMap" in v}
    maps = config_maps()
    assert mounted and mounted <= set(maps)
    for name in mounted:
        directory = tmp_path / name
        directory.mkdir()
        for file, text in maps[name].items():
            (directory / file).write_text(text)
        loaded = load_manifests([directory], environ={})
        assert loaded.errors == [], (name, loaded.errors)
        assert loaded.servers or loaded.tools, name


def test_the_readme_haproxy_snippet_passes_haproxy_check(tmp_path: Path) -> None:
    readme = (ROOT / "deploy" / "kubernetes" / "README.md").read_text()
    (snippet,) = re.findall(r"```\n(resolvers kube\n.*?)```", readme, re.DOTALL)
    assert "stick store-response res.hdr(Mcp-Session-Id)" in snippet
    assert "sidecar-gateway-replicas." in snippet  # the headless Service
    config = tmp_path / "haproxy.cfg"
    config.write_text(
        "defaults\n    mode http\n    timeout connect 5s\n    timeout client 15m\n"
        "    timeout server 15m\nfrontend mcp\n    bind 127.0.0.1:8080\n"
        "    default_backend sidecars\n" + snippet)
    env = {"PATH": os.environ["PATH"], "SIDECAR_TOKEN": "a-token-for-the-check"}
    result = subprocess.run([HAPROXY, "-c", "-f", str(config)], env=env, capture_output=True,
                            text=True, timeout=30)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Configuration file is valid" in result.stdout
