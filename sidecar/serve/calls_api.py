"""`/v1/calls`: the calls `/v1` started, once started (`CallsApi`): their state, their
cancellation (here, or on the replica of a fleet that runs them) and the call history. The calls
in flight and recently finished are kept in a `CallTracker`.

Imports the core, `sidecar.formats` and the rest of `sidecar.serve`. Exports `CallsApi`,
`CallTracker`, `outcome_json`, `CANCEL_WAIT` and `SETTLE_WAIT`.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import pydantic_core
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from sidecar.formats import Format, result_for
from sidecar.model.outcome import Outcome
from sidecar.model.replica import replica_id
from sidecar.serve.api_requests import ApiError, JSONResponse, handled, query_format
from sidecar.serve.identities.history import own_history
from sidecar.stores.call_history import CallQuery, InvalidQuery

if TYPE_CHECKING:
    from sidecar.location.location import Location

CANCEL_WAIT = 5.0
"""Seconds a DELETE of a call running on another replica waits for that replica's answer."""
SETTLE_WAIT = 2.0
"""Seconds a cancel requested by another replica waits for the call to end here."""
_FINISHED_KEEP = 1024
_FINISHED_TTL = 600.0


@dataclass(slots=True)
class _Running:
    task: asyncio.Task[Outcome]
    started: float
    fingerprint: Callable[[], str]


class CallTracker:
    """Calls in flight (cancellable by id) and recently finished ones (with their output)."""

    def __init__(self) -> None:
        self.running: dict[str, _Running] = {}
        self._finished: OrderedDict[str, tuple[float, Outcome]] = OrderedDict()

    def start(self, call_id: str, fingerprint: Callable[[], str],
              run: Callable[[], Any]) -> asyncio.Task[Outcome]:
        """The task of the call running under `call_id` when it is this call (`fingerprint`,
        as `call_fingerprint`, computed only then), else a new one. Another call under a
        running id runs untracked: the seam refuses it (`conflict`); the running one keeps
        the id."""
        current = self.running.get(call_id)
        if current is not None and current.fingerprint() == fingerprint():
            return current.task
        task: asyncio.Task[Outcome] = asyncio.create_task(run(), name=f"call:{call_id}")
        if current is None:
            self.running[call_id] = _Running(task, time.time(), fingerprint)
            task.add_done_callback(lambda t: self._done(call_id, t))
        return task

    def _done(self, call_id: str, task: asyncio.Task[Outcome]) -> None:
        self.running.pop(call_id, None)
        # a refused call (not admitted, or another call's id) never stands for the id
        if not task.cancelled() and task.exception() is None and not task.result().refused:
            self._finished[call_id] = (time.monotonic(), task.result())
            while len(self._finished) > _FINISHED_KEEP:
                self._finished.popitem(last=False)

    def finished(self, call_id: str) -> Outcome | None:
        entry = self._finished.get(call_id)
        if entry is None or time.monotonic() - entry[0] > _FINISHED_TTL:
            return None
        return entry[1]

    async def aclose(self) -> None:
        tasks = [r.task for r in self.running.values()]
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks)


def outcome_json(outcome: Outcome, fmt: Format | None, tool_call_id: str | None) -> Any:
    """The outcome, plus its provider wire value when `fmt` is given. The wire value's
    call id is the model's (`tool_call_id`); without one, OpenAI and Anthropic get our
    call id (they require one) and Gemini none."""
    data = outcome.to_json()
    data["replayed"] = outcome.replayed
    if fmt is not None:
        if tool_call_id is None:
            tool_call_id = "" if fmt == "gemini" else outcome.call_id
        data["wire"] = result_for(fmt, outcome, tool_call_id=tool_call_id)
    return data


class CallsApi:
    """GET /v1/calls (the history), GET and DELETE /v1/calls/{call_id} (state, cancel)."""

    def __init__(self, location: Location, calls: CallTracker) -> None:
        self.location = location
        self.calls = calls

    def routes(self) -> list[Route]:
        return [
            Route("/v1/calls", handled(self.call_history), methods=["GET"]),
            Route("/v1/calls/{call_id}", handled(self.call_state), methods=["GET", "DELETE"]),
        ]

    async def call_history(self, request: Request) -> Response:
        history = self.location.stores.history
        if history is None:
            raise ApiError(404, "no_history", "this daemon keeps no call history")
        fmt = request.query_params.get("format", "json")
        if fmt not in ("json", "jsonl"):
            raise ApiError(400, "invalid_parameter", "format must be json or jsonl", "format")
        try:
            query = CallQuery.from_params(request.query_params)
        except InvalidQuery as exc:
            raise ApiError(400, "invalid_parameter", str(exc), exc.field) from None
        narrowed = own_history(request.scope, query)
        if isinstance(narrowed, str):
            raise ApiError(403, "forbidden_role", narrowed, "user")
        query = narrowed
        if fmt == "json":
            rows, cursor = await history.query(query)
            return JSONResponse({"calls": [r.to_json() for r in rows], "next_cursor": cursor})

        async def lines() -> AsyncIterator[bytes]:
            page: CallQuery | None = query
            while page is not None:
                rows, cursor = await history.query(page)
                for row in rows:
                    yield pydantic_core.to_json(row.to_json()) + b"\n"
                page = None if cursor is None else replace(page, cursor=cursor)

        return StreamingResponse(lines(), media_type="application/x-ndjson")

    async def call_state(self, request: Request) -> Response:
        """One route for both methods, so a 405 names both in `Allow`."""
        if request.method == "DELETE":
            return await self.cancel_call(request)
        return await self.get_call(request)

    async def get_call(self, request: Request) -> Response:
        call_id = request.path_params["call_id"]
        running = self.calls.running.get(call_id)
        if running is not None:
            return JSONResponse({"call_id": call_id, "status": "running",
                                 "started_at": running.started})
        outcome = self.calls.finished(call_id) or await self.location.outcome(call_id)
        if outcome is None:
            elsewhere = await self.location.running_on(call_id)
            if elsewhere is not None:  # a fleet: another replica runs it
                return JSONResponse({"call_id": call_id, "status": "running",
                                     "replica": elsewhere})
            if (outcome := await self._settled_meanwhile(call_id)) is None:
                raise ApiError(404, "unknown_call", f"no call {call_id!r} is running or settled")
        fmt = query_format(request) if "format" in request.query_params else None
        return JSONResponse(outcome_json(outcome, fmt, None))

    async def cancel_call(self, request: Request) -> Response:
        call_id = request.path_params["call_id"]
        running = self.calls.running.get(call_id)
        if running is None:
            if self.calls.finished(call_id) or await self.location.outcome(call_id):
                raise ApiError(409, "already_settled", f"call {call_id!r} has already settled")
            elsewhere = await self.location.running_on(call_id)
            if elsewhere is not None:
                return await self._cancel_elsewhere(call_id, elsewhere)
            if await self._settled_meanwhile(call_id):
                raise ApiError(409, "already_settled", f"call {call_id!r} has already settled")
            raise ApiError(404, "unknown_call", f"no call {call_id!r} is running")
        running.task.cancel()
        return JSONResponse({"call_id": call_id, "status": "cancelling"}, status_code=202)

    async def _settled_meanwhile(self, call_id: str) -> Outcome | None:
        """A call with no outcome, then no claim: another replica may have settled it in
        between (outcome stored as its claim is deleted), so look again before a 404."""
        return await self.location.outcome(call_id)

    async def _cancel_elsewhere(self, call_id: str, replica: str) -> Response:
        """A fleet: `replica` holds the call's claim. It cancels the call as a local DELETE
        would (`cancel_here`) and answers; 409 `running_elsewhere` when it cannot."""
        answer = None
        cancels = self.location.stores.cancels
        if cancels is not None and replica != replica_id():  # here: not a /v1 call
            answer = await cancels.request(call_id, replica, wait=CANCEL_WAIT)
        if answer == "cancelling":
            return JSONResponse({"call_id": call_id, "status": "cancelling",
                                 "replica": replica}, status_code=202)
        if answer is None and replica != replica_id():
            raise ApiError(409, "running_elsewhere", f"call {call_id!r} runs on replica "
                           f"{replica!r}, which did not answer the cancel request within "
                           f"{CANCEL_WAIT:g} s (down, stalled, or cut off from the database); "
                           "if it is down, its claim expires and the call may be retried")
        # it ended meanwhile, or runs there outside /v1 (an /mcp or stdio call)
        if await self.location.outcome(call_id):
            raise ApiError(409, "already_settled", f"call {call_id!r} has already settled")
        if await self.location.running_on(call_id) is None:
            raise ApiError(404, "unknown_call", f"no call {call_id!r} is running")
        raise ApiError(409, "running_elsewhere", f"call {call_id!r} runs on replica "
                       f"{replica!r} outside /v1 (an /mcp or stdio call): /v1 cannot cancel it")

    async def cancel_here(self, call_id: str) -> str:
        """Another replica's cancel request (`Location.cancellers`): what a local DELETE
        does, then a moment (`SETTLE_WAIT`) for the call to end and release its claim."""
        running = self.calls.running.get(call_id)
        if running is None:
            return "not_running"
        running.task.cancel()
        await asyncio.wait([running.task], timeout=SETTLE_WAIT)
        return "cancelling"
