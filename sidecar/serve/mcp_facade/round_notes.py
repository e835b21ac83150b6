"""Progress and log notifications of a call continued for another replica's request
(`fleet_rounds`): what the continued call emits on the holder follows it to the resuming
request, as it would reach that request on one machine. The three steps and their bounds are
`RelayedNotes`' docstring.

Imports `sidecar.stores`. Exports `wants_of` (resuming replica), `RelayedNotes` (holder),
`deliver` (resuming replica), `LOGS_PER_ROUND` and `NOTE_BYTES`.
"""

from __future__ import annotations

import json
from typing import Any

import mcp_types as types

from sidecar.stores.shared_rounds import Relay

__all__ = ["LOGS_PER_ROUND", "NOTE_BYTES", "RelayedNotes", "deliver", "wants_of"]

LOGS_PER_ROUND = 100
"""Below the upstream's own burst (`bridges.mcp.log_budget.BURST`, then 20 lines a second):
a continued round keeps at most this many rows for log lines in the fleet database."""
NOTE_BYTES = 8192
PROGRESS_SLOT = "progress"


def wants_of(progress_token: Any, log_levels: frozenset[str]) -> dict[str, Any] | None:
    """What a resuming request wants relayed (None: nothing)."""
    progress = isinstance(progress_token, str | int) and not isinstance(progress_token, bool)
    if not progress and not log_levels:
        return None
    return {"progress": progress, "levels": sorted(log_levels)}


class RelayedNotes:
    """The holder's side: a `CallChannel` whose notifications become notes of the relay.

        resuming replica   `wants_of(...)`: what its request asked for (a `progressToken`, the
                           log levels it opted in to with `io.modelcontextprotocol/logLevel`)
        holder             `RelayedNotes(relay)` is the continued call's channel
                           (`DownstreamCall.channel`): progress and log notifications become
                           notes of the relay (`sidecar.stores.shared_rounds.Relay`)
        resuming replica   `deliver(note, ...)` sends each note on its request's stream, with
                           ITS progress token, before the answer

    Bounds (per continued round, i.e. per resumed request): progress is coalesced (a report not
    yet delivered is replaced by the next one: the latest always arrives), at most
    `LOGS_PER_ROUND` log messages are relayed and the rest counted (one warning at the end says
    how many), and a note is cut to about `NOTE_BYTES` (a log message's data then becomes a
    shortened text)."""

    def __init__(self, relay: Relay) -> None:
        wants = relay.wants if isinstance(relay.wants, dict) else {}
        self._relay = relay
        self.progress = bool(wants.get("progress"))
        levels = wants.get("levels")
        self._levels = frozenset(str(v) for v in levels) if isinstance(levels, list) else (
            frozenset())
        self._logs = 0
        self.dropped = 0
        self._open = True

    async def request(self, request: Any, result_type: Any) -> Any:
        return types.ErrorData(code=types.INVALID_REQUEST, message=(
            "a call continued for another replica's request cannot send requests"))

    async def notify(self, notification: Any) -> None:
        self.put(notification)

    def put(self, notification: Any) -> None:
        if not self._open:
            return
        if isinstance(notification, types.ProgressNotification):
            if self.progress:
                params = notification.params
                message = params.message
                if message is not None and len(message) > NOTE_BYTES:
                    message = message[:NOTE_BYTES] + "..."
                self._relay.put({"progress": {"progress": params.progress,
                                              "total": params.total, "message": message}},
                                slot=PROGRESS_SLOT)
        elif isinstance(notification, types.LoggingMessageNotification):
            if notification.params.level not in self._levels:
                return
            if self._logs >= LOGS_PER_ROUND:
                self.dropped += 1
                return
            self._logs += 1
            self._relay.put({"log": _bounded_log(notification.params)})

    def close(self) -> None:
        """The continued round reached its next state: the count of log messages not relayed
        (if any) goes last; later notifications are dropped (as on one machine, where the
        request's stream has ended)."""
        if self._open and self.dropped and "warning" in self._levels:
            self._relay.put({"log": {"level": "warning", "logger": "sidecar", "data": (
                f"{self.dropped} more log messages of this call were not relayed: at most "
                f"{LOGS_PER_ROUND} are, per request resumed on another replica")}})
        self._open = False


def _bounded_log(params: types.LoggingMessageNotificationParams) -> dict[str, Any]:
    wire = params.model_dump(mode="json", by_alias=True, exclude_none=True)
    text = json.dumps(wire.get("data"), ensure_ascii=False, default=str)
    if len(text) > NOTE_BYTES:
        wire["data"] = (f"{text[:NOTE_BYTES]}... (cut: {len(text)} characters, relayed from "
                        "another replica)")
    return wire


async def deliver(note: Any, session: Any, request_id: types.RequestId | None,
                  progress_token: Any, log_levels: frozenset[str]) -> None:
    """The resuming replica's side: one note on its request's stream (errors are the caller's
    to contain)."""
    if not isinstance(note, dict):
        return
    progress = note.get("progress")
    if isinstance(progress, dict) and isinstance(progress_token, str | int):
        value = progress.get("progress")
        total = progress.get("total")
        message = progress.get("message")
        if isinstance(value, int | float):
            await session.send_progress_notification(
                progress_token, value, total if isinstance(total, int | float) else None,
                message if isinstance(message, str) else None,
                related_request_id=None if request_id is None else str(request_id))
        return
    logged = note.get("log")
    if isinstance(logged, dict) and logged.get("level") in log_levels:
        params = types.LoggingMessageNotificationParams.model_validate(logged)
        await session.send_notification(types.LoggingMessageNotification(params=params),
                                        related_request_id=request_id)
