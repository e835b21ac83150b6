"""The /mcp fast path (`http_fastpath`), on the wire: raw HTTP against a live uvicorn, so the
answers' shapes (JSON body, SSE stream, 202, error codes) are what is checked."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import httpx
import pytest
from mcp.server.transport_security import DEFAULT_MAX_REQUEST_BODY_SIZE

from sidecar.serve.mcp_facade import CALL_ID_KEY
from tests.serve.mcp_facade.conftest import TOKEN, Served

pytestmark = pytest.mark.anyio

VERSION = "2025-11-25"
ACCEPT = "application/json, text/event-stream"


class Raw:
    """One MCP session spoken by hand."""

    def __init__(self, http: httpx.AsyncClient, url: str) -> None:
        self.http = http
        self.url = url
        self.headers = {"accept": ACCEPT, "content-type": "application/json"}
        self._ids = 0

    def request(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        self._ids += 1
        return {"jsonrpc": "2.0", "id": self._ids, "method": method,
                **({"params": params} if params is not None else {})}

    async def post(self, body: Any, **headers: str) -> httpx.Response:
        content = body if isinstance(body, bytes) else json.dumps(body).encode()
        return await self.http.post(self.url, content=content,
                                    headers={**self.headers, **headers})

    async def open(self, capabilities: dict[str, Any] | None = None) -> None:
        response = await self.post(self.request("initialize", {
            "protocolVersion": VERSION, "capabilities": capabilities or {},
            "clientInfo": {"name": "raw", "version": "1"}}))
        assert response.status_code == 200
        assert messages(response)[0]["result"]["protocolVersion"] == VERSION
        self.headers["mcp-session-id"] = response.headers["mcp-session-id"]
        self.headers["mcp-protocol-version"] = VERSION
        done = await self.post({"jsonrpc": "2.0", "method": "notifications/initialized"})
        assert done.status_code == 202

    async def call(self, name: str, arguments: dict[str, Any],
                   meta: dict[str, Any] | None = None) -> httpx.Response:
        params: dict[str, Any] = {"name": name, "arguments": arguments}
        if meta is not None:
            params["_meta"] = meta
        return await self.post(self.request("tools/call", params))


def messages(response: httpx.Response) -> list[dict[str, Any]]:
    """The JSON-RPC messages of a JSON or an SSE answer."""
    if response.headers["content-type"].startswith("application/json"):
        return [response.json()]
    return [json.loads(line[5:]) for line in response.text.splitlines()
            if line.startswith("data:") and line[5:].strip()]


@asynccontextmanager
async def raw_session(served: Served, capabilities: dict[str, Any] | None = None
                      ) -> AsyncIterator[Raw]:
    async with httpx.AsyncClient(headers={"authorization": f"Bearer {TOKEN}"},
                                 timeout=30) as http:
        raw = Raw(http, served.url)
        await raw.open(capabilities)
        yield raw


async def test_plain_calls_and_later_listings_are_answered_with_json(served: Served) -> None:
    fast = served.fast_path
    assert fast.installed
    async with raw_session(served) as raw:
        first = await raw.post(raw.request("tools/list"))
        assert first.headers["content-type"].startswith("text/event-stream")  # the SDK's way
        assert fast.handled == 0
        tools = messages(first)[0]["result"]["tools"]

        again = await raw.post(raw.request("tools/list"))
        assert again.headers["content-type"] == "application/json"
        assert again.headers["mcp-session-id"] == raw.headers["mcp-session-id"]
        assert again.json()["result"]["tools"] == tools

        echoed = await raw.call("echo", {"text": "hi"}, {CALL_ID_KEY: "fast-1"})
        assert echoed.status_code == 200
        assert echoed.headers["content-type"] == "application/json"
        body = echoed.json()
        assert body["id"] == raw._ids
        assert body["result"]["structuredContent"] == {"echoed": "hi"}
        outcome = await served.location.outcome("fast-1")
        assert outcome is not None and outcome.status == "completed"

        upstream = (await raw.call("test_simple_text", {})).json()["result"]
        assert upstream["content"][0]["text"] == "This is a simple text response for testing."
        invalid = (await raw.call("echo", {"text": 5})).json()["result"]
        assert invalid["isError"] and "text" in invalid["content"][0]["text"]
        assert fast.handled == 4
        # every request after `initialize` went straight from the security checks to its
        # session (`HttpFastPath.shortcut`), which handed two to the SDK: the notification
        # and the first listing
        assert fast.shortcuts == 6

        # a call asking for progress takes the SDK's way, with its SSE stream
        progress = await raw.call("test_tool_with_progress", {}, {"progressToken": "p"})
        assert progress.headers["content-type"].startswith("text/event-stream")
        sent = messages(progress)
        assert [m["params"]["progress"] for m in sent[:-1]] == [0, 50, 100]
        assert fast.handled == 4


async def test_a_call_that_needs_its_client_becomes_an_sse_stream(served: Served) -> None:
    async with raw_session(served, {"sampling": {}}) as raw:
        await raw.post(raw.request("tools/list"))
        call = raw.request("tools/call", {"name": "test_sampling",
                                          "arguments": {"prompt": "the question"}})
        async with raw.http.stream("POST", raw.url, content=json.dumps(call).encode(),
                                   headers=raw.headers) as stream:
            assert stream.headers["content-type"] == "text/event-stream"
            lines = stream.aiter_lines()
            asked = await next_message(lines)
            assert asked["method"] == "sampling/createMessage"
            assert asked["params"]["messages"][0]["content"]["text"] == "the question"
            answer = {"jsonrpc": "2.0", "id": asked["id"], "result": {
                "role": "assistant", "model": "m", "content": {"type": "text", "text": "42"}}}
            accepted = await raw.post(answer)
            assert accepted.status_code == 202
            result = await next_message(lines)
        assert result["id"] == call["id"]
        assert result["result"]["content"][0]["text"] == "LLM response: 42"

        logged = await raw.call("test_tool_with_logging", {})
        assert logged.headers["content-type"] == "text/event-stream"
        sent = messages(logged)
        assert [m["params"]["data"] for m in sent[:-1]] == [
            "Tool execution started", "Tool processing data", "Tool execution completed"]
        assert all(m["method"] == "notifications/message" for m in sent[:-1])
        assert sent[-1]["id"] == raw._ids and "result" in sent[-1]
        assert served.fast_path.handled == 2  # both calls (the first listing is the SDK's)


async def next_message(lines: AsyncIterator[str]) -> dict[str, Any]:
    with anyio.fail_after(20):
        async for line in lines:
            if line.startswith("data:") and line[5:].strip():
                message: dict[str, Any] = json.loads(line[5:])
                return message
    raise AssertionError("the stream ended")


async def test_a_cancelled_call_is_answered_request_cancelled(served: Served) -> None:
    async with raw_session(served) as raw:
        await raw.post(raw.request("tools/list"))
        call = raw.request("tools/call", {"name": "test_sleep", "arguments": {"seconds": 30},
                                          "_meta": {CALL_ID_KEY: "to-cancel"}})
        answers: list[httpx.Response] = []

        async with anyio.create_task_group() as tg:
            async def run() -> None:
                answers.append(await raw.post(call))

            tg.start_soon(run)
            with anyio.fail_after(10):
                while served.fast_path.handled < 1:  # noqa: ASYNC110
                    await anyio.sleep(0.01)
            cancel = await raw.post({"jsonrpc": "2.0", "method": "notifications/cancelled",
                                     "params": {"requestId": call["id"], "reason": "enough"}})
            assert cancel.status_code == 202
        (answer,) = answers
        assert answer.json()["error"] == {"code": -32800, "message": "Request cancelled"}
        # nothing is left running under that call id: it runs again at once
        with anyio.fail_after(10):
            again = await raw.call("test_sleep", {"seconds": 0}, {CALL_ID_KEY: "to-cancel"})
        assert again.json()["result"]["content"][0]["text"] == "slept"


async def test_what_the_fast_path_does_not_take_gets_the_sdk_answers(served: Served) -> None:
    async with raw_session(served) as raw:
        await raw.post(raw.request("tools/list"))
        before = served.fast_path.handled

        unparsable = await raw.post(b"{not json")
        assert unparsable.status_code == 400
        assert unparsable.json()["error"]["code"] == -32700

        malformed = await raw.post(raw.request("tools/call", {"name": "echo",
                                                              "arguments": "not an object"}))
        assert malformed.headers["content-type"].startswith("text/event-stream")
        assert "error" in messages(malformed)[0]

        json_only = await raw.post(raw.request("tools/list"), accept="application/json")
        assert json_only.status_code == 406

        unknown = await raw.post(raw.request("tools/list"), **{"mcp-session-id": "nope"})
        assert unknown.status_code == 404

        stray = await raw.post({"jsonrpc": "2.0", "id": "sidecar-99", "result": {}})
        assert stray.status_code == 202  # an answer nobody waits for: the SDK drops it
        assert served.fast_path.handled == before

        deleted = await raw.http.delete(raw.url, headers=raw.headers)
        assert deleted.status_code == 200
        gone = await raw.call("echo", {"text": "hi"})
        assert gone.status_code == 404
        assert served.fast_path.handled == before


async def test_a_bug_below_the_fast_path_is_answered_as_an_internal_error_and_logged(
    served: Served, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    async with raw_session(served) as raw:
        await raw.post(raw.request("tools/list"))

        async def broken(*args: Any, **kwargs: Any) -> dict[str, Any]:
            raise RuntimeError("a bug in result mapping")

        # Fault injection: no real input reaches this state, so the fast answer is replaced;
        # what is under test is the fast path's answer when it raises.
        monkeypatch.setattr(served.fast_path.facade.fast, "call", broken)
        with anyio.fail_after(10):
            failed = await raw.call("echo", {"text": "x"})
        assert failed.json()["error"] == {"code": -32603, "message": "Internal error"}
        assert served.fast_path.handled == 1
        monkeypatch.undo()
        after = await raw.call("echo", {"text": "still served"})
        assert after.json()["result"]["structuredContent"] == {"echoed": "still served"}
    assert any(r.exc_info and "a bug in result mapping" in str(r.exc_info[1])
               for r in caplog.records)


async def test_the_shortcut_leaves_to_the_stack_what_it_would_answer_otherwise(
        served: Served) -> None:
    """`HttpFastPath.shortcut` skips the body limit, the depth guard and the session manager
    only for what they would pass: the rest gets the same answer as with the fast path off."""
    fast = served.fast_path
    async with raw_session(served) as raw:
        await raw.post(raw.request("tools/list"))
        oversized = raw.request("tools/call", {"name": "echo", "arguments": {
            "text": "x" * DEFAULT_MAX_REQUEST_BODY_SIZE}})
        listing = raw.request("tools/list")
        deep = b'{"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": ' \
            + b'{"name": "echo", "arguments": {"text": ' + b"[" * 1000 + b"]" * 1000 + b"}}}"
        cases = [
            ("oversized", lambda: raw.post(oversized)),
            ("too deep", lambda: raw.post(deep)),
            ("a 2026-07-28 header", lambda: raw.post(listing, **{
                "mcp-protocol-version": "2026-07-28"})),
            ("an unknown session", lambda: raw.post(listing, **{"mcp-session-id": "0" * 32})),
            ("no JSON content type", lambda: raw.post(listing, **{
                "content-type": "text/plain"})),
        ]
        answers: dict[str, list[tuple[int, str]]] = {}
        for enabled in (True, False):
            fast.enabled = enabled
            taken = fast.shortcuts
            for name, post in cases:
                response = await post()
                answers.setdefault(name, []).append((response.status_code, response.text))
            assert fast.shortcuts == taken, enabled
        fast.enabled = True
        for name, (with_it, without) in answers.items():
            assert with_it == without, name
        assert answers["oversized"][0][0] == 413
        assert answers["too deep"][0][0] == 400 and "levels deep" in answers["too deep"][0][1]
        assert answers["an unknown session"][0][0] == 404
        assert answers["no JSON content type"][0] == (400, "Invalid Content-Type header")
        echoed = await raw.call("echo", {"text": "still served"})
        assert echoed.json()["result"]["structuredContent"] == {"echoed": "still served"}
        assert fast.shortcuts == taken + 1


def test_the_plain_post_decision_is_the_sdks_once_per_header_pair() -> None:
    from sidecar.serve.mcp_facade import http_fastpath

    types_ = [None, b"application/json", b"Application/JSON; charset=utf-8", b"text/plain"]
    accepts = [None, b"application/json, text/event-stream", b"*/*", b"application/json",
               b"text/event-stream;q=0.9, application/*", b"text/*"]
    for content_type in types_:
        for accept in accepts:
            headers = [(b"host", b"127.0.0.1")]
            headers += [(b"content-type", content_type)] if content_type else []
            headers += [(b"accept", accept)] if accept else []
            headers += [(b"accept", b"*/*")]  # a second Accept: the SDK reads the first
            scope = {"type": "http", "method": "POST", "path": "/mcp", "headers": headers}
            expected = http_fastpath._decide_plain(scope)
            assert http_fastpath._plain_post(scope) is expected, (content_type, accept)
            assert http_fastpath._plain_post(scope) is expected  # from the cache
    assert len(http_fastpath._PLAIN) <= http_fastpath._PLAIN_KEPT
