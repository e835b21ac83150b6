"""The facade over stdio (a subprocess running `serve_stdio`) and the conformance suite."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
import pytest
from mcp import Client, StdioServerParameters
from mcp.shared.exceptions import MCPError

from sidecar import Location
from sidecar.serve.mcp_facade import CALL_ID_KEY
from tests.serve.mcp_facade.conftest import HARNESS, fixture_server, write_manifest
from tests.serve.mcp_facade.test_relays import elicitation, roots_answer, sampling

pytestmark = pytest.mark.anyio
REPO = Path(__file__).resolve().parents[3]


def params(tmp_path: Path, protocol: str = "legacy") -> StdioServerParameters:
    manifests = write_manifest(tmp_path / "manifests",
                               {"fixture": fixture_server(protocol=protocol)})
    return StdioServerParameters(command=sys.executable, args=[
        str(HARNESS), "stdio", "--manifests", str(manifests),
        "--state-dir", str(tmp_path / "state"), "--root", str(tmp_path)])


@pytest.mark.parametrize("mode", ["legacy", "2026-07-28"])
async def test_stdio_both_eras(tmp_path: Path, mode: str) -> None:
    progress: list[float] = []

    async def on_progress(value: float, total: float | None, message: str | None) -> None:
        progress.append(value)

    async with Client(params(tmp_path), mode=mode, cache=None,
                      read_timeout_seconds=60) as client:
        names = [t.name for t in (await client.list_tools()).tools]
        assert "test_simple_text" in names and "managed_read" in names
        result = await client.call_tool("test_simple_text", {})
        assert result.content[0].text == "This is a simple text response for testing."
        structured = await client.call_tool("test_structured", {"value": [1, 2]})
        assert structured.structured_content == {"value": [1, 2]}
        await client.call_tool("test_tool_with_progress", {}, progress_callback=on_progress)
        if mode == "legacy":
            assert progress == [0, 50, 100]


@pytest.mark.parametrize("upstream", ["legacy", "2026-07-28"])
@pytest.mark.parametrize("mode", ["legacy", "2026-07-28"])
async def test_stdio_relays_sampling_and_elicitation(
    tmp_path: Path, mode: str, upstream: str
) -> None:
    logs: list[Any] = []

    async def on_log(params: types.LoggingMessageNotificationParams) -> None:
        logs.append(params.data)

    async with Client(params(tmp_path, upstream), mode=mode, cache=None, read_timeout_seconds=60,
                      sampling_callback=sampling, elicitation_callback=elicitation,
                      list_roots_callback=roots_answer("file:///stdio"),
                      logging_callback=on_log) as client:
        await client.list_tools()
        sampled = await client.call_tool("test_sampling", {"prompt": "over stdio"})
        assert sampled.content[0].text == "LLM response: answer to over stdio"
        elicited = await client.call_tool("test_elicitation", {"message": "e@x"})
        assert "action=accept" in elicited.content[0].text
        roots = await client.call_tool("test_roots", {})
        assert json.loads(roots.content[0].text)["roots"] == ["file:///stdio"]
        if mode == "legacy":  # 2026-07-28 requests opt in to logs one by one
            await client.call_tool("test_tool_with_logging", {})
            with anyio.fail_after(5):
                while "Tool execution completed" not in logs:  # noqa: ASYNC110
                    await anyio.sleep(0.02)


async def test_stdio_fast_path_cancels_and_keeps_serving(tmp_path: Path) -> None:
    """Plain handshake-era calls skip the SDK's runner (`fastpath`); a client's cancellation
    still reaches the call: it records nothing, so the same call id runs again at once (were
    the first attempt still running, the retry would wait for its 30 s)."""
    async with Client(params(tmp_path), mode="legacy", cache=None,
                      read_timeout_seconds=60) as client:
        await client.list_tools()
        with pytest.raises(MCPError):
            await client.call_tool("test_sleep", {"seconds": 30}, read_timeout_seconds=1,
                                   meta={CALL_ID_KEY: "to-cancel"})
        with anyio.fail_after(10):
            again = await client.call_tool("test_sleep", {"seconds": 0},
                                           meta={CALL_ID_KEY: "to-cancel"})
        assert again.content[0].text == "slept"
        fine = await client.call_tool("test_simple_text", {}, meta={CALL_ID_KEY: "after"})
        assert fine.content[0].text == "This is a simple text response for testing."
        bad = await client.call_tool("no_such_tool", {})
        assert bad.is_error and "no_such_tool" in bad.content[0].text
    async with Location.open(tmp_path, state_dir=tmp_path / "state") as location:
        retried = await location.outcome("to-cancel")
        assert retried is not None and retried.error is None
        assert (await location.outcome("after")) is not None


def test_stdio_unknown_method_before_initialize_gets_an_error(tmp_path: Path) -> None:
    request = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "no/such", "params": {}}) + "\n"
    p = params(tmp_path)
    done = subprocess.run([p.command, *p.args], input=request, capture_output=True, text=True,
                          timeout=60, check=False)
    reply = json.loads(done.stdout.splitlines()[0])
    assert reply["id"] == 1 and "error" in reply


def test_conformance_suite_passes_through_the_sidecar() -> None:
    done = subprocess.run([str(REPO / "scripts" / "conformance")], capture_output=True,
                          text=True, timeout=170, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Total: 40 passed, 0 failed" in done.stdout, done.stdout
