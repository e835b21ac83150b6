"""One `tools/list` page, checked tool by tool in a worker thread and cut at `max_tools`.

Imports the SDK's types only; exports `ToolLimit`, `Listing`, `check_page` and
`release_heap`. A page can be tens of megabytes and tens of thousands of tools; everything
done per tool after the listing (catalog, registry, pins, profiles, search) grows with their
number, much of it on the event loop. So a server offers at most `max_tools` tools (10,000 by
default, `max_tools` in its manifest entry): the tools after that are counted, not checked,
and the rest of the listing is not asked for. Tools that `tools.allow` / `tools.deny` filter
out do not count against the cap.

A listing of tens of megabytes leaves the C allocator holding the memory its parsed form
used: glibc keeps freed chunks in the arena of the worker thread that allocated them, so a
50 MB listing kept ~1 GB resident for good. `release_heap` (glibc `malloc_trim`) gives it
back once the page is dropped; elsewhere it does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import mcp_types as types
from mcp.shared.exceptions import MCPError
from mcp.shared.inbound import find_invalid_x_mcp_header
from pydantic import ValidationError

log = logging.getLogger("bridges.mcp")

DEFAULT_MAX_TOOLS = 10_000
RELEASE_AT = 1_000
"""A page of this many tools or more is followed by `release_heap`."""


@dataclass(frozen=True, slots=True)
class ToolLimit:
    """How many tools of a listing are kept: at most `max_tools` of those `offered` says the
    server offers (the others are kept for the catalog to count as filtered)."""

    max_tools: int = DEFAULT_MAX_TOOLS
    offered: Callable[[str], bool] = lambda name: True


@dataclass(frozen=True, slots=True)
class Listing:
    """Every kept tool of a listing, a warning if the listing stopped early, how many
    offered tools were left out past `max_tools` (`over_cap`), and the listing's cache hints
    (2026-07-28: the smallest `ttlMs` and the narrowest `cacheScope` of its pages; None from
    a handshake-era server, which gives none)."""

    tools: list[types.Tool]
    warning: str | None = None
    over_cap: int = 0
    max_tools: int = DEFAULT_MAX_TOOLS
    ttl_ms: int | None = None
    cache_scope: str | None = None

    @property
    def cap_reason(self) -> str | None:
        """What health says of a listing cut at `max_tools` (None when it was not)."""
        if not self.over_cap:
            return None
        return (f"{self.over_cap:,} more tools listed after the first {self.max_tools:,} were "
                f"left out: over this server's max_tools ({self.max_tools:,}); later pages "
                "of tools/list were not asked for; raise max_tools for this server to offer "
                "them")


@dataclass(frozen=True, slots=True)
class CheckedPage:
    page: types.ListToolsResult
    offered: int
    """Kept tools that count against the cap."""
    over_cap: int


def check_page(box: list[dict[str, Any]], foreign: frozenset[str], modern: bool,
               room: int, offered: Callable[[str], bool]) -> CheckedPage:
    """A `tools/list` result checked tool by tool (each a short step, so the event loop's
    thread gets the interpreter between them), keeping at most `room` offered tools; the raw
    page is emptied and freed here, off the loop. As the SDK's session does, a 2026-era
    listing drops tools whose `x-mcp-header` annotations are invalid."""
    raw = box.pop()
    ttl = raw.get("ttlMs")
    if isinstance(ttl, int | float) and not isinstance(ttl, bool) and ttl < 0:
        raw["ttlMs"] = 0  # floored, as the SDK does (2026-07-28 caching SHOULD)
    listed = raw.get("tools")
    if not isinstance(listed, list):
        raise MCPError(types.INTERNAL_ERROR, "the server's tools/list result is not a valid "
                       "ListToolsResult (at tools: a list is required)")
    where: tuple[str | int, ...] = ()
    kept = over = 0
    tool: Any = None
    try:
        tools: list[types.Tool] = []
        for index, tool in enumerate(listed):
            name = tool.get("name") if isinstance(tool, dict) else None
            counts = not isinstance(name, str) or offered(name)
            if counts and kept >= room:
                over += 1  # not checked: it will not be offered
                continue
            where = ("tools", index)
            checked = types.Tool.model_validate(tool, by_name=False)
            if modern and (reason := find_invalid_x_mcp_header(checked.input_schema)):
                log.warning("dropping tool %r: invalid x-mcp-header (%s)", checked.name, reason)
                continue
            tools.append(checked)
            kept += counts
        where = ()
        rest = {key: value for key, value in raw.items()
                if key != "tools" and key not in foreign}
        page = types.ListToolsResult.model_validate({**rest, "tools": []}, by_name=False)
    except ValidationError as exc:
        detail = exc.errors(include_input=False)[0]
        path = ".".join(str(part) for part in (*where, *detail["loc"]))
        raise MCPError(types.INTERNAL_ERROR, "the server's tools/list result is not a valid "
                       f"ListToolsResult (at {path or 'the top'}: {detail['msg']})") from None
    finally:
        size = len(listed)
        # Emptied, not only let go: the transport's message may still hold the page (over
        # streamable HTTP it does), and the tools would then be freed on the event loop by
        # whoever drops it last (a quarter of a second for 66,000 tools), after the trim.
        listed.clear()
        raw.clear()
        del raw, listed, tool
        if size >= RELEASE_AT:
            release_heap()
    return CheckedPage(page.model_copy(update={"tools": tools}), kept, over)


def _malloc_trim() -> Callable[[int], int] | None:
    name = ctypes.util.find_library("c")
    try:
        trim: Callable[[int], int] = ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError, TypeError):  # not glibc
        return None
    return trim


_TRIM = _malloc_trim()


def release_heap() -> None:
    """Return the C allocator's free memory to the system (glibc; elsewhere nothing). Blocks
    for a few milliseconds without the interpreter lock: call it from a worker thread."""
    if _TRIM is not None:
        _TRIM(0)
