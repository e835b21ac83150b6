"""Server-to-client traffic through /mcp across protocol eras and sessions: sampling,
elicitation and roots (2025 requests and 2026-07-28 `input_required` rounds), logs with several
sessions, roots/list_changed, and namespacing with several upstream servers."""

from __future__ import annotations

import json
import subprocess
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
import pytest
from mcp.shared.exceptions import MCPError

from sidecar.model.replica import replica_id
from sidecar.serve.mcp_facade import CALL_ID_KEY, rounds
from tests.serve.mcp_facade.conftest import Served, fixture_server, serving
from tests.serve.mcp_facade.test_http import connect

pytestmark = pytest.mark.anyio
TASKS_FIXTURE = Path(__file__).resolve().parents[2] / "conformance" / "tasks_fixture.py"
ERAS = ["legacy", "2026-07-28"]


async def sampling(ctx: Any, params: types.CreateMessageRequestParams) -> Any:
    question = params.messages[0].content.text
    await anyio.sleep(0.2)  # overlap with other sessions' calls
    return types.CreateMessageResult(role="assistant", model="m",
                                     content=types.TextContent(text=f"answer to {question}"))


async def elicitation(ctx: Any, params: types.ElicitRequestParams) -> Any:
    return types.ElicitResult(action="accept", content={"username": "u", "email": params.message})


def roots_answer(*uris: str) -> Any:
    async def list_roots(ctx: Any) -> types.ListRootsResult:
        return types.ListRootsResult(roots=[types.Root(uri=uri) for uri in uris])
    return list_roots


@pytest.mark.parametrize("upstream", ERAS)
@pytest.mark.parametrize("downstream", ERAS)
async def test_sampling_elicitation_roots_in_every_era_pair(
    tmp_path: Path, upstream: str, downstream: str
) -> None:
    servers = {"fixture": fixture_server(protocol=upstream)}
    async with serving(tmp_path, servers) as served, connect(
        served.url, downstream, sampling_callback=sampling, elicitation_callback=elicitation,
        list_roots_callback=roots_answer("file:///work/a"),
    ) as client:
        await client.list_tools()
        call_id = f"sample-{upstream}-{downstream}"
        sampled = await client.call_tool("test_sampling", {"prompt": "q1"},
                                         meta={CALL_ID_KEY: call_id})
        assert sampled.content[0].text == "LLM response: answer to q1", sampled.content
        outcome = await served.location.outcome(call_id)
        assert outcome is not None and outcome.error is None
        elicited = await client.call_tool("test_elicitation", {"message": "who@x"})
        assert "action=accept" in elicited.content[0].text
        assert "who@x" in elicited.content[0].text
        roots = await client.call_tool("test_roots", {})
        assert json.loads(roots.content[0].text)["roots"] == ["file:///work/a"]


@pytest.mark.parametrize("downstream", ERAS)
async def test_2026_upstream_requests_reach_the_calling_session(
    tmp_path: Path, downstream: str
) -> None:
    """An input_required round names its call, so concurrent sessions each get their own."""
    servers = {"fixture": fixture_server(protocol="2026-07-28")}
    async with serving(tmp_path, servers) as served:
        answers: dict[str, str] = {}

        async def one(name: str) -> None:
            async with connect(served.url, downstream, sampling_callback=sampling) as client:
                await client.list_tools()
                result = await client.call_tool("test_sampling", {"prompt": name})
                answers[name] = result.content[0].text

        async with anyio.create_task_group() as tg:
            for name in ("first", "second", "third"):
                tg.start_soon(one, name)
    assert answers == {name: f"LLM response: answer to {name}"
                       for name in ("first", "second", "third")}


async def test_a_2025_request_with_calls_from_two_sessions_is_refused_clearly(
    tmp_path: Path,
) -> None:
    """A 2025-era sampling request names no call: with two sessions waiting on the same
    server the sidecar cannot tell whose it is, and says so instead of guessing."""
    async with serving(tmp_path) as served:
        async with connect(served.url, "legacy", sampling_callback=sampling) as one, \
                connect(served.url, "legacy", sampling_callback=sampling) as two:
            await one.list_tools()
            await two.list_tools()
            results: list[types.CallToolResult] = []

            async def call(client: Any, prompt: str) -> None:
                results.append(await client.call_tool("test_sampling", {"prompt": prompt}))

            async with anyio.create_task_group() as tg:
                tg.start_soon(call, one, "a")
                tg.start_soon(call, two, "b")
    refused = [r for r in results if r.is_error]
    assert refused, [r.content for r in results]
    assert "2 client sessions" in refused[0].content[0].text


def fixture_over_http(*options: str) -> Iterator[str]:
    """tests/conformance/tasks_fixture.py over streamable HTTP: its /mcp URL."""
    proc = subprocess.Popen([sys.executable, str(TASKS_FIXTURE), "--http", *options],
                            stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True)
    try:
        assert proc.stdout is not None
        yield f"http://127.0.0.1:{int(proc.stdout.readline().split()[1])}/mcp"
    finally:
        proc.kill()
        proc.wait(timeout=10)
        if proc.stdout is not None:
            proc.stdout.close()


@pytest.fixture
def tasks_over_http() -> Iterator[str]:
    yield from fixture_over_http()


@pytest.fixture
def completion_asks() -> Iterator[str]:
    """The same fixture with prompt `pick`, whose completion it answers with input_required."""
    yield from fixture_over_http("--completion-asks")


@pytest.mark.parametrize("downstream", ERAS)
async def test_a_completion_answered_with_input_required_is_a_clear_error(
    tmp_path: Path, completion_asks: str, downstream: str
) -> None:
    """MCP 2026-07-28 allows input requests on tools/call, prompts/get and resources/read only
    (a completion request has no inputResponses to answer them with): the client is told
    which server did it and why, not handed a -32602 about its own parameters."""
    servers = {"asks": {"url": completion_asks, "namespace": "", "protocol": "auto"}}
    async with serving(tmp_path, servers) as served, connect(served.url, downstream) as client:
        got = await client.get_prompt("pick", {"choice": "apple"})  # the server itself works
        assert got.messages[0].content.text == "picked apple"
        with pytest.raises(MCPError) as refused:
            await client.complete(types.PromptReference(name="pick"),
                                  {"name": "choice", "value": "ap"})
    assert refused.value.error.code == types.INTERNAL_ERROR
    assert refused.value.error.message.startswith(
        "MCP server 'asks' answered completion/complete with input_required: MCP 2026-07-28 "
        "admits input requests only on tools/call, prompts/get and resources/read (SEP-2322)")


async def test_a_2025_request_on_a_calls_http_stream_reaches_that_calls_session(
    tmp_path: Path, tasks_over_http: str
) -> None:
    """A streamable HTTP server sends its 2025-era elicitation on the response stream of the
    call that asks: with two sessions' calls in flight on that server, only the asking
    session's client hears it, and the other call is left alone."""
    servers = {"tasks": {"url": tasks_over_http, "namespace": "", "protocol": "legacy"}}
    asked: dict[str, list[str]] = {"waiting": [], "asking": []}
    in_flight: dict[str, Any] = {}  # the facade's calls; whether the other was one when asked

    def answering(name: str) -> Any:
        async def on_elicit(ctx: Any, params: types.ElicitRequestParams) -> Any:
            asked[name].append(params.message)
            in_flight.setdefault("when asked", "waiting-call" in in_flight["calls"])
            return types.ElicitResult(action="accept", content={"confirm": True})
        return on_elicit

    results: dict[str, str] = {}
    async with serving(tmp_path, servers) as served, \
            connect(served.url, "legacy", elicitation_callback=answering("waiting")) as a, \
            connect(served.url, "legacy", elicitation_callback=answering("asking")) as b:
        await a.list_tools()
        await b.list_tools()
        calls = in_flight["calls"] = served.fast_path.facade.sessions.calls

        async def slow() -> None:
            done = await a.call_tool("slow_compute", {"seconds": 3, "label": "a"},
                                     meta={CALL_ID_KEY: "waiting-call"})
            results["waiting"] = done.content[0].text

        async with anyio.create_task_group() as tg:
            tg.start_soon(slow)
            with anyio.fail_after(10):
                while "waiting-call" not in calls:  # noqa: ASYNC110
                    await anyio.sleep(0.01)
            asking = await b.call_tool("confirm_delete", {})
            results["asking"] = asking.content[0].text
    # the other call was in flight when the elicitation went out (checked then, not after the
    # asking call: on a loaded machine that took longer than the slow call, 2026-12-07)
    assert in_flight["when asked"] is True
    assert results == {"waiting": "computed a", "asking": "confirmed: True"}
    assert asked == {"waiting": [], "asking": ["Delete the file?"]}


async def test_an_unanswered_round_expires_and_the_call_settles(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(rounds, "ROUND_TTL", 0.5)
    monkeypatch.setattr("sidecar.serve.mcp_facade.paused_calls.ROUND_TTL", 0.5)
    async with serving(tmp_path) as served, connect(served.url, "2026-07-28",
                                                    sampling_callback=sampling) as client:
        await client.list_tools()
        first = await client.session.call_tool(
            "test_sampling", {"prompt": "q"}, meta={CALL_ID_KEY: "left-waiting"},
            allow_input_required=True)
        assert isinstance(first, types.InputRequiredResult)
        assert first.request_state and first.input_requests
        request = next(iter(first.input_requests.values()))
        assert request.method == "sampling/createMessage"
        with anyio.fail_after(10):
            while (outcome := await served.location.outcome("left-waiting")) is None:  # noqa: ASYNC110
                await anyio.sleep(0.05)
        assert outcome.error is not None
        assert "did not answer sampling/createMessage" in outcome.error.message
        with pytest.raises(MCPError, match="Invalid or expired requestState"):
            await client.session.call_tool(
                "test_sampling", {"prompt": "q"}, request_state=first.request_state,
                input_responses={}, allow_input_required=True)


async def test_request_state_is_bound_to_its_call_and_used_once(served: Served) -> None:
    async with connect(served.url, "2026-07-28", sampling_callback=sampling) as client:
        await client.list_tools()
        first = await client.session.call_tool("test_sampling", {"prompt": "mine"},
                                               allow_input_required=True)
        assert isinstance(first, types.InputRequiredResult)
        (key, _), = first.input_requests.items()
        answer = types.CreateMessageResult(role="assistant", model="m",
                                           content=types.TextContent(text="mine"))

        async def resume(arguments: dict[str, Any]) -> Any:
            return await client.session.call_tool(
                "test_sampling", arguments, request_state=first.request_state,
                input_responses={key: answer}, allow_input_required=True)

        with pytest.raises(MCPError, match="Invalid or expired requestState"):
            await resume({"prompt": "other arguments"})
        done = await resume({"prompt": "mine"})
        assert isinstance(done, types.CallToolResult)
        assert done.content[0].text == "LLM response: mine"
        with pytest.raises(MCPError, match="Invalid or expired requestState"):
            await resume({"prompt": "mine"})


async def test_a_request_state_of_another_replica_names_it(served: Served) -> None:
    """In a fleet the token names the replica holding the paused call, so a resume that
    reached another replica says where it must go instead of "expired"."""
    async with connect(served.url, "2026-07-28", sampling_callback=sampling) as client:
        await client.list_tools()
        first = await client.session.call_tool("test_sampling", {"prompt": "mine"},
                                               allow_input_required=True)
        assert isinstance(first, types.InputRequiredResult)
        assert first.request_state.endswith(f".{replica_id()}")
        foreign = first.request_state.partition(".")[0] + ".replica-elsewhere"
        with pytest.raises(MCPError, match="paused on replica 'replica-elsewhere'"):
            await client.session.call_tool(
                "test_sampling", {"prompt": "mine"}, request_state=foreign,
                input_responses={}, allow_input_required=True)


async def test_roots_list_changed_reaches_upstream_servers(served: Served) -> None:
    async with connect(served.url, "legacy",
                       list_roots_callback=roots_answer("file:///changed")) as client:
        await client.list_tools()
        with warnings.catch_warnings():  # roots are deprecated in 2026-07-28 only
            warnings.simplefilter("ignore")
            await client.session.send_roots_list_changed()
        with anyio.fail_after(10):
            while True:
                seen = json.loads((await client.call_tool("test_roots", {})).content[0].text)
                if seen["after_change"] == ["file:///changed"]:
                    break
                await anyio.sleep(0.05)


async def test_logs_reach_every_session_with_a_call_in_flight(served: Served) -> None:
    logs: dict[str, list[Any]] = {"a": [], "b": []}

    def collector(name: str) -> Any:
        async def on_log(params: types.LoggingMessageNotificationParams) -> None:
            logs[name].append(params.data)
        return on_log

    async with connect(served.url, "legacy", logging_callback=collector("a")) as a, \
            connect(served.url, "legacy", logging_callback=collector("b")) as b:
        await a.list_tools()
        await b.list_tools()
        async with anyio.create_task_group() as tg:
            tg.start_soon(a.call_tool, "test_tool_with_logging", {})
            tg.start_soon(b.call_tool, "test_tool_with_logging", {})
        with anyio.fail_after(5):
            while not (logs["a"] and logs["b"]):  # noqa: ASYNC110
                await anyio.sleep(0.02)
    assert "Tool execution started" in logs["a"]
    assert "Tool execution started" in logs["b"]


async def test_several_servers_are_namespaced_and_reversible(tmp_path: Path) -> None:
    servers = {"one": fixture_server(namespace="a"), "two": fixture_server(namespace="b")}
    updated: list[str] = []

    async def on_message(message: Any) -> None:
        if isinstance(message, types.ResourceUpdatedNotification):
            updated.append(str(message.params.uri))

    async with serving(tmp_path, servers) as served, connect(
        served.url, "legacy", message_handler=on_message
    ) as client:
        uris = {str(r.uri) for r in (await client.list_resources()).resources}
        assert {"a+test://static-text", "b+test://static-text"} <= uris
        assert not any(u.startswith("test://") for u in uris)
        templates = (await client.list_resource_templates()).resource_templates
        assert {t.uri_template for t in templates} == {
            "a+test://template/{id}/data", "b+test://template/{id}/data"}
        read = await client.read_resource("b+test://template/9/data")
        assert "Data for ID: 9" in read.contents[0].text
        assert str(read.contents[0].uri) == "b+test://template/9/data"
        prompts = {p.name for p in (await client.list_prompts()).prompts}
        assert {"a/test_simple_prompt", "b/test_simple_prompt"} <= prompts
        got = await client.get_prompt("a/test_prompt_with_arguments", {"arg1": "x", "arg2": "y"})
        assert "arg1='x'" in got.messages[0].content.text
        done = await client.complete(types.PromptReference(name="b/test_prompt_with_arguments"),
                                     {"name": "arg1", "value": "par"})
        assert "paris" in done.completion.values
        with warnings.catch_warnings():  # resources/subscribe is gone in 2026-07-28 only
            warnings.simplefilter("ignore")
            await client.subscribe_resource("a+test://watched-resource")
        with anyio.fail_after(5):
            while not updated:  # noqa: ASYNC110
                await anyio.sleep(0.02)
        assert updated == ["a+test://watched-resource"]
        with pytest.raises(MCPError, match="c"):
            await client.read_resource("c+test://static-text")
