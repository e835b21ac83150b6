"""A paused 2026-07-28 call resumed on any replica of a fleet: `ResumeAnywhere` (how a resume
reaches the holder, and what it answers, is its docstring), given the paused calls'
bookkeeping by `paused_calls.PausedCalls`; `round_key` names a paused state in the fleet
database (never the token itself).

Imports `sidecar.stores` and the rest of `sidecar.serve`. Exports `ResumeAnywhere`,
`round_key` and `INVALID_STATE`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import mcp_types as types
from mcp.shared.exceptions import MCPError
from pydantic import TypeAdapter

from sidecar.serve.mcp_facade.relays import quietly
from sidecar.serve.mcp_facade.round_notes import RelayedNotes, deliver, wants_of
from sidecar.serve.mcp_facade.rounds import ROUND_TTL, Execution, request_digest
from sidecar.serve.mcp_facade.sessions import Sessions
from sidecar.stores.shared_rounds import (
    Relay,
    RoundHolderGone,
    RoundLost,
    RoundUnknown,
    SharedRounds,
)

if TYPE_CHECKING:
    from mcp.server.context import ServerRequestContext

_RESPONSES: TypeAdapter[types.InputResponses] = TypeAdapter(types.InputResponses)
INVALID_STATE = "Invalid or expired requestState"


def round_key(token: str) -> str:
    """What the fleet database knows a paused state by: never the token itself."""
    return hashlib.sha256(token.encode()).hexdigest()


Step = Callable[[Execution], Awaitable[types.CallToolResult | types.InputRequiredResult]]
"""Continue a paused execution to its next state (`PausedCalls.step`)."""


class ResumeAnywhere:
    """The fleet side of `rounds`: `shared` is the Location's `SharedRounds` (None: the embedded
    default, and stdio sessions, whose tokens are bound to their session: both keep the
    replica-local behaviour); `paused` the executions held here by token; `step` continues one.

    A call paused for the client's input keeps running in the replica that paused it; its
    `requestState` token ends in `.<replica id>`. With `SharedRounds` every paused state is
    listed there under a digest of its token before the `input_required` answer leaves, and:

    - a resume that reaches the same replica takes the local path (`PausedCalls.resume`, no
      database round trip on the way; the listing is removed in the background);
    - a resume that reaches another replica hands the client's `inputResponses` to the holder
      through the database and waits for the holder's next state, which it answers exactly as
      the holder would have: the result, the next `input_required` (its token again names the
      holder, so the round after may be resumed anywhere too), or the JSON-RPC error;
    - the holder gone (killed, cut off from the database for the claim TTL) is an error naming
      it, never a hang; an unknown, used, expired or forged token is "Invalid or expired
      requestState".

    Progress and log notifications of a call continued for another replica's request follow it
    there, in order, before the answer (`round_notes`)."""

    def __init__(
        self, shared: SharedRounds | None, sessions: Sessions, paused: dict[str, Execution],
        step: Step,
    ) -> None:
        self._shared = None if sessions.fixed else shared
        self._sessions = sessions
        self._paused = paused
        self._step = step

    async def list_round(self, token: str, execution: Execution) -> None:
        """List a paused state held here, so a resume on another replica continues it."""
        shared = self._shared
        if shared is None:
            return

        async def resume(responses: Any, relay: Relay) -> dict[str, Any] | None:
            return await self._resumed_for_another(token, execution, responses, relay)

        await shared.held(round_key(token), execution.request, resume, ROUND_TTL)

    def unlist_round(self, token: str) -> None:
        shared = self._shared
        if shared is not None:
            shared.dropped(round_key(token))

    async def resume_elsewhere(
        self, ctx: ServerRequestContext[Any, Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult | types.InputRequiredResult | None:
        """A resume of a call another replica holds: its next state, answered here (and the
        call's notifications on the way, on this request's stream). None when this replica
        has no shared rounds (the embedded default, stdio)."""
        shared = self._shared
        if shared is None:
            return None
        responses = {key: answer.model_dump(mode="json", by_alias=True, exclude_none=True)
                     for key, answer in (params.input_responses or {}).items()}
        meta = dict(params.meta) if params.meta is not None else {}
        progress_token = meta.get("progress_token", meta.get("progressToken"))
        levels: frozenset[str] = getattr(ctx.session, "_allowed_log_levels", frozenset())

        async def on_note(note: Any) -> None:
            await quietly(deliver(note, ctx.session, ctx.request_id, progress_token, levels))

        try:
            state = await shared.resume(round_key(params.request_state or ""),
                                        request_digest(params.name, params.arguments or {}),
                                        responses, wants=wants_of(progress_token, levels),
                                        on_note=on_note)
        except RoundUnknown:
            raise MCPError(types.INVALID_PARAMS, INVALID_STATE) from None
        except RoundHolderGone as exc:
            code = types.INVALID_PARAMS if exc.before else types.INTERNAL_ERROR
            raise MCPError(code, str(exc)) from None
        except RoundLost as exc:
            raise MCPError(types.INTERNAL_ERROR, str(exc)) from None
        return _answer_of(state)

    async def _resumed_for_another(
        self, token: str, execution: Execution, responses: Any, relay: Relay
    ) -> dict[str, Any] | None:
        """On the holder: continue a paused call with the input another replica received;
        the next state as JSON for that replica (None: no longer held here). Its progress and
        log notifications meanwhile go to that replica's request through `relay`."""
        answers = _RESPONSES.validate_python(responses)
        if self._paused.get(token) is not execution:
            return None
        del self._paused[token]
        notes = RelayedNotes(relay)
        call = self._sessions.calls.get(execution.call_id)
        if call is not None:  # the request now waiting is on another replica: the relay
            self._sessions.calls[execution.call_id] = replace(
                call, channel=notes,
                progress_token=call.progress_token if notes.progress else None)
        execution.answer(answers)
        try:
            step = await self._step(execution)
        except MCPError as exc:
            return {"error": exc.error.model_dump(mode="json", exclude_none=True)}
        finally:
            notes.close()
        kind = "input_required" if isinstance(step, types.InputRequiredResult) else "result"
        return {kind: step.model_dump(mode="json", by_alias=True, exclude_none=True)}


def _answer_of(state: Any) -> types.CallToolResult | types.InputRequiredResult:
    """The holder's next state (`ResumeAnywhere._resumed_for_another`), as this replica's
    answer."""
    if "result" in state:
        return types.CallToolResult.model_validate(state["result"])
    if "input_required" in state:
        return types.InputRequiredResult.model_validate(state["input_required"])
    error = types.ErrorData.model_validate(state["error"])
    raise MCPError(error.code, error.message, error.data)

