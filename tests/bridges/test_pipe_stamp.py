"""`pipe_stamp`: a request line on a pipe gets the same `_meta` as from the SDK's own stamp of
the session's era (its private `_make_modern_stamp` / `_make_handshake_stamp`, built as a
session builds them), without the HTTP headers; a stamp whose `_meta` depends on the request
is not taken apart. Calls over real pipes in the 2026-07-28 era (the SDK's server refuses a
request without its `_meta` envelope) are in the bridge's end-to-end tests and
`tests/bench/test_stages_smoke.py`."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from mcp.client.session import _make_handshake_stamp, _make_modern_stamp

from bridges.mcp.connection import pipe_stamp

CLIENT = {"name": "mcp-sidecar", "version": "0.1.0"}
CAPABILITIES = {"roots": {"listChanged": True}, "sampling": {}}


def modern(log_level: Any = None) -> Any:
    return _make_modern_stamp("2026-07-28", CLIENT, CAPABILITIES,
                              lambda name, arguments: {"Mcp-Param-Q": "x"},
                              log_level=log_level)


REQUESTS = [
    {"method": "tools/call", "params": {"name": "echo", "arguments": {"text": "hi"}}},
    {"method": "tools/call", "params": {"name": "echo", "arguments": {}, "_meta": {
        "io.mcp-sidecar/call_id": "c1", "io.modelcontextprotocol/logLevel": "error",
        "io.modelcontextprotocol/protocolVersion": "1999-01-01"}}},
    {"method": "tools/list", "params": {"cursor": "2"}},
    {"method": "tools/list", "params": {}},
]


@pytest.mark.parametrize("sdk", [modern(), modern("debug"), _make_handshake_stamp("2025-11-25")],
                         ids=["2026-07-28", "2026-07-28 with a log level", "2025 handshake"])
def test_a_line_on_a_pipe_gets_the_sdk_stamps_meta_and_no_headers(sdk: Any) -> None:
    ours = pipe_stamp(sdk)
    assert ours is not None
    for request in REQUESTS:
        theirs, mine = copy.deepcopy(request), copy.deepcopy(request)
        their_opts: dict[str, Any] = {}
        mine_opts: dict[str, Any] = {}
        sdk(theirs, their_opts)
        ours(mine, mine_opts)
        assert mine == theirs, request
        assert mine_opts == {}  # the headers are the HTTP transport's
        assert their_opts.get("headers")  # (which the SDK's stamp does build)


def test_the_sdk_stamps_own_meta_keys_are_kept_apart_from_the_requests() -> None:
    ours = pipe_stamp(modern("debug"))
    assert ours is not None
    line: dict[str, Any] = {"method": "tools/call", "params": {"name": "echo", "_meta": {
        "io.modelcontextprotocol/logLevel": "error",
        "io.modelcontextprotocol/protocolVersion": "1999-01-01"}}}
    ours(line, {})
    meta = line["params"]["_meta"]
    assert meta["io.modelcontextprotocol/logLevel"] == "error"  # the request's own: kept
    assert meta["io.modelcontextprotocol/protocolVersion"] == "2026-07-28"  # the session's
    assert meta["io.modelcontextprotocol/clientCapabilities"] is CAPABILITIES


def test_a_stamp_whose_meta_depends_on_the_request_is_run_on_every_request() -> None:
    def per_request(data: dict[str, Any], opts: Any) -> None:
        meta = data.setdefault("params", {}).setdefault("_meta", {})
        meta["tool"] = data["params"].get("name")

    assert pipe_stamp(per_request) is None

    def fresh_each_time(data: dict[str, Any], opts: Any) -> None:
        data.setdefault("params", {}).setdefault("_meta", {})["caps"] = dict(CAPABILITIES)

    assert pipe_stamp(fresh_each_time) is None
