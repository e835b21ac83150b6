"""The tool-search index (`sidecar.codemode.tool_index`) on real registry entries: ranking by
field, the glossary, fields no tool fills, and a rebuild that re-reads only what changed."""

from __future__ import annotations

from typing import Any

import pytest

from sidecar.codemode.tool_index import ToolIndex, ToolIndexes, query_terms, stem
from sidecar.model.tool import Tool, ToolResponse
from sidecar.registry.registry import Entry, build_entries

pytestmark = pytest.mark.anyio


async def _run(value: Any, ctx: Any) -> ToolResponse:
    return ToolResponse(content="ran")


def tool(description: str, **properties: str) -> Tool:
    schema = {"type": "object", "properties": {
        k: {"type": "string", "description": v} for k, v in properties.items()}}
    return Tool(description=description, input=schema, execute=_run)


def entries() -> dict[str, Entry]:
    return {
        **build_entries({"create_issue": tool("Create a new issue", title="Issue title"),
                         "list_pull_requests": tool("List pull requests of a repository")},
                        "github"),
        **build_entries({"get_current_time": tool("Get the current time in a timezone",
                                                  timezone="IANA timezone name")}, "time"),
    }


def test_terms_are_split_stemmed_and_stop_words_dropped() -> None:
    assert query_terms("Listing the openIssues of my repos") == ["list", "open", "issu",
                                                                 "repo"]
    assert query_terms("list_pull-requests") == ["list", "pull", "request"]
    assert [stem(w) for w in ("queries", "query", "created", "boxes", "status")] == [
        "queri", "queri", "creat", "box", "status"]


def test_search_ranks_by_fields_and_the_glossary() -> None:
    index = ToolIndex(entries(), {})
    assert index.search("current time in a timezone", 5)[0][0] == "time_get_current_time"
    assert index.search("file a bug", 5)[0][0] == "github_create_issue"  # bug -> issue
    assert index.search("open PRs in the repo", 5)[0][0] == "github_list_pull_requests"
    assert index.search("the and of", 5) == []
    assert ToolIndex({}, {}).search("anything", 5) == []


async def test_a_rebuild_tokenizes_only_changed_definitions() -> None:
    indexes = ToolIndexes()
    base = entries()
    first = await indexes.index(base)
    assert await indexes.index(dict(base)) is first  # the same definitions: kept
    changed = {**base, **build_entries({"create_issue": tool("Open a ticket")}, "github")}
    second = await indexes.index(changed)
    assert second is not first
    unchanged = "time_get_current_time"
    assert second.tokenized[unchanged] is first.tokenized[unchanged]  # not re-read
    assert second.tokenized["github_create_issue"] is not first.tokenized["github_create_issue"]
    assert second.search("ticket", 5)[0][0] == "github_create_issue"
