"""Tool search (`expose = "search"`): a snapshot that lists `search_tools`, `call_tool`,
`managed_read` and the profile's `always` tools, and still captures every tool.

`search_tools({query, limit})` ranks the snapshot's other tools (`tool_index`) and returns each
match's name, description and input schema. `call_tool({name, arguments})` is not a tool that
calls another: `SearchSnapshot.execute` hands such a call to the seam as a call of `name` with
`arguments`, so it gets everything a direct call gets (profile, pins, permissions, rate limits,
bounding, hooks) and the history records the real tool. Only a call the seam could not run
(`name` missing or unknown, a built-in) reaches the `call_tool` tool, whose error names the
tool and points to `search_tools`. A model may also call an unlisted tool by its name.

Imports the lower core and its `sidecar.codemode` siblings. Exports `search_snapshot`,
`SearchSnapshot`, `advertised`, `called_tool`, `SEARCH_BUILTINS`, `ALWAYS_LISTED` and the two
built-ins' descriptions.
"""

from __future__ import annotations

import fnmatch
import json
import logging
from collections.abc import Iterable, Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from sidecar.codemode.tool_index import ToolIndexes
from sidecar.execution.seam import Seam
from sidecar.execution.snapshot import Snapshot
from sidecar.model import json_depth
from sidecar.model.codec import make_codec
from sidecar.model.errors import ToolFailure
from sidecar.model.outcome import Outcome
from sidecar.model.suggest import closest
from sidecar.model.tool import Annotations, CallContext, Tool, ToolContext, ToolResponse
from sidecar.registry.registry import Entry, ToolDefinition, build_entries, sorted_definitions

SEARCH_TOOLS = "search_tools"
CALL_TOOL = "call_tool"
SEARCH_BUILTINS = (SEARCH_TOOLS, CALL_TOOL)
ALWAYS_LISTED = ("managed_read",)
"""Listed in search mode whenever the profile serves them (previews point to `managed_read`)."""

SEARCH_TOOLS_DESCRIPTION = """\
Find the tools available to you: only a few are listed. Search by what you want to do, in a \
few words: the action, the kind of thing it acts on, and the product or service when you know \
it (e.g. "create a github issue", "read a file", "list kubernetes pods"). Leave names, ids and \
values out: they go in call_tool's arguments. Returns the best matches, each with its name, \
description and input_schema; then run one with call_tool."""

CALL_TOOL_DESCRIPTION = """\
Run a tool that search_tools found: `name` is its exact name, `arguments` its input as its \
input_schema describes. Returns that tool's result."""

log = logging.getLogger("sidecar.codemode")


class SearchToolsInput(BaseModel):
    model_config = ConfigDict(extra="forbid")

    query: str = Field(min_length=1, description=(
        "What you want to do: the action and the kind of thing, in a few words."))
    limit: int = Field(5, ge=1, le=50, description="How many matches to return.")


class ToolMatch(BaseModel):
    name: str
    description: str
    input_schema: dict[str, Any]


class SearchToolsOutput(BaseModel):
    tools: list[ToolMatch]
    total: int = Field(description="How many tools can be searched in all.")


class CallToolInput(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, description="The tool's exact name, as search_tools gives it.")
    arguments: dict[str, Any] = Field(
        default_factory=dict, description="The tool's input, as its input_schema describes.")


_SEARCH_IN = make_codec(SearchToolsInput)
_SEARCH_OUT = make_codec(SearchToolsOutput)
_CALL_IN = make_codec(CallToolInput)


def _search_text(query: str, matches: list[ToolMatch]) -> str:
    if not matches:
        return (f"No tool matches {query!r}. Try other words: what the tool does, or the "
                "service it talks to.")
    return "\n\n".join(
        f"{m.name}: {m.description}\ninput_schema: "
        f"{json.dumps(m.input_schema, separators=(',', ':'))}" for m in matches
    )


def search_tools_tool(searchable: Mapping[str, Entry], indexes: ToolIndexes) -> Tool:
    """`search_tools` over `searchable` (the snapshot's tools but the listed ones)."""

    async def run(args: SearchToolsInput, ctx: CallContext) -> ToolResponse:
        built = await indexes.index(searchable)
        hits = built.search(args.query, args.limit)
        matches = [
            ToolMatch(name=name, description=searchable[name].definition.description,
                      input_schema=dict(searchable[name].definition.input_schema))
            for name, _ in hits
        ]
        return ToolResponse(output=SearchToolsOutput(tools=matches, total=len(searchable)),
                            content=_search_text(args.query, matches))

    return Tool(
        description=SEARCH_TOOLS_DESCRIPTION, input=_SEARCH_IN, output=_SEARCH_OUT,
        execute=run, title="Search the available tools", codemode=False,
        annotations=Annotations(read_only_hint=True, idempotent_hint=True,
                                destructive_hint=False, open_world_hint=False),
    )


def call_tool_tool(names: Iterable[str]) -> Tool:
    """`call_tool`: reached only by a call the snapshot could not hand on (see the module)."""
    known = tuple(names)

    async def run(args: CallToolInput, ctx: CallContext) -> ToolResponse:
        if args.name in SEARCH_BUILTINS:
            raise ToolFailure(f"call_tool cannot run {args.name}: call {args.name} directly.")
        near = closest(args.name, known)
        hint = f" Did you mean: {', '.join(near)}?" if near else ""
        raise ToolFailure(
            f"call_tool: no tool named {args.name!r} is available here.{hint} Use search_tools "
            "to find the tool you need and its exact name.")

    return Tool(
        description=CALL_TOOL_DESCRIPTION, input=_CALL_IN, execute=run,
        title="Run a tool found by search_tools", codemode=False,
    )


def _call_target(raw_input: Any) -> tuple[str, Any] | None:
    """(name, arguments) of a well-formed `call_tool` input, else None (the tool reports it)."""
    if isinstance(raw_input, str | bytes):
        try:
            raw_input = json_depth.loads(raw_input)
        except ValueError:
            return None
    if not isinstance(raw_input, dict) or set(raw_input) - {"name", "arguments"}:
        return None
    name = raw_input.get("name")
    arguments = raw_input.get("arguments", {})
    if not isinstance(name, str) or not isinstance(arguments, dict):
        return None
    return name, arguments


def called_tool(name: str, raw_input: Any) -> str:
    """The tool a call of `name` with `raw_input` runs: for `call_tool`, the tool its input
    names (when well formed and not a built-in), else `name` itself."""
    if name != CALL_TOOL:
        return name
    target = _call_target(raw_input)
    return target[0] if target is not None and target[0] not in SEARCH_BUILTINS else name


class SearchSnapshot(Snapshot):
    """A snapshot whose `definitions` are the listed tools only; `deferred` holds the
    definitions of the others (the Anthropic format sends them with `defer_loading`)."""

    __slots__ = ("deferred",)

    def __init__(
        self, seam: Seam, entries: Mapping[str, Entry], listed: Iterable[str], *,
        final_step: bool = False, session_id: str | None = None, removed: Iterable[str] = (),
    ) -> None:
        super().__init__(seam, entries, final_step=final_step, session_id=session_id,
                         removed=removed)
        shown = frozenset(listed)
        self.definitions = sorted_definitions(e for n, e in entries.items() if n in shown)
        self.deferred = sorted_definitions(
            e for n, e in entries.items() if n not in shown and n not in SEARCH_BUILTINS)

    async def execute(self, name: str, raw_input: Any, context: ToolContext) -> Outcome:
        if name == CALL_TOOL:
            target = _call_target(raw_input)
            if target is not None and target[0] not in SEARCH_BUILTINS and (
                self.entry(target[0]) is not None or target[0] in self.removed
            ):
                return await super().execute(target[0], target[1], context)
        return await super().execute(name, raw_input, context)


def search_snapshot(
    seam: Seam,
    entries: Mapping[str, Entry],
    *,
    indexes: ToolIndexes,
    always: Iterable[str] = (),
    session_id: str | None = None,
    final_step: bool = False,
    removed: Iterable[str] = (),
) -> SearchSnapshot:
    """The search-mode snapshot of `entries` (captured as for a direct one). `always` are
    globs over effective names listed beside the built-ins; `indexes` start building the
    search index of the others now, off the event loop."""
    patterns = tuple(always)
    searchable = {n: e for n, e in entries.items() if n not in SEARCH_BUILTINS}
    for name in entries.keys() & set(SEARCH_BUILTINS):
        log.warning("tool %r (%s) is shadowed in search mode by the built-in of the same name",
                    name, entries[name].key)
    listed = [*SEARCH_BUILTINS, *(
        n for n in searchable
        if n in ALWAYS_LISTED or any(fnmatch.fnmatchcase(n, p) for p in patterns)
    )]
    hidden = {n: e for n, e in searchable.items() if n not in listed}  # what search finds
    indexes.warm(hidden)
    builtins = build_entries({
        SEARCH_TOOLS: search_tools_tool(hidden, indexes),
        CALL_TOOL: call_tool_tool(searchable),
    }, None)
    return SearchSnapshot(seam, {**searchable, **builtins}, listed, final_step=final_step,
                          session_id=session_id, removed=removed)


def advertised(
    snapshot: Snapshot, *, native_search: bool
) -> tuple[tuple[ToolDefinition, ...], tuple[ToolDefinition, ...]]:
    """(listed, deferred) definitions of a request. A provider that searches deferred tools
    itself (`native_search`: Anthropic) gets every tool, the others deferred, and no
    `search_tools`/`call_tool`; any other gets `snapshot.definitions` alone."""
    if not native_search or not isinstance(snapshot, SearchSnapshot):
        return snapshot.definitions, ()
    listed = tuple(d for d in snapshot.definitions if d.name not in SEARCH_BUILTINS)
    return listed, snapshot.deferred
