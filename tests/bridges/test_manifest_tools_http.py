"""`http` manifest tools against a real Starlette app on uvicorn, through a real Location."""

from __future__ import annotations

import asyncio
import gc
import logging
from collections.abc import Iterator
from typing import Any

import pytest

from bridges.manifest.loading import load_manifests
from bridges.manifest_tools import manifest_tool_validator
from sidecar import ErrorKind, ImageContent
from sidecar.model.permissions import PermissionRule
from tests.bridges.manifest_tools_support.http_app import (
    PNG,
    SECRET_TOKEN,
    MiB,
    ServerThread,
    closed_port,
)
from tests.bridges.manifest_tools_support.location import (
    call,
    context,
    eventually,
    manifest_tools,
    open_location,
)
from tests.bridges.manifest_tools_support.memory import MB, peak_rss, reset_peak, rss

pytestmark = pytest.mark.anyio


@pytest.fixture
async def location(tmp_path):
    async with open_location(tmp_path) as opened:
        yield opened

NAME = {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}
NOTHING: dict[str, Any] = {"type": "object", "properties": {}}


@pytest.fixture(scope="module")
def server() -> Iterator[ServerThread]:
    thread = ServerThread()
    thread.start()
    try:
        yield thread
    finally:
        thread.stop()


def tool(url: str, input: dict[str, Any] | None = None, **keys: Any) -> dict[str, Any]:
    request = {"url": url, **keys.pop("request", {})}
    return {"kind": "http", "description": "test tool", "input": input or NOTHING,
            "request": request, **keys}


async def test_get_with_percent_encoded_placeholders(location, server):
    entries = {"item": tool(server.url + "/items/{name}?tag={name}", NAME)}
    async with manifest_tools(location, entries):
        hostile = "a b/../c?d=1&e#f%"
        outcome = await call(location, "item", {"name": hostile})
        dots = await call(location, "item", {"name": ".."})
    assert outcome.status == "completed", outcome.error
    echoed = outcome.content[0].text
    assert '"name":"a b/../c?d=1&e#f%"' in echoed
    assert "/items/a%20b%2F..%2Fc%3Fd%3D1%26e%23f%25" in echoed
    assert '"query":"tag=a%20b%2F..%2Fc%3Fd%3D1%26e%23f%25"' in echoed
    assert dots.status == "completed", dots.error
    assert '"name":".."' in dots.content[0].text  # never normalised into the parent path


async def test_query_mapping_and_default_post_body(location, server):
    schema = {
        "type": "object",
        "properties": {"q": {"type": "string"}, "tags": {"type": "array"},
                       "page": {"type": "integer"}, "flag": {"type": "boolean"},
                       "text": {"type": "string"}, "n": {"type": "integer"}},
        "required": ["q"],
    }
    entries = {
        "post": tool(server.url + "/echo", schema,
                     request={"method": "POST", "query": {"search": "q", "tags": "tags",
                                                          "page": "page"}}),
        "get": tool(server.url + "/echo?fixed=1&q={q}", schema,
                    request={"query": ["flag", "page"]}),
    }
    async with manifest_tools(location, entries):
        posted = await call(location, "post",
                            {"q": "a&b", "tags": ["x", "y z"], "text": "hi", "n": 2})
        got = await call(location, "get", {"q": "one", "flag": True, "text": "unused"})
    assert posted.status == "completed", posted.error
    body = posted.content[0].text
    assert '"query":"search=a%26b&tags=x&tags=y+z"' in body  # page absent: left out
    assert '"body":{"text":"hi","n":2}' in body  # the remaining fields, as JSON
    assert '"method":"POST"' in body
    assert '"query":"fixed=1&q=one&flag=true"' in got.content[0].text  # merged with the URL's
    assert '"body":""' in got.content[0].text  # GET sends no default body


async def test_explicit_json_and_form_body_mappings(location, server):
    schema = {"type": "object", "properties": {"a": {"type": "string"},
                                               "b": {"type": "integer"},
                                               "doc": {"type": "object"}}}
    entries = {
        "json": tool(server.url + "/echo", schema,
                     request={"method": "PUT", "body": {"first": "a", "second": "b"}}),
        "whole": tool(server.url + "/echo", schema, request={"method": "POST", "body": "doc"}),
        "form": tool(server.url + "/echo", schema,
                     request={"method": "POST", "body": ["a", "b"], "body_format": "form"}),
    }
    async with manifest_tools(location, entries):
        mapped = await call(location, "json", {"a": "x", "b": 1, "doc": {}})
        whole = await call(location, "whole", {"doc": {"k": [1, 2]}, "a": "ignored"})
        form = await call(location, "form", {"a": "x y", "b": 7})
    assert '"body":{"first":"x","second":1}' in mapped.content[0].text
    assert '"body":{"k":[1,2]}' in whole.content[0].text
    assert '"body":{"a":"x y","b":"7"}' in form.content[0].text


async def test_header_secrets_from_env_work_and_are_never_shown(
    location, server, tmp_path, caplog
):
    caplog.set_level(logging.DEBUG)
    manifests = tmp_path / "manifests"
    manifests.mkdir()
    (manifests / "tools.toml").write_text(f"""
[tools.auth]
kind = "http"
description = "needs a token"
input = {{ type = "object", properties = {{ trace = {{ type = "string" }} }} }}
request = {{ url = "{server.url}/auth", headers = {{ Authorization = "Bearer ${{env:API_TOKEN}}" \
}} }}

[tools.leak]
kind = "http"
description = "a server that echoes credentials in its errors"
input = {{ type = "object", properties = {{}} }}
request = {{ url = "{server.url}/leak", headers = {{ Authorization = "Bearer ${{env:API_TOKEN}}" \
}} }}
""")
    loaded = load_manifests([manifests], environ={"API_TOKEN": SECRET_TOKEN},
                            tool_validator=manifest_tool_validator(location.root))
    assert loaded.problems == []
    assert SECRET_TOKEN not in repr(loaded.tools)
    async with manifest_tools(location, {}) as registrar:
        await registrar.apply(loaded.tools)
        ok = await call(location, "auth", {})
        leaked = await call(location, "leak", {})
    assert ok.status == "completed" and '{"ok":true}' in ok.content[0].text
    assert leaked.error.kind is ErrorKind.TOOL_FAILURE
    assert leaked.error.message.endswith("HTTP 500 Internal Server Error: upstream exploded "
                                         "while using ***")
    stored = await location.outcome(leaked.call_id)
    for text in (leaked.error.message, repr(stored), caplog.text):
        assert SECRET_TOKEN not in text


async def test_json_output_is_validated_against_the_declared_schema(location, server):
    city = {"type": "object", "properties": {"city": {"type": "string"},
                                             "bad": {"type": "boolean"}}, "required": ["city"]}
    output = {"type": "object", "properties": {"temperature": {"type": "number"}},
              "required": ["temperature"]}
    entries = {
        "weather": tool(server.url + "/weather", city, output=output,
                        request={"query": ["city", "bad"]}),
        "html": tool(server.url + "/not-json", output=output),
        "plain": tool(server.url + "/weather", city, request={"query": ["city"]}),
    }
    async with manifest_tools(location, entries):
        good = await call(location, "weather", {"city": "Oslo"})
        bad = await call(location, "weather", {"city": "Oslo", "bad": True})
        html = await call(location, "html", {})
        plain = await call(location, "plain", {"city": "Oslo"})
        definitions = {d.name: d for d in location.snapshot().definitions}
    assert good.status == "completed"
    assert good.output == {"city": "Oslo", "temperature": 21.5}
    assert good.metadata["status"] == 200
    assert bad.error.kind is ErrorKind.INVALID_OUTPUT and bad.error.path == "$.temperature"
    assert html.error.kind is ErrorKind.UPSTREAM and "expected a JSON response" in \
        html.error.message and "<html>oops</html>" in html.error.message
    # without a declared output, JSON is text content and there is no output
    assert plain.output is None and plain.content[0].text == '{"city":"Oslo","temperature":21.5}'
    assert definitions["plain"].output_schema is None  # an output codec only when declared
    assert definitions["weather"].output_schema == output


async def test_text_media_charsets_and_binary_bodies(location, server):
    entries = {name: tool(server.url + "/" + name) for name in
               ("text", "image", "latin1", "binary")}
    async with manifest_tools(location, entries):
        text = await call(location, "text", {})
        image = await call(location, "image", {})
        latin1 = await call(location, "latin1", {})
        binary = await call(location, "binary", {})
    assert text.content[0].text == "hello\nworld\n" and text.output is None
    assert isinstance(image.content[0], ImageContent)
    assert image.content[0].mime_type == "image/png" and image.metadata["bytes"] == len(PNG)
    assert latin1.content[0].text == "café"
    assert "invalid bytes were replaced" in binary.content[0].text
    assert "ok \ufffd\ufffd bytes" in binary.content[0].text
    assert binary.metadata["replaced_invalid_bytes"] is True


async def test_non_2xx_is_a_tool_failure_with_status_and_a_bounded_excerpt(location, server):
    async with manifest_tools(location, {"status": tool(server.url + "/status/404")}):
        outcome = await call(location, "status", {})
    assert outcome.error.kind is ErrorKind.TOOL_FAILURE
    message = outcome.error.message
    assert message.startswith("status: GET http://127.0.0.1:")
    assert "HTTP 404 Not Found" in message and "failure 404: detail line" in message
    assert len(message) < 1300 and message.count("detail line") <= 20
    assert outcome.partial == {"status": 404}


async def test_connection_refused_is_upstream(location):
    url = f"http://127.0.0.1:{closed_port()}/x"
    async with manifest_tools(location, {"down": tool(url)}):
        outcome = await call(location, "down", {})
    assert outcome.error.kind is ErrorKind.UPSTREAM
    assert outcome.error.message.startswith(f"down: GET {url} failed")


async def test_a_slow_server_is_a_timeout(location, server):
    slow = tool(server.url + "/slow", request={"timeout": 0.3})
    async with manifest_tools(location, {"slow": slow}):
        outcome = await call(location, "slow", {})
    assert outcome.error.kind is ErrorKind.TIMEOUT  # the server answers only after 2 s
    assert "timed out after 0.3 s" in outcome.error.message


async def test_redirects_are_not_followed_unless_asked(location, server):
    entries = {
        "stay": tool(server.url + "/redirect"),
        "follow": tool(server.url + "/redirect", request={"follow_redirects": True}),
    }
    async with manifest_tools(location, entries):
        stay = await call(location, "stay", {})
        follow = await call(location, "follow", {})
    assert stay.error.kind is ErrorKind.TOOL_FAILURE
    assert "HTTP 302" in stay.error.message and "redirect to /text" in stay.error.message
    assert "follow_redirects" in stay.error.message
    assert follow.status == "completed" and follow.content[0].text == "hello\nworld\n"


async def test_max_response_bytes_stops_reading_and_counts_exactly(location, server):
    size, limit = 5 * MiB + 17, MiB + 123
    entries = {
        "known": tool(server.url + f"/big?size={size}&length=1",
                      request={"max_response_bytes": limit}),
        "unknown": tool(server.url + f"/big?size={size}", request={"max_response_bytes": limit}),
    }
    async with manifest_tools(location, entries):
        known = await call(location, "known", {})
        unknown = await call(location, "unknown", {})
    assert known.status == "completed", known.error
    dropped = size - limit
    assert known.content[0].text.startswith(
        f"[response truncated at request.max_response_bytes = {limit:,} bytes: {dropped:,} of "
        f"its {size:,} bytes were dropped (not kept)]"
    )
    assert known.metadata["truncated"] == {
        "limit": limit, "kept_bytes": limit, "content_length": size, "dropped_bytes": dropped
    }
    assert known.metadata["bytes"] == limit
    assert "the rest was not read (no Content-Length" in unknown.content[0].text
    assert unknown.metadata["truncated"]["dropped_bytes"] is None


async def test_a_200_mb_body_is_spooled_with_bounded_memory(location, server):
    size = 200 * MiB
    big = tool(server.url + f"/big?size={size}&length=1",
               request={"max_response_bytes": 256 * MiB, "timeout": 120})
    async with manifest_tools(location, {"big": big}):
        gc.collect()
        before = rss()
        reset_peak()
        outcome = await call(location, "big", {})
        growth = peak_rss() - before
        assert outcome.status == "completed", outcome.error
        ref = outcome.metadata["body"]["ref"]
        page = await call(location, "managed_read", {"ref": ref, "offset": 3_000_000,
                                                     "limit": 2})
    assert growth < 64 * MB, f"peak RSS grew by {growth / MB:.1f} MB for a 200 MiB body"
    assert outcome.metadata["body"]["size_bytes"] == size
    assert outcome.metadata["body"]["lines"] == size // 64
    text = outcome.content[0].text
    assert text.startswith(f"[response body: {size:,} bytes in {size // 64:,} lines, kept "
                           f"whole as {ref}")
    assert len(text.encode()) < 20_000 and "bytes omitted here (lines 101-" in text
    line = "0123456789abcdef" * 3 + "0123456789abcde"
    assert page.content[0].text.endswith(f"]\n{line}\n{line}\n")


async def test_permission_rules_and_asks_gate_the_request(location, server):
    entries = {"item": tool(server.url + "/items/{name}", NAME)}
    async with manifest_tools(location, entries):
        location.permissions.set_location_rules([PermissionRule("item", "deny")])
        # hide_denied=False: the tool is offered, so the call reaches the tool's own ask
        denied = await location.snapshot(session_id="s1", hide_denied=False).execute(
            "item", {"name": "x"}, context("denied")
        )
        location.permissions.set_location_rules([PermissionRule("item", "ask")])
        task = asyncio.create_task(
            location.snapshot().execute("item", {"name": "y"}, context("asked"))
        )
        await eventually(lambda: bool(location.permissions.pending()))
        [ask] = location.permissions.pending()
        await location.permissions.reply(ask.id, "once")
        allowed = await task
    assert denied.error.kind is ErrorKind.DENIED
    assert ask.request.action == "item" and ask.request.call_id == "asked"
    assert (ask.request.session_id, ask.request.agent, ask.request.message_id) == (
        "s1", "agent", "m1")
    assert ask.request.resources == (f"{server.url}/items/y",)
    assert ask.request.metadata == {"kind": "http", "method": "GET",
                                    "url": f"{server.url}/items/y"}
    assert allowed.status == "completed"
