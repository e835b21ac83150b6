"""The deployment files, parsed once per run (callers must not change what they get):
compose.yaml, deploy/haproxy/haproxy.cfg and every YAML document under deploy/kubernetes/."""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "compose.yaml"
HAPROXY_CFG = ROOT / "deploy" / "haproxy" / "haproxy.cfg"
KUBERNETES = ROOT / "deploy" / "kubernetes"


@cache
def compose() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(COMPOSE.read_text())
    return loaded


def fleet_services() -> dict[str, dict[str, Any]]:
    return {name: service for name, service in compose()["services"].items()
            if "fleet" in service.get("profiles", [])}


def kubernetes_files() -> list[Path]:
    return sorted(KUBERNETES.rglob("*.yaml"))


@cache
def kubernetes_documents() -> list[tuple[Path, dict[str, Any]]]:
    return [(path, doc) for path in kubernetes_files()
            for doc in yaml.safe_load_all(path.read_text()) if doc is not None]


def pod_containers(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """The containers of a workload's pod template, native sidecars (init containers with
    `restartPolicy: Always`) included."""
    if doc["kind"] not in ("Deployment", "StatefulSet", "DaemonSet"):
        return []
    spec = doc["spec"]["template"]["spec"]
    return [*spec.get("initContainers", []), *spec["containers"]]


def is_sidecar_daemon(container: dict[str, Any]) -> bool:
    command: list[str] = container.get("command", [])
    return command[:2] == [".venv/bin/sidecar", "serve"]


@cache
def config_maps() -> dict[str, dict[str, str]]:
    return {doc["metadata"]["name"]: doc.get("data", {})
            for _, doc in kubernetes_documents() if doc["kind"] == "ConfigMap"}


def container_env(container: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Name -> its `env` entry; names from `envFrom` ConfigMaps map to `{"value": ...}`."""
    maps = config_maps()
    env: dict[str, dict[str, Any]] = {}
    for source in container.get("envFrom", []):
        data = maps[source["configMapRef"]["name"]]
        env.update({name: {"name": name, "value": value} for name, value in data.items()})
    env.update({entry["name"]: entry for entry in container.get("env", [])})
    return env


def health_commands() -> list[tuple[str, list[str]]]:
    """(where, command) of every health check and probe that asks the daemon itself."""
    found: list[tuple[str, list[str]]] = []
    for name, service in compose()["services"].items():
        test = service.get("healthcheck", {}).get("test", [])
        if test[:2] == ["CMD", ".venv/bin/python"]:
            found.append((f"compose {name}", test[1:]))
    for path, doc in kubernetes_documents():
        for container in pod_containers(doc):
            for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
                if probe in container:
                    where = f"{path.relative_to(ROOT)} {container['name']} {probe}"
                    found.append((where, container[probe]["exec"]["command"]))
    return found
