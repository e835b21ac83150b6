"""What an upstream server sends us besides tool listings, handed to whoever serves clients.
Imports nothing of ours; exports `Relay` (who gets what: its docstring), `RelayTarget`,
`InflightCall`, `NO_CLIENT`, `CALLER_CAPABILITIES`, `CALLER_INPUT_RESPONSES`, `CALLER_HEADERS`,
`INPUT_KEY`, `UPSTREAM_CALL` and `UPSTREAM_TASK` (each variable's docstring says who sets it).

An upstream connection is shared by every downstream client and opened at daemon start, before
any client exists: it advertises `sampling`, `elicitation` and `roots` (upstreams such as
server-everything add tools only for clients that have them), and each server-to-client request
is routed, through the pool's `Relay`, to the downstream session whose call it belongs to.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Protocol

import mcp_types as types

from sidecar.model.frozen import quick_init

log = logging.getLogger("bridges.mcp")

CALLER_CAPABILITIES: ContextVar[dict[str, Any] | None] = ContextVar(
    "sidecar_caller_capabilities", default=None)
"""The downstream caller's client capabilities, set by the frontend for the request it serves.
A 2026-07-28 server hears capabilities per request: while this is set, every request to such a
server declares these instead of the gateway's, so the server sees what the client can answer
(and refuses with -32021 what it cannot)."""
INPUT_KEY: ContextVar[str | None] = ContextVar("sidecar_input_key", default=None)
"""The key a server gave the request embedded in its `input_required` round, while that request
is being relayed."""
CALLER_INPUT_RESPONSES: ContextVar[Any] = ContextVar("sidecar_input_responses", default=None)
"""The `inputResponses` a client sent with a `tools/call` that carries no `requestState`,
handed on with the first request of the call (the spec's SHOULD)."""
CALLER_HEADERS: ContextVar[Sequence[tuple[bytes, bytes]] | None] = ContextVar(
    "sidecar_caller_headers", default=None)
"""The headers of the HTTP request a call came with (ASGI `(name, value)` byte pairs, names
lower-case), for servers with `forward_headers`."""
UPSTREAM_TASK: ContextVar[Callable[[], None] | None] = ContextVar(
    "sidecar_upstream_task", default=None)
"""Called when the server answers the call with a task (SEP-2663), which the bridge then
follows to its end (`tasks/get`, its input rounds through `tasks/update`)."""

NO_CLIENT = (
    "no downstream client can answer {method}: it is only relayed while one client session has "
    "a call in flight on this server"
)


@quick_init  # built for every call
@dataclass(frozen=True, slots=True)
class InflightCall:
    """One tool call in flight on an upstream server: the runner context it came with."""

    session_id: str
    call_id: str


UPSTREAM_CALL: ContextVar[InflightCall | None] = ContextVar(
    "sidecar_upstream_call", default=None)
"""The call whose `tools/call` request the current task sent (`calls.Caller`)."""


class RelayTarget(Protocol):
    """The frontend side of the relay. Implementations must not raise."""

    async def server_request(
        self, server: str, calls: Sequence[InflightCall], method: str, params: Any
    ) -> Any:
        """Answer `sampling/createMessage`, `elicitation/create` or `roots/list` (params None):
        a result model or a `types.ErrorData`.

        `calls` says whose it is. A 2026-07-28 server asks inside an `input_required` result
        of one call, which comes with exactly that call. So does a 2025 request that a
        streamable HTTP server sends on the response stream of one `tools/call` (the SDK runs
        its handler in the context of the task that sent the call, where `UPSTREAM_CALL` names
        it). Any other 2025 request (stdio, SSE, the standalone GET stream) comes with every
        call in flight on the server, and the target decides: it refuses with an error that
        says why when it cannot tell, or when the client lacks the capability; nothing hangs."""
        ...

    async def server_notification(
        self, server: str, calls: Sequence[InflightCall], notification: Any
    ) -> None:
        """A notification other than tools/list_changed (resources, prompts; logs arrive here
        too), handed on as it arrives, with the calls in flight on that server."""
        ...


class Relay:
    """The pool's attachment point for its `RelayTarget`s (one relay per pool, shared by its
    servers).

        detach = pool.relay.attach(my_frontend)  # a `RelayTarget`; several may be attached
        detach()                                 # (or `pool.relay.target = x`: x alone, or none)

    A daemon serves several frontends at once (the `/mcp` facade and one facade per attached
    `sidecar stdio` client), so several targets may be attached. A request goes to the most
    recently attached target that `owns` one of the calls in flight (a target without `owns`
    owns nothing), else to the most recent target; a log message goes to the targets that own
    a call, else to all; other notifications go to every target.
    """

    __slots__ = ("_targets",)

    def __init__(self) -> None:
        self._targets: list[RelayTarget] = []

    @property
    def target(self) -> RelayTarget | None:
        """The most recently attached target, or None."""
        return self._targets[-1] if self._targets else None

    @target.setter
    def target(self, target: RelayTarget | None) -> None:
        self._targets = [] if target is None else [target]

    def attach(self, target: RelayTarget) -> Callable[[], None]:
        """Add a target; the returned function removes it again."""
        self._targets.append(target)

        def detach() -> None:
            if target in self._targets:
                self._targets.remove(target)

        return detach

    def _owners(self, calls: Sequence[InflightCall]) -> list[RelayTarget]:
        if not calls:
            return []
        return [t for t in self._targets if getattr(t, "owns", _owns_nothing)(calls)]

    async def request(
        self, server: str, calls: Sequence[InflightCall], method: str, params: Any
    ) -> Any:
        sent_by = UPSTREAM_CALL.get()  # the request came on that call's own response stream
        if sent_by is not None and sent_by in calls:
            calls = [sent_by]
        owners = self._owners(calls)
        target = owners[-1] if owners else self.target
        if target is None:
            return types.ErrorData(
                code=types.INVALID_REQUEST, message=NO_CLIENT.format(method=method)
            )
        try:
            return await target.server_request(server, calls, method, params)
        except Exception as exc:  # a defect in the target must not end the upstream session
            log.exception("[%s] relaying %s failed", server, method)
            return types.ErrorData(code=types.INTERNAL_ERROR, message=f"relay failed: {exc!r}")

    async def notify(self, server: str, calls: Sequence[InflightCall], notification: Any) -> None:
        targets = list(self._targets)
        if isinstance(notification, types.LoggingMessageNotification):
            targets = self._owners(calls) or targets
        for target in targets:
            try:
                await target.server_notification(server, calls, notification)
            except Exception:
                log.exception("[%s] relaying a notification failed", server)


def _owns_nothing(calls: Sequence[InflightCall]) -> bool:
    return False
