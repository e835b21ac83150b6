"""The launchers a sandbox prepares (`bridges.sandbox.launchers`): which argv[0] is which
launcher, what the preparation of each `npx`/`uvx`/`uv` form fetches, and a preparation
that fails (a real npm against a registry nobody serves) as health shows it: `preparing`
while it runs, then one line in `last_error`, and nothing started."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from bridges.manifest.loading import ServerConfig
from bridges.mcp import ServerHealth, ServerPool
from bridges.sandbox import PREPARED, launcher_of, pending
from sidecar import Location


@pytest.fixture
def prepared_root(tmp_path: Path) -> Iterator[Path]:
    PREPARED.use(tmp_path / "prepared")
    yield tmp_path / "prepared"


@pytest.mark.parametrize(("argv", "launcher"), [
    (["npx", "-y", "pkg@1.0.0"], "npx"),
    (["/usr/local/bin/uvx", "tool==1"], "uvx"),
    (["uv", "tool", "run", "tool==1"], "uvx"),
    (["uv", "x", "tool==1"], "uvx"),
    (["uv", "run", "server.py"], "uv run"),
    (["uv", "pip", "list"], None),
    (["node", "server.js"], "node"),
    (["/opt/venv/bin/python3.12", "-m", "server"], "python"),
    (["python", "server.py"], "python"),
    (["github-mcp-server", "stdio"], None),
])
def test_the_launcher_is_named_by_argv0s_base_name(argv: list[str], launcher: str | None
                                                   ) -> None:
    assert launcher_of(argv) == launcher


@pytest.mark.parametrize(("argv", "what"), [
    (["npx", "-y", "@scope/server@1.2.3", "--port", "1"], "npm: @scope/server@1.2.3"),
    (["npx", "--yes", "--registry=https://r.example/", "server@1.2.3"], "npm: server@1.2.3"),
    (["npx", "-p", "a@1", "--package=b@2", "--", "run-a"], "npm: a@1 b@2"),
    (["uvx", "mcp-server-time==2026.10.19", "--local-timezone", "UTC"],
     "uv: mcp-server-time==2026.10.19"),
    (["uvx", "--offline", "ruff@0.3.0", "check"], "uv: ruff==0.3.0"),
    (["uvx", "--python", "3.12", "--from", "pkg[cli]==1", "pkg-cli"], "uv: pkg[cli]==1"),
    (["uv", "tool", "run", "--with", "extra==2", "tool==1"], "uv: tool==1"),
    (["uv", "run", "--with", "dep==1", "python", "server.py"], "uv: uv run (its environment)"),
    (["node", "server.js"], None),
    (["python", "-m", "server"], None),
])
def test_what_a_first_preparation_fetches(
    prepared_root: Path, argv: list[str], what: str | None
) -> None:
    assert pending(argv, name="s", cwd=None) == what


@pytest.fixture
def dead_registry() -> Iterator[str]:
    """A 127.0.0.1 URL where nothing answers (the port was free a moment ago)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    yield f"http://127.0.0.1:{port}/"


@pytest.mark.anyio
async def test_a_failed_preparation_says_why_and_starts_nothing(
    location: Location, prepared_root: Path, dead_registry: str
) -> None:
    seen: list[ServerHealth] = []
    config = ServerConfig.model_validate({
        "command": "npx",
        "args": ["-y", f"--registry={dead_registry}", "--fetch-retries=0",
                 "@modelcontextprotocol/server-nothing@1.0.0"],
        "sandbox": True, "timeouts": {"startup": 5}})
    async with ServerPool({"n": config}, location.tools,
                          on_health=lambda _, h: seen.append(h)) as pool:
        health = pool.health()["n"]
    assert health.state != "ready" and health.pid is None
    assert health.last_error is not None and health.last_error.startswith(
        "PreparationFailed: sandbox: preparing npm: @modelcontextprotocol/server-nothing@1.0.0 "
        "failed: npm error"), health.last_error
    preparing = [h.preparing for h in seen if h.preparing is not None]
    assert preparing[:1] == ["npm: @modelcontextprotocol/server-nothing@1.0.0"], seen
    assert health.to_json()["preparing"] is None
    assert not (PREPARED.entry_dir("n") / "prepared.json").exists()
