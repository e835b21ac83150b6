"""The host side of a program's tool calls: every one goes through the seam.

One `NestedCalls` serves one `execute` run. A call from the program is executed on the inner
snapshot (captured with the outer one, from the same entries) through the same seam, with the
runner context of `execute` and the call id `<execute call id>/<n>` (n counts from 1 in the
order the program made the calls). So input is validated, permissions are asked, hooks run,
content is bounded and the outcome is recorded durably, exactly as for a direct call.

A call returns the tool's encoded output when it declares an output codec, else its text
content. A failed call raises `RuntimeError("<tool> failed [<kind>]: <message>")` inside the
program; `invalid_input` names the JSON path (`... [invalid_input at $.path]: ...`). A
`declined` permission ends the whole run (the runner should end the turn), as does going past
`max_tool_calls`.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from sidecar.codemode.catalog import Catalog
from sidecar.codemode.limits import CodeModeLimits
from sidecar.codemode.program import ProgramError, limit_error
from sidecar.codemode.sandbox import RunGuard, ToolTree
from sidecar.execution.snapshot import Snapshot
from sidecar.model.content import text_of
from sidecar.model.errors import CallError, ErrorKind
from sidecar.model.outcome import Outcome
from sidecar.model.tool import ToolContext


@dataclass(frozen=True, slots=True)
class CallRecord:
    n: int
    call_id: str
    tool: str
    status: str
    duration: float
    error_kind: str | None = None

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "call_id": self.call_id, "tool": self.tool, "status": self.status,
            "duration_ms": round(self.duration * 1000, 3),
        }
        if self.error_kind is not None:
            data["error_kind"] = self.error_kind
        return data


def _json_input(value: Any) -> Any:
    """Sandbox values as the JSON a codec expects (tuples are arrays)."""
    if isinstance(value, dict):
        return {k: _json_input(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_input(v) for v in value]
    return value


def failure_message(tool: str, error: CallError) -> str:
    where = f" at {error.path}" if error.path and error.kind is ErrorKind.INVALID_INPUT else ""
    return f"{tool} failed [{error.kind.value}{where}]: {error.message}"


class NestedCalls:
    __slots__ = (
        "_catalog", "_count", "_guard", "_limits", "_parent", "_semaphore", "_snapshot",
        "_tasks", "declined", "records",
    )

    def __init__(
        self,
        snapshot: Snapshot,
        catalog: Catalog,
        parent: ToolContext,
        limits: CodeModeLimits,
        guard: RunGuard,
    ) -> None:
        self._snapshot = snapshot
        self._catalog = catalog
        self._parent = parent
        self._limits = limits
        self._guard = guard
        self._count = 0
        self._semaphore = asyncio.Semaphore(limits.max_concurrent_calls)
        self._tasks: set[asyncio.Task[Outcome]] = set()
        self.records: list[CallRecord] = []
        self.declined: CallError | None = None

    # --- what the program sees ------------------------------------------------------------

    def tree(self) -> ToolTree:
        """The `tools` module: namespaces as nested modules, tools as async functions."""

        def build(node: Mapping[str, Any]) -> dict[str, Any]:
            return {
                key: build(value) if isinstance(value, Mapping) else self._bound(value)
                for key, value in node.items()
            }

        return build(self._catalog.tree)

    def functions(self) -> dict[str, Callable[..., Any]]:
        return {"call_tool": self._call_tool}

    def _bound(self, name: str) -> Callable[..., Any]:
        async def tool(*args: Any, **kwargs: Any) -> Any:
            return await self.call(name, _arguments(name, args, kwargs))

        tool.__name__ = name
        return tool

    async def _call_tool(self, *args: Any, **kwargs: Any) -> Any:
        if not args or not isinstance(args[0], str):
            raise TypeError('call_tool needs the tool name first: call_tool("name", arg=value)')
        name, rest = args[0], args[1:]
        return await self.call(name, _arguments(name, rest, kwargs))

    # --- the seam -----------------------------------------------------------------------

    async def call(self, name: str, raw_input: Any) -> Any:
        stopping = self._guard.reason
        if stopping is not None:  # the run is ending; nothing more may start
            raise RuntimeError(f"{name} was not called: {stopping.message}")
        self._count += 1
        n = self._count
        if n > self._limits.max_tool_calls:
            error = limit_error(
                "tool_calls", f"The program made more than {self._limits.max_tool_calls} tool "
                "calls. The run was stopped; batch the work or narrow it down.",
            )
            self._guard.stop(error)
            raise RuntimeError(error.message)
        parent = self._parent
        context = ToolContext(
            session_id=parent.session_id, agent=parent.agent, message_id=parent.message_id,
            call_id=f"{parent.call_id}/{n}", owner=parent.owner,
        )
        task = asyncio.create_task(self._settle(n, name, _json_input(raw_input), context))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        outcome = await task
        return self._value(outcome)

    async def _settle(self, n: int, name: str, raw_input: Any, context: ToolContext) -> Outcome:
        async with self._semaphore:
            started = time.perf_counter()
            outcome = await self._snapshot.execute(name, raw_input, context)
            elapsed = time.perf_counter() - started
        kind = outcome.error.kind.value if outcome.error is not None else None
        self.records.append(
            CallRecord(n, context.call_id, outcome.tool, outcome.status, elapsed, kind)
        )
        return outcome

    def _value(self, outcome: Outcome) -> Any:
        if outcome.error is not None:
            message = failure_message(outcome.tool, outcome.error)
            if outcome.error.kind is ErrorKind.DECLINED:
                self.declined = outcome.error
                self._guard.stop(ProgramError("PermissionDeclined", message))
            raise RuntimeError(message)
        entry = self._snapshot.entry(outcome.tool)
        text = text_of(outcome.content)
        if entry is None or entry.tool.output is None:
            return text
        if outcome.output is None and outcome.replayed:
            # the durable log keeps content, not output: the output's JSON form is the content
            try:
                return json.loads(text)
            except ValueError:
                return text
        return outcome.output

    async def cancel_pending(self) -> None:
        """Cancel the calls still in flight (the run ended or was cancelled) and wait."""
        pending = [t for t in self._tasks if not t.done()]
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.wait(pending)

    def sorted_records(self) -> list[CallRecord]:
        return sorted(self.records, key=lambda r: r.n)


def _arguments(name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    if not args:
        return kwargs
    if len(args) == 1 and isinstance(args[0], dict) and not kwargs:
        return args[0]
    raise TypeError(
        f"{name} takes keyword arguments (its input's properties), e.g. "
        f"tools.ns.tool(path='x'), or one dict with the whole input"
    )
