"""The linear stdio framer: lines split at any chunk boundary, one join per line, limits."""

from __future__ import annotations

import json

import mcp_types as types
import pytest
from mcp.shared.message import SessionMessage

from bridges.mcp.framing import LineFramer, OversizedLine, drain_messages
from bridges.mcp.redact import Redactor


def message(i: int, text: str = "x") -> bytes:
    body = {"jsonrpc": "2.0", "id": i, "result": {"content": [{"type": "text", "text": text}]}}
    return json.dumps(body).encode() + b"\n"


def feed_in_pieces(framer: LineFramer, data: bytes, size: int) -> None:
    for start in range(0, len(data), size):
        framer.feed(data[start : start + size])


@pytest.mark.parametrize("piece", [1, 3, 7, 64, 4096])
def test_messages_survive_any_chunking(piece: int) -> None:
    data = message(1, "a\nb") + b"\r\n" + message(2, "é" * 50) + b"  \n" + message(3)
    framer = LineFramer(max_line_bytes=1 << 20)
    feed_in_pieces(framer, data, piece)
    parsed = list(drain_messages(framer))
    assert [type(m) for m in parsed] == [SessionMessage] * 3
    results = [m.message for m in parsed if isinstance(m, SessionMessage)]
    assert [r.id for r in results if isinstance(r, types.JSONRPCResponse)] == [1, 2, 3]
    first = results[0]
    assert isinstance(first, types.JSONRPCResponse)
    assert first.result["content"][0]["text"] == "a\nb"


def test_a_long_line_is_joined_once_from_its_chunks() -> None:
    text = "y" * 3_000_000
    data = message(7, text)
    framer = LineFramer(max_line_bytes=1 << 24)
    feed_in_pieces(framer, data, 65536)
    assert framer.buffered_bytes == 0
    (parsed,) = list(drain_messages(framer))
    assert isinstance(parsed, SessionMessage)
    assert isinstance(parsed.message, types.JSONRPCResponse)
    assert parsed.message.result["content"][0]["text"] == text


def test_an_unfinished_line_stays_buffered() -> None:
    framer = LineFramer(max_line_bytes=1024)
    framer.feed(b'{"jsonrpc": "2.0", ')
    assert list(drain_messages(framer)) == []
    assert framer.buffered_bytes == len(b'{"jsonrpc": "2.0", ')


def test_a_bad_line_is_reported_and_the_next_one_still_parses() -> None:
    framer = LineFramer(max_line_bytes=1024)
    framer.feed(b"Server starting...\n" + message(4))
    bad, good = list(drain_messages(framer))
    assert isinstance(bad, ValueError) and "not a JSON-RPC message" in str(bad)
    assert isinstance(good, SessionMessage)


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        (message(42, "z" * 5000), 42),  # the Python SDK writes the id first
        (b'{"result":{"content":[{"type":"text","text":"' + b"z" * 5000
         + b'"}]},"jsonrpc":"2.0","id":"r-9"}\n', "r-9"),  # the TypeScript SDK writes it last
        (b'{"result": "' + b"z" * 5000 + b'"}\n', None),
    ],
)
def test_an_oversized_line_is_not_buffered_but_identified(line: bytes, expected: object) -> None:
    framer = LineFramer(max_line_bytes=1000)
    feed_in_pieces(framer, line + message(5), 700)
    oversized, after = list(drain_messages(framer))
    assert isinstance(oversized, OversizedLine)
    assert oversized.size == len(line) - 1
    assert len(oversized.head) <= 512 and len(oversized.tail) <= 512
    assert oversized.request_id() == expected
    assert isinstance(after, SessionMessage)


def test_redactor_masks_env_and_header_values_and_bearer_tokens() -> None:
    redact = Redactor.for_server({"API_KEY": "s3cr3t-value", "PAGER": "cat"},
                                 {"Authorization": "Bearer tok-123456"})
    text = "key=s3cr3t-value auth=Bearer tok-123456 raw tok-123456 pager=cat"
    assert redact(text) == "key=*** auth=*** raw *** pager=cat"
