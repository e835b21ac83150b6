"""Token accounting on a real `sidecar serve` process with a real MCP server (the bridge tests'
`testserver.py`) and a command tool: the tokens of each served definition in `GET /v1/tools`
(per tool, per server, in total, by profile), `sidecar tools --tokens`, the
`sidecar_tool_definition_tokens{profile}` gauge, the console's tools page, and the tokens of
what each call returned in `GET /v1/calls` and `sidecar calls`."""

from __future__ import annotations

import json
import os
import re
import secrets
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from sidecar.model.token_count import ENCODING, count_tokens, definition_text
from tests.serve.test_observability import started, stop

SIDECAR = [sys.executable, "-m", "sidecar.cli"]
SERVER = Path(__file__).resolve().parents[1] / "bridges" / "servers" / "testserver.py"
MANIFEST = f"""
[mcpServers.up]
command = {json.dumps(sys.executable)}
args = [{json.dumps(str(SERVER))}]

[tools.numbers]
kind = "command"
description = "Print the numbers 1..n, one per line"
input = {{ type = "object", properties = {{ n = {{ type = "integer" }} }}, required = ["n"] }}
argv = ["seq", "{{n}}"]

[profiles.small]
include = ["numbers"]
"""


class Daemon:
    def __init__(self, url: str, token: str, env: dict[str, str]) -> None:
        self.url, self.token, self.env = url, token, env

    def client(self) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=30,
                            headers={"authorization": f"Bearer {self.token}"})

    def cli(self, *args: str) -> str:
        done = subprocess.run([*SIDECAR, *args], env=self.env, capture_output=True, text=True,
                              timeout=120)
        assert done.returncode == 0, done.stderr
        return done.stdout


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    root = tmp_path_factory.mktemp("tokens")
    (root / "manifests").mkdir()
    (root / "manifests" / "tools.toml").write_text(MANIFEST)
    token = secrets.token_urlsafe(32)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SIDECAR_", "OTEL_"))}
    env.update(SIDECAR_STATE_DIR=str(root / "state"),
               SIDECAR_MANIFESTS=str(root / "manifests"), SIDECAR_TOKEN=token)
    proc, url = started([*SIDECAR, "serve", "--port", "0"], env, "listening on ")
    try:
        daemon = Daemon(url, token, env)
        daemon.cli("health")  # waits for nothing; `tools` below waits for the server's start
        yield daemon
    finally:
        stop(proc)


def listing(daemon: Daemon, **params: str) -> dict[str, Any]:
    daemon.cli("tools")  # returns once the upstream server has started
    with daemon.client() as client:
        response = client.get("/v1/tools", params=params)
    assert response.status_code == 200, response.text
    return dict(response.json())


def test_v1_tools_counts_each_served_definition(daemon: Daemon) -> None:
    body = listing(daemon)
    tools = {t["name"]: t for t in body["tools"]}
    assert {"up_echo", "numbers", "managed_read"} <= tools.keys()
    assert body["token_encoding"] == ENCODING == "cl100k_base"
    # each count is the definition as the model sees it: name, description, input schema
    assert body["tokens"] == {
        name: count_tokens(definition_text(name, t["description"], t["inputSchema"]))
        for name, t in tools.items()}
    assert list(body["tokens"]) == list(tools)  # the listing's order
    assert body["total_tokens"] == sum(body["tokens"].values()) > 0
    servers = body["tokens_by_server"]
    assert "up_echo" in servers["up"]["tools"]
    assert servers["manifest-tools"] == {"tokens": body["tokens"]["numbers"],
                                         "tools": ["numbers"]}
    assert sum(s["tokens"] for s in servers.values()) == body["total_tokens"]
    assert [s["tokens"] for s in servers.values()] == sorted(
        (s["tokens"] for s in servers.values()), reverse=True)
    # the counts do not depend on the provider format the definitions are listed in
    openai = listing(daemon, format="openai")
    assert openai["tokens"] == body["tokens"] and openai["format"] == "openai"


def test_a_profile_counts_only_what_it_serves(daemon: Daemon) -> None:
    small = listing(daemon, profile="small")
    assert set(small["tokens"]) == {"numbers", "managed_read"}
    every = listing(daemon)
    assert small["total_tokens"] == every["tokens"]["numbers"] + every["tokens"]["managed_read"]
    with daemon.client() as client:
        metrics = client.get("/metrics").text
    gauges = dict(re.findall(r'^sidecar_tool_definition_tokens\{profile="([^"]+)"\} (\S+)$',
                             metrics, re.M))
    assert gauges == {"default": f"{every['total_tokens']:.1f}",
                      "small": f"{small['total_tokens']:.1f}"}


def test_sidecar_tools_tokens(daemon: Daemon) -> None:
    every = listing(daemon)
    shown = daemon.cli("tools", "--tokens")
    assert "cl100k_base" in shown and "the default profile" in shown
    assert f"total  {every['total_tokens']:,} tokens, {len(every['tokens'])} tools" in shown
    up = every["tokens_by_server"]["up"]
    assert f"up  {up['tokens']:,} tokens, {len(up['tools'])} tools" in shown
    assert re.search(rf"^  numbers +{every['tokens']['numbers']:>7,}$", shown, re.M)
    as_json = json.loads(daemon.cli("tools", "--tokens", "--json", "--profile", "small"))
    small = listing(daemon, profile="small")
    assert as_json == {k: small[k] for k in ("token_encoding", "tokens", "total_tokens",
                                             "tokens_by_server")}



def test_sidecar_tools_tokens_embedded(daemon: Daemon, tmp_path: Path) -> None:
    """`--embedded` opens the manifests itself (another state directory): the same counts."""
    every = listing(daemon)
    env = {**daemon.env, "SIDECAR_STATE_DIR": str(tmp_path / "state")}
    done = subprocess.run([*SIDECAR, "tools", "--tokens", "--json", "--all", "--embedded"],
                          env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["tokens"] == every["tokens"]


def test_the_console_shows_the_tokens_of_each_tool(daemon: Daemon) -> None:
    every = listing(daemon)
    with httpx.Client(base_url=daemon.url, follow_redirects=False) as client:
        assert client.post("/ui/login", data={"token": daemon.token}).status_code == 303
        page = client.get("/ui/tools", params={"q": "numbers"}).text
    assert f'<span id=total-tokens>{every["total_tokens"]:,}</span> tokens' in page
    assert f'numbers</a></strong> <span class="muted tokens">{every["tokens"]["numbers"]:,} ' \
        'tokens</span>' in page


def test_the_history_keeps_the_tokens_of_each_result(daemon: Daemon) -> None:
    with daemon.client() as client:
        snapshot = client.post("/v1/snapshots", json={"session_id": "tok"}).json()["id"]
        outcomes = {}
        for call_id, name, arguments in (("tok-1", "numbers", {"n": 300}),
                                         ("tok-2", "up_echo", {"text": "hello tokens"}),
                                         ("tok-3", "up_fail", {})):
            outcomes[call_id] = client.post(f"/v1/snapshots/{snapshot}/calls", json={
                "name": name, "input": arguments,
                "context": {"session_id": "tok", "agent": "t", "message_id": "m",
                            "call_id": call_id}}).json()
        rows = {r["call_id"]: r for r in
                client.get("/v1/calls", params={"session": "tok"}).json()["calls"]}
    for call_id in ("tok-1", "tok-2"):
        text = "\n".join(i["text"] for i in outcomes[call_id]["content"] if i["type"] == "text")
        assert rows[call_id]["content_tokens"] == count_tokens(text) > 0, call_id
    assert rows["tok-1"]["content_tokens"] > 300  # 300 numbers, a line each
    failed = outcomes["tok-3"]
    assert failed["status"] == "error"
    assert rows["tok-3"]["content_tokens"] == count_tokens(failed["error"]["message"])
    shown = daemon.cli("calls", "--session", "tok")
    line = next(x for x in shown.splitlines() if "tok-1" in x)
    assert f" ms  {rows['tok-1']['content_tokens']:,} tokens  session tok" in line
