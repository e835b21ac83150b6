"""Per-user quotas on a real `sidecar serve` trusting a real OpenID provider: calls per
minute, calls at once and snapshots, each refused 429 `quota` naming the limit on `/v1`, as a
tool error through `/mcp`; per-user overrides; counted in /metrics. Bytes in the managed store
(`store_bytes`): a user's own oldest texts go first, one output over the limit fails the call
with `Quota: ...`."""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.serve.identities.conftest import Daemon, Provider, auth_manifest, start_daemon
from tests.serve.identities.test_access_tokens import call, error
from tests.serve.test_observability import stop

QUOTAS = """
[tools.pause]
kind = "command"
description = "Wait for a file to appear"
input = { type = "object", properties = { path = { type = "string" } }, required = ["path"] }
argv = ["sh", "-c", "while [ ! -e \\"$0\\" ]; do sleep 0.05; done", "{path}"]

[tools.asked]
kind = "command"
description = "Print a word, once a person allowed it"
input = { type = "object", properties = { w = { type = "string" } }, required = ["w"] }
argv = ["echo", "{w}"]

[[permissions.rules]]
action = "asked"
decision = "ask"

[auth.quotas]
calls_per_minute = 3
concurrent_calls = 1
snapshots = 50
store_bytes = 10000000

[auth.quotas.users.bob]
calls_per_minute = 100
store_bytes = 200000

[auth.quotas.users.olga]
snapshots = 2
"""


@pytest.fixture(scope="module")
def limited(oidc_provider: Provider, tmp_path_factory: pytest.TempPathFactory
            ) -> Iterator[Daemon]:
    manifest = auth_manifest(oidc_provider.issuer, QUOTAS).replace(
        'include = ["numbers"]', 'include = ["numbers", "pause", "asked"]')
    proc, served = start_daemon(tmp_path_factory.mktemp("quotas"), manifest)
    try:
        yield served
    finally:
        stop(proc)


def metric(daemon: Daemon, name: str, **labels: str) -> float | None:
    with daemon.client() as client:
        text = client.get("/metrics").text
    shown = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    found = re.search(rf"^{name}\{{{re.escape(shown)}\}} (\S+)$", text, re.M)
    return float(found.group(1)) if found else None


def test_calls_per_minute(limited: Daemon, oidc_provider: Provider) -> None:
    with limited.client(oidc_provider.token("alice")) as alice:
        for i in range(3):
            assert call(alice, "numbers", {"n": 1}, f"cpm-{i}", "small").status_code == 200
        status, code, message = error(call(alice, "numbers", {"n": 1}, "cpm-3", "small"))
        assert (status, code) == (429, "quota")
        assert message.startswith("Quota: alice may make 3 calls per minute (quota "
                                  "calls_per_minute); retry in ")
    assert metric(limited, "sidecar_quota_refused_total", user="alice",
                  limit="calls_per_minute") == 1.0
    with limited.client(oidc_provider.token("bob")) as bob:  # bob's own quota: 100
        for i in range(4):
            assert call(bob, "numbers", {"n": 1}, f"cpm-bob-{i}", "small").status_code == 200
    with limited.client() as local:  # the all-access token counts against no one
        for i in range(4):
            assert call(local, "numbers", {"n": 1}, f"cpm-local-{i}").status_code == 200


def test_the_quota_holds_through_mcp(limited: Daemon, oidc_provider: Provider) -> None:
    token = oidc_provider.token("alice")  # over its 3 calls a minute (the test above)
    headers = {"authorization": f"Bearer {token}",
               "accept": "application/json, text/event-stream"}
    with httpx.Client(base_url=limited.url, headers=headers, timeout=30) as client:
        hello = client.post("/mcp/small", json={
            "jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
                "protocolVersion": "2025-06-18", "capabilities": {},
                "clientInfo": {"name": "t", "version": "1"}}})
        assert hello.status_code == 200, hello.text
        session = {"mcp-session-id": hello.headers["mcp-session-id"],
                   "mcp-protocol-version": "2025-06-18"}
        client.post("/mcp/small", headers=session,
                    json={"jsonrpc": "2.0", "method": "notifications/initialized"})
        answer = client.post("/mcp/small", headers=session, json={
            "jsonrpc": "2.0", "id": 2, "method": "tools/call",
            "params": {"name": "numbers", "arguments": {"n": 1}}})
    result = rpc_result(answer)
    assert result["isError"] is True
    assert "Quota: alice may make 3 calls per minute" in result["content"][0]["text"]


def rpc_result(response: httpx.Response) -> dict[str, Any]:
    if response.headers["content-type"].startswith("text/event-stream"):
        for line in response.text.splitlines():
            if line.startswith("data:"):
                message = json.loads(line[5:])
                if "result" in message:
                    return dict(message["result"])
        raise AssertionError(response.text)
    return dict(response.json()["result"])


def test_concurrent_calls(limited: Daemon, oidc_provider: Provider, tmp_path) -> None:
    gate = tmp_path / "open"
    token = oidc_provider.token("bob")
    first: list[httpx.Response] = []

    def slow() -> None:
        with limited.client(token) as bob:
            first.append(call(bob, "pause", {"path": str(gate)}, "held-1", "small"))

    runner = threading.Thread(target=slow)
    runner.start()
    try:
        deadline = time.monotonic() + 20
        while metric(limited, "sidecar_user_calls_running", user="bob") != 1.0:
            assert time.monotonic() < deadline, "the first call never started"
            time.sleep(0.02)
        with limited.client(token) as bob:
            status, code, message = error(call(bob, "numbers", {"n": 1}, "held-2", "small"))
        assert (status, code) == (429, "quota")
        assert message == ("Quota: bob has 1 call(s) running, at most 1 at once (quota "
                           "concurrent_calls); retry when one has finished")
    finally:
        gate.touch()
        runner.join(timeout=30)
    assert first[0].status_code == 200 and first[0].json()["status"] == "completed"
    assert metric(limited, "sidecar_user_calls_running", user="bob") == 0.0


def test_snapshots(limited: Daemon, oidc_provider: Provider) -> None:
    with limited.client(oidc_provider.token("olga")) as olga:
        for _ in range(2):
            assert olga.post("/v1/snapshots", json={"session_id": "s"}).status_code == 201
        status, code, message = error(olga.post("/v1/snapshots", json={"session_id": "s"}))
    assert (status, code) == (429, "quota")
    assert message.startswith("Quota: olga may hold 2 snapshots (quota snapshots); the "
                              "oldest expires in ")
    assert metric(limited, "sidecar_user_snapshots", user="olga") == 2.0


def test_the_console_shows_each_users_quota(limited: Daemon, oidc_provider: Provider) -> None:
    with limited.client(oidc_provider.token("alice")) as alice:
        call(alice, "numbers", {"n": 1}, "console-quota", "small")  # alice is counted
    with httpx.Client(base_url=limited.url, timeout=30) as browser:
        signed = browser.post("/ui/login", data={"token": limited.token})
        assert signed.status_code == 303, signed.text
        page = browser.get("/ui").text
    assert "<h2>Quotas</h2>" in page
    row = re.search(r"<tr><td>alice</td><td>(\d+) / 3</td><td>0 / 1</td><td>\d+ / 50</td>",
                    page)
    assert row is not None and int(row.group(1)) >= 1, page[-2000:]


def test_store_bytes(limited: Daemon, oidc_provider: Provider) -> None:
    def retained(client: httpx.Client, n: int, call_id: str) -> tuple[str, int]:
        done = call(client, "numbers", {"n": n}, call_id, "small")
        assert done.status_code == 200 and done.json()["status"] == "completed", done.text
        (kept,) = done.json()["managed"]
        return kept["ref"], kept["size_bytes"]

    def alive(ref: str) -> bool:
        with limited.client() as local:
            return local.get(f"/v1/managed/{ref}").status_code == 200

    with limited.client(oidc_provider.token("bob")) as bob, \
            limited.client(oidc_provider.token("root")) as root:
        first, size = retained(bob, 20000, "store-bob-1")  # 108,894 bytes each
        other, _ = retained(root, 20000, "store-root-1")  # root: the table's 10,000,000
        second, _ = retained(bob, 20000, "store-bob-2")  # over bob's 200,000: his oldest goes
        assert [alive(first), alive(other), alive(second)] == [False, True, True]
        over = call(bob, "numbers", {"n": 40000}, "store-bob-3", "small")  # 228,894 bytes
    assert over.status_code == 200, over.text  # a call that ran: its outcome, not a 429
    assert over.json()["status"] == "error"
    assert over.json()["error"]["kind"] == "unavailable"
    assert over.json()["error"]["message"] == (
        "Quota: bob may keep 200,000 bytes in the managed store (quota store_bytes); "
        "numbers's output of 228,894 bytes was not kept whole: ask for less output")
    assert [alive(other), alive(second)] == [True, True]
    assert metric(limited, "sidecar_user_store_bytes", user="bob") == size
    assert metric(limited, "sidecar_user_store_bytes_limit", user="bob") == 200000
    assert metric(limited, "sidecar_user_store_bytes_limit", user="root") == 10000000
    assert metric(limited, "sidecar_quota_refused_total", limit="store_bytes", user="bob") == 1
    with httpx.Client(base_url=limited.url, timeout=30) as browser:
        browser.post("/ui/login", data={"token": limited.token})
        page = browser.get("/ui").text
    assert f"<td>{size:,} / 200,000</td></tr>" in page
    manifest = limited.state.parent / "manifests" / "auth.toml"  # a reload sets the new limit
    manifest.write_text(manifest.read_text().replace("store_bytes = 200000",
                                                     "store_bytes = 300000"))
    deadline = time.monotonic() + 20
    while metric(limited, "sidecar_user_store_bytes_limit", user="bob") != 300000:
        assert time.monotonic() < deadline, "the reload never set bob's new limit"
        time.sleep(0.05)
    with limited.client(oidc_provider.token("bob")) as bob:
        assert retained(bob, 40000, "store-bob-4")[1] == 228894


def test_a_user_sees_and_answers_only_the_asks_of_their_calls(
        limited: Daemon, oidc_provider: Provider) -> None:
    bob, alice, olga = (oidc_provider.token(n) for n in ("bob", "alice", "olga"))
    answered: list[httpx.Response] = []

    def asking() -> None:
        with limited.client(bob) as client:
            answered.append(call(client, "asked", {"w": "hi"}, "ask-bob", "small"))

    runner = threading.Thread(target=asking)
    runner.start()
    try:
        deadline = time.monotonic() + 20
        while True:
            with limited.client(bob) as client:
                pending = client.get("/v1/permissions").json()["pending"]
            if pending or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        (ask,) = pending
        assert ask["source"]["call_id"] == "ask-bob"
        with limited.client(alice) as client:
            assert client.get("/v1/permissions").json() == {"pending": []}
            status, code, message = error(client.post(
                f"/v1/permissions/{ask['id']}/reply", json={"reply": "once"}))
            assert (status, code) == (404, "unknown_ask") and "of a call of alice" in message
        with limited.client(olga) as client:  # an operator sees every ask
            assert [a["id"] for a in client.get("/v1/permissions").json()["pending"]] == [
                ask["id"]]
        with limited.client(bob) as client:
            replied = client.post(f"/v1/permissions/{ask['id']}/reply", json={"reply": "once"})
            assert replied.status_code == 200, replied.text
    finally:
        runner.join(timeout=30)
    assert answered[0].status_code == 200 and answered[0].json()["status"] == "completed"
