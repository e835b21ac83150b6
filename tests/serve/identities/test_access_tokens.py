"""Access tokens of a real OpenID provider on a real `sidecar serve`: accepted on `/v1` and
`/mcp` beside local tokens, refused with the reason (wrong audience, expired, another issuer,
no grant); roles on routes; the history records the user and a user reads only their own."""

from __future__ import annotations

import json
import socket
import subprocess
import time
from typing import Any

import httpx
import jwt

from tests.serve.identities.conftest import (
    SIDECAR,
    Daemon,
    Provider,
    auth_manifest,
    start_daemon,
)
from tests.serve.test_observability import stop


def call(client: httpx.Client, name: str, args: dict[str, Any], call_id: str,
         profile: str | None = None) -> httpx.Response:
    body: dict[str, Any] = {"session_id": "s-" + call_id}
    if profile is not None:
        body["profile"] = profile
    snap = client.post("/v1/snapshots", json=body)
    assert snap.status_code == 201, snap.text
    return client.post(f"/v1/snapshots/{snap.json()['id']}/calls", json={
        "name": name, "input": args, "context": {
            "session_id": "s-" + call_id, "agent": "a", "message_id": "m", "call_id": call_id}})


def error(response: httpx.Response) -> tuple[int, str, str]:
    body = response.json()["error"]
    return response.status_code, body["code"], body["message"]


def test_a_users_access_token_reaches_its_profile_beside_the_local_token(
        daemon: Daemon, oidc_provider: Provider) -> None:
    with daemon.client(oidc_provider.token("alice")) as alice:
        listed = alice.get("/v1/tools", params={"profile": "small"})
        assert listed.status_code == 200, listed.text
        done = call(alice, "numbers", {"n": 3}, "alice-1", profile="small")
        assert done.status_code == 200, done.text
        assert done.json()["status"] == "completed"
        # a profile not granted
        assert error(alice.get("/v1/tools"))[:2] == (403, "forbidden_profile")
    with daemon.client() as local:  # the all-access local token still reaches everything
        assert local.get("/v1/tools").status_code == 200


def test_mcp_accepts_an_access_token_of_a_granted_profile_only(
        daemon: Daemon, oidc_provider: Provider) -> None:
    hello = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {},
        "clientInfo": {"name": "t", "version": "1"}}}
    headers = {"accept": "application/json, text/event-stream"}
    with daemon.client(oidc_provider.token("alice")) as alice:
        assert alice.post("/mcp/small", json=hello, headers=headers).status_code == 200
        refused = alice.post("/mcp", json=hello, headers=headers)
        assert error(refused)[:2] == (403, "forbidden_role")
        assert "reaches only the profiles small" in error(refused)[2]


def test_refused_tokens_say_why(daemon: Daemon, oidc_provider: Provider) -> None:
    cases = {
        "audience": (oidc_provider.token("alice", resource="urn:another"),
                     "the access token is not for this gateway (its audience is not "
                     "'urn:sidecar')"),
        "issuer": (oidc_provider.token("alice", issuer=oidc_provider.other),
                   f"the access token was not issued by {oidc_provider.issuer}"),
        "no grant": (oidc_provider.token("mallory"),
                     "mallory signed in, but no [[auth.grants]] entry names them or their "
                     "groups (none)"),
    }
    for token, message in cases.values():
        with daemon.client(token) as client:
            response = client.get("/v1/tools", params={"profile": "small"})
        assert error(response) == (401, "unauthorized", message)
        assert response.headers["www-authenticate"].startswith("Bearer")
    # a token whose signature was tampered with
    good = oidc_provider.token("alice")
    head, payload, signature = good.split(".")
    forged = f"{head}.{payload}.{signature[:-4]}AAAA"
    with daemon.client(forged) as client:
        status, code, message = error(client.get("/v1/tools", params={"profile": "small"}))
    assert (status, code) == (401, "unauthorized") and "not valid" in message


def test_an_expired_token_is_refused(daemon: Daemon, oidc_provider: Provider) -> None:
    token = oidc_provider.token("shortlived")
    expires = jwt.decode(token, options={"verify_signature": False})["exp"]
    with daemon.client(token) as client:
        assert client.get("/v1/tools", params={"profile": "small"}).status_code == 200
        # the manifest allows 1 s of clock skew (`leeway`; default 30 s)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            response = client.get("/v1/tools", params={"profile": "small"})
            if response.status_code != 200:
                break
            time.sleep(0.2)
        assert time.time() > expires + 1
        assert error(response) == (401, "unauthorized", "the access token has expired")
        assert client.get("/v1/tools", params={"profile": "small"}).status_code == 401


def test_roles_on_routes(daemon: Daemon, oidc_provider: Provider) -> None:
    alice, olga, root = (oidc_provider.token(n) for n in ("alice", "olga", "root"))
    routes = [("POST", "/v1/tools/numbers/approve"), ("GET", "/v1/events"),
              ("POST", "/v1/servers/up/restart"), ("GET", "/v1/resources"),
              ("GET", "/metrics"), ("GET", "/v1/health"), ("POST", "/v1/auth/up/login")]
    with daemon.client(alice) as client:
        for method, path in routes:
            status, code, message = error(client.request(method, path))
            assert (status, code) == (403, "forbidden_role"), (path, message)
            assert message.startswith("alice has the role user") and f"{method} {path}" in message
    with daemon.client(olga) as client:  # operator: servers, approvals, definitions, history
        assert client.get("/v1/permissions").status_code == 200
        assert client.get("/v1/health").status_code == 200
        assert client.get("/v1/tools").status_code == 200  # every profile: no grant lists any
        approve = client.post("/v1/tools/numbers/approve")
        assert approve.status_code == 404 and approve.json()["error"]["code"] == "not_held"
    with daemon.client(root) as client:  # the admin: what the all-access token reaches
        assert client.get("/metrics").status_code == 200


def test_the_history_records_the_user_and_a_user_reads_only_their_own(
        daemon: Daemon, oidc_provider: Provider) -> None:
    alice, bob, olga = (oidc_provider.token(n) for n in ("alice", "bob", "olga"))
    for who, token in (("alice", alice), ("bob", bob)):
        with daemon.client(token) as client:
            done = call(client, "numbers", {"n": 2}, f"history-{who}", profile="small")
            assert done.status_code == 200, done.text
    with daemon.client() as local:  # the all-access token: no user
        assert call(local, "letters", {"w": "x"}, "history-local").status_code == 200

    def users(token: str, **params: str) -> set[tuple[str, str | None]]:
        deadline = time.monotonic() + 10
        while True:  # the history is written off the call's path
            with daemon.client(token) as client:
                response = client.get("/v1/calls", params=params)
            assert response.status_code == 200, response.text
            rows = {(r["call_id"], r["username"]) for r in response.json()["calls"]
                    if r["call_id"].startswith("history-")}
            if len(rows) >= (1 if params or token in (alice, bob) else 3) \
                    or time.monotonic() > deadline:
                return rows
            time.sleep(0.05)

    assert users(alice) == {("history-alice", "alice")}
    assert users(bob) == {("history-bob", "bob")}
    assert users(olga) == {("history-alice", "alice"), ("history-bob", "bob"),
                           ("history-local", None)}
    assert users(olga, user="bob") == {("history-bob", "bob")}
    assert users(daemon.token, user="alice") == {("history-alice", "alice")}
    with daemon.client(alice) as client:
        assert error(client.get("/v1/calls", params={"user": "bob"})) == (
            403, "forbidden_role",
            "alice has the role user and reads only their own history, not bob's")


def test_a_local_token_that_belongs_to_a_user(daemon: Daemon) -> None:
    made = subprocess.run([*SIDECAR, "token", "create", "--profile", "small", "--user", "carol",
                           "--json"], env=daemon.env, capture_output=True, text=True,
                          timeout=60)
    assert made.returncode == 0, made.stderr
    secret = json.loads(made.stdout)["token"]
    assert json.loads(made.stdout)["user"] == "carol"
    with daemon.client(secret) as carol:
        assert call(carol, "numbers", {"n": 1}, "carol-1", profile="small").status_code == 200
        deadline = time.monotonic() + 10
        while True:
            rows = carol.get("/v1/calls").json()["calls"]
            if rows or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert {(r["call_id"], r["username"]) for r in rows} == {("carol-1", "carol")}
        assert error(carol.get("/v1/calls", params={"user": "alice"}))[:2] == (
            403, "forbidden_role")
        assert carol.get("/v1/permissions").json() == {"pending": []}  # her calls' asks
        assert error(carol.get("/v1/health"))[:2] == (403, "forbidden_profile")


def test_sidecar_calls_filters_by_user(daemon: Daemon, oidc_provider: Provider) -> None:
    with daemon.client(oidc_provider.token("bob")) as bob:
        assert call(bob, "numbers", {"n": 1}, "cli-bob", profile="small").status_code == 200
    deadline = time.monotonic() + 10
    while True:
        shown = subprocess.run([*SIDECAR, "calls", "--user", "bob", "--json"], env=daemon.env,
                               capture_output=True, text=True, timeout=60)
        assert shown.returncode == 0, shown.stderr
        rows = json.loads(shown.stdout)["calls"]
        if any(r["call_id"] == "cli-bob" for r in rows) or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert {r["username"] for r in rows} == {"bob"}
    assert "cli-bob" in {r["call_id"] for r in rows}


def test_an_unreachable_provider_makes_tokens_unverifiable_not_valid(
        oidc_provider: Provider, tmp_path) -> None:
    with socket.socket() as closed:  # a port nothing listens on
        closed.bind(("127.0.0.1", 0))
        issuer = f"http://127.0.0.1:{closed.getsockname()[1]}"
    proc, daemon = start_daemon(tmp_path, auth_manifest(issuer))
    try:
        token = oidc_provider.token("alice")
        for _ in range(2):  # the second answer is the remembered failure: no new fetch
            with daemon.client(token) as client:
                status, code, message = error(client.get("/v1/tools",
                                                         params={"profile": "small"}))
            assert (status, code) == (503, "unavailable")
            assert message.startswith(f"the identity provider did not answer at {issuer}/")
    finally:
        stop(proc)
