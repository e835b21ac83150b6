"""Upstream listings become registry entries: names, pages, filters, left-out tools, health."""

from __future__ import annotations

import json
import logging

import pytest

from bridges.mcp import ServerPool
from sidecar import Location
from tests.bridges.helpers import legacy, stdio

pytestmark = pytest.mark.anyio


async def test_every_page_is_listed_and_tools_register_under_their_namespaces(
    location: Location, caplog: pytest.LogCaptureFixture
) -> None:
    servers = {
        # pages of 4, one tool with an invalid inputSchema, 6 extra tools
        "t": stdio("--invalid-schema", "--page-size", "4", "--extra-tools", "6"),
        # exposed unprefixed, and filtered by allow/deny globs over upstream names
        "bare": stdio("--extra-tools", "3", namespace="",
                      tools={"allow": ["e*", "a*", "t00*"], "deny": ["t001"]}),
        # a broken paginator that repeats its cursor
        "loop": stdio("--page-size", "5", "--repeat-cursor", namespace="lp"),
    }
    with caplog.at_level(logging.WARNING, logger="bridges.mcp"):
        async with ServerPool(servers, location.tools) as pool:
            health = pool.health()
            names = set(location.snapshot().names)
            definitions = {d.name: d for d in location.snapshot().definitions}

    t = health["t"]
    assert t.state == "ready" and t.last_error is None
    upstream = {"echo", "add", "structured_only", "bad_output", "plain_structured", "media",
                "big", "big_structured", "big_resource", "many_links", "slow", "crash", "fail",
                "rpc_error", "progress", "mutate"}
    extra = {f"t{i:03d}" for i in range(6)}
    assert {f"t_{n}" for n in upstream | extra} <= names
    assert t.tool_count == len(upstream) + len(extra)
    # the invalid schema leaves out that tool only, with the reason in health and the log
    assert [s.name for s in t.skipped] == ["broken"]
    assert "invalid inputSchema" in t.skipped[0].reason
    assert "no-such-type" in t.skipped[0].reason
    assert "t_broken" not in names
    assert any("broken" in r.getMessage() and "left out" in r.getMessage() for r in caplog.records)

    bare = health["bare"]
    assert {"echo", "add", "t000", "t002"} <= names
    assert "t001" not in names and "fail" not in names
    assert bare.tool_count == 4
    assert bare.filtered == 19 - 4

    # a repeated cursor ends the listing with what came before it, and says so
    loop = health["loop"]
    assert loop.state == "ready"
    assert loop.tool_count == 10
    assert any("repeated the cursor" in r.getMessage() for r in caplog.records)

    echo = definitions["t_echo"]
    assert echo.title == "Echo"
    assert echo.description == "Echo the text back"
    assert echo.annotations == {"read_only_hint": True}
    assert echo.meta == {"vendor/x": 1}
    assert echo.input_schema["required"] == ["text"]
    assert definitions["t_add"].output_schema == {
        "type": "object", "properties": {"sum": {"type": "integer"}}, "required": ["sum"]
    }
    assert definitions["t_echo"].output_schema is None

    document = json.dumps({key: h.to_json() for key, h in health.items()})
    assert json.loads(document)["t"]["skipped"][0]["name"] == "broken"


async def test_leaving_the_pool_removes_exactly_its_tools(location: Location) -> None:
    before = set(location.snapshot().names)
    async with ServerPool({"t": legacy()}, location.tools):
        assert "t_echo" in location.snapshot().names
    assert set(location.snapshot().names) == before


async def test_secrets_never_reach_health_or_logs(
    location: Location, caplog: pytest.LogCaptureFixture
) -> None:
    secret = "s3cr3t-token-value-123"
    servers = {
        # prints its secret env var to stderr, then exits: the stderr tail goes to health
        "leaky": legacy("--secret-env", "API_TOKEN", "--exit-at-start", "2",
                        env={"API_TOKEN": secret}),
        "http": {"url": "http://127.0.0.1:9/mcp", "headers": {"Authorization": f"Bearer {secret}"}},
    }
    from bridges.manifest.loading import ServerConfig

    configs = {k: v if isinstance(v, ServerConfig) else ServerConfig(**v)
               for k, v in servers.items()}
    with caplog.at_level(logging.DEBUG):
        async with ServerPool(configs, location.tools) as pool:
            health = pool.health()
    leaky = health["leaky"]
    assert leaky.state == "backoff"
    assert leaky.last_error is not None and "API_TOKEN=***" in leaky.last_error
    assert "exited with code 2" in leaky.last_error
    assert health["http"].state == "backoff"
    shown = json.dumps({k: h.to_json() for k, h in health.items()}) + caplog.text
    assert secret not in shown
    assert "s3cr3t" not in shown
