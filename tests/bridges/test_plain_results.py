"""A result of text blocks alone is read without the SDK's model (`plain_result`): it must mean
exactly what `CALL_RESULT` + `tool_response` / `tool_error` make of it, and anything else must
be left to them."""

from __future__ import annotations

from typing import Any

import pytest

from bridges.mcp.call_results import CALL_RESULT, plain_result
from bridges.mcp.results import plain_error, plain_response, tool_error, tool_response

PLAIN = [
    {"content": [{"type": "text", "text": "hello"}]},
    {"content": [{"type": "text", "text": "a"}, {"type": "text", "text": ""}], "isError": False},
    {"content": [{"type": "text", "text": "  it broke \n"}], "isError": True},
    {"content": [{"type": "text", "text": ""}], "isError": True},
    {"content": [{"type": "text", "text": "é\u2028\U0001f600"}]},
    {"content": [{"type": "text", "text": "x"}], "resultType": "complete"},
    {"content": [{"type": "text", "text": "x"}], "resultType": "complete", "isError": False,
     "_meta": {"io.modelcontextprotocol/serverInfo": {"name": "s", "version": "1"}}},
    {"content": [{"type": "text", "text": "x"}], "_meta": {}},
]

NOT_PLAIN = [
    {"content": []},
    {"content": [{"type": "text", "text": "x", "annotations": {"priority": 1}}]},
    {"content": [{"type": "text", "text": "x", "_meta": {"k": 1}}]},
    {"content": [{"type": "image", "data": "aGk=", "mimeType": "image/png"}]},
    {"content": [{"type": "text", "text": "x"}], "structuredContent": {"a": 1}},
    {"content": [{"type": "text", "text": "x"}], "_meta": {"k": 1}},
    {"content": [{"type": "text", "text": "x"}], "isError": "true"},
    {"content": [{"type": "text", "text": 5}]},
    {"content": [{"text": "x"}]},
    {"content": "x"},
    {"isError": False},
    {"content": [{"type": "text", "text": "x"}], "resultType": "input_required"},
    {"content": [{"type": "text", "text": "x"}], "resultType": "task"},
    {"content": [{"type": "text", "text": "x"}], "_meta": {"io.modelcontextprotocol/x": 1,
                                                             "vendor/k": 1}},
    {"content": [{"type": "text", "text": "x"}], "_meta": []},
]


@pytest.mark.parametrize("raw", PLAIN)
@pytest.mark.parametrize("has_output", [False, True])
def test_a_plain_result_means_what_the_model_path_makes_of_it(
    raw: dict[str, Any], has_output: bool
) -> None:
    plain = plain_result(raw)
    assert plain is not None
    model = CALL_RESULT.validate_python(raw, by_name=False)
    assert plain.is_error is model.is_error
    if model.is_error:
        mine = plain_error(plain, server="s", tool="t")
        theirs = tool_error(model, server="s", tool="t")
        assert (mine.message, mine.metadata, mine.kind) == \
            (theirs.message, theirs.metadata, theirs.kind)
    else:
        assert plain_response(plain, has_output=has_output) == \
            tool_response(model, has_output=has_output)


@pytest.mark.parametrize("raw", NOT_PLAIN)
def test_anything_else_is_left_to_the_model(raw: dict[str, Any]) -> None:
    assert plain_result(raw) is None
