"""What an upstream server sends on its own: `ServerMessages` takes its notifications (a
tools/list_changed asks for a re-listing; resource and prompt changes are relayed), its log
messages (logged within a budget, shown to the calls in flight, relayed) and its requests
(sampling, elicitation, roots), relayed to the client whose call is in flight. Imports
`bridges.mcp.{calls,listening,log_budget,passthrough,redact}`; exports `ServerMessages`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import mcp_types as types
from mcp.client.session import ClientRequestContext, IncomingMessage
from mcp.shared.subscriptions import SUBSCRIPTION_ID_META_KEY

from bridges.mcp.calls import Caller, log_text
from bridges.mcp.listening import describe
from bridges.mcp.log_budget import LogBudget
from bridges.mcp.passthrough import InflightCall, Relay
from bridges.mcp.redact import Redactor

log = logging.getLogger("bridges.mcp")

_LOG_LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "notice": logging.INFO,
    "warning": logging.WARNING,
}

_RELAYED_NOTIFICATIONS = (
    types.ResourceUpdatedNotification,
    types.ResourceListChangedNotification,
    types.PromptListChangedNotification,
)


def _on_listen_stream(notification: Any) -> bool:
    meta = getattr(notification.params, "meta", None)
    return isinstance(meta, dict) and SUBSCRIPTION_ID_META_KEY in meta


class ServerMessages:
    """One server's notifications, logs and requests; `relay` None: nothing is relayed."""

    __slots__ = ("_ask_relist", "_caller", "_key", "_log_budget", "_redact", "relay")

    def __init__(self, key: str, relay: Relay | None, caller: Caller, *,
                 redact: Callable[[], Redactor], ask_relist: Callable[[], None]) -> None:
        self._key = key
        self.relay = relay
        self._caller = caller
        self._redact = redact  # the supervisor's current redactor
        self._ask_relist = ask_relist
        self._log_budget = LogBudget(key, "log notifications", log)

    async def relay_change(self, notification: Any) -> None:
        """A list change or resource update a 2026-07-28 server announced on its listen
        stream."""
        if self.relay is not None:
            await self.relay.notify(self._key, self._caller.calls(), notification)

    async def on_message(self, message: IncomingMessage) -> None:
        if isinstance(message, types.ToolListChangedNotification):
            self._ask_relist()
        elif (isinstance(message, _RELAYED_NOTIFICATIONS) and self.relay is not None
              and not _on_listen_stream(message)):
            # a listen stream's frames are relayed by `listen_for_changes` (the SDK tees
            # them here too: relaying both sent every change twice)
            await self.relay.notify(self._key, self._caller.calls(), message)
        elif isinstance(message, Exception):
            log.debug("[%s] transport reported: %s", self._key,
                      self._redact()(describe(message)))

    async def on_log(self, params: types.LoggingMessageNotificationParams) -> None:
        size = len(params.data) if isinstance(params.data, str) else 0
        if not self._log_budget.allow(size):
            return  # a flood: not logged, shown to the call or relayed (summarised instead)
        level = _LOG_LEVELS.get(params.level, logging.ERROR)
        log.log(level, "[%s] log: %s", self._key, log_text(params, self._redact()))
        self._caller.on_log(params)
        if self.relay is not None:
            notification = types.LoggingMessageNotification(params=params)
            await self.relay.notify(self._key, self._caller.calls(), notification)

    # --- server-to-client requests (relayed to the client whose call is in flight) -------

    async def on_sampling(
        self, context: ClientRequestContext, params: types.CreateMessageRequestParams
    ) -> Any:
        return await self._relay_request("sampling/createMessage", params)

    async def on_elicitation(
        self, context: ClientRequestContext, params: types.ElicitRequestParams
    ) -> Any:
        return await self._relay_request("elicitation/create", params)

    async def on_list_roots(self, context: ClientRequestContext) -> Any:
        return await self._relay_request("roots/list", None)

    async def relay_input_request(self, call: InflightCall, request: Any) -> Any:
        relay = self.relay if self.relay is not None else Relay()
        params = getattr(request, "params", None)
        return await relay.request(self._key, [call], request.method, params)

    async def _relay_request(self, method: str, params: Any) -> Any:
        relay = self.relay if self.relay is not None else Relay()
        return await relay.request(self._key, self._caller.calls(), method, params)
