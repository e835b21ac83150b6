"""A paused 2026-07-28 `/mcp` call resumes on any replica: two `sidecar serve` processes on one
real PostgreSQL database, an upstream MCP server that asks the client (sampling) during a
call (tests/fleet/asking_server.py), and the mcp SDK's client in the 2026-07-28 era. The call
pauses on A (`input_required`, a `requestState` ending in `.replica-a`); its resume on B is
answered by B with A's next state; a second pause is resumed on A; unknown, used and forged
states are refused on B; after A was killed B names it; through HAProxy with round robin the
SDK's own rounds land on both replicas; the progress and log notifications of a call continued
on A for B's request reach B's client, with B's request's progress token, before the result,
and no more than the per-round cap of log messages."""

from __future__ import annotations

import json
import os
import secrets
import signal
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import anyio
import httpx2
import mcp_types as types
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.dispatcher import ProgressFnT
from mcp.shared.exceptions import MCPError

from sidecar.serve.mcp_facade import CALL_ID_KEY
from sidecar.serve.mcp_facade.round_notes import LOGS_PER_ROUND
from tests.fleet.haproxy import HAProxy
from tests.fleet.postgres import PostgresServer
from tests.fleet.test_replicas import start_replica, stop

pytestmark = [pytest.mark.anyio,
              pytest.mark.parametrize("anyio_backend", [("asyncio", {"use_uvloop": False})])]

ASKING = Path(__file__).resolve().parent / "asking_server.py"
NAMES = ("replica-a", "replica-b")


@dataclass
class Fleet:
    urls: dict[str, str]
    procs: dict[str, Any]
    token: str
    asked: Path
    """One line per finished run of the upstream tool."""
    proxy: HAProxy | None = None

    def runs(self) -> list[str]:
        return self.asked.read_text().splitlines() if self.asked.exists() else []


def start_fleet(root: Path, postgres_server: PostgresServer, *, proxy: bool = False,
                env_extra: dict[str, str] | None = None) -> Fleet:
    dsn = anyio.run(postgres_server.new_database)
    token = secrets.token_urlsafe(32)
    asked = root / "asked.txt"
    servers = root / "servers"
    servers.mkdir(parents=True)
    (servers / "servers.json").write_text(json.dumps({"mcpServers": {"asking": {
        "command": sys.executable, "args": [str(ASKING), str(asked)], "namespace": "",
        "protocol": "legacy"}}}))
    fleet = Fleet({}, {}, token, asked)
    try:
        for name in NAMES:
            env = {"SIDECAR_MANIFESTS": f"{root / name / 'manifests'}{os.pathsep}{servers}",
                   **(env_extra or {})}
            fleet.procs[name], fleet.urls[name] = start_replica(
                root / name, dsn, token, root / "runs.txt", name=name, env_extra=env)
        if proxy:
            ports = [urlsplit(fleet.urls[name]).port or 0 for name in NAMES]
            fleet.proxy = HAProxy.start(root, ports)
        return fleet
    except BaseException:
        stop_fleet(fleet)
        raise


def stop_fleet(fleet: Fleet) -> None:
    if fleet.proxy is not None:
        fleet.proxy.stop()
    for proc in fleet.procs.values():
        if proc.poll() is None:
            stop(proc)
        elif proc.stderr is not None:  # killed by the test
            proc.stderr.close()


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory,
          postgres_server: PostgresServer) -> Iterator[Fleet]:
    started = start_fleet(tmp_path_factory.mktemp("rounds"), postgres_server, proxy=True)
    try:
        yield started
    finally:
        stop_fleet(started)


async def unused(ctx: Any, params: types.CreateMessageRequestParams) -> Any:
    raise AssertionError("these tests answer each round themselves")


@asynccontextmanager
async def client(url: str, token: str, answered_by: list[str] | None = None,
                 sent: list[httpx2.Request] | None = None,
                 **kwargs: Any) -> AsyncIterator[Client]:
    """A 2026-07-28 client of `url`'s /mcp that can answer sampling requests; `answered_by`
    gets "<requestState's holder>><the replica that answered>" for every resume, `sent` every
    request it sends."""
    kwargs.setdefault("sampling_callback", unused)

    async def keep(request: httpx2.Request) -> None:
        if sent is not None:
            sent.append(request)

    async def note(response: httpx2.Response) -> None:
        body = json.loads(response.request.content or b"{}")
        state = (body.get("params") or {}).get("requestState") if isinstance(body, dict) else None
        if answered_by is not None and state:
            answered_by.append(f"{state.rpartition('.')[2]}>"
                               f"{response.headers.get('sidecar-replica')}")

    async with httpx2.AsyncClient(headers={"authorization": f"Bearer {token}"},
                                  timeout=httpx2.Timeout(30),
                                  event_hooks={"response": [note], "request": [keep]}) as http:
        transport = streamable_http_client(f"{url}/mcp", http_client=http)
        async with Client(transport, mode="2026-07-28", cache=None,  # type: ignore[arg-type]
                          read_timeout_seconds=30, **kwargs) as connected:
            yield connected


def sampled(text: str) -> types.CreateMessageResult:
    return types.CreateMessageResult(role="assistant", model="m",
                                     content=types.TextContent(text=text))


async def pause(on: Client, questions: list[str], call_id: str,
                on_progress: ProgressFnT | None = None,
                **more: Any) -> types.InputRequiredResult:
    first = await on.session.call_tool("ask", {"questions": questions, **more},
                                       progress_callback=on_progress,
                                       meta={CALL_ID_KEY: call_id}, allow_input_required=True)
    assert isinstance(first, types.InputRequiredResult), first.content[0].text  # type: ignore[union-attr]
    return first


async def resume(on: Client, questions: list[str], state: types.InputRequiredResult,
                 answer: str, on_progress: ProgressFnT | None = None,
                 **more: Any) -> types.CallToolResult | types.InputRequiredResult:
    (key, request), = state.input_requests.items()
    assert request.method == "sampling/createMessage"
    return await on.session.call_tool(
        "ask", {"questions": questions, **more}, progress_callback=on_progress,
        request_state=state.request_state, input_responses={key: sampled(answer)},
        allow_input_required=True)


def question(state: types.InputRequiredResult) -> str:
    (request,) = state.input_requests.values()
    assert isinstance(request, types.CreateMessageRequest)
    content = request.params.messages[0].content
    assert isinstance(content, types.TextContent)
    return content.text


async def test_a_call_paused_on_a_resumes_on_b(fleet: Fleet) -> None:
    answered: list[str] = []
    async with client(fleet.urls["replica-a"], fleet.token) as a, \
            client(fleet.urls["replica-b"], fleet.token, answered) as b:
        paused = await pause(a, ["colour?"], "paused-a-1")
        assert paused.request_state.endswith(".replica-a")
        assert question(paused) == "colour?"
        done = await resume(b, ["colour?"], paused, "blue")
        assert isinstance(done, types.CallToolResult), done
        assert not done.is_error and done.content[0].text == "blue"  # type: ignore[union-attr]
        assert answered == ["replica-a>replica-b"]
        with pytest.raises(MCPError, match="Invalid or expired requestState"):  # used once
            await resume(b, ["colour?"], paused, "blue")
        with pytest.raises(MCPError, match="Invalid or expired requestState"):
            await resume(a, ["colour?"], paused, "blue")
    assert fleet.runs().count("blue") == 1


async def test_paused_twice_resumed_on_b_then_on_a(fleet: Fleet) -> None:
    questions = ["first?", "second?"]
    async with client(fleet.urls["replica-a"], fleet.token) as a, \
            client(fleet.urls["replica-b"], fleet.token) as b:
        paused = await pause(a, questions, "paused-a-2")
        again = await resume(b, questions, paused, "one")
        assert isinstance(again, types.InputRequiredResult), again  # A's next round, via B
        assert again.request_state.endswith(".replica-a")
        assert again.request_state != paused.request_state
        assert question(again) == "second?"
        done = await resume(a, questions, again, "two")  # the local path on the holder
        assert isinstance(done, types.CallToolResult), done
        assert done.content[0].text == "one | two"  # type: ignore[union-attr]
    assert fleet.runs().count("one | two") == 1


async def test_unknown_forged_and_mismatched_states_are_refused_on_b(fleet: Fleet) -> None:
    async with client(fleet.urls["replica-a"], fleet.token) as a, \
            client(fleet.urls["replica-b"], fleet.token) as b:
        paused = await pause(a, ["mine?"], "paused-a-3")
        forged = paused.model_copy(update={
            "request_state": secrets.token_urlsafe(18) + ".replica-a"})
        with pytest.raises(MCPError, match="Invalid or expired requestState"):
            await resume(b, ["mine?"], forged, "x")
        with pytest.raises(MCPError, match="Invalid or expired requestState"):
            await resume(b, ["other arguments?"], paused, "x")
        done = await resume(b, ["mine?"], paused, "still usable")  # not used by a refusal
        assert done.content[0].text == "still usable"  # type: ignore[union-attr]


async def test_cancelling_a_resume_on_b_cancels_the_call_on_a(
    fleet: Fleet, tmp_path: Path,
) -> None:
    """The resumed call goes on, on A, past the answer (it waits for a file that never
    comes); the client gives up its request to B, and A cancels the call as it would for a
    request of its own."""
    hold = {"hold": str(tmp_path / "never")}
    async with client(fleet.urls["replica-a"], fleet.token) as a, \
            client(fleet.urls["replica-b"], fleet.token) as b:
        paused = await pause(a, ["hold on?"], "cancelled-on-b", **hold)
        with anyio.move_on_after(1):  # the client gives up; not a timing assertion
            await resume(b, ["hold on?"], paused, "holding", **hold)
    with anyio.fail_after(30):  # a hang guard
        while "cancelled" not in fleet.runs():  # noqa: ASYNC110
            await anyio.sleep(0.05)
    assert "holding" not in fleet.runs()


async def test_the_sdk_client_through_round_robin_haproxy(fleet: Fleet) -> None:
    """`Client.call_tool` answers every round itself; with no affinity its resumes alternate
    between the replica that paused the call and the other one."""
    assert fleet.proxy is not None
    asked: list[str] = []

    async def sampling(ctx: Any, params: types.CreateMessageRequestParams) -> Any:
        content = params.messages[0].content
        asked.append(content.text if isinstance(content, types.TextContent) else "?")
        return sampled(f"a{len(asked)}")

    answered: list[str] = []
    questions = ["q1", "q2", "q3", "q4"]
    async with client(fleet.proxy.url, fleet.token, answered,
                      sampling_callback=sampling) as through:
        done = await through.call_tool("ask", {"questions": questions},
                                       meta={CALL_ID_KEY: "balanced-1"})
    assert done.content[0].text == "a1 | a2 | a3 | a4"  # type: ignore[union-attr]
    assert asked == questions
    assert len(answered) == 4, answered
    holders = {pair.partition(">")[0] for pair in answered}
    assert len(holders) == 1 and holders <= set(NAMES), answered  # one holder throughout
    # resumes answered by the holder and by the other replica, within one call
    assert {pair.partition(">")[2] for pair in answered} == set(NAMES), answered
    assert fleet.runs().count("a1 | a2 | a3 | a4") == 1


@pytest.fixture
def short_lived(tmp_path: Path, postgres_server: PostgresServer) -> Iterator[Fleet]:
    """A fleet of its own whose replicas count a holder gone after 2 s of silence (the
    claim TTL), for a test that kills one."""
    started = start_fleet(tmp_path, postgres_server, env_extra={"SIDECAR_CLAIM_TTL": "2"})
    try:
        yield started
    finally:
        stop_fleet(started)


async def test_a_resume_after_the_holder_was_killed_names_it(short_lived: Fleet) -> None:
    """Killed right after pausing: B hands the responses over, then finds A silent and says
    so (not a hang, not "expired")."""
    own = short_lived
    async with client(own.urls["replica-a"], own.token) as a:
        paused = await pause(a, ["still there?"], "paused-killed")
    own.procs["replica-a"].send_signal(signal.SIGKILL)
    own.procs["replica-a"].wait(timeout=10)
    async with client(own.urls["replica-b"], own.token) as b:
        with pytest.raises(MCPError, match="paused on replica 'replica-a', which stopped"
                           ) as failed:
            await resume(b, ["still there?"], paused, "yes")
    assert "the paused call is gone; call the tool again" in failed.value.message
    assert set(own.runs()) <= {"cancelled"}  # the upstream's call ended with A, unanswered


LOG_LEVEL = "io.modelcontextprotocol/logLevel"


async def paused_by_the_sdk(url: str, token: str, arguments: dict[str, Any],
                            call_id: str) -> tuple[types.InputRequiredResult, httpx2.Request]:
    """A call paused on `url` by the SDK's client (its request with a progress token), and
    that request as sent: the envelope a raw resume copies."""
    sent: list[httpx2.Request] = []

    async def ignored(progress: float, total: float | None, message: str | None) -> None:
        return None

    async with client(url, token, sent=sent) as on:
        paused = await on.session.call_tool("ask", arguments, progress_callback=ignored,
                                            meta={CALL_ID_KEY: call_id},
                                            allow_input_required=True)
    assert isinstance(paused, types.InputRequiredResult), paused
    (request,) = [r for r in sent if b'"tools/call"' in r.content]
    return paused, request


async def raw_resume(url: str, like: httpx2.Request, paused: types.InputRequiredResult,
                     answer: str, meta: dict[str, Any]) -> list[dict[str, Any]]:
    """Resume `paused` on `url` with a request copied from `like` (its headers, envelope and
    arguments; `meta` added to its `_meta`): every JSON-RPC message of the answer's stream,
    in order."""
    body = json.loads(like.content)
    params = body["params"]
    (key,) = paused.input_requests
    params["requestState"] = paused.request_state
    params["inputResponses"] = {key: sampled(answer).model_dump(mode="json", by_alias=True,
                                                                exclude_none=True)}
    params["_meta"] = {k: v for k, v in params["_meta"].items()
                       if k not in (CALL_ID_KEY, "progressToken")} | meta
    body["id"] = 99
    headers = {k: v for k, v in like.headers.items()
               if k.lower() not in ("content-length", "host")}
    async with httpx2.AsyncClient(timeout=httpx2.Timeout(30)) as http:
        response = await http.post(f"{url}/mcp", content=json.dumps(body).encode(),
                                   headers=headers)
    assert response.status_code == 200, response.text
    holder = paused.request_state.rpartition(".")[2]
    assert response.headers["sidecar-replica"] != holder  # answered by the other replica
    if response.headers["content-type"].startswith("application/json"):
        return [response.json()]
    return [json.loads(line[5:]) for line in response.text.splitlines()
            if line.startswith("data:") and line[5:].strip()]


async def test_progress_and_logs_of_a_call_resumed_on_b_reach_the_sdk_client(
    fleet: Fleet,
) -> None:
    """The SDK's client: paused on A with one progress callback, resumed on B with another:
    B's request gets the progress the call reports on A after the resume (the SDK delivers a
    progress notification only to the request whose token it carries), and its log lines."""
    before: list[tuple[float, float | None]] = []
    after: list[tuple[float, float | None]] = []
    logs: list[Any] = []

    async def on_before(progress: float, total: float | None, message: str | None) -> None:
        before.append((progress, total))

    async def on_after(progress: float, total: float | None, message: str | None) -> None:
        after.append((progress, total))

    async def on_log(params: types.LoggingMessageNotificationParams) -> None:
        logs.append(params.data)

    asked = ["progress?"]
    async with client(fleet.urls["replica-a"], fleet.token) as a, \
            client(fleet.urls["replica-b"], fleet.token, logging_callback=on_log,
                   log_level="info") as b:
        paused = await pause(a, asked, "relayed-sdk", on_before, progress=3, logs=2)
        done = await resume(b, asked, paused, "fine", on_after, progress=3, logs=2)
        assert isinstance(done, types.CallToolResult), done
        assert done.content[0].text == "fine"  # type: ignore[union-attr]
        with anyio.fail_after(10):  # a hang guard: the SDK hands notifications to tasks
            while len(logs) < 2 or not after or after[-1] != (3, 3):  # noqa: ASYNC110
                await anyio.sleep(0.02)
    assert before == []  # nothing was reported before the pause
    values = [value for value, _ in after]
    assert values == sorted(set(values)) and set(values) <= {1, 2, 3}  # coalesced, in order
    assert logs == ["log 1", "log 2"]


async def test_notifications_come_before_the_result_with_the_resumed_requests_token(
    fleet: Fleet,
) -> None:
    """On the wire: B's answer to the resume is an event stream of A's notifications, each
    progress carrying the resumed request's own token, then the result."""
    arguments = {"questions": ["order?"], "progress": 3, "logs": 3}
    paused, like = await paused_by_the_sdk(fleet.urls["replica-a"], fleet.token, arguments,
                                           "relayed-raw")
    sent = await raw_resume(fleet.urls["replica-b"], like, paused, "ordered",
                            {"progressToken": "resumed-token", LOG_LEVEL: "info"})
    *notes, last = sent
    assert last["result"]["content"][0]["text"] == "ordered", last
    assert all(n.get("method") for n in notes), notes
    progress = [n["params"] for n in notes if n["method"] == "notifications/progress"]
    assert {p["progressToken"] for p in progress} == {"resumed-token"}
    values = [p["progress"] for p in progress]
    assert values == sorted(set(values)) and values[-1] == 3 and progress[-1]["total"] == 3
    logged = [n["params"]["data"] for n in notes if n["method"] == "notifications/message"]
    assert logged == ["log 1", "log 2", "log 3"]
    assert fleet.runs().count("ordered") == 1


async def test_log_messages_past_the_cap_are_counted_not_relayed(fleet: Fleet) -> None:
    """A chatty tool: the first LOGS_PER_ROUND log messages of the continued round reach the
    client, then one warning counts the rest, then the result; without a log level opted in,
    none."""
    extra = 5
    arguments = {"questions": ["chatty?"], "logs": LOGS_PER_ROUND + extra}
    paused, like = await paused_by_the_sdk(fleet.urls["replica-a"], fleet.token, arguments,
                                           "relayed-cap")
    sent = await raw_resume(fleet.urls["replica-b"], like, paused, "capped",
                            {LOG_LEVEL: "info"})
    *notes, last = sent
    assert last["result"]["content"][0]["text"] == "capped", last
    logged = [n["params"] for n in notes if n["method"] == "notifications/message"]
    assert [p["data"] for p in logged[:-1]] == [f"log {n}" for n in
                                                range(1, LOGS_PER_ROUND + 1)]
    assert logged[-1]["level"] == "warning"
    assert logged[-1]["data"].startswith(f"{extra} more log messages of this call were not "
                                         "relayed")
    paused, like = await paused_by_the_sdk(fleet.urls["replica-a"], fleet.token,
                                           {"questions": ["quiet?"], "logs": 3}, "relayed-off")
    sent = await raw_resume(fleet.urls["replica-b"], like, paused, "quiet", {})
    assert [m.get("method") for m in sent] == [None], sent  # the result alone


async def test_after_a_round_relayed_through_b_a_resume_on_a_gets_its_progress(
    fleet: Fleet,
) -> None:
    """Paused on A, resumed on B (which relays for its request), paused again, resumed on A:
    the progress reported after that goes to A's own request again, not to B's spent relay."""
    questions = ["first?", "second?"]
    seen: list[tuple[float, float | None]] = []

    async def ignored(progress: float, total: float | None, message: str | None) -> None:
        return None

    async def on_a(progress: float, total: float | None, message: str | None) -> None:
        seen.append((progress, total))

    async with client(fleet.urls["replica-a"], fleet.token) as a, \
            client(fleet.urls["replica-b"], fleet.token) as b:
        paused = await pause(a, questions, "relayed-then-local", ignored, progress=2)
        again = await resume(b, questions, paused, "one", ignored, progress=2)
        assert isinstance(again, types.InputRequiredResult), again
        done = await resume(a, questions, again, "two", on_a, progress=2)
        assert done.content[0].text == "one | two"  # type: ignore[union-attr]
        with anyio.fail_after(10):  # a hang guard: the SDK hands progress to tasks
            while not seen or seen[-1] != (2, 2):  # noqa: ASYNC110
                await anyio.sleep(0.02)
