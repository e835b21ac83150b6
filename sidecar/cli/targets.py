"""Where a CLI command runs (its target): an embedded Location, or a running daemon over `/v1`
(`sidecar.cli.commands` picks one; `Backend` is what both offer)."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import sys
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, AsyncExitStack
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Protocol

from sidecar.location.location import Location
from sidecar.model.events import CallProgress
from sidecar.model.tool import ToolContext

if TYPE_CHECKING:
    import httpx


class Unreachable(Exception):
    """The configured daemon does not answer. `refused`: nothing was listening (no request
    reached it), so asking again, of another daemon, is safe."""

    def __init__(self, message: str, *, refused: bool = False) -> None:
        super().__init__(message)
        self.refused = refused


class Refused(Exception):
    """The daemon answered the request with an error (4xx/5xx): its HTTP `status` and /v1
    error `code` ("" when the body was not a /v1 error)."""

    def __init__(self, message: str, *, status: int = 0, code: str = "") -> None:
        super().__init__(message)
        self.status = status
        self.code = code

    @property
    def database_down(self) -> bool:
        """The daemon's fleet database failed under the request (503 `unavailable`, naming
        it): the CLI exits 6 as when it uses the database itself."""
        return self.status == 503 and self.code == "unavailable"


INTERRUPTS = (signal.SIGINT, signal.SIGTERM)
ASK_NOTICE_AFTER = 0.3
"""How long a call runs before the CLI looks for a permission ask it waits on (then every
`ASK_POLL` seconds)."""
ASK_POLL = 1.0
WITHDRAW_TIMEOUT = 5.0
"""How long an interrupted call waits for the daemon to cancel it."""
UNKNOWN_CALL_GRACE = 0.5
"""How long an interrupted call asks again of a daemon that does not know it yet (its
request may be on the way)."""


class Interrupted(Exception):
    """SIGINT or SIGTERM ended a call: `signum`, its `call_id`, and what the daemon did
    (`RemoteBackend._withdraw`)."""

    def __init__(self, signum: int, call_id: str, withdrawn: str) -> None:
        super().__init__(call_id)
        self.signum, self.call_id, self.withdrawn = signum, call_id, withdrawn

    def line(self) -> str:
        """What the CLI prints: one line."""
        name = signal.Signals(self.signum).name
        return f"sidecar: interrupted ({name}): " + {
            "cancelled": f"call {self.call_id} was cancelled on the daemon; a permission ask "
                         "it waited on is withdrawn, so nothing runs it later",
            "settled": f"call {self.call_id} had already finished (`sidecar calls` shows it)",
            "unknown": f"call {self.call_id} had not reached the daemon",
            "unanswered": f"the daemon did not confirm cancelling call {self.call_id} "
                          f"(`sidecar calls` shows what became of it)",
        }[self.withdrawn]


def ask_notice(ask: dict[str, Any], url: str | None) -> str:
    """Where to answer the permission ask a call waits on (`url`: the daemon's HTTP address,
    whose console lists it; None for a daemon on its local doors only)."""
    console = f" in the console at {url.rstrip('/')}/ui/asks or" if url else ""
    return (f"sidecar: waiting for a permission answer to {ask.get('action')!r} (ask "
            f"{ask.get('id')}): answer it{console} with `sidecar asks reply "
            f"{ask.get('id')} once|always|reject`")


def find_daemon(state_dir: str) -> str | None:
    """The URL of a `sidecar serve` running on this state directory, if its pid is alive."""
    try:
        info = json.loads((Path(state_dir) / "daemon.json").read_text())
        os.kill(int(info["pid"]), 0)
    except (OSError, ValueError, KeyError, TypeError):
        return None
    url = info.get("url")
    return url if isinstance(url, str) else None


def _show_progress(snapshot: dict[str, Any]) -> None:
    """One progress snapshot on stderr: rewritten in place on a terminal, one plain line per
    snapshot otherwise (no escape codes into a pipe or a file)."""
    text = json.dumps(snapshot, ensure_ascii=False)
    if sys.stderr.isatty():
        width = shutil.get_terminal_size().columns - 3
        print(f"\r\033[2K… {text[:max(width, 20)]}", end="", file=sys.stderr, flush=True)
    else:
        print(f"progress: {text[:2000]}", file=sys.stderr, flush=True)


def _end_progress() -> None:
    if sys.stderr.isatty():
        print("\r\033[2K", end="", file=sys.stderr, flush=True)


class Backend(Protocol):
    async def __aenter__(self) -> Backend: ...

    async def __aexit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None: ...

    async def tools(self, fmt: str | None, profile: str | None = None) -> list[dict[str, Any]]:
        ...

    async def tool_tokens(self, profile: str | None = None) -> dict[str, Any]:
        """The tokens of the served definitions (`GET /v1/tools`' token fields)."""
        ...

    async def call(
        self, name: str, raw_input: str, context: dict[str, str], *, show_progress: bool,
        profile: str | None = None,
    ) -> dict[str, Any]: ...

    async def health(self) -> dict[str, Any]: ...


STARTUP_WAIT = 120.0
"""How long `tools`, `call`, `managed read` and `check --live` wait for a daemon's servers
still starting."""


async def servers_started(backend: Backend) -> None:
    """Wait until no upstream server of the daemon is still on its first attempt (a daemon
    starts them in the background), so that the command sees their tools."""
    deadline = asyncio.get_running_loop().time() + STARTUP_WAIT
    while asyncio.get_running_loop().time() < deadline:
        servers = (await backend.health()).get("servers", {})
        if not any(server.get("state") == "starting" for server in servers.values()):
            return
        await asyncio.sleep(0.1)


class OpenLocation(Protocol):
    """`Location.open` as the CLI entry point wires it (`sidecar.daemon.daemon.Location.open`)."""

    def __call__(
        self, root: str, *, state_dir: str, manifests: list[str]
    ) -> AbstractAsyncContextManager[Location]: ...


class EmbeddedBackend:
    def __init__(self, state_dir: str, manifests: list[str], open_location: OpenLocation) -> None:
        self._state_dir = state_dir
        self._manifests = manifests
        self._open_location = open_location
        self._stack = AsyncExitStack()
        self.location: Location | None = None

    async def __aenter__(self) -> EmbeddedBackend:
        self.location = await self._stack.enter_async_context(
            self._open_location(".", state_dir=self._state_dir, manifests=self._manifests)
        )
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._stack.aclose()

    def _loc(self) -> Location:
        assert self.location is not None
        return self.location

    async def tools(self, fmt: str | None, profile: str | None = None) -> list[dict[str, Any]]:
        snapshot = self._loc().snapshot(hide_denied=False, keep=False, profile=profile)
        if fmt is None:
            return [d.to_json() for d in snapshot.definitions]
        from sidecar.codemode.tool_search import advertised
        from sidecar.formats import definitions_for, parse_format

        chosen = parse_format(fmt)  # a search profile: as GET /v1/tools answers
        listed, deferred = advertised(snapshot, native_search=chosen == "anthropic")
        return list(definitions_for(chosen, listed, deferred=deferred))

    async def tool_tokens(self, profile: str | None = None) -> dict[str, Any]:
        from sidecar.serve.tool_tokens import tool_tokens

        location = self._loc()
        if profile == "*":
            served = location.profiles.entries(None, location.registry.effective())
            definitions = tuple(e.definition for e in served.values())
        else:
            definitions = location.snapshot(hide_denied=False, keep=False,
                                            profile=profile).definitions
        return (await tool_tokens(location, definitions)).to_json()

    async def call(
        self, name: str, raw_input: str, context: dict[str, str], *, show_progress: bool,
        profile: str | None = None,
    ) -> dict[str, Any]:
        location = self._loc()
        snapshot = location.snapshot(session_id=context["session_id"], profile=profile)
        ctx = ToolContext(**context)
        if not show_progress:
            return (await snapshot.execute(name, raw_input, ctx)).to_json()
        async with location.events.subscribe() as sub:
            call = asyncio.create_task(snapshot.execute(name, raw_input, ctx))
            while not call.done():
                waiter = asyncio.create_task(sub.next())
                await asyncio.wait([call, waiter], return_when=asyncio.FIRST_COMPLETED)
                if waiter.done():
                    event = waiter.result()
                    if isinstance(event, CallProgress) and event.call_id == ctx.call_id:
                        _show_progress(event.snapshot)
                else:
                    waiter.cancel()
            _end_progress()
            return (await call).to_json()

    async def health(self) -> dict[str, Any]:
        return await self._loc().health()


class RemoteBackend:
    """A daemon over HTTP: at `url`, or through the Unix socket `uds` (then `url` only names
    the Host the requests carry)."""

    def __init__(self, url: str, state_dir: str, *, uds: str | None = None) -> None:
        token = os.environ.get("SIDECAR_TOKEN")
        if not token:
            try:
                token = (Path(state_dir) / "token").read_text().strip()
            except OSError:
                token = None
        headers = {"authorization": f"Bearer {token}"} if token else {}
        import httpx  # only a client of a running daemon needs it (`sidecar stdio` does not)

        transport = httpx.AsyncHTTPTransport(uds=uds) if uds is not None else None
        self._client: httpx.AsyncClient = httpx.AsyncClient(
            base_url=url, headers=headers, timeout=None, transport=transport)
        self._url = uds or url
        self._state_dir = state_dir
        self._http_url = url if uds is None else None

    async def __aenter__(self) -> RemoteBackend:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._client.aclose()

    async def request(self, method: str, path: str, **kwargs: Any) -> Any:
        """The daemon's JSON answer to one `/v1` request (`Refused` for an error)."""
        return self._answer(await self._send(method, path, **kwargs))


    async def events(self, path: str, **kwargs: Any) -> AsyncIterator[tuple[str, Any]]:
        """The `(event, data)` pairs of an event stream from the daemon (`Refused` for an
        error answer), until it ends."""
        import httpx

        try:
            async with self._client.stream("GET", path, **kwargs) as response:
                if response.status_code >= 400:
                    await response.aread()
                    self._answer(response)
                event = ""
                async for line in response.aiter_lines():
                    if line.startswith("event: "):
                        event = line[7:]
                    elif line.startswith("data: "):
                        yield event, json.loads(line[6:])
        except httpx.TransportError as exc:
            raise Unreachable(f"the daemon at {self._url} is unreachable: {exc}",
                              refused=isinstance(exc, httpx.ConnectError)) from None

    async def _send(self, method: str, path: str, **kwargs: Any) -> Any:
        import httpx

        try:
            return await self._client.request(method, path, **kwargs)
        except httpx.TransportError as exc:
            raise Unreachable(f"the daemon at {self._url} is unreachable: {exc}",
                              refused=isinstance(exc, httpx.ConnectError)) from None

    def _answer(self, response: Any) -> Any:
        if response.status_code >= 400:
            code = ""
            try:
                error = response.json()["error"]
                code, message = str(error["code"]), f"{error['code']}: {error['message']}"
            except (ValueError, KeyError, TypeError):
                message = response.text[:500]
            raise Refused(f"the daemon at {self._url} answered {response.status_code}: {message}",
                          status=response.status_code, code=code)
        return response.json()

    async def tools(self, fmt: str | None, profile: str | None = None) -> list[dict[str, Any]]:
        params = {"format": fmt or "mcp", **({"profile": profile} if profile else {})}
        body = await self.request("GET", "/v1/tools", params=params)
        return list(body["tools"])

    async def tool_tokens(self, profile: str | None = None) -> dict[str, Any]:
        params = {"format": "mcp", **({"profile": profile} if profile else {})}
        body = await self.request("GET", "/v1/tools", params=params)
        return {k: body[k] for k in ("token_encoding", "tokens", "total_tokens",
                                     "tokens_by_server")}

    async def approve(self, name: str) -> dict[str, Any]:
        """Accept a tool's changed upstream definition (`sidecar.policy.pins`)."""
        from urllib.parse import quote

        body = await self.request("POST", f"/v1/tools/{quote(name, safe='')}/approve")
        return dict(body["approved"])

    async def call(
        self, name: str, raw_input: str, context: dict[str, str], *, show_progress: bool,
        profile: str | None = None,
    ) -> dict[str, Any]:
        """The call's outcome. SIGINT or SIGTERM while it runs cancels it on the daemon (a
        permission ask it waits on is withdrawn, so a later answer runs nothing), then raises
        `Interrupted`."""
        body = json.loads(raw_input)  # before anything reaches the daemon
        work = asyncio.create_task(self._call(name, body, context, show_progress, profile))
        signals: list[int] = []
        loop = asyncio.get_running_loop()

        def interrupt(signum: int) -> None:
            signals.append(signum)
            work.cancel()

        for signum in INTERRUPTS:
            loop.add_signal_handler(signum, interrupt, signum)
        try:
            return await work
        except asyncio.CancelledError:
            if not signals or not work.cancelled():
                raise
        finally:
            for signum in INTERRUPTS:
                loop.remove_signal_handler(signum)
        raise Interrupted(signals[0], context["call_id"], await self._withdraw(context["call_id"]))

    async def _call(self, name: str, raw_input: Any, context: dict[str, str],
                    show_progress: bool, profile: str | None) -> dict[str, Any]:
        snapshot = await self.request(
            "POST", "/v1/snapshots",
            json={"session_id": context["session_id"],
                  **({"profile": profile} if profile is not None else {})},
        )
        body = {"name": name, "input": raw_input, "context": context}
        path = f"/v1/snapshots/{snapshot['id']}/calls"
        watchers = [asyncio.create_task(self._say_where_to_answer(context))]
        if show_progress:
            watchers.append(asyncio.create_task(self._follow_progress(context["call_id"])))
        try:
            result: dict[str, Any] = await self.request("POST", path, json=body)
        finally:
            for watcher in watchers:
                watcher.cancel()
            await asyncio.wait(watchers)
            if show_progress:
                _end_progress()
        return result

    async def _say_where_to_answer(self, context: dict[str, str]) -> None:
        """Once the call waits for a permission answer, say where to give it (stderr)."""
        import httpx

        await asyncio.sleep(ASK_NOTICE_AFTER)
        while True:
            try:
                listed = await self.request("GET", "/v1/permissions",
                                             params={"session_id": context["session_id"]})
            except (Refused, Unreachable, httpx.HTTPError, ValueError):
                return  # best effort: the call itself reports what went wrong
            for ask in listed.get("pending", []):
                if ask.get("source", {}).get("call_id") == context["call_id"]:
                    url = self._http_url or find_daemon(self._state_dir)
                    print(ask_notice(ask, url), file=sys.stderr, flush=True)
                    return
            await asyncio.sleep(ASK_POLL)

    async def _withdraw(self, call_id: str) -> str:
        """Cancel `call_id` on the daemon and wait (bounded) until it is no longer running:
        "cancelled", "settled" (it had finished), "unknown" (the daemon never got it) or
        "unanswered" (the daemon did not answer in time)."""
        import httpx

        try:
            async with asyncio.timeout(WITHDRAW_TIMEOUT):
                response = await self._send("DELETE", f"/v1/calls/{call_id}")
                # a request already sent may start the call just after: look again a while
                for _ in range(int(UNKNOWN_CALL_GRACE / 0.05)):
                    if response.status_code != 404:
                        break
                    await asyncio.sleep(0.05)
                    response = await self._send("DELETE", f"/v1/calls/{call_id}")
                if response.status_code == 409:
                    return "settled"
                if response.status_code == 404:
                    return "unknown"
                while True:  # the daemon's cancel ends the call (and its ask) just after
                    state = await self._send("GET", f"/v1/calls/{call_id}")
                    if state.status_code != 200 or state.json().get("status") != "running":
                        return "cancelled"
                    await asyncio.sleep(0.05)
        except (TimeoutError, Refused, Unreachable, httpx.HTTPError, ValueError):
            return "unanswered"

    async def _follow_progress(self, call_id: str) -> None:
        """Show the call's progress snapshots from the daemon's event stream (best effort)."""
        async with self._client.stream("GET", "/v1/events") as response:
            async for line in response.aiter_lines():
                if not line.startswith("data: "):
                    continue
                event = json.loads(line[6:])
                if event.get("call_id") == call_id and isinstance(event.get("snapshot"), dict):
                    _show_progress(event["snapshot"])

    async def health(self) -> dict[str, Any]:
        """The daemon's health report, also when it answers 503 with one (its fleet database
        does not answer: status "unavailable")."""
        response = await self._send("GET", "/v1/health")
        if response.status_code == 503:
            try:
                report = response.json()
            except ValueError:
                report = None
            if isinstance(report, dict) and "status" in report:
                return report
        result: dict[str, Any] = self._answer(response)
        return result

    async def history(self, params: dict[str, str]) -> dict[str, Any]:
        result: dict[str, Any] = await self.request("GET", "/v1/calls", params=params)
        return result
