"""A `tools/list` page checked in bounded steps and cut at `max_tools`."""

from __future__ import annotations

from typing import Any

import pytest
from mcp.shared.exceptions import MCPError

from bridges.mcp.listing import Listing, check_page, release_heap


def _page(count: int, **extra: Any) -> list[dict[str, Any]]:
    tools = [{"name": f"t{k}", "inputSchema": {"type": "object"}} for k in range(count)]
    return [{"tools": tools, **extra}]


def test_tools_past_the_room_are_counted_not_checked() -> None:
    box = _page(5)
    box[0]["tools"][4] = {"name": "t4", "inputSchema": "not a schema"}  # past the cap
    checked = check_page(box, frozenset(), False, 3, lambda name: True)
    assert [t.name for t in checked.page.tools] == ["t0", "t1", "t2"]
    assert (checked.offered, checked.over_cap) == (3, 2) and box == []


def test_the_page_is_emptied_even_when_the_transport_still_holds_it() -> None:
    """Over streamable HTTP the SDK's message keeps the page: it is emptied in the checking
    thread so that its tools are not freed later by the event loop."""
    box = _page(3, nextCursor="c")
    held = box[0]
    checked = check_page(box, frozenset(), False, 10, lambda name: True)
    assert [t.name for t in checked.page.tools] == ["t0", "t1", "t2"]
    assert held == {} and checked.page.next_cursor == "c"


def test_filtered_tools_do_not_count_against_the_cap() -> None:
    checked = check_page(_page(6, nextCursor="c"), frozenset(), False, 2,
                         lambda name: name in ("t1", "t4", "t5"))
    assert [t.name for t in checked.page.tools] == ["t0", "t1", "t2", "t3", "t4"]
    assert (checked.offered, checked.over_cap) == (2, 1)
    assert checked.page.next_cursor == "c"


def test_an_invalid_tool_under_the_cap_names_its_place() -> None:
    box = _page(2)
    box[0]["tools"][1] = {"name": 7}
    with pytest.raises(MCPError, match=r"at tools\.1\.name"):
        check_page(box, frozenset(), False, 10, lambda name: True)


def test_the_cap_reason_names_the_cap_and_the_count() -> None:
    assert Listing([], over_cap=0).cap_reason is None
    assert Listing([], over_cap=56_000, max_tools=10_000).cap_reason == (
        "56,000 more tools listed after the first 10,000 were left out: over this server's "
        "max_tools (10,000); later pages of tools/list were not asked for; raise max_tools "
        "for this server to offer them")
    release_heap()  # harmless at any time (glibc malloc_trim, or nothing)
