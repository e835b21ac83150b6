"""`McpFacade`: the Location's registry and upstream servers as one lowlevel MCP `Server`. One
facade serves any number of downstream sessions (stdio: one; HTTP: one per `Mcp-Session-Id`),
in both protocol eras. It is the SDK's route: every request the fast route does not take
(`fast_answers`) arrives here through the SDK server's handlers. It is made of collaborators,
each given what it needs: `served` (`ServedTools`), `fast` (`FastAnswers`), `relay`
(`UpstreamRelay`: upstream traffic to the sessions), `paused` (`PausedCalls`: 2026-07-28
rounds, on any replica through `fleet_rounds`) and `subscriptions` (`ResourceSubscriptions`:
the clients' resource subscriptions, and what the upstreams are asked for them).

Imports the core and the rest of `sidecar.serve`. Exports `McpFacade`, `new_session_id`,
`SERVER_NAME`, `PROGRESS_DRAIN_SECONDS` and `CHANGE_DEBOUNCE`.
"""

from __future__ import annotations

import logging
import uuid
import warnings
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from typing import TYPE_CHECKING, Any, cast

import anyio
import anyio.abc
import mcp_types as types
from mcp.server import NotificationOptions, Server
from mcp.server.context import ServerRequestContext
from mcp.server.subscriptions import InMemorySubscriptionBus, ToolsListChanged
from mcp.shared.exceptions import MCPError
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from bridges.mcp import CALLER_CAPABILITIES, CALLER_INPUT_RESPONSES, UPSTREAM_TASK
from sidecar.execution.snapshot import Snapshot
from sidecar.model import tracing
from sidecar.model.events import CallProgress, CallSettled
from sidecar.serve.mcp_facade import offered, skills, tools, upstream
from sidecar.serve.mcp_facade.fast_answers import FastAnswers
from sidecar.serve.mcp_facade.paused_calls import PausedCalls
from sidecar.serve.mcp_facade.relays import UpstreamRelay, quietly
from sidecar.serve.mcp_facade.resource_subscriptions import ResourceSubscriptions
from sidecar.serve.mcp_facade.rounds import Execution
from sidecar.serve.mcp_facade.served import ServedTools, passes
from sidecar.serve.mcp_facade.sessions import DownstreamCall, Sessions
from sidecar.serve.mcp_facade.tasks import (
    TASKS_EXTENSION,
    FacadeTasks,
    TaskParams,
    check_routing,
    declares_tasks,
    missing_tasks_capability,
    task_support,
)
from sidecar.stores.database_down import database_label, unavailable_message

if TYPE_CHECKING:
    from sidecar.location.location import Location

log = logging.getLogger("sidecar.mcp")

SERVER_NAME = "mcp-sidecar"
PROGRESS_DRAIN_SECONDS = 2.0
CHANGE_DEBOUNCE = 0.05
CLIENT_CAPABILITIES_KEY = "io.modelcontextprotocol/clientCapabilities"
Ctx = ServerRequestContext[Any, Any]


class McpFacade:
    """Build with a Location; `server` is the SDK server to run on any transport. Use
    `async with facade.attached():` around serving so registry changes and upstream traffic
    reach the sessions.

    What it answers: `tools` (tool list/call and the `_meta` keys), `upstream` (resources,
    prompts, completion, namespacing) and `sessions`; upstream servers' requests and
    notifications go through `relay` (`UpstreamRelay`). Every `CallProgress` event of a call
    (from any tool, upstream progress included) becomes `notifications/progress` when the
    client sent a `progressToken`. A call to a tool of a server that waits for an OAuth login,
    from a client with URL-mode elicitation, first asks the client to open the authorization
    URL (`login_ask`)."""

    def __init__(
        self, location: Location, *, session_id: str | None = None, profile: str | None = None
    ) -> None:
        self.location = location
        self.profile = profile
        """The profile served (`sidecar.registry.profiles`; None: the default one)."""
        self.sessions = Sessions(session_id)
        self.bus = InMemorySubscriptionBus()
        self._tg: anyio.abc.TaskGroup | None = None
        pool = lambda: location.upstreams  # noqa: E731
        self.upstreams = upstream.Upstreams(pool, partial(passes, location, profile,
                                                          which="resources"))
        self.prompt_upstreams = upstream.Upstreams(pool, partial(passes, location, profile,
                                                                 which="prompts"))
        running: dict[str, Execution] = {}  # by call id: the 2026-07-28 calls' executions
        self.subscriptions = ResourceSubscriptions(self.upstreams, self.bus)
        self.sessions.on_end = self.subscriptions.ended
        self.relay = UpstreamRelay(self.sessions, self.bus, self.upstreams, running,
                                   self.subscriptions.holders)
        """Upstream servers' requests and notifications to the sessions; a transport that
        writes them itself (stdio) sets its `requester` and `notifier`."""
        self.served = ServedTools(location, profile, self.upstreams, self.relay.server_request)
        self.fast = FastAnswers(self.sessions, self.served)
        self.paused = PausedCalls(self.sessions, running, location.stores.rounds,
                                  self.served.result)
        with warnings.catch_warnings():  # logging/setLevel is deprecated in 2026-07-28 only
            warnings.simplefilter("ignore")
            self.server: Server[Any] = Server(
                SERVER_NAME,
                version="0.1.0",
                on_list_tools=self._list_tools,
                # a dict: a task's CreateTaskResult (an extension's result shape)
                on_call_tool=cast("Any", self._call_tool),
                on_list_resources=self._list_resources,
                on_list_resource_templates=self._list_templates,
                on_read_resource=self._read_resource,
                on_subscribe_resource=self._subscribe,
                on_unsubscribe_resource=self._unsubscribe,
                on_list_prompts=self._list_prompts,
                on_get_prompt=self._get_prompt,
                on_completion=self._complete,
                on_set_logging_level=self._set_level,
                on_roots_list_changed=self._roots_changed,
                on_subscriptions_listen=self._listen,
            )
        # MCP Apps (SEP-1865): `ui://` resources and tools' `_meta.ui` pass through
        self.server.extensions[upstream.UI_EXTENSION] = {}
        # Agent Skills (SEP-2640), advertised while an upstream declares them
        skills.register(self.server, lambda: self.upstreams)
        capabilities = self.server.get_capabilities

        def advertised(*args: Any, **kwargs: Any) -> types.ServerCapabilities:
            skills.advertise(self.server.extensions, self.upstreams)
            # resources, prompts, completions, logging: while an upstream offers them
            return offered.capabilities(capabilities(*args, **kwargs), self.upstreams,
                                        self.prompt_upstreams, self.served.starting())

        self.server.get_capabilities = advertised  # type: ignore[method-assign]
        self.tasks = FacadeTasks(location, self._task_result)  # SEP-2663
        self.paused.escalate = self._escalate
        self.server.extensions[TASKS_EXTENSION] = {}
        self.server.add_request_handler("tasks/get", TaskParams, self._tasks_get)
        self.server.add_request_handler("tasks/update", TaskParams, self._tasks_update)
        self.server.add_request_handler("tasks/cancel", TaskParams, self._tasks_cancel)
        options = NotificationOptions(
            tools_changed=True, resources_changed=True, prompts_changed=True
        )
        original = self.server.create_initialization_options
        # The HTTP session manager calls it without arguments: advertise listChanged anyway.
        self.server.create_initialization_options = (  # type: ignore[method-assign]
            lambda *a, **k: original(options, *a[1:], **k)
        )

    # --- lifecycle -----------------------------------------------------------------------

    @asynccontextmanager
    async def attached(self) -> AsyncIterator[None]:
        """Follow registry changes and take the upstream relay while serving."""
        location = self.location
        self._changed = anyio.Event()
        self._listed = self.served.snapshot("").definitions
        unsubscribe = location.registry.on_change(lambda: self._changed.set())
        unsubscribe_profiles = location.profiles.on_change(lambda: self._changed.set())
        pool = location.upstreams
        detach = pool.relay.attach(self.relay) if pool is not None else None
        try:
            async with anyio.create_task_group() as tg:
                self._tg = self.paused.tg = tg
                tg.start_soon(self._push_changes)
                yield
                tg.cancel_scope.cancel()
        finally:
            self._tg = self.paused.tg = None
            if detach is not None:
                detach()
            unsubscribe()
            unsubscribe_profiles()

    async def _push_changes(self) -> None:
        snapshot = self.served.snapshot
        while True:
            await self._changed.wait()
            await anyio.sleep(CHANGE_DEBOUNCE)  # one push for a burst of changes
            self._changed = anyio.Event()
            await self.location.definitions_checked()  # fingerprinted off the loop first
            # Only sessions whose listing changed hear of it: a change to one profile's tools
            # (or to tools no profile of this facade serves) leaves the others alone.
            listing = snapshot("").definitions
            changed_here = listing != self._listed
            self._listed = listing
            for state in self.sessions.live():
                if state.snapshot is not None:
                    before = state.snapshot.definitions
                    state.snapshot = snapshot(state.id)
                    if state.snapshot.definitions == before:
                        continue
                elif not changed_here:
                    continue
                if not state.modern:
                    await self.relay.note(state.session, types.ToolListChangedNotification())
            if changed_here:
                await self.bus.publish(ToolsListChanged())

    # --- tools ---------------------------------------------------------------------------

    async def _list_tools(
        self, ctx: Ctx, params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        state = self.sessions.state(ctx)
        served = self.served
        snapshot = state.snapshot = served.snapshot(state.id)
        listing = served.listing(snapshot, modern=_modern(ctx))
        starting = served.starting()
        if starting:
            meta = {**(listing.meta or {}), tools.STARTING_KEY: starting}
            return listing.model_copy(update={"meta": meta})
        return listing

    async def _call_tool(
        self, ctx: Ctx, params: types.CallToolRequestParams
    ) -> types.CallToolResult | types.InputRequiredResult | dict[str, Any]:
        caller = CALLER_CAPABILITIES.set(_caller_capabilities(ctx, params.meta))
        # inputResponses without requestState: handed to the upstream's first request
        given = CALLER_INPUT_RESPONSES.set(
            params.input_responses if params.request_state is None else None)
        try:
            return await self._call_tool_as_caller(ctx, params)
        finally:
            CALLER_INPUT_RESPONSES.reset(given)
            CALLER_CAPABILITIES.reset(caller)

    async def _call_tool_as_caller(
        self, ctx: Ctx, params: types.CallToolRequestParams
    ) -> types.CallToolResult | types.InputRequiredResult | dict[str, Any]:
        state = self.sessions.state(ctx)
        if params.request_state is not None:
            return await self.paused.resume(ctx, state.id, params)
        snapshot = state.snapshot
        if snapshot is None:
            snapshot = state.snapshot = self.served.snapshot(state.id)
        if snapshot.entry(params.name) is None:
            snapshot = await self.served.settled_snapshot(state)
            if (name := self.served.app_tool(snapshot, params.name)) != params.name:
                params = params.model_copy(update={"name": name})  # an MCP App's View
        meta: dict[str, Any] = dict(params.meta) if params.meta is not None else {}
        client = ctx.session.client_params
        try:
            context = tools.call_context(
                session_id=state.id, request_id=ctx.request_id, meta=meta,
                client_name=client.client_info.name if client is not None else None,
                owner=state.owner,
            )
        except ValueError as exc:
            return tools.error_result(str(exc))
        if context.call_id in self.sessions.calls:
            return tools.error_result(f"call id {context.call_id!r} is already in flight")
        as_task = state.modern and self._as_task(snapshot, params.name)
        token = meta.get("progress_token", meta.get("progressToken"))
        call = DownstreamCall(context.call_id, state, ctx.session, ctx.request_id,
                              token if isinstance(token, str | int) else None)
        self.sessions.calls[call.call_id] = call
        try:
            if as_task and self._tg is not None:  # SEP-2663: a CreateTaskResult at once
                execution = Execution(state.id, params.name, params.arguments or {},
                                      call.call_id, snapshot)
                return await self.tasks.start(
                    execution, lambda: self._execute(snapshot, params, context, call),
                    self.paused.running, lambda: self.sessions.calls.pop(call.call_id, None),
                    self._tg)
            if state.modern and self._tg is not None:
                execution = Execution(state.id, params.name, params.arguments or {},
                                      call.call_id, snapshot)
                # an upstream that makes a task of the call (after its input rounds): so does
                # this facade, for a client with the tasks extension
                upstream_task = UPSTREAM_TASK.set(
                    execution.became_task if declares_tasks(CALLER_CAPABILITIES.get()) else None)
                try:
                    return await self.paused.run(
                        execution, lambda: self._execute(snapshot, params, context, call),
                        self._tg)
                finally:
                    UPSTREAM_TASK.reset(upstream_task)
            try:
                outcome = await self._execute(snapshot, params, context, call)
            finally:
                del self.sessions.calls[call.call_id]
        except Exception as exc:  # the fleet database down: a JSON-RPC error naming it
            message = unavailable_message(exc, f"call {context.call_id!r} could not be run",
                                          database_label(self.location.stores.database))
            if message is None:
                raise
            raise MCPError(types.INTERNAL_ERROR, message) from exc
        return await self.served.result(outcome, snapshot, modern=_modern(ctx))

    def _as_task(self, snapshot: Snapshot, name: str) -> bool:
        """Whether this call runs as a task (`tasks`: which tools, which clients); -32021 for
        a tool that runs only as one, from a client without the extension."""
        support = task_support(snapshot.entry(name))
        if support is None:
            return False
        if declares_tasks(CALLER_CAPABILITIES.get()):
            return True
        if support == "required":
            raise missing_tasks_capability(f"tool {name!r}")
        return False

    async def _task_result(self, outcome: Any, snapshot: Snapshot | None) -> dict[str, Any]:
        if snapshot is None:
            snapshot = self.served.snapshot("tasks")
        return await self.served.result_wire(outcome, snapshot, modern=True)

    async def _escalate(self, execution: Execution) -> dict[str, Any]:
        assert self._tg is not None
        return await self.tasks.adopt(execution, self._tg)

    def _tasks_gate(self, ctx: Ctx, params: TaskParams, method: str) -> None:
        if not declares_tasks(_caller_capabilities(ctx, params.meta)):
            raise missing_tasks_capability(method)
        check_routing(ctx.request, params)

    async def _tasks_get(self, ctx: Ctx, params: TaskParams) -> dict[str, Any]:
        self._tasks_gate(ctx, params, "tasks/get")
        return await self.tasks.get(params)

    async def _tasks_update(self, ctx: Ctx, params: TaskParams) -> dict[str, Any]:
        self._tasks_gate(ctx, params, "tasks/update")
        return await self.tasks.update(params)

    async def _tasks_cancel(self, ctx: Ctx, params: TaskParams) -> dict[str, Any]:
        self._tasks_gate(ctx, params, "tasks/cancel")
        return await self.tasks.cancel(params)

    async def _listen(
        self, ctx: Ctx, params: types.SubscriptionsListenRequestParams
    ) -> types.SubscriptionsListenResult:
        """`subscriptions/listen`: resource subscriptions and list changes, plus the status of
        the tasks it names (SEP-2663 `notifications/tasks`, `tasks.FacadeTasks.listen`)."""
        declared = declares_tasks(_caller_capabilities(ctx, params.meta))
        return await self.tasks.listen(ctx, params, declared, self.subscriptions.listen)

    async def _execute(
        self, snapshot: Snapshot, params: types.CallToolRequestParams, context: Any,
        call: DownstreamCall,
    ) -> Any:
        await self.served.login_first(snapshot, params.name, call, params.arguments)
        with tracing.continued(params.meta):  # a client's `_meta.traceparent`
            if call.progress_token is None:
                return await snapshot.execute(params.name, params.arguments or {}, context)
            return await self._execute_with_progress(snapshot, params, context, call)

    async def _execute_with_progress(
        self, snapshot: Snapshot, params: types.CallToolRequestParams, context: Any,
        call: DownstreamCall,
    ) -> Any:
        settled = anyio.Event()
        async with self.location.events.subscribe() as sub, anyio.create_task_group() as tg:

            async def forward() -> None:
                step = 0.0
                while True:
                    event = await sub.next()
                    if isinstance(event, CallSettled) and event.call_id == call.call_id:
                        settled.set()
                        return
                    if not isinstance(event, CallProgress) or event.call_id != call.call_id:
                        continue
                    snap = event.snapshot
                    value = snap.get("progress")
                    if isinstance(value, int | float) and not isinstance(value, bool):
                        if value <= step and step:
                            continue
                        step = float(value)
                        total = snap.get("total")
                        message = snap.get("message")
                    elif "log" in snap and "server" in snap:
                        continue  # an upstream log line: relayed as a log message
                    else:
                        step += 1
                        total, message = None, _compact(snap)
                    now = self.sessions.calls.get(call.call_id, call)
                    if now.progress_token is None:
                        continue
                    if now.channel is not None:  # continued for another replica's request
                        await quietly(now.channel.notify(types.ProgressNotification(
                            params=types.ProgressNotificationParams(
                                progress_token=now.progress_token, progress=step,
                                total=total if isinstance(total, int | float) else None,
                                message=message if isinstance(message, str) else None))))
                        continue
                    await quietly(now.session.send_progress_notification(
                        now.progress_token,
                        step,
                        total if isinstance(total, int | float) else None,
                        message if isinstance(message, str) else None,
                        related_request_id=str(now.request_id),
                    ))

            tg.start_soon(forward)
            outcome = await snapshot.execute(params.name, params.arguments or {}, context)
            with anyio.move_on_after(PROGRESS_DRAIN_SECONDS):
                await settled.wait()
            tg.cancel_scope.cancel()
        return outcome

    # --- resources, prompts, completion, logging -----------------------------------------

    async def _list_resources(self, ctx: Ctx, params: Any) -> types.ListResourcesResult:
        return await upstream.list_resources(self.upstreams)

    async def _list_templates(self, ctx: Ctx, params: Any) -> types.ListResourceTemplatesResult:
        return await upstream.list_templates(self.upstreams)

    async def _read_resource(
        self, ctx: Ctx, params: types.ReadResourceRequestParams
    ) -> types.ReadResourceResult | types.InputRequiredResult:
        caller = CALLER_CAPABILITIES.set(_caller_capabilities(ctx, params.meta))
        try:
            return await upstream.read_resource(self.upstreams, str(params.uri), params)
        finally:
            CALLER_CAPABILITIES.reset(caller)

    async def _subscribe(self, ctx: Ctx, params: types.SubscribeRequestParams) -> types.EmptyResult:
        await self.subscriptions.subscribe(self.sessions.state(ctx), str(params.uri))
        return types.EmptyResult()

    async def _unsubscribe(
        self, ctx: Ctx, params: types.UnsubscribeRequestParams
    ) -> types.EmptyResult:
        await self.subscriptions.unsubscribe(self.sessions.state(ctx), str(params.uri))
        return types.EmptyResult()

    async def _list_prompts(self, ctx: Ctx, params: Any) -> types.ListPromptsResult:
        return await upstream.list_prompts(self.prompt_upstreams)

    async def _get_prompt(
        self, ctx: Ctx, params: types.GetPromptRequestParams
    ) -> types.GetPromptResult | types.InputRequiredResult:
        caller = CALLER_CAPABILITIES.set(_caller_capabilities(ctx, params.meta))
        try:
            return await upstream.get_prompt(self.prompt_upstreams, params)
        finally:
            CALLER_CAPABILITIES.reset(caller)

    async def _complete(
        self, ctx: Ctx, params: types.CompleteRequestParams
    ) -> types.CompleteResult:
        if not self.upstreams.all():
            return types.CompleteResult(completion=types.Completion(values=[]))
        return await upstream.complete(self.upstreams, params)

    async def _set_level(self, ctx: Ctx, params: types.SetLevelRequestParams) -> types.EmptyResult:
        self.sessions.state(ctx).log_level = params.level
        return types.EmptyResult()

    async def _roots_changed(self, ctx: Ctx, params: Any) -> None:
        """A client's roots changed: every upstream server hears it (and may ask again)."""
        self.sessions.state(ctx)
        for up in self.upstreams.all():
            session = up.connection.client.session
            await quietly(session.send_notification(types.RootsListChangedNotification()))


def _caller_capabilities(ctx: Ctx, meta: Any) -> dict[str, Any] | None:
    """The client capabilities the caller declared (2026-07-28: in the request's `_meta`;
    2025: at its handshake), declared in turn to 2026-07-28 upstreams for its requests."""
    if _modern(ctx):
        caps = (meta or {}).get(CLIENT_CAPABILITIES_KEY)
        return dict(caps) if isinstance(caps, dict) else {}
    client = ctx.session.client_params
    if client is None:
        return None
    dumped: dict[str, Any] = client.capabilities.model_dump(
        by_alias=True, mode="json", exclude_none=True)
    return dumped


def _modern(ctx: Ctx) -> bool:
    return ctx.protocol_version in MODERN_PROTOCOL_VERSIONS


def _compact(value: Any) -> str:
    import json

    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=str)


def new_session_id() -> str:
    return f"stdio-{uuid.uuid4().hex}"
