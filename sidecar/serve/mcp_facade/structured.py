"""`structuredContent` through the MCP facade, bounded like the text it travels with: each
tool's rule (`Tool.structured_output`, for MCP servers the manifest key `structured_output`:
`bounded`, `full` or `off`) applied to a result (`bound_structured`, whose docstring has the
rules) and to the listing (`advertise_output_schemas`). `/v1` and Code Mode are programmatic:
they keep the full `output` whatever this says.

Imports `sidecar.model`, `sidecar.execution`, `sidecar.formats` and `managed_store`. Exports
`bound_structured`, `advertise_output_schemas`, `mode_of`, `STRUCTURED_META` and
`OUTPUT_SCHEMA_META`.
"""

from __future__ import annotations

from typing import Any

import pydantic_core

from managed_store import TextStore
from sidecar.execution.bounding import apply_preview, plan_bounding
from sidecar.execution.snapshot import Snapshot
from sidecar.formats.results import META_PREFIX, mcp_content
from sidecar.model.content import content_from_json
from sidecar.model.outcome import Outcome
from sidecar.model.text import utf8_length
from sidecar.model.tool import Bounds, StructuredOutput

STRUCTURED_META = f"{META_PREFIX}structured"
OUTPUT_SCHEMA_META = f"{META_PREFIX}outputSchema"
"""In a `tools/list` entry's `_meta`: the output schema of a `bounded` tool (see above)."""


def mode_of(snapshot: Snapshot, tool: str) -> StructuredOutput:
    entry = snapshot.entry(tool)
    return (entry.tool.structured_output if entry is not None else None) or "bounded"


def advertise_output_schemas(listing: list[dict[str, Any]], snapshot: Snapshot) -> None:
    """Each tool's `outputSchema` as its rule advertises it (in place, on wire tool
    definitions): kept for `full`, moved to `_meta["sidecar/outputSchema"]` for `bounded`,
    dropped for `off`."""
    for tool in listing:
        if "outputSchema" not in tool:
            continue
        mode = mode_of(snapshot, tool["name"])
        if mode == "full":
            continue
        schema = tool.pop("outputSchema")
        if mode == "bounded":
            tool["_meta"] = {**tool.get("_meta", {}), OUTPUT_SCHEMA_META: schema}


async def bound_structured(
    wire: dict[str, Any], outcome: Outcome, snapshot: Snapshot, *, store: TextStore,
    namespace: str, bounds: Bounds,
) -> dict[str, Any]:
    """`wire` (a `CallToolResult` as a dict) with its `structuredContent` relayed by the
    tool's rule. A call result's model-visible bytes are its text (already bounded by the seam)
    plus its `structuredContent`: clients such as pydantic-ai hand the latter to the model whole.

    - `bounded` (the default): `structuredContent` is sent when the text and the compact JSON
      of the value together fit the tool's byte bound. Otherwise the JSON is retained whole in
      the managed store and left out of the result; a note in the text names its ref and how to
      read it (`managed_read` by characters: it is one line), and `_meta["sidecar/structured"]`
      has `{"ref", "bytes"}`. Such a result is a success: the tool's schema is advertised under
      `_meta["sidecar/outputSchema"]` of its `tools/list` entry, not as `outputSchema`, because
      a success without `structuredContent` is invalid for a tool with an `outputSchema` (the
      Python `mcp` client raises) and an error result reaches the model as a failure
      (pydantic-ai raises `ModelRetry`). The text keeps within the bound: if the note does not
      fit beside it, the text is bounded again (its full form retained).
    - `full`: always sent whole, and `outputSchema` advertised (trusted programmatic clients
      that never show it to a model).
    - `off`: never sent, and no schema is advertised, so no client expects it."""
    if "structuredContent" not in wire:
        return wire
    mode = mode_of(snapshot, outcome.tool)
    if mode == "full":
        return wire
    value = wire.pop("structuredContent")
    if mode == "off":
        return wire
    entry = snapshot.entry(outcome.tool)
    if entry is not None and entry.tool.bounds is not None:
        bounds = entry.tool.bounds.over(bounds)
    encoded = pydantic_core.to_json(value).decode()
    text_bytes = sum(_visible_bytes(item) for item in wire["content"])
    if text_bytes + len(encoded.encode()) <= bounds.bytes_limit:
        wire["structuredContent"] = value
        return wire
    ref = await store.put(encoded, namespace=namespace)
    note = (
        f"[The call succeeded. Its structured result ({ref.size_bytes:,} bytes of JSON) is "
        f"over the {bounds.bytes_limit:,}-byte bound of a result, so it is not sent as "
        f"structuredContent; it is kept whole as {ref.id}: read it with managed_read("
        f'ref="{ref.id}", offset=1, start=0).]'
    )
    note_bytes = utf8_length(note) + 1
    if text_bytes + note_bytes > bounds.bytes_limit:
        wire["content"] = await _bound_again(wire["content"], bounds, note_bytes, store,
                                             namespace, wire)
    wire["content"].append({"type": "text", "text": note})
    meta = wire.setdefault("_meta", {})
    meta[STRUCTURED_META] = {"ref": ref.id, "bytes": ref.size_bytes}
    return wire


async def _bound_again(
    items: list[dict[str, Any]], bounds: Bounds, reserve: int, store: TextStore,
    namespace: str, wire: dict[str, Any],
) -> list[dict[str, Any]]:
    """The text of `items` cut again to leave `reserve` bytes for the note (lossless: what is
    cut is retained, and an earlier cut's ref stays in the text)."""
    content = content_from_json([_ours(item) for item in items])
    tighter = Bounds(max_bytes=max(bounds.bytes_limit - reserve, 1024),
                     max_lines=bounds.lines_limit)
    planned = plan_bounding(content, tighter)
    if planned is None:
        return items
    joined, plan = planned
    ref = await store.put(joined, namespace=namespace)
    managed = wire.setdefault("_meta", {}).setdefault(f"{META_PREFIX}managed", [])
    managed.append({"ref": ref.id, "size_bytes": ref.size_bytes, "lines": ref.lines})
    return mcp_content(apply_preview(content, joined, plan, ref.id))


def _visible_bytes(item: dict[str, Any]) -> int:
    """Bytes of a wire content item a model reads as text (media: none)."""
    kind = item.get("type")
    if kind == "text":
        return utf8_length(item.get("text", ""))
    if kind == "resource":
        return utf8_length(item.get("resource", {}).get("text", "") or "")
    if kind == "resource_link":
        return sum(utf8_length(str(item.get(key) or ""))
                   for key in ("uri", "name", "description", "mimeType")) + 24
    return 0


def _ours(item: dict[str, Any]) -> dict[str, Any]:
    """An MCP wire content item in our JSON form (camelCase -> snake_case, resource flattened)."""
    kind = item.get("type")
    if kind == "resource":
        resource = item["resource"]
        out = {"type": "resource", "uri": resource["uri"]}
        for key, ours in (("mimeType", "mime_type"), ("text", "text"), ("blob", "blob")):
            if key in resource:
                out[ours] = resource[key]
        return out
    return {("mime_type" if k == "mimeType" else k): v for k, v in item.items()
            if k not in ("annotations", "_meta", "title", "icons", "size")}
