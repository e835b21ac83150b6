"""Tasks (SEP-2663, extension `io.modelcontextprotocol/tasks`) on the facade: a `tools/call` the
client lets run as a task returns a `CreateTaskResult` at once; `tasks/get`, `tasks/update` and
`tasks/cancel` follow it; listen streams that name it hear its status (`task_status`). A task
is the call itself: its id is the call id, it runs through the seam like any call (an
`rounds.Execution`: the upstream's questions become the task's `inputRequests`), and once
settled its outcome is in the outcome log, where `tasks/get` finds it after the record here is
gone (another replica, a restart).

Which tools: an upstream tool that lists `execution.taskSupport` `optional` or `required`
(`bridges.mcp` keeps it in the tool's `_meta`, `TASK_SUPPORT_META`). A client that declared the
extension (in the request's `_meta` client capabilities) gets a task for those; one that did not
gets the plain result of an `optional` tool and -32021 for a `required` one, and -32021 for every
`tasks/*` method and for a listen stream that names tasks. An unknown task id is -32602.

May import the core and the rest of `sidecar.serve`. Exports `FacadeTasks`, `TASKS_EXTENSION`,
`declares_tasks`, `task_support`, `check_routing` and `missing_tasks_capability`.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import anyio
import anyio.abc
import mcp_types as types
from mcp.server.context import ServerRequestContext
from mcp.shared.exceptions import MCPError
from mcp.shared.inbound import decode_header_value
from mcp_types.jsonrpc import HEADER_MISMATCH
from pydantic import BaseModel, ConfigDict, Field

from bridges.mcp import TASK_SUPPORT_META
from sidecar.serve.mcp_facade.rounds import Escalated, Execution, Finished, Question
from sidecar.serve.mcp_facade.task_status import Listen, TaskStatusStreams, task_ids

if TYPE_CHECKING:
    from sidecar.location.location import Location

TASKS_EXTENSION = "io.modelcontextprotocol/tasks"
MISSING_CAPABILITY = -32021
TTL_MS = 3_600_000
POLL_MS = 250
GATHER_SECONDS = 0.1
MCP_NAME_HEADER = "mcp-name"
REQUIRED: dict[str, Any] = {"extensions": {TASKS_EXTENSION: {}}}
Result = Callable[[Any, Any], Awaitable[dict[str, Any]]]
"""(outcome, snapshot or None) -> the `CallToolResult` wire it gives (`ServedTools`)."""


class TaskParams(types.RequestParams):
    model_config = ConfigDict(extra="allow", populate_by_name=True)
    task_id: str = Field(alias="taskId")
    input_responses: dict[str, Any] | None = Field(default=None, alias="inputResponses")


def declares_tasks(caps: Any) -> bool:
    extensions = caps.get("extensions") if isinstance(caps, dict) else None
    return isinstance(extensions, dict) and TASKS_EXTENSION in extensions


def task_support(entry: Any) -> str | None:
    """`optional` or `required` for a tool whose upstream runs it as a task, else None."""
    meta = getattr(getattr(entry, "tool", None), "meta", None) or {}
    support = meta.get(TASK_SUPPORT_META)
    return support if support in ("optional", "required") else None


def check_routing(request: Any, params: TaskParams) -> None:
    """SEP-2663 over HTTP: `Mcp-Name`, when sent on `tasks/*`, names the task (-32020)."""
    headers = getattr(request, "headers", None)
    name = headers.get(MCP_NAME_HEADER) if headers is not None else None
    if name is not None and decode_header_value(name) != params.task_id:
        raise MCPError(HEADER_MISMATCH, "Mcp-Name header does not match the request body's "
                       "'taskId' parameter")


def missing_tasks_capability(what: str) -> MCPError:
    return MCPError(MISSING_CAPABILITY, f"{what} needs the client capability {TASKS_EXTENSION}",
                    {"requiredCapabilities": REQUIRED})


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


@dataclass(slots=True)
class Task:
    task_id: str
    execution: Execution
    created: str = field(default_factory=_now)
    updated: str = field(default_factory=_now)
    status: str = "working"
    result: dict[str, Any] | None = None
    error: dict[str, Any] | None = None
    pending: dict[str, Question] = field(default_factory=dict)
    resumed: anyio.Event = field(default_factory=anyio.Event)
    expires: float = field(default_factory=lambda: time.monotonic() + TTL_MS / 1000)
    on_change: Callable[[str], None] | None = None
    """Told the task id after each status change (`task_status.TaskStatusStreams`)."""

    def set(self, status: str) -> None:
        self.status = status
        self.updated = _now()
        if self.on_change is not None:
            self.on_change(self.task_id)

    def envelope(self) -> dict[str, Any]:
        return {"taskId": self.task_id, "status": self.status, "createdAt": self.created,
                "lastUpdatedAt": self.updated, "ttlMs": TTL_MS, "pollIntervalMs": POLL_MS}


class FacadeTasks:
    """The tasks of one facade, by task id (= call id)."""

    def __init__(self, location: Location, result: Result) -> None:
        self._location = location
        self._result = result
        self._tasks: dict[str, Task] = {}
        self.status = TaskStatusStreams()

    # --- tools/call ------------------------------------------------------------------------

    async def start(
        self, execution: Execution, work: Callable[[], Awaitable[Any]],
        running: dict[str, Execution], done: Callable[[], object], tg: anyio.abc.TaskGroup,
    ) -> dict[str, Any]:
        """Run the call as a task in `tg`; its `CreateTaskResult`, once `tasks/get` finds it."""
        self._forget_expired()
        running[execution.call_id] = execution

        def forget() -> None:
            running.pop(execution.call_id, None)
            done()

        tg.start_soon(execution.run, work, forget)
        return await self.adopt(execution, tg)

    async def adopt(self, execution: Execution, tg: anyio.abc.TaskGroup) -> dict[str, Any]:
        """The running call as a task from now on (also a paused call whose upstream made a
        task of it: SEP-2663's input rounds before the task): its `CreateTaskResult`."""
        task = Task(execution.call_id, execution, on_change=self.status.changed)
        self._tasks[task.task_id] = task
        tg.start_soon(self._follow, task)
        return {"resultType": "task", **task.envelope()}

    async def _follow(self, task: Task) -> None:
        """The task's status as its call asks and settles."""
        while True:
            step = await task.execution.next_step()
            if isinstance(step, Escalated):
                continue
            if isinstance(step, Finished):
                await self._settle(task, step)
                return
            await anyio.sleep(GATHER_SECONDS)  # questions asked together: one round
            task.pending = {**step, **task.execution.asked_since()}
            task.resumed = anyio.Event()
            task.set("input_required")
            await task.resumed.wait()

    async def _settle(self, task: Task, step: Finished) -> None:
        if task.status == "cancelled":
            return
        if step.failure is not None:
            task.error = {"code": types.INTERNAL_ERROR, "message": str(step.failure)}
            task.set("failed")
            return
        if step.outcome is None:
            task.set("cancelled")
            return
        failed = _protocol_error(step.outcome)
        if failed is not None:
            task.error = failed
            task.set("failed")
            return
        try:
            task.result = await self._result(step.outcome, task.execution.snapshot)
        except MCPError as exc:
            task.error = {"code": exc.code, "message": exc.message}
            task.set("failed")
            return
        task.set("completed")

    # --- tasks/* ---------------------------------------------------------------------------

    async def get(self, params: TaskParams) -> dict[str, Any]:
        detailed = self.detailed(params.task_id)
        if detailed is None:
            return await self._from_log(params.task_id)
        return detailed

    def detailed(self, task_id: str) -> dict[str, Any] | None:
        """A held task's `DetailedTask` (what `tasks/get` and `notifications/tasks` carry)."""
        task = self._tasks.get(task_id)
        if task is None:
            return None
        detailed = task.envelope()
        if task.status == "input_required":
            detailed["inputRequests"] = {
                key: q.request.model_dump(by_alias=True, mode="json", exclude_none=True)
                for key, q in task.pending.items()}
        if task.result is not None:
            detailed["result"] = task.result
        if task.error is not None:
            detailed["error"] = task.error
        return detailed

    async def listen(
        self, ctx: ServerRequestContext[Any, Any], params: types.SubscriptionsListenRequestParams,
        declared: bool, inner: Listen,
    ) -> types.SubscriptionsListenResult:
        """A `subscriptions/listen` stream (served by `inner`) that may list task ids: those
        this facade holds are acknowledged and their status changes ride the stream; a client
        that did not declare the extension (`declared`) and lists some gets -32021."""
        wanted = task_ids(params)
        if not wanted:
            return await inner(ctx, params)
        if not declared:
            raise missing_tasks_capability("subscriptions/listen for task ids")
        honored = [task_id for task_id in wanted if task_id in self._tasks]
        return await self.status.listen(ctx, params, honored, self.detailed, inner)

    async def update(self, params: TaskParams) -> dict[str, Any]:
        task = self._known(params.task_id)
        for key, answer in (params.input_responses or {}).items():
            question = task.pending.pop(key, None)
            if question is not None:
                question.settle(_response(question.request, answer))
        if task.status == "input_required" and not task.pending:
            task.set("working")
            task.resumed.set()
        return {}

    async def cancel(self, params: TaskParams) -> dict[str, Any]:
        task = self._tasks.get(params.task_id)
        if task is None:
            await self._from_log(params.task_id)  # -32602 when nobody knows it
            return {}
        if task.status in ("working", "input_required"):
            task.set("cancelled")
            task.execution.scope.cancel()
            task.resumed.set()
        return {}

    def _known(self, task_id: str) -> Task:
        task = self._tasks.get(task_id)
        if task is None:
            raise MCPError(types.INVALID_PARAMS, f"unknown task id {task_id!r}")
        return task

    async def _from_log(self, task_id: str) -> dict[str, Any]:
        """A task this facade no longer holds: its call's outcome in the outcome log."""
        outcome = await self._location.outcome(task_id)
        if outcome is None:
            raise MCPError(types.INVALID_PARAMS, f"unknown task id {task_id!r}")
        stamp = _now()
        detailed: dict[str, Any] = {"taskId": task_id, "createdAt": stamp,
                                    "lastUpdatedAt": stamp, "ttlMs": TTL_MS}
        failed = _protocol_error(outcome)
        if failed is not None:
            return {**detailed, "status": "failed", "error": failed}
        return {**detailed, "status": "completed", "result": await self._result(outcome, None)}

    def _forget_expired(self) -> None:
        now = time.monotonic()
        for task_id in [t for t, task in self._tasks.items() if task.expires < now]:
            del self._tasks[task_id]


def _protocol_error(outcome: Any) -> dict[str, Any] | None:
    """An upstream's JSON-RPC error for the call (the task failed), or None (a result, which
    may be a tool error: the task completed)."""
    error = getattr(outcome, "error", None)
    code = (getattr(outcome, "partial", None) or {}).get("code")
    if getattr(outcome, "status", None) != "error" or error is None or not isinstance(code, int):
        return None
    return {"code": code, "message": str(error.message)}


def _response(request: Any, answer: Any) -> Any:
    """A client's answer as the result type its question expects (an error when malformed)."""
    kinds: dict[str, type[BaseModel]] = {"elicitation/create": types.ElicitResult,
            "sampling/createMessage": types.CreateMessageResult,
            "roots/list": types.ListRootsResult}
    kind = kinds.get(getattr(request, "method", ""))
    if kind is None:
        return answer
    try:
        return kind.model_validate(answer, by_name=False)
    except Exception:
        return types.ErrorData(code=types.INVALID_PARAMS, message="malformed input response")
