"""Every /v1 endpoint against a real uvicorn on 127.0.0.1, bad input included."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from sidecar import Tool
from sidecar.formats import definitions_for
from tests.serve.conftest import TOKEN, EchoIn, EchoOut

pytestmark = pytest.mark.anyio

CTX = {"session_id": "s1", "agent": "a", "message_id": "m1"}


def ctx(call_id: str, session: str = "s1") -> dict[str, str]:
    return {**CTX, "session_id": session, "call_id": call_id}


async def snapshot(served, **extra) -> str:
    res = await served.client.post("/v1/snapshots", json={"session_id": "s1", **extra})
    assert res.status_code == 201, res.text
    return res.json()["id"]


async def test_token_host_and_origin_are_checked(served):
    async with httpx.AsyncClient(base_url=served.url) as bare:
        res = await bare.get("/v1/tools")
        assert res.status_code == 401 and res.json()["error"]["code"] == "unauthorized"
        res = await bare.get("/v1/tools", headers={"authorization": "Bearer wrong"})
        assert res.status_code == 401
        ok = {"authorization": f"Bearer {TOKEN}"}
        res = await bare.get("/v1/tools", headers={**ok, "host": "evil.example.com"})
        assert res.status_code == 403 and res.json()["error"]["code"] == "forbidden_host"
        res = await bare.get("/v1/tools", headers={**ok, "origin": "http://evil.example.com"})
        assert res.status_code == 403 and res.json()["error"]["code"] == "forbidden_origin"
        res = await bare.get("/v1/tools", headers={**ok, "host": "localhost:1234",
                                                   "origin": "http://localhost:3000"})
        assert res.status_code == 200


async def test_tools_in_each_provider_format(served):
    for fmt in ("mcp", "openai", "anthropic", "gemini", "openai-responses"):
        res = await served.client.get("/v1/tools", params={"format": fmt})
        assert res.status_code == 200, (fmt, res.text)
        assert "echo" in json.dumps(res.json()["tools"])
    bad = await served.client.get("/v1/tools", params={"format": "cohere"})
    assert bad.status_code == 400 and bad.json()["error"]["field"] == "format"


async def test_listings_follow_the_registry_and_match_a_fresh_encoding(served):
    """Listings are encoded once per registry state: the cached bytes must equal a fresh
    conversion, and a registry change must show at once, in both endpoints."""
    for fmt in ("openai", "anthropic"):
        for strict in (False, True):
            snap = served.location.snapshot(hide_denied=False, keep=False)
            expected = definitions_for(fmt, snap.definitions, strict=strict)
            first = await served.client.post("/v1/snapshots", json={
                "session_id": "s1", "format": fmt, "strict": strict})
            again = await served.client.post("/v1/snapshots", json={
                "session_id": "s1", "format": fmt, "strict": strict})
            assert first.json()["definitions"] == again.json()["definitions"] == expected
            assert first.json()["id"] != again.json()["id"]
        listed = (await served.client.get("/v1/tools", params={"format": fmt})).json()
        assert listed.pop("tools") == definitions_for(fmt, snap.definitions)
        tokens = listed.pop("tokens")  # the counts: tests/serve/test_token_accounting.py
        assert list(tokens) == [d.name for d in snap.definitions]
        assert listed.pop("total_tokens") == sum(tokens.values())
        assert listed.pop("tokens_by_server")
        assert listed == {"format": fmt, "token_encoding": "cl100k_base"}
    async def late(args: EchoIn, ctx: object) -> EchoOut:
        return EchoOut(echoed=args.text)

    served.location.tools.register({"late_tool": Tool(
        description="Registered after the first listing", input=EchoIn, output=EchoOut,
        execute=late)})
    for fmt in ("openai", "anthropic"):  # both encoded before the change
        listed = await served.client.get("/v1/tools", params={"format": fmt})
        created = await served.client.post("/v1/snapshots", json={
            "session_id": "s1", "format": fmt, "strict": True})
        assert "late_tool" in json.dumps(listed.json()["tools"]), fmt
        assert "late_tool" in json.dumps(created.json()["definitions"]), fmt


async def test_listing_tools_keeps_no_snapshot_and_evicts_none(served):
    created = await served.client.post("/v1/snapshots", json={"session_id": "s1"})
    snapshot_id = created.json()["id"]
    kept = len(served.location.snapshots)
    for _ in range(served.location.snapshots.max_count + 5):
        assert (await served.client.get("/v1/tools")).status_code == 200
    assert len(served.location.snapshots) == kept
    call = {"name": "echo", "input": {"text": "still here"}, "context": ctx("c-kept")}
    res = await served.client.post(f"/v1/snapshots/{snapshot_id}/calls", json=call)
    assert res.status_code == 200, res.text
    assert res.json()["output"] == {"echoed": "still here"}


async def test_snapshot_call_idempotent_and_wire_value(served):
    res = await served.client.post("/v1/snapshots", json={"session_id": "s1", "format": "openai"})
    body = res.json()
    assert res.status_code == 201 and body["tool_choice"] == "auto"
    names = [d["function"]["name"] for d in body["definitions"]]
    assert names == sorted(names) and "echo" in names
    call = {"name": "echo", "input": {"text": "hi"}, "context": ctx("c1"), "format": "anthropic"}
    first = await served.client.post(f"/v1/snapshots/{body['id']}/calls", json=call)
    assert first.status_code == 200, first.text
    outcome = first.json()
    assert outcome["status"] == "completed" and outcome["output"] == {"echoed": "hi"}
    assert outcome["wire"]["type"] == "tool_result" and outcome["replayed"] is False
    again = await served.client.post(f"/v1/snapshots/{body['id']}/calls", json=call)
    assert again.json()["replayed"] is True and again.json()["content"] == outcome["content"]
    stored = await served.client.get("/v1/calls/c1")
    assert stored.status_code == 200 and stored.json()["status"] == "completed"


async def test_final_step_snapshot(served):
    sid = await snapshot(served, final_step=True)
    res = await served.client.post(f"/v1/snapshots/{sid}/calls",
                                   json={"name": "echo", "input": {"text": "x"},
                                         "context": ctx("fin")})
    assert res.json()["error"]["kind"] == "unavailable"


async def test_bad_bodies_get_4xx_naming_the_field(served):
    sid = await snapshot(served)
    path = f"/v1/snapshots/{sid}/calls"
    raw = await served.client.post(path, content=b'{"name": "echo", ',
                                   headers={"content-type": "application/json"})
    assert raw.status_code == 400 and raw.json()["error"]["code"] == "malformed_json"
    unknown = await served.client.post(path, json={"name": "echo", "context": ctx("u"),
                                                   "bogus": 1})
    assert unknown.status_code == 422 and unknown.json()["error"]["field"] == "bogus"
    wrong = await served.client.post(path, json={"name": 5, "context": ctx("w")})
    assert wrong.status_code == 422 and wrong.json()["error"]["field"] == "name"
    missing = await served.client.post(path, json={"name": "echo"})
    assert missing.status_code == 422 and missing.json()["error"]["field"] == "context"
    nested = await served.client.post(path, json={"name": "echo", "context": {**ctx("n"),
                                                                             "call_id": ""}})
    assert nested.status_code == 422 and nested.json()["error"]["field"] == "context.call_id"
    listy = await served.client.post(path, json=[1, 2])
    assert listy.status_code == 422
    huge = await served.client.post(path, json={"name": "echo", "context": ctx("h"),
                                                "input": {"text": "x" * 100_000}})
    assert huge.status_code == 413 and huge.json()["error"]["code"] == "body_too_large"
    expired = await served.client.post("/v1/snapshots/snap_nope/calls",
                                       json={"name": "echo", "context": ctx("e")})
    assert expired.status_code == 404 and expired.json()["error"]["code"] == "snapshot_expired"
    invalid_input = await served.client.post(path, json={"name": "echo", "input": {"text": 3},
                                                         "context": ctx("ii")})
    assert invalid_input.status_code == 200
    assert invalid_input.json()["error"]["kind"] == "invalid_input"


async def test_async_call_poll_and_cancel(served):
    sid = await snapshot(served)
    path = f"/v1/snapshots/{sid}/calls"
    quick = await served.client.post(path, headers={"prefer": "respond-async"},
                                     json={"name": "slow", "input": {"seconds": 0.05},
                                           "context": ctx("a1")})
    assert quick.status_code == 202 and quick.headers["location"] == "/v1/calls/a1"
    for _ in range(200):
        state = (await served.client.get("/v1/calls/a1")).json()
        if state["status"] != "running":
            break
        await asyncio.sleep(0.02)
    assert state["status"] == "completed" and state["content"][0]["text"] == "woke up"
    await served.client.post(path, headers={"prefer": "respond-async"},
                             json={"name": "slow", "input": {"seconds": 60},
                                   "context": ctx("a2")})
    assert (await served.client.get("/v1/calls/a2")).json()["status"] == "running"
    cancel = await served.client.delete("/v1/calls/a2")
    assert cancel.status_code == 202
    for _ in range(100):
        res = await served.client.get("/v1/calls/a2")
        if res.status_code == 404:
            break
        await asyncio.sleep(0.02)
    assert res.status_code == 404  # cancelled: nothing was recorded
    assert (await served.client.delete("/v1/calls/a1")).status_code == 409
    assert (await served.client.delete("/v1/calls/nope")).status_code == 404


async def test_a_waiting_synchronous_call_can_be_cancelled(served):
    sid = await snapshot(served)
    request = asyncio.create_task(served.client.post(
        f"/v1/snapshots/{sid}/calls",
        json={"name": "slow", "input": {"seconds": 60}, "context": ctx("sync1")},
    ))
    for _ in range(100):
        if (await served.client.get("/v1/calls/sync1")).status_code == 200:
            break
        await asyncio.sleep(0.02)
    assert (await served.client.delete("/v1/calls/sync1")).status_code == 202
    res = await request
    assert res.status_code == 409 and res.json()["error"]["code"] == "cancelled"


async def test_managed_text_read_and_grep(served):
    sid = await snapshot(served)
    res = await served.client.post(f"/v1/snapshots/{sid}/calls",
                                   json={"name": "big", "input": {"text": "row"},
                                         "context": ctx("b1")})
    outcome = res.json()
    (managed,) = outcome["managed"]
    assert managed["lines"] == 20_000 and managed["ref"] in outcome["content"][0]["text"]
    ref = managed["ref"]
    page = (await served.client.get(f"/v1/managed/{ref}",
                                     params={"offset": 10_001, "limit": 2})).json()
    assert page["text"] == "row line 10000\nrow line 10001\n" and page["total_lines"] == 20_000
    grep = (await served.client.get(f"/v1/managed/{ref}", params={"pattern": "line 1999[0-9]$"}))
    assert [m["line"] for m in grep.json()["matches"]] == list(range(19_991, 20_001))
    assert (await served.client.get("/v1/managed/..%2F..%2Fetc%2Fpasswd")).status_code in (
        400, 404)
    assert (await served.client.get("/v1/managed/m_notreal")).status_code == 400
    unknown = await served.client.get("/v1/managed/m_" + "a" * 26)
    assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "unknown_ref"
    bad = await served.client.get(f"/v1/managed/{ref}", params={"offset": "x"})
    assert bad.status_code == 400 and bad.json()["error"]["field"] == "offset"
    regex = await served.client.get(f"/v1/managed/{ref}", params={"pattern": "("})
    assert regex.status_code == 400


async def read_events(lines, count: int) -> list[tuple[str, str, dict]]:
    """Read `count` events from one shared `aiter_lines()` iterator."""
    events, current = [], {}
    async for line in lines:
        if line.startswith(":"):
            continue
        if not line:
            if current:
                events.append((current["id"], current["event"], json.loads(current["data"])))
                current = {}
                if len(events) == count:
                    return events
            continue
        key, _, value = line.partition(": ")
        current[key] = value
    return events


async def test_events_stream_progress_permissions_and_resume(served):
    sid = await snapshot(served)
    async with served.client.stream("GET", "/v1/events") as stream:
        assert stream.status_code == 200
        lines = stream.aiter_lines()
        call = asyncio.create_task(served.client.post(
            f"/v1/snapshots/{sid}/calls",
            json={"name": "guarded", "input": {"text": "x"}, "context": ctx("g1")},
        ))
        (first,) = await read_events(lines, 1)
        assert first[1] == "permission.asked"
        ask = first[2]["ask"]
        pending = (await served.client.get("/v1/permissions")).json()["pending"]
        assert [p["id"] for p in pending] == [ask["id"]]
        bad = await served.client.post(f"/v1/permissions/{ask['id']}/reply",
                                        json={"reply": "maybe"})
        assert bad.status_code == 422 and bad.json()["error"]["field"] == "reply"
        ok = await served.client.post(f"/v1/permissions/{ask['id']}/reply",
                                      json={"reply": "once"})
        assert ok.status_code == 200
        outcome = (await call).json()
        assert outcome["content"][0]["text"] == "guarded x"
        rest = await read_events(lines, 2)
        assert [e[1] for e in rest] == ["permission.replied", "call.settled"]
    gone = await served.client.post(f"/v1/permissions/{ask['id']}/reply",
                                    json={"reply": "once"})
    assert gone.status_code == 404
    async with served.client.stream("GET", "/v1/events",
                                    headers={"last-event-id": first[0]}) as resumed:
        replay = await read_events(resumed.aiter_lines(), 2)
    assert [e[1] for e in replay] == ["permission.replied", "call.settled"]


async def test_health_metrics_and_openapi(served):
    health = (await served.client.get("/v1/health")).json()
    assert health["status"] == "ok" and health["tools"] >= 5
    sid = await snapshot(served)
    await served.client.post(f"/v1/snapshots/{sid}/calls",
                             json={"name": "echo", "input": {"text": "m"}, "context": ctx("m1")})
    metrics = (await served.client.get("/metrics")).text
    assert 'sidecar_calls_total{error_kind="",status="completed",tool="echo"} 1.0' in metrics
    assert "sidecar_store_objects" in metrics
    spec = (await served.client.get("/v1/openapi.json")).json()
    assert spec["openapi"].startswith("3.1")
    assert "/v1/snapshots/{snapshot_id}/calls" in spec["paths"]


async def test_managed_text_read_inside_a_long_line(served):
    text = "first line\n" + "".join(f"[{i:05d}ü]" for i in range(20_000)) + "\nlast\n"
    ref = (await served.location.seam.store.put(text)).id
    page = (await served.client.get(f"/v1/managed/{ref}",
                                     params={"offset": 2, "start": 8, "length": 16})).json()
    assert page["text"] == "[00001ü][00002ü]" and page["line"] == 2
    assert page["next_start"] == 24 and page["end_of_line"] is False
    tail = (await served.client.get(f"/v1/managed/{ref}",
                                     params={"offset": 2, "start": 159_992})).json()
    assert tail["text"] == "[19999ü]" and tail["end_of_line"] is True
    bad = await served.client.get(f"/v1/managed/{ref}", params={"start": "-1"})
    assert bad.status_code == 400 and bad.json()["error"]["field"] == "start"
