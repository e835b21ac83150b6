"""The tool-search index (`sidecar.codemode.tool_index`) on real registry entries: ranking by
field, the glossary, fields no tool fills, the embedding model the `wordllama` package ships (a
request that shares no word with its tool), a rebuild that re-reads and re-embeds only what
changed, and search by words alone when the model cannot load."""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import pytest

from sidecar.codemode.embedding import load_embedder
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


async def test_a_rebuild_embeds_only_changed_definitions() -> None:
    indexes = ToolIndexes()
    base = entries()
    first = await indexes.index(base)
    changed = {**base, **build_entries({"create_issue": tool("Open a ticket")}, "github")}
    second = await indexes.index(changed)
    vectors = {name: t.vector for name, t in second.tokenized.items()}
    assert all(v is not None and abs(float(np.linalg.norm(v)) - 1) < 1e-5
               for v in vectors.values())
    for unchanged in ("time_get_current_time", "github_list_pull_requests"):
        assert vectors[unchanged] is first.tokenized[unchanged].vector  # not embedded again
    old = first.tokenized["github_create_issue"].vector
    assert old is not None
    assert vectors["github_create_issue"] is not old
    assert not np.allclose(vectors["github_create_issue"], old)


def test_texts_become_unit_vectors_and_a_text_without_tokens_the_zero_vector() -> None:
    model = load_embedder()
    assert model is not None, "wordllama (a dependency) ships the model"
    texts = ["Create a new issue", "", "Open a new ISSUE", "Weather forecast for a city"]
    vectors = model.embed(texts)
    assert vectors.shape == (4, model.dimensions) and vectors.dtype == np.float32
    assert not vectors[1].any()
    assert np.allclose(np.linalg.norm(vectors[[0, 2, 3]], axis=1), 1)
    assert np.allclose(model.embed(texts[:1]), vectors[:1])  # a text alone: the same vector
    # meaning: the two ways to say "new issue" are closer than either is to the weather
    assert vectors[0] @ vectors[2] > max(vectors[0] @ vectors[3], vectors[2] @ vectors[3])


def weather_entries() -> dict[str, Entry]:
    return {**entries(), **build_entries(
        {"get_forecast": tool("Weather forecast for a city", city="City name"),
         "read_file": tool("Read the contents of a file", path="Path of the file")}, "weather")}


def test_a_request_sharing_no_word_with_its_tool_is_found_by_meaning() -> None:
    index = ToolIndex(weather_entries(), {})
    for request in ("will it rain tomorrow", "is it sunny in Paris"):
        assert index.search(request, 5, embedding=False) == []  # no word in common
        assert index.search(request, 5)[0][0] == "weather_get_forecast"
    # words still count: a tool that shares them stays first
    assert index.search("read notes.txt", 5)[0][0] == "weather_read_file"


def test_without_the_model_search_ranks_by_words_alone(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, logger="sidecar.codemode.embedding"):
        # a package that is not installed, and one that is but ships no model
        assert load_embedder("sidecar_tests_no_such_model") is None
        assert load_embedder("sidecar_tests_no_such_model") is None
        assert load_embedder("json") is None
    warnings = [r.getMessage() for r in caplog.records
                if r.name == "sidecar.codemode.embedding"]
    assert len(warnings) == 2  # one per package, however often it is asked for
    assert warnings[0].startswith("tool search ranks by words alone: its embedding model")
    assert "sidecar_tests_no_such_model" in warnings[0]
    index = ToolIndex(weather_entries(), {}, embedder=None)
    assert all(t.vector is None for t in index.tokenized.values())
    assert index.search("will it rain tomorrow", 5) == []
    assert index.search("open PRs in the repo", 5)[0][0] == "github_list_pull_requests"
    assert index.search("weather forecast", 5)[0][0] == "weather_get_forecast"
