"""Where a CLI command runs (its target): an embedded Location, or a running daemon over `/v1`
(`sidecar.cli` picks one; `Backend` is what both offer)."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import sys
from contextlib import AbstractAsyncContextManager, AsyncExitStack
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Protocol

from sidecar.events import CallProgress
from sidecar.location import Location
from sidecar.tool import ToolContext

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

    async def tools(self, fmt: str | None) -> list[dict[str, Any]]: ...

    async def call(
        self, name: str, raw_input: str, context: dict[str, str], *, show_progress: bool
    ) -> dict[str, Any]: ...

    async def health(self) -> dict[str, Any]: ...


class OpenLocation(Protocol):
    """`Location.open` as the CLI entry point wires it (`sidecar.daemon.Location.open`)."""

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

    async def tools(self, fmt: str | None) -> list[dict[str, Any]]:
        definitions = self._loc().snapshot(hide_denied=False, keep=False).definitions
        if fmt is None:
            return [d.to_json() for d in definitions]
        from sidecar.serve.replay import definitions_for, parse_format

        return list(definitions_for(parse_format(fmt), definitions))

    async def call(
        self, name: str, raw_input: str, context: dict[str, str], *, show_progress: bool
    ) -> dict[str, Any]:
        location = self._loc()
        snapshot = location.snapshot(session_id=context["session_id"])
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

    async def __aenter__(self) -> RemoteBackend:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._client.aclose()

    async def _request(self, method: str, path: str, **kwargs: Any) -> Any:
        return self._answer(await self._send(method, path, **kwargs))

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

    async def tools(self, fmt: str | None) -> list[dict[str, Any]]:
        body = await self._request("GET", "/v1/tools", params={"format": fmt or "mcp"})
        return list(body["tools"])

    async def approve(self, name: str) -> dict[str, Any]:
        """Accept a tool's changed upstream definition (`sidecar.pins`)."""
        from urllib.parse import quote

        body = await self._request("POST", f"/v1/tools/{quote(name, safe='')}/approve")
        return dict(body["approved"])

    async def call(
        self, name: str, raw_input: str, context: dict[str, str], *, show_progress: bool
    ) -> dict[str, Any]:
        snapshot = await self._request(
            "POST", "/v1/snapshots", json={"session_id": context["session_id"]}
        )
        body = {"name": name, "input": json.loads(raw_input), "context": context}
        path = f"/v1/snapshots/{snapshot['id']}/calls"
        if not show_progress:
            result: dict[str, Any] = await self._request("POST", path, json=body)
            return result
        follower = asyncio.create_task(self._follow_progress(context["call_id"]))
        try:
            result = await self._request("POST", path, json=body)
        finally:
            follower.cancel()
            await asyncio.wait([follower])
            _end_progress()
        return result

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
        result: dict[str, Any] = await self._request("GET", "/v1/calls", params=params)
        return result
