"""No Docker engine runs here: check compose.yaml's structure and that the Dockerfile installs
with the same bootstrap command the README uses."""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml

from bridges.manifest.loading import load_manifests

ROOT = Path(__file__).resolve().parents[2]


def test_compose_structure():
    compose = yaml.safe_load((ROOT / "compose.yaml").read_text())
    services = compose["services"]
    sidecar, upstream = services["sidecar"], services["everything"]
    assert sidecar["build"] == "."
    assert sidecar["env_file"] == "sidecar.env"  # the token comes from an env file
    assert sidecar["ports"] == ["127.0.0.1:8765:8765"]  # published on loopback only
    mounts = {v.split(":")[1]: v for v in sidecar["volumes"]}
    assert mounts["/manifests"].endswith(":ro")
    assert mounts["/state"].startswith("sidecar-state:") and "sidecar-state" in compose["volumes"]
    check = " ".join(sidecar["healthcheck"]["test"])
    assert "/v1/health" in check and "SIDECAR_TOKEN" in check
    assert "everything" in sidecar["depends_on"]
    assert "streamableHttp" in upstream["command"]
    source = (ROOT / "deploy" / "manifests").resolve()
    assert (ROOT / mounts["/manifests"].split(":")[0]).resolve() == source
    loaded = load_manifests([source], environ={})
    assert loaded.errors == []
    server = loaded.servers["everything"].value
    assert server.transport == "http" and server.url == "http://everything:3001/mcp"


def test_dockerfile_uses_the_readme_install_command():
    dockerfile = (ROOT / "Dockerfile").read_text()
    runs = re.findall(r"^RUN (.+)$", dockerfile, flags=re.M)
    assert runs == ['SIDECAR_EXTRAS="$SIDECAR_EXTRAS" scripts/bootstrap']
    assert re.search(r"(?m)^ARG SIDECAR_EXTRAS=$", dockerfile)  # by default no extras
    readme = (ROOT / "README.md").read_text()
    assert "./scripts/run" in readme.split("\n\n")[1]  # the README's first command bootstraps
    assert "scripts/bootstrap" in (ROOT / "scripts" / "run").read_text()
    cmd = json.loads(re.search(r"^CMD (.+)$", dockerfile, flags=re.M).group(1))
    assert cmd[:2] == [".venv/bin/sidecar", "serve"]
