"""The daemon's local doors: Unix sockets in the state directory, mode 0600 (`bind_unix`), and
`StdioDoor`, which serves `sidecar stdio` clients on one of them (the protocol is
`sidecar.serve.local_door`'s).

    listener = bind_unix(state / "daemon.sock")     # HTTP (/v1, /mcp): handed to uvicorn
    door = StdioDoor(location, state / "stdio.sock", daemon=info)
    await door.run()                                # MCP sessions until cancelled

Imports `sidecar.location`, `sidecar.registry`, `sidecar.serve.local_door` and
`sidecar.serve.mcp_facade`. Exports `bind_unix`, `StdioDoor` and `Activity`.
"""

from __future__ import annotations

import array
import asyncio
import contextlib
import json
import logging
import os
import socket
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
from starlette.types import ASGIApp, Receive, Scope, Send

from sidecar.registry.profiles import UnknownProfile
from sidecar.serve.local_door import DaemonInfo, manifests_mismatch
from sidecar.serve.mcp_facade import serve_stdio

if TYPE_CHECKING:
    from sidecar.location.location import Location

log = logging.getLogger("sidecar.door")

HELLO_TIMEOUT = 10.0
MAX_HELLO_BYTES = 1 << 20
ACCEPT_RETRY = 0.5
"""How long the door waits after a failed accept (out of descriptors) before the next one."""


def bind_unix(path: Path) -> socket.socket:
    """A listening Unix socket at `path`, mode 0600 from the start (bound under a temporary
    name, then renamed over any stale socket)."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}")
    with contextlib.suppress(FileNotFoundError):
        temporary.unlink()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(str(temporary))
        os.chmod(temporary, 0o600)
        sock.listen(64)
        os.replace(temporary, path)
    except BaseException:
        sock.close()
        with contextlib.suppress(FileNotFoundError):
            temporary.unlink()
        raise
    sock.setblocking(False)
    return sock


class StdioDoor:
    """Serves `sidecar stdio` clients on a Unix socket: one MCP session per client. In
    "fds" mode the client hands over its stdin and stdout and the session runs on them
    exactly as `sidecar stdio` on its own pipes would (the same fast paths; no bytes pass
    through the client process); in "stream" mode the connection itself carries the session.
    A client asking for other manifests than the daemon's is refused with one line that says
    so. One session's failure ends that session alone (logged); a client going away
    mid-answer is no failure at all."""

    def __init__(self, location: Location, path: Path, *, daemon: DaemonInfo) -> None:
        self.location = location
        self.path = path
        self.daemon = daemon
        self.sessions = 0
        self.served = 0
        self.last_active = time.monotonic()

    async def run(self) -> None:
        """Accept clients until cancelled; leaving ends every session and removes the socket."""
        listener = bind_unix(self.path)
        loop = asyncio.get_running_loop()
        try:
            async with anyio.create_task_group() as tg:
                while True:
                    try:
                        conn, _ = await loop.sock_accept(listener)
                    except OSError as exc:  # EMFILE and the like: the door stays open
                        log.warning("%s could not accept a client: %s", self.path, exc)
                        await anyio.sleep(ACCEPT_RETRY)
                        continue
                    tg.start_soon(self._session, conn)
        finally:
            listener.close()
            with contextlib.suppress(FileNotFoundError):
                self.path.unlink()

    async def _session(self, conn: socket.socket) -> None:
        """One client's session; whatever goes wrong in it ends it alone, logged."""
        self.sessions += 1
        try:
            await self._attach(conn)
        except Exception:
            log.exception("the session of a client on %s failed; other clients are unaffected",
                          self.path)
        finally:
            conn.close()
            self.sessions -= 1
            self.last_active = time.monotonic()

    async def _attach(self, conn: socket.socket) -> None:
        fds: list[int] = []
        try:
            try:
                hello, fds = await asyncio.to_thread(_receive_hello, conn)
            except (OSError, ValueError) as exc:
                log.warning("a client on %s sent no valid hello: %s", self.path, exc)
                return
            refusal = manifests_mismatch(self.daemon, hello.get("manifests"))
            mode = hello.get("mode")
            profile = hello.get("profile")
            if refusal is None:
                refusal = self._profile_refusal(profile)
            if refusal is None and mode == "fds" and len(fds) != 2:
                refusal = "the hello asked for mode 'fds' but did not carry two descriptors"
            elif refusal is None and mode not in ("fds", "stream"):
                refusal = f"unknown mode {mode!r}"
            loop = asyncio.get_running_loop()
            answer = ({"ok": False, "error": refusal} if refusal is not None
                      else {"ok": True, "daemon": self.daemon.to_json()})
            try:
                await loop.sock_sendall(conn, json.dumps(answer).encode() + b"\n")
            except OSError as exc:
                log.info("client pid %s left before its answer: %s", hello.get("pid"), exc)
                return
            if refusal is not None:
                log.info("refused a client (pid %s): %s", hello.get("pid"), refusal)
                return
            self.served += 1
            log.info("client pid %s attached (%s; %d session(s))", hello.get("pid"), mode,
                     self.sessions)
            if mode == "fds":
                wire, fds = (fds[0], fds[1]), []
                await self._serve_until_gone(conn, wire, profile)
            else:  # the connection is the wire, both ways (one socket transport)
                await serve_stdio(self.location, profile=profile,
                                  fds=(os.dup(conn.fileno()), os.dup(conn.fileno())))
        finally:
            for fd in fds:
                os.close(fd)

    def _profile_refusal(self, profile: Any) -> str | None:
        if profile is not None and not isinstance(profile, str):
            return "the hello's profile is not a string"
        try:
            self.location.profiles.resolve(profile)
        except UnknownProfile as exc:
            return str(exc)
        return None

    async def _serve_until_gone(
        self, conn: socket.socket, wire: tuple[int, int], profile: str | None
    ) -> None:
        """Serve the client's pipes; a client process that dies ends its session too."""
        loop = asyncio.get_running_loop()
        async with anyio.create_task_group() as tg:

            async def watch() -> None:
                with contextlib.suppress(OSError):
                    while await loop.sock_recv(conn, 1):
                        pass
                tg.cancel_scope.cancel()

            tg.start_soon(watch)
            await serve_stdio(self.location, fds=wire, profile=profile)
            tg.cancel_scope.cancel()


def _receive_hello(conn: socket.socket) -> tuple[dict[str, Any], list[int]]:
    """The client's hello line and the descriptors that came with it (blocking; a thread)."""
    conn.settimeout(HELLO_TIMEOUT)
    data = b""
    fds: list[int] = []
    try:
        while not data.endswith(b"\n"):
            chunk, ancillary, _, _ = conn.recvmsg(4096, socket.CMSG_SPACE(8 * 4))
            for level, kind, payload in ancillary:
                if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                    received = array.array("i")
                    received.frombytes(payload[: len(payload) - len(payload) % received.itemsize])
                    fds.extend(received)
            if not chunk:
                raise ValueError("the connection ended before the hello")
            data += chunk
            if len(data) > MAX_HELLO_BYTES:
                raise ValueError("the hello is too long")
        value = json.loads(data)
        if not isinstance(value, dict):
            raise ValueError("the hello is not a JSON object")
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise
    finally:
        conn.setblocking(False)
    return value, fds


class Activity:
    """ASGI wrapper that counts HTTP requests in flight and when the last one ended (for a
    daemon's `--idle-exit`)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.inflight = 0
        self.last_active = time.monotonic()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        self.inflight += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.inflight -= 1
            self.last_active = time.monotonic()
