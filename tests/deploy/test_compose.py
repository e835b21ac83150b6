"""compose.yaml's `fleet` profile, checked without a Docker engine (none runs here): the whole
file against the Compose Specification (the strict `compose_spec` parser), the five roles, the
fleet configuration on both replicas (names the daemon reads, values that point at the other
services), health checks and start order, and deploy/haproxy/haproxy.cfg checked by the real
HAProxy (`haproxy -c`). tests/deploy/test_probes.py runs the health checks."""

from __future__ import annotations

import json
import os
import re
import subprocess
import tomllib
from typing import Any
from urllib.parse import urlsplit

import pytest
from compose_spec import PyCompose

from tests.deploy.daemon_facts import (
    FLEET_CONTRACT_ENV,
    daemon_env_names,
    daemon_routes,
    health_probe_url,
    serve_port,
)
from tests.deploy.files import COMPOSE, HAPROXY_CFG, ROOT, compose, fleet_services
from tests.deploy.test_probes import HAPROXY

REPLICAS = ("sidecar-1", "sidecar-2")


def test_the_file_follows_the_compose_specification() -> None:
    # YAML anchors and merge keys resolved first (Compose resolves them; the parser does not)
    parsed = PyCompose.from_json(json.dumps(compose()))
    assert set(parsed.service_names()) == set(compose()["services"])
    typo = json.loads(json.dumps(compose()))
    typo["services"]["lb"]["healthcheck"]["start_perod"] = "5s"
    with pytest.raises(ValueError, match="start_perod"):
        PyCompose.from_json(json.dumps(typo))


def test_plain_compose_up_still_starts_only_the_sidecar_and_its_example_server() -> None:
    services = compose()["services"]
    unprofiled = {name for name, service in services.items() if "profiles" not in service}
    assert unprofiled == {"sidecar", "everything"}
    assert set(fleet_services()) == {"postgres", "seaweedfs", *REPLICAS, "lb"}


def test_the_fleet_has_a_database_an_object_store_two_replicas_and_a_load_balancer() -> None:
    fleet = fleet_services()
    assert fleet["postgres"]["image"] == "postgres:16"
    assert fleet["seaweedfs"]["image"].startswith("chrislusf/seaweedfs:")
    assert fleet["seaweedfs"]["command"][0] == "mini"
    assert fleet["lb"]["image"] == "haproxy:2.9"
    for name in REPLICAS:
        replica = fleet[name]
        assert replica["build"] == {"context": ".", "args": {"SIDECAR_EXTRAS": "fleet"}}
        assert replica["command"][:2] == [".venv/bin/sidecar", "serve"]
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]["fleet"]
    assert {re.split(r"[<>=]", extra)[0] for extra in extras} >= {"asyncpg", "obstore"}
    # the state directory belongs to one daemon: each replica has its own volume
    states = [next(v for v in fleet[name]["volumes"] if v.endswith(":/state"))
              for name in REPLICAS]
    assert len(set(states)) == 2
    assert all(state.split(":")[0] in compose()["volumes"] for state in states)


def test_each_replica_gets_the_fleet_configuration_under_names_the_daemon_reads() -> None:
    fleet = fleet_services()
    known = daemon_env_names()
    assert "SIDECAR_TOKEN" in known and "SIDECAR_DATABASE_URL" in known
    ids = set()
    for name in REPLICAS:
        env: dict[str, str] = fleet[name]["environment"]
        assert set(env) <= known, set(env) - known
        assert FLEET_CONTRACT_ENV <= set(env), FLEET_CONTRACT_ENV - set(env)
        # the bearer token comes from the file the README's fleet section creates, shared
        # with the load balancer's health checks
        assert fleet[name]["env_file"] == "sidecar.env" == fleet["lb"]["env_file"]
        ids.add(env["SIDECAR_REPLICA_ID"])
        check_database(env["SIDECAR_DATABASE_URL"], fleet["postgres"])
        check_object_store(env, fleet["seaweedfs"])
    assert ids == set(REPLICAS)


def check_database(url: str, postgres: dict[str, Any]) -> None:
    parts = urlsplit(url)
    db = postgres["environment"]
    assert parts.scheme == "postgresql" and (parts.hostname, parts.port) == ("postgres", 5432)
    assert (parts.username, parts.password) == (db["POSTGRES_USER"], db["POSTGRES_PASSWORD"])
    assert parts.path == "/" + db["POSTGRES_DB"]


def check_object_store(env: dict[str, str], seaweedfs: dict[str, Any]) -> None:
    flags = dict(flag.lstrip("-").split("=", 1) for flag in seaweedfs["command"][1:])
    store = urlsplit(env["SIDECAR_OBJECT_STORE"])
    assert store.scheme == "s3" and store.hostname == flags["bucket"]  # created at start
    endpoint = urlsplit(env["AWS_ENDPOINT_URL"])
    assert (endpoint.scheme, endpoint.hostname) == ("http", "seaweedfs")
    assert endpoint.port == int(flags["s3.port"])
    identity = seaweedfs["environment"]  # weed mini's admin identity
    assert env["AWS_ACCESS_KEY_ID"] == identity["AWS_ACCESS_KEY_ID"]
    assert env["AWS_SECRET_ACCESS_KEY"] == identity["AWS_SECRET_ACCESS_KEY"]
    assert f"/buckets/{flags['bucket']}/" in " ".join(seaweedfs["healthcheck"]["test"])


def test_every_fleet_service_has_a_health_check_and_starts_after_what_it_needs() -> None:
    fleet = fleet_services()
    for name, service in fleet.items():
        test = service["healthcheck"]["test"]
        assert test[0] in ("CMD", "CMD-SHELL") and len(test) > 1, name
    for name in REPLICAS:
        assert fleet[name]["depends_on"]["postgres"] == {"condition": "service_healthy"}
        assert fleet[name]["depends_on"]["seaweedfs"] == {"condition": "service_healthy"}
        _, port, path = health_probe_url(fleet[name]["healthcheck"]["test"][1:])
        assert port == serve_port(fleet[name]["command"]) and path in daemon_routes()
    assert fleet["lb"]["depends_on"] == {
        name: {"condition": "service_healthy"} for name in REPLICAS}
    services = compose()["services"]
    for service in fleet.values():
        assert set(service.get("depends_on", {})) <= set(services)


def test_the_load_balancer_config_matches_the_services_and_passes_haproxy_check() -> None:
    fleet = fleet_services()
    lb = fleet["lb"]
    mount = f"./{HAPROXY_CFG.relative_to(ROOT)}:/usr/local/etc/haproxy/haproxy.cfg:ro"
    assert lb["volumes"] == [mount]
    config = HAPROXY_CFG.read_text()
    servers = dict(re.findall(r"(?m)^\s+server (\S+) (\S+)$", config))
    assert servers == {name: f"{name}:{serve_port(fleet[name]['command'])}"
                       for name in REPLICAS}
    # replicas accept the name clients on the compose network use for the load balancer
    assert all("lb" in fleet[name]["command"] for name in REPLICAS)
    published = lb["ports"][0].rsplit(":", 1)[1]
    assert lb["ports"][0].startswith("127.0.0.1:") and f"bind :{published}\n" in config
    monitor = re.search(r"bind :(\d+)\n\s+monitor-uri (\S+)", config)
    assert monitor and f"127.0.0.1/{monitor[1]}" in lb["healthcheck"]["test"][-1]
    assert f"GET {monitor[2]} " in lb["healthcheck"]["test"][-1]
    # server-assigned MCP session ids stick: learned from the response, matched on requests
    assert "stick store-response res.hdr(Mcp-Session-Id)" in config
    assert "stick match req.hdr(Mcp-Session-Id)" in config
    env = {"PATH": os.environ["PATH"], "SIDECAR_TOKEN": "a-token-for-the-check"}
    # offline: the replicas' names do not resolve here, which `init-addr ...,none` allows
    result = subprocess.run([HAPROXY, "-c", "-f", str(HAPROXY_CFG)], env=env,
                            capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Configuration file is valid" in result.stdout
    warnings = [line for line in result.stderr.splitlines() if "[WARNING]" in line]
    assert all("could not resolve address 'sidecar-" in line for line in warnings), warnings


def test_the_image_installs_the_fleet_extra_only_when_asked() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert re.search(r"(?m)^ARG SIDECAR_EXTRAS=$", dockerfile)  # default: the daemon alone
    assert 'RUN SIDECAR_EXTRAS="$SIDECAR_EXTRAS" scripts/bootstrap' in dockerfile
    assert "docker compose --profile fleet up" in COMPOSE.read_text()


def test_the_readme_shows_how_to_start_the_fleet() -> None:
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("## Running a fleet\n"):]
    section = section[:section.index("\n## ", 1)]
    assert "docker compose --profile fleet up" in section
    assert "> sidecar.env" in section  # the token the replicas and the load balancer share
    assert "[docs/fleet.md](docs/fleet.md)" in section
