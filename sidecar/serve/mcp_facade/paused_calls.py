"""The facade's 2026-07-28 calls that may pause for the client's input (`rounds`).

`PausedCalls` runs such a call in a task of the facade (`run`), answers each of its steps (the
result, or `input_required` with a fresh `requestState` token), continues it when the client
answers (`resume`; a token of another replica goes to `fleet_rounds.ResumeAnywhere`) and
expires a round nobody answers within `ROUND_TTL`. It is given the facade's sessions, the
executions by call id it shares with `relays.UpstreamRelay`, the Location's `SharedRounds` and
how a finished call becomes its result (`ServedTools.result`).
May import the core and the rest of `sidecar.serve`. Exports `PausedCalls`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Any

import anyio
import anyio.abc
import mcp_types as types
from mcp.server.context import ServerRequestContext
from mcp.shared.exceptions import MCPError

from sidecar.serve.mcp_facade import tools
from sidecar.serve.mcp_facade.fleet_rounds import ResumeAnywhere
from sidecar.serve.mcp_facade.rounds import (
    ROUND_TTL,
    Escalated,
    Execution,
    Finished,
    foreign_round,
    new_token,
    request_digest,
)
from sidecar.serve.mcp_facade.sessions import Sessions
from sidecar.stores.shared_rounds import SharedRounds

Result = Callable[..., Awaitable[types.CallToolResult]]
"""`(outcome, snapshot, *, modern)` -> the call's result (`ServedTools.result`)."""


class PausedCalls:
    """The executions of 2026-07-28 calls, running (`running`, by call id) and paused (by
    `requestState` token). `tg`: the facade's task group while it serves (expiries run in
    it)."""

    def __init__(
        self, sessions: Sessions, running: dict[str, Execution], shared: SharedRounds | None,
        result: Result,
    ) -> None:
        self._sessions = sessions
        self.running = running
        self._paused: dict[str, Execution] = {}  # by requestState token
        self._result = result
        self.fleet = ResumeAnywhere(shared, sessions, self._paused, self.step)
        self.tg: anyio.abc.TaskGroup | None = None
        self.escalate: Callable[[Execution], Awaitable[dict[str, Any]]] | None = None
        """A call that becomes a task once answered (`Execution.as_task`): its CreateTaskResult
        (`tasks.FacadeTasks.adopt`)."""

    async def run(
        self, execution: Execution, work: Callable[[], Awaitable[Any]], tg: anyio.abc.TaskGroup,
    ) -> types.CallToolResult | types.InputRequiredResult:
        """Run the call (`work`) in a task of `tg`, so that it can outlive this request when
        an upstream server asks the client something (answered by a later request)."""
        call_id = execution.call_id
        self.running[call_id] = execution

        def forget() -> None:
            self.running.pop(call_id, None)
            self._sessions.calls.pop(call_id, None)

        tg.start_soon(execution.run, work, forget)
        return await self.step(execution)

    async def resume(
        self, ctx: ServerRequestContext[Any, Any], session_id: str,
        params: types.CallToolRequestParams,
    ) -> types.CallToolResult | types.InputRequiredResult:
        """A `tools/call` with `requestState`: the paused call continues with the client's
        `inputResponses` (another replica's: through the fleet)."""
        token = params.request_state or ""
        execution = self._paused.get(token)
        stable = self._sessions.fixed  # stdio: one session; HTTP 2026: requests stand alone
        if execution is None and (foreign := foreign_round(token)) is not None:
            # a fleet: paused on another replica, which continues it (`fleet_rounds`)
            elsewhere = await self.fleet.resume_elsewhere(ctx, params)
            if elsewhere is None:  # no fleet database: only that replica can
                raise MCPError(types.INVALID_PARAMS, foreign)
            return elsewhere
        if execution is None or (stable and execution.session_id != session_id) or (
            execution.request != request_digest(params.name, params.arguments or {})
        ):
            raise MCPError(types.INVALID_PARAMS, "Invalid or expired requestState")
        del self._paused[token]
        self.fleet.unlist_round(token)
        calls = self._sessions.calls
        call = calls.get(execution.call_id)
        if call is not None:  # later progress and logs ride the new request
            meta = dict(params.meta) if params.meta is not None else {}
            token_in = meta.get("progress_token", meta.get("progressToken"))
            calls[execution.call_id] = replace(
                call, session=ctx.session, request_id=ctx.request_id,
                progress_token=token_in if isinstance(token_in, str | int) else None,
                channel=None,  # a relay to another replica's earlier resume, if any
            )
        execution.answer(params.input_responses)
        return await self.step(execution)

    async def step(
        self, execution: Execution
    ) -> types.CallToolResult | types.InputRequiredResult:
        """The call's next state: its result, or the questions to send out now (the call
        pauses under a fresh token)."""
        stepped = False
        try:
            step = await execution.next_step()
            while isinstance(step, Escalated) and self.escalate is None:
                step = await execution.next_step()
            stepped = True
        finally:
            if not stepped:  # this request was cancelled: so is the call
                execution.scope.cancel()
        if isinstance(step, Escalated):
            assert self.escalate is not None
            return await self.escalate(execution)  # type: ignore[return-value]
        if isinstance(step, Finished):
            if step.failure is not None:
                raise step.failure
            if step.outcome is None:
                return tools.error_result("the call was cancelled")
            return await self._result(step.outcome, execution.snapshot, modern=True)
        token = new_token()
        self._paused[token] = execution
        if self.tg is not None:
            self.tg.start_soon(self._expire, token, execution)
        await self.fleet.list_round(token, execution)  # a fleet: resumable on any replica
        return types.InputRequiredResult(
            input_requests={key: q.request for key, q in step.items()}, request_state=token
        )

    async def _expire(self, token: str, execution: Execution) -> None:
        await anyio.sleep(ROUND_TTL)
        if self._paused.get(token) is execution:
            del self._paused[token]
            self.fleet.unlist_round(token)
            execution.expire()
