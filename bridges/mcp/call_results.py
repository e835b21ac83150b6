"""What a `tools/call` may answer besides a plain result, and how it is decoded: `CALL_RESULT`
(the tagged parse: a `CallToolResult`, a 2026-07-28 `input_required` round, or a SEP-2663
task), `later_revision_fields` (result keys only newer revisions declare, dropped before
parsing), `answer_all` (an `input_required` round's embedded requests answered) and
`follow_task` (a task polled with `tasks/get` to its end), `plain_result` (a result of text
blocks alone, read without a model: `PlainResult`). Imports `bridges.mcp.passthrough`; exports
those, `AnswerFnT`, `MAX_INPUT_ROUNDS`, `STATE_ONLY_PAUSE` and `PROTOCOL_META_PREFIX`.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from types import UnionType
from typing import Annotated, Any, get_args

import anyio
import mcp_types as types
from mcp.client.session import ClientSession
from mcp.shared.exceptions import MCPError
from mcp_types.methods import SERVER_RESULTS
from mcp_types.version import KNOWN_PROTOCOL_VERSIONS
from pydantic import BaseModel, Discriminator, Tag, TypeAdapter

from bridges.mcp.passthrough import INPUT_KEY, UPSTREAM_TASK


@functools.cache
def later_revision_fields(version: str, method: str = "tools/call") -> frozenset[str]:
    """`method`'s result keys only revisions newer than `version` declare: outside the
    negotiated contract, so dropped before parsing (as the SDK drops them)."""
    current = SERVER_RESULTS.get((method, version))
    if current is None or version not in KNOWN_PROTOCOL_VERSIONS:
        return frozenset()
    later: set[str] = set()
    for revision in KNOWN_PROTOCOL_VERSIONS[KNOWN_PROTOCOL_VERSIONS.index(version) + 1 :]:
        if (row := SERVER_RESULTS.get((method, revision))) is not None:
            later |= _wire_fields(row)
    return frozenset(later - _wire_fields(current))


def _wire_fields(target: Any) -> set[str]:
    members = get_args(target) if isinstance(target, UnionType) else (target,)
    return {
        field.alias or name
        for model in members if isinstance(model, type) and issubclass(model, BaseModel)
        for name, field in model.model_fields.items()
    }


AnswerFnT = Callable[[types.InputRequest], Awaitable[types.InputResponse | types.ErrorData]]
"""Answers one request embedded in an `input_required` result (sampling, elicitation, roots)."""

MAX_INPUT_ROUNDS = 10
STATE_ONLY_PAUSE = 0.05


def _result_kind(value: Any) -> str:
    if isinstance(value, dict):
        kind = value.get("resultType")
        return "input" if kind == "input_required" else "task" if kind == "task" else "complete"
    return "input" if isinstance(value, types.InputRequiredResult) else "complete"


# Tagged by `resultType` so a large result is validated once, as a `CallToolResult`; a task
# (SEP-2663's CreateTaskResult) stays a dict.
CALL_RESULT: TypeAdapter[types.CallToolResult | types.InputRequiredResult | dict[str, Any]] = (
    TypeAdapter(Annotated[
        Annotated[types.CallToolResult, Tag("complete")]
        | Annotated[types.InputRequiredResult, Tag("input")]
        | Annotated[dict[str, Any], Tag("task")],
        Discriminator(_result_kind),
    ]))
_ANY_RESULT: TypeAdapter[Any] = TypeAdapter(dict[str, Any])


class PlainResult:
    """A `tools/call` result made of text blocks alone (`plain_result`): what
    `CALL_RESULT` would make a `CallToolResult` of, read without building one."""

    __slots__ = ("is_error", "texts")

    def __init__(self, texts: list[str], is_error: bool) -> None:
        self.texts = texts
        self.is_error = is_error


_PLAIN_KEYS = frozenset({"content", "isError", "resultType", "_meta"})
PROTOCOL_META_PREFIX = "io.modelcontextprotocol/"
"""The protocol's own `_meta` keys (e.g. the 2026-07-28 serverInfo stamp), not the tool's."""
_TEXT_KEYS = frozenset({"type", "text"})


def plain_result(raw: dict[str, Any]) -> PlainResult | None:
    """The result as a `PlainResult` when it is nothing but `content` (one or more blocks of
    exactly `type: "text"` and a string `text`), an optional boolean `isError`, and what only
    the protocol reads (`resultType: "complete"`, the protocol's own `_meta` keys such as the
    2026-07-28 serverInfo stamp, which `tool_response` drops); None for anything else
    (annotations, other `_meta`, `structuredContent`, other blocks, lax values), which
    `CALL_RESULT` validates. Validating even a small result with the SDK's model cost ~20 µs
    of the daemon's CPU a call (2026-12-06), for the most common answer of all."""
    if not _PLAIN_KEYS.issuperset(raw):
        return None
    content = raw.get("content")
    is_error = raw.get("isError", False)
    if type(content) is not list or not content or type(is_error) is not bool:
        return None
    if raw.get("resultType", "complete") != "complete":
        return None
    if "_meta" in raw and (type(meta := raw["_meta"]) is not dict
                           or not all(key.startswith(PROTOCOL_META_PREFIX) for key in meta)):
        return None
    texts: list[str] = []
    for block in content:
        if (type(block) is not dict or block.keys() != _TEXT_KEYS or block["type"] != "text"
                or type(text := block["text"]) is not str):
            return None
        texts.append(text)
    return PlainResult(texts, is_error)
_INPUT_REQUEST: TypeAdapter[types.InputRequest] = TypeAdapter(types.InputRequest)


class _TaskRequest(types.Request[dict[str, Any], str]):
    """`tasks/get` or `tasks/update` (SEP-2663), whose `Mcp-Name` is the task id."""

    name_param = "taskId"


def _dump(value: Any) -> Any:
    if isinstance(value, BaseModel):
        return value.model_dump(by_alias=True, mode="json", exclude_none=True)
    return value


async def answer_all(
    requests: dict[str, types.InputRequest], answer: AnswerFnT | None
) -> types.InputResponses | None:
    """Every embedded request answered concurrently; the first refusal ends the call."""
    if not requests:
        return None
    responses: types.InputResponses = {}
    refused: list[types.ErrorData] = []

    async def one(key: str, request: types.InputRequest) -> None:
        if answer is None:
            reply: types.InputResponse | types.ErrorData = types.ErrorData(
                code=types.INVALID_REQUEST, message=f"{request.method} cannot be answered here")
        else:
            INPUT_KEY.set(key)  # this task's own context: the relay may keep the key
            reply = await answer(request)
        if isinstance(reply, types.ErrorData):
            refused.append(reply)
            tg.cancel_scope.cancel()
        else:
            responses[key] = reply

    async with anyio.create_task_group() as tg:
        for key, request in requests.items():
            tg.start_soon(one, key, request)
    if refused:
        raise MCPError.from_error_data(refused[0])
    return responses


async def follow_task(
    session: ClientSession, created: dict[str, Any], call_timeout: float,
    answer: AnswerFnT | None,
) -> types.CallToolResult:
    """A task the server made of a call, polled with `tasks/get` until it ends (within
    `call_timeout`); its input requests are answered through `tasks/update`."""
    task_id = created.get("taskId")
    if not isinstance(task_id, str):
        raise MCPError(types.INTERNAL_ERROR, "the server's CreateTaskResult has no taskId")
    notify = UPSTREAM_TASK.get()
    if notify is not None:
        notify()
    with anyio.fail_after(call_timeout):
        while True:
            task: dict[str, Any] = await session.send_request(
                _TaskRequest(method="tasks/get", params={"taskId": task_id}), _ANY_RESULT)
            status = task.get("status")
            if status == "completed":
                return types.CallToolResult.model_validate(task.get("result") or {},
                                                           by_name=False)
            if status == "failed":
                error = task.get("error") or {}
                raise MCPError(int(error.get("code", types.INTERNAL_ERROR)),
                               str(error.get("message", "the task failed")))
            if status == "cancelled":
                raise MCPError(types.INTERNAL_ERROR, f"task {task_id!r} was cancelled")
            if status == "input_required":
                asked = {key: _INPUT_REQUEST.validate_python(value, by_name=False)
                         for key, value in (task.get("inputRequests") or {}).items()}
                responses = await answer_all(asked, answer) or {}
                await session.send_request(_TaskRequest(method="tasks/update", params={
                    "taskId": task_id,
                    "inputResponses": {key: _dump(value)
                                       for key, value in responses.items()},
                }), _ANY_RESULT)
                continue
            poll = task.get("pollIntervalMs") or created.get("pollIntervalMs") or 250
            await anyio.sleep(min(max(float(poll), 50.0), 2000.0) / 1000)
