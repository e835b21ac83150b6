"""Secret references in manifests (`${env:}`, `${file:}`, `${keyring:}`) and the `oauth` table:
values resolved, clear problems for what cannot be, secrets never in a repr; the token file."""

from __future__ import annotations

import json
import stat
from collections.abc import Iterator
from pathlib import Path

import keyring
import pytest
from keyring.backends.fail import Keyring as FailKeyring
from keyring.backends.null import Keyring as NullKeyring

from bridges.manifest.loading import ServerConfig, load_manifests
from sidecar.backends.local.grants import FileGrantStore


def write(tmp_path: Path, entry: dict[str, object]) -> Path:
    manifests = tmp_path / "manifests"
    manifests.mkdir(exist_ok=True)
    (manifests / "m.json").write_text(json.dumps({"mcpServers": {"cloud": entry}}))
    return manifests


@pytest.fixture
def no_keyring() -> Iterator[None]:
    previous = keyring.get_keyring()
    keyring.set_keyring(FailKeyring())
    try:
        yield
    finally:
        keyring.set_keyring(previous)


def test_file_secrets_fill_the_oauth_table(tmp_path: Path) -> None:
    secrets = tmp_path / "manifests" / "secrets"
    secrets.mkdir(parents=True)
    (secrets / "client_secret").write_text("s3cret-from-a-file\n")
    manifests = write(tmp_path, {
        "url": "https://mcp.example.com/mcp", "auth": "oauth",
        "oauth": {"grant": "client_credentials", "client_id": "cid",
                  "client_secret": "${file:secrets/client_secret}",
                  "token_endpoint_auth_method": "client_secret_post", "scopes": ["read"]},
    })
    loaded = load_manifests([manifests], environ={})
    assert not loaded.problems
    config = loaded.servers["cloud"].value
    assert isinstance(config, ServerConfig) and config.oauth is not None
    assert config.oauth.client_secret == "s3cret-from-a-file"  # the trailing newline is gone
    assert config.oauth_mode == "oauth"
    assert "s3cret" not in repr(config)


def test_unreadable_references_are_problems_that_name_the_path(
    tmp_path: Path, no_keyring: None
) -> None:
    manifests = tmp_path / "manifests"
    manifests.mkdir()
    (manifests / "m.json").write_text(json.dumps({"mcpServers": {
        "a": {"url": "https://a.example/mcp", "headers": {"X-Key": "${file:/no/such/file}"}},
        "b": {"url": "https://b.example/mcp", "headers": {"X-Key": "${env:NOT_SET_HERE}"}},
        "c": {"url": "https://c.example/mcp", "headers": {"X-Key": "${keyring:svc/user}"}},
        "d": {"url": "https://d.example/mcp", "headers": {"X-Key": "${keyring:nouser}"}},
    }}))
    loaded = load_manifests([manifests], environ={})
    assert not loaded.servers
    by_path = {p.path: p for p in loaded.problems}
    unreadable = by_path["$.mcpServers.a.headers.X-Key"]
    assert "cannot read secret file '/no/such/file'" in unreadable.message
    assert by_path["$.mcpServers.b.headers.X-Key"].message == (
        "environment variable NOT_SET_HERE is not set")
    keyring_problem = by_path["$.mcpServers.c.headers.X-Key"]
    assert "no OS keyring is available here" in keyring_problem.message
    assert "${file:PATH}" in keyring_problem.hint
    assert "SERVICE/NAME" in by_path["$.mcpServers.d.headers.X-Key"].message


def test_a_keyring_without_the_secret_says_how_to_store_it(tmp_path: Path) -> None:
    previous = keyring.get_keyring()
    keyring.set_keyring(NullKeyring())
    try:
        manifests = write(tmp_path, {"url": "https://a.example/mcp",
                                     "headers": {"Authorization": "Bearer ${keyring:svc/u}"}})
        loaded = load_manifests([manifests], environ={})
    finally:
        keyring.set_keyring(previous)
    (problem,) = loaded.problems
    assert "no secret for service 'svc', name 'u'" in problem.message
    assert problem.hint == "store it with `keyring set svc u`"


@pytest.mark.parametrize(("entry", "message"), [
    ({"command": "x", "auth": "oauth"}, "HTTP servers (`url`) only"),
    ({"url": "https://a.example/mcp", "oauth": {"grant": "client_credentials"}},
     "grant client_credentials needs `client_id`"),
    ({"url": "https://a.example/mcp", "oauth": {"redirect_uri": "https://evil.example/cb"}},
     "redirect_uri must be a loopback http URL"),
    ({"url": "https://a.example/mcp", "oauth": {"grant": "cross_app_access",
                                                "client_id": "c"}},
     "grant cross_app_access needs client_secret, issuer"),
])
def test_inconsistent_oauth_entries_are_refused(
    tmp_path: Path, entry: dict[str, object], message: str
) -> None:
    loaded = load_manifests([write(tmp_path, entry)], environ={})
    assert not loaded.servers
    assert any(message in p.message for p in loaded.problems), loaded.problems


def test_oauth_mode_follows_auth_and_headers() -> None:
    url = "https://a.example/mcp"
    assert ServerConfig(url=url).oauth_mode == "auto"
    assert ServerConfig(url=url, headers={"authorization": "Bearer x"}).oauth_mode == "none"
    assert ServerConfig(url=url, auth="none").oauth_mode == "none"
    assert ServerConfig(url=url, auth="oauth", headers={"X": "y"}).oauth_mode == "oauth"
    assert ServerConfig(command="x").oauth_mode == "none"


@pytest.mark.anyio
async def test_the_token_file_is_private_and_updates_atomically(tmp_path: Path) -> None:
    store = FileGrantStore(tmp_path / "state")
    assert await store.get("a") is None
    await store.put("a", {"resource": "https://a.example/mcp", "tokens": {"access_token": "t"}})
    await store.update("b", lambda old: {"n": (old or {}).get("n", 0) + 1})
    await store.update("b", lambda old: {"n": (old or {}).get("n", 0) + 1})
    assert await store.servers() == ["a", "b"]
    assert (await store.get("b")) == {"n": 2}
    assert stat.S_IMODE(store.path.stat().st_mode) == 0o600
    assert await store.delete("a") and not await store.delete("a")
    assert await store.servers() == ["b"]
    assert not list(store.path.parent.glob(".*.tmp"))
