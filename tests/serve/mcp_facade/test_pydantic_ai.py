"""A successful call reaches a pydantic-ai agent as a success: an over-bound result of a tool
that declares an output schema, through a real `sidecar serve` (/mcp, bearer token) and a real
`sidecar stdio --standalone`, to pydantic-ai's `MCPToolset`, driven by an offline
`FunctionModel` that calls the tool, follows the note to `managed_read`, and answers. An
`isError` result, as a bounded result was before, is what pydantic-ai turns into a retry
(`ModelRetry`, shown to the model as a tool return with outcome `retried`)."""

from __future__ import annotations

import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import pytest
from fastmcp.client.transports import StdioTransport
from pydantic_ai import Agent
from pydantic_ai.mcp import MCPToolset
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    RetryFeedbackPart,
    RetryPromptPart,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel

from tests.hardening.daemon_process import serving, sidecar_env
from tests.serve.mcp_facade.test_structured_success import BIG, BOUND, REPO, manifests

pytestmark = pytest.mark.anyio
TIMEOUTS: dict[str, Any] = {"init_timeout": 60, "read_timeout": 60}
"""pydantic-ai gives `initialize` 5 s by default: a cold `sidecar stdio --standalone` (imports,
the Location, the upstream) took longer once on CI's two loaded cores."""
REF = re.compile(r'managed_read\(ref="([^"]+)", offset=1, start=0\)')


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # the daemon under test is its own process with its own loop


@dataclass(frozen=True, slots=True)
class Step:
    """One tool call of the scripted model: its name and its arguments, built from what the
    model was shown for the previous call."""

    tool: str
    args: Callable[[Any], dict[str, Any]]


def ref_in(shown: Any) -> str:
    """The managed ref the sidecar's note names, from what pydantic-ai showed the model."""
    assert isinstance(shown, list), shown
    match = REF.search(shown[-1])
    assert match is not None, shown[-1]
    return match.group(1)


SCRIPT = [
    Step("t_big_structured", lambda _: {"bytes": BIG}),
    Step("managed_read", lambda shown: {"ref": ref_in(shown), "offset": 1, "start": 0,
                                        "length": 20}),
    Step("t_big_structured", lambda _: {"bytes": 500}),
]


def told_to_retry(message: ModelMessage) -> bool:
    """Whether `message` asks the model to try again (pydantic-ai 2 answers a `ModelRetry`
    with the call's tool return, outcome `retried`; older ones with a `RetryPromptPart`)."""
    return isinstance(message, ModelRequest) and any(
        isinstance(part, RetryPromptPart | RetryFeedbackPart)
        or (isinstance(part, ToolReturnPart) and part.outcome != "success")
        for part in message.parts)


def scripted(script: list[Step]) -> FunctionModel:
    """A model that makes the calls of `script` one per turn, each once, then answers; being
    told to retry ends the run at once (the test then fails on the history)."""

    def respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        if told_to_retry(messages[-1]):
            return ModelResponse(parts=[TextPart("told to retry")])
        returns = tool_returns(messages)
        if len(returns) == len(script):
            return ModelResponse(parts=[TextPart("done")])
        step = script[len(returns)]
        args = step.args(returns[-1].content if returns else None)
        return ModelResponse(parts=[ToolCallPart(step.tool, args)])

    return FunctionModel(respond)


async def run_agent(toolset: MCPToolset[None]) -> list[ModelMessage]:
    async with toolset:
        await listed_once_started(toolset)
        result = await Agent(scripted(SCRIPT), toolsets=[toolset]).run("read the file")
    assert result.output == "done"
    return result.all_messages()


async def listed_once_started(toolset: MCPToolset[None]) -> None:
    """Until the upstream's tools are listed (a daemon lists a server still starting in
    `_meta`, and adds its tools when it is ready). The toolsets do not cache the listing:
    pydantic-ai drops its cache on `notifications/tools/list_changed`, which a 2026-07-28
    session (what its client negotiates) only sends on a `subscriptions/listen` stream that
    its client does not open, so a listing cached before the upstream was ready would stay."""
    with anyio.fail_after(60):
        while True:
            if "t_big_structured" in {tool.name for tool in await toolset.list_tools()}:
                return
            await anyio.sleep(0.1)


def tool_returns(history: list[ModelMessage]) -> list[ToolReturnPart]:
    return [part for message in history if isinstance(message, ModelRequest)
            for part in message.parts if isinstance(part, ToolReturnPart)]


def assert_bounded_success(history: list[ModelMessage]) -> None:
    """What the model saw: the bounded preview and the note naming the ref, the value read
    back by that ref, the small result whole; never a retry prompt."""
    assert not any(told_to_retry(message) for message in history)
    calls = [part.tool_name for message in history if isinstance(message, ModelResponse)
             for part in message.parts if isinstance(part, ToolCallPart)]
    assert calls == ["t_big_structured", "managed_read", "t_big_structured"]
    big, head, small = tool_returns(history)
    assert [(part.outcome, part.retry) for part in (big, head, small)] == [("success", None)] * 3
    assert isinstance(big.content, list) and len(big.content) == 2, big.content
    preview, note = big.content
    assert preview.startswith("xxxxxxxx")
    assert note.startswith("[The call succeeded.")
    read = [part for message in history if isinstance(message, ModelResponse)
            for part in message.parts
            if isinstance(part, ToolCallPart) and part.tool_name == "managed_read"]
    assert read[0].args_as_dict()["ref"] == ref_in(big.content)
    assert len(preview.encode()) + len(note.encode()) <= BOUND
    assert isinstance(head.content, str) and head.content.endswith('{"content":"xxxxxxxx')
    # a small result is the structured value whole (pydantic-ai prefers structuredContent)
    assert isinstance(small.content, dict) and list(small.content) == ["content"]
    assert len(small.content["content"]) >= 500


async def test_pydantic_ai_agent_over_sidecar_serve_sees_a_bounded_result_as_a_success(
    tmp_path: Path,
) -> None:
    with serving(tmp_path / "state", manifests=manifests(tmp_path / "manifests")) as daemon:
        toolset: MCPToolset[None] = MCPToolset(
            f"{daemon.url}/mcp", headers={"Authorization": f"Bearer {daemon.token}"},
            cache_tools=False, **TIMEOUTS)
        assert_bounded_success(await run_agent(toolset))


async def test_pydantic_ai_agent_over_sidecar_stdio_sees_a_bounded_result_as_a_success(
    tmp_path: Path,
) -> None:
    env = sidecar_env(tmp_path / "state", manifests(tmp_path / "manifests"))
    transport = StdioTransport(sys.executable, ["-m", "sidecar.cli", "stdio", "--standalone"],
                               env=env, cwd=str(REPO))
    toolset: MCPToolset[None] = MCPToolset(transport, cache_tools=False, **TIMEOUTS)
    assert_bounded_success(await run_agent(toolset))


async def test_pydantic_ai_turns_an_is_error_result_into_a_retry(
    tmp_path: Path,
) -> None:
    """Why a bounded result must not be `isError`: the same agent, offered a tool whose
    result is `isError` (the upstream's `fail`), is told to retry a call that returned."""
    with serving(tmp_path / "state", manifests=manifests(tmp_path / "manifests")) as daemon:
        toolset: MCPToolset[None] = MCPToolset(
            f"{daemon.url}/mcp", headers={"Authorization": f"Bearer {daemon.token}"},
            cache_tools=False, **TIMEOUTS)
        async with toolset:
            await listed_once_started(toolset)
            model = scripted([Step("t_fail", lambda _: {})])
            result = await Agent(model, toolsets=[toolset]).run("fail once")
    assert result.output == "told to retry"
    [failed] = tool_returns(result.all_messages())
    assert (failed.tool_name, failed.outcome) == ("t_fail", "retried")
    assert failed.retry is not None and failed.retry.cause == "model_retry"
    assert isinstance(failed.content, str) and failed.content.startswith("it failed")
