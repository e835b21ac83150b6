"""The Code Mode built-ins: `execute`, `search_tools`, `describe_tools`.

Their descriptions and schemas never change with the catalog, so a provider's prompt cache
survives registry changes; the catalog reaches the model through `search_tools` and
`describe_tools`. They are direct tools (`codemode=False`): never callable from a program.
"""

from __future__ import annotations

import difflib
from typing import Any, NotRequired

import pydantic
import pydantic_core
from pydantic import BaseModel, ConfigDict, Field
from typing_extensions import TypedDict  # pydantic needs it on Python < 3.12

from sidecar.codemode.catalog import Catalog
from sidecar.codemode.limits import CodeModeLimits
from sidecar.codemode.nested import NestedCalls
from sidecar.codemode.program import ProgramRun
from sidecar.codemode.sandbox import RunGuard, Sandbox
from sidecar.codemode.search import SearchIndex
from sidecar.codemode.stubs import StubWriter
from sidecar.execution.snapshot import Snapshot
from sidecar.model.codec import make_codec
from sidecar.model.errors import ErrorKind, ToolFailure
from sidecar.model.tool import Annotations, CallContext, Tool, ToolResponse

EXECUTE_DESCRIPTION = """\
Run a short Python program that calls tools as async functions. Only what the program prints \
and the value of its last expression come back to you: use it to chain, loop over, filter and \
combine tool calls without pulling every intermediate result into the conversation.

Find tools with search_tools and read their exact signatures with describe_tools before \
calling them. Inside the program:
- `await tools.<namespace>.<tool>(arg=value, ...)` calls a tool; keyword arguments are its \
input. A tool without a namespace is `tools.<tool>`. `await call_tool("<tool name>", \
arg=value)` calls any tool by the name search_tools shows.
- A call returns the tool's structured output (dicts, lists) when it declares one, else its \
text.
- A failed call raises RuntimeError("<tool> failed [<kind>]: <message>"); catch it with \
try/except.
- `await asyncio.gather(...)` runs calls concurrently. `asyncio` and `tools` are already \
imported.
- End with an expression to return its value (like a notebook cell), or print().
The language is a Python subset (no class inheritance, no third-party packages). There is no \
filesystem, network or environment access except through tools. Run time, memory, the number \
of tool calls and the output size are limited."""

SEARCH_DESCRIPTION = """\
Search the tools that `execute` programs can call, by keywords matched against their names, \
titles, descriptions and parameter names. Returns the best matches, each with how to call it. \
Use "*" to list every tool."""

DESCRIBE_DESCRIPTION = """\
Typed Python signatures (TypedDict-style stubs) of tools that `execute` programs can call: \
keyword parameters, return type and docs. Pass tool names or paths as search_tools shows them."""


class ExecuteInput(BaseModel):
    model_config = ConfigDict(extra="forbid")

    code: str = Field(min_length=1, description="The Python program to run.")


class ToolCallJson(TypedDict):
    call_id: str
    tool: str
    status: str
    duration_ms: float
    error_kind: NotRequired[str]


class ProgramErrorJson(TypedDict):
    type: str
    message: str
    line: NotRequired[int]
    limit: NotRequired[str]
    traceback: NotRequired[str]


class ExecuteOutput(TypedDict):
    result: pydantic.JsonValue
    tool_calls: list[ToolCallJson]
    error: NotRequired[ProgramErrorJson]


class SearchInput(BaseModel):
    model_config = ConfigDict(extra="forbid")

    query: str = Field(description="Keywords, e.g. 'read file' or 'issue comments'; '*' lists all.")
    limit: int = Field(10, ge=1, le=50, description="How many matches to return.")


class SearchHitJson(BaseModel):
    name: str
    call: str
    description: str
    title: str | None = None
    score: float


class SearchOutput(BaseModel):
    results: list[SearchHitJson]
    total: int = Field(description="How many tools matched in all.")


class DescribeInput(BaseModel):
    model_config = ConfigDict(extra="forbid")

    names: list[str] = Field(
        min_length=1, max_length=50,
        description="Tool names or paths, e.g. ['fs_read_file'] or ['fs.read_file'].",
    )


class DescribeOutput(BaseModel):
    stubs: str
    missing: list[str]


_EXECUTE_IN = make_codec(ExecuteInput)
_EXECUTE_OUT = make_codec(pydantic.TypeAdapter(ExecuteOutput))
_SEARCH_IN = make_codec(SearchInput)
_SEARCH_OUT = make_codec(SearchOutput)
_DESCRIBE_IN = make_codec(DescribeInput)
_DESCRIBE_OUT = make_codec(DescribeOutput)
_SHORT = 160
_MAX_BY_TOOL = 20


def _first_sentence(text: str) -> str:
    flat = " ".join(text.split())
    cut = flat.find(". ")
    if 0 < cut < _SHORT:
        return flat[: cut + 1]
    return flat if len(flat) <= _SHORT else flat[: _SHORT - 1].rstrip() + "…"


def execute_tool(
    sandbox: Sandbox, inner: Snapshot, catalog: Catalog, limits: CodeModeLimits
) -> Tool:
    async def run(args: ExecuteInput, ctx: CallContext) -> ToolResponse:
        guard = RunGuard()
        calls = NestedCalls(inner, catalog, ctx.runner, limits, guard)
        try:
            program = await sandbox.run(
                args.code, tools=calls.tree(), functions=calls.functions(), limits=limits,
                guard=guard,
            )
        finally:
            await calls.cancel_pending()
        if calls.declined is not None:
            raise ToolFailure(
                f"The program stopped: a tool call was declined. {calls.declined.message}",
                kind=ErrorKind.DECLINED,
            )
        return _response(program, calls)

    return Tool(
        description=EXECUTE_DESCRIPTION, input=_EXECUTE_IN, output=_EXECUTE_OUT, execute=run,
        title="Run a Python program over the tools", codemode=False,
    )


def _response(program: ProgramRun, calls: NestedCalls) -> ToolResponse:
    records = calls.sorted_records()
    output: dict[str, Any] = {
        "result": program.result, "tool_calls": [r.to_json() for r in records],
    }
    if program.error is not None:
        output["error"] = program.error.to_json()
    parts = [program.printed.rstrip("\n")] if program.printed.strip() else []
    if program.result is not None:
        result = program.result
        shown = result if isinstance(result, str) else pydantic_core.to_json(result).decode()
        parts.append(f"Result: {shown}")
    if program.error is not None:
        parts.append(f"Error: {program.error.render()}")
    if not parts:
        parts.append("(No output: the program printed nothing and its result is None.)")
    by_tool: dict[str, dict[str, Any]] = {}
    for record in records:
        entry = by_tool.setdefault(record.tool, {"calls": 0, "errors": 0, "ms": 0.0})
        entry["calls"] += 1
        entry["errors"] += record.status == "error"
        entry["ms"] = round(entry["ms"] + record.duration * 1000, 3)
    metadata: dict[str, Any] = {
        "tool_calls": len(records),
        "failed_calls": sum(r.status == "error" for r in records),
        "duration_ms": round(program.duration * 1000, 3),
        "tool_ms": round(sum(r.duration for r in records) * 1000, 3),
        "by_tool": dict(sorted(by_tool.items(), key=lambda kv: -kv[1]["calls"])[:_MAX_BY_TOOL]),
    }
    if program.error is not None:
        metadata["error"] = program.error.limit or program.error.type
    return ToolResponse(output=output, content="\n".join(parts), metadata=metadata)


def search_tool(catalog: Catalog) -> Tool:
    index: list[SearchIndex] = []  # built on the first search of this snapshot

    async def run(args: SearchInput, ctx: CallContext) -> ToolResponse:
        if not index:
            index.append(SearchIndex(catalog))
        hits, total = index[0].search(args.query, args.limit)
        results = [
            SearchHitJson(
                name=h.tool.name, call=h.tool.call_example, title=h.tool.definition.title,
                description=_first_sentence(h.tool.definition.description),
                score=round(h.score, 2),
            )
            for h in hits
        ]
        if not results:
            text = (f"No tool matches {args.query!r}. Try other words, or '*' to list all "
                    f"{len(catalog)} tools.")
        else:
            lines = [f"{r.call}  [{r.name}]  {r.description}" for r in results]
            if total > len(results):
                lines.append(f"({len(results)} of {total} matches; raise limit for more)")
            text = "\n".join(lines)
        return ToolResponse(output=SearchOutput(results=results, total=total), content=text)

    return Tool(
        description=SEARCH_DESCRIPTION, input=_SEARCH_IN, output=_SEARCH_OUT, execute=run,
        title="Search the Code Mode tools", codemode=False,
        annotations=Annotations(read_only_hint=True, idempotent_hint=True),
    )


def describe_tool(catalog: Catalog) -> Tool:
    async def run(args: DescribeInput, ctx: CallContext) -> ToolResponse:
        writer = StubWriter()
        missing: list[str] = []
        seen: set[str] = set()
        for reference in args.names:
            tool = catalog.find(reference)
            if tool is None:
                missing.append(reference)
            elif tool.name not in seen:
                seen.add(tool.name)
                writer.add(tool)
        notes = [_missing_note(name, catalog) for name in missing]
        if not seen:
            raise ToolFailure(" ".join(notes) + " Use search_tools to find tools.")
        stubs = writer.render()
        text = "\n\n".join([stubs, *(f"# {note}" for note in notes)])
        return ToolResponse(output=DescribeOutput(stubs=stubs, missing=missing), content=text)

    return Tool(
        description=DESCRIBE_DESCRIPTION, input=_DESCRIBE_IN, output=_DESCRIBE_OUT,
        execute=run, title="Describe Code Mode tools", codemode=False,
        annotations=Annotations(read_only_hint=True, idempotent_hint=True),
    )


def _missing_note(name: str, catalog: Catalog) -> str:
    close = difflib.get_close_matches(name, catalog.names(), n=3)
    hint = f" (did you mean {', '.join(close)}?)" if close else ""
    return f"No tool {name!r}{hint}."
