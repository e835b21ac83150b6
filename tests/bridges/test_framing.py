"""The linear stdio framer: lines split at any chunk boundary, one join per line, limits."""

from __future__ import annotations

import asyncio
import json
import random
import tracemalloc

import mcp_types as types
import pytest
from mcp.shared.message import SessionMessage

from bridges.mcp import framing
from bridges.mcp.framing import (
    LargeLine,
    LineFramer,
    LineReader,
    OversizedLine,
    drain_messages,
    read_chunk,
    take_lines,
)
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


# -- lines parsed as they arrive (stream_at) ---------------------------------------------------

_ALPHABET = ["a", " ", '"', "\\", "\n", "\t", "\x01", "é", "€", "😀", "\u2028", "/", "zzzzz"]


def _random_value(rnd: random.Random, depth: int = 0) -> object:
    pick = rnd.random()
    if depth > 3 or pick < 0.3:
        return "".join(rnd.choice(_ALPHABET) for _ in range(rnd.choice([0, 3, 40, 60, 300, 3000])))
    if pick < 0.45:
        return rnd.randint(-10**6, 10**6)
    if pick < 0.55:
        return rnd.choice([True, False, None, 1.5])
    if pick < 0.8:
        return [_random_value(rnd, depth + 1) for _ in range(rnd.randint(0, 4))]
    return {"".join(rnd.choice(_ALPHABET) for _ in range(rnd.choice([1, 5, 70]))):
            _random_value(rnd, depth + 1) for _ in range(rnd.randint(0, 4))}


def _feed_line(line: bytes, framer: LineFramer, rnd: random.Random, most: int = 300) -> None:
    position = 0
    while position < len(line):
        size = rnd.randint(1, most)
        framer.feed(line[position : position + size])
        position += size
    framer.feed(b"\n")


@pytest.mark.parametrize("found_quotes", [0, 2, 16])
def test_a_streamed_line_parses_as_json_loads_does_whatever_the_pieces(monkeypatch, found_quotes):
    """Escapes, surrogate pairs and multi-byte characters cut anywhere by the pieces and by
    the decoding slices (thresholds shrunk so that every shape takes every path; with
    `found_quotes` 0 a string's end is always found by the regex)."""
    monkeypatch.setattr(framing, "_LONG_STRING", 50)
    monkeypatch.setattr(framing, "_DECODE_SLICE", 64)
    monkeypatch.setattr(framing, "_SAFE_CUT_WINDOW", 64)
    monkeypatch.setattr(framing, "_FOUND_QUOTES", found_quotes)
    rnd = random.Random(8 + found_quotes)
    for number in range(1500):
        message = {"jsonrpc": "2.0", "id": number, "result": _random_value(rnd)}
        line = json.dumps(message, ensure_ascii=rnd.random() < 0.3,
                          separators=rnd.choice([(",", ":"), (", ", ": ")])).encode()
        stream_at = rnd.choice([0, 10, 100])
        framer = LineFramer(10**9, stream_at=stream_at)
        _feed_line(line, framer, rnd)
        parsed = framer.pop()
        if len(line) > stream_at:
            assert isinstance(parsed, LargeLine)
            assert parsed.decode() == message, line[:300]
            assert parsed.size == len(line)
        else:  # never past stream_at: buffered as before
            assert isinstance(parsed, bytes) and json.loads(parsed) == message


def test_a_streamed_line_that_is_not_json_is_an_error_value():
    for line in (b'{"id": 1, "result": "never closed', b'{"id": 1, "result": [1, 2}',
                 b'{"id": 1, "x": "' + b"a" * 200_000 + b'"'):
        framer = LineFramer(10**9, stream_at=0)
        framer.feed(line + b"\n")
        [item] = list(drain_messages(framer))
        assert isinstance(item, ValueError) and "not a JSON-RPC message" in str(item)


@pytest.mark.parametrize("where", ["start", "end"])
def test_a_long_string_with_a_bad_escape_makes_the_line_an_error_value(where):
    """Decoding a long string's slices fails on the escape; the line is reported like any
    other bad line, and the next line still parses."""
    text = b"a" * 3_000_000
    bad = b"\\q" + text if where == "start" else text + b"\\q"
    framer = LineFramer(10**9, stream_at=1_000_000)
    _feed_line(b'{"jsonrpc": "2.0", "id": 1, "result": {"text": "' + bad + b'"}}', framer,
               random.Random(3), most=65536)
    framer.feed(message(2))
    error, good = list(drain_messages(framer))
    assert isinstance(error, ValueError)
    assert "not a JSON-RPC message (3,000," in str(error) and "Invalid \\escape" in str(error)
    assert isinstance(good, SessionMessage) and good.message.id == 2


def test_a_long_string_is_decoded_in_slices_that_grow_with_it(monkeypatch):
    """Each slice is appended to the text, which may move its whole page table: slices of a
    fixed size would make a large text quadratic."""
    monkeypatch.setattr(framing, "_DECODE_SLICE", 1024)
    slices: list[int] = []
    decode = framing._decode_prefix

    def counted(raw: bytearray, cut: int) -> str:
        slices.append(cut)
        return decode(raw, cut)

    monkeypatch.setattr(framing, "_decode_prefix", counted)
    text = "é1\n\"" * 1_000_000  # 5 M characters, 8 MB of JSON
    framer = LineFramer(10**9, stream_at=0)
    _feed_line(json.dumps({"id": 1, "text": text}).encode(), framer, random.Random(4),
               most=65536)
    parsed = framer.pop()
    assert isinstance(parsed, LargeLine) and parsed.decode() == {"id": 1, "text": text}
    assert len(slices) < 250  # 1 KiB slices: ~8,000
    assert max(slices) > 100_000  # about a 32nd of the text by the end


def test_a_streamed_line_past_the_limit_is_oversized_with_its_id():
    framer = LineFramer(3_000_000, stream_at=1_000_000)
    line = b'{"jsonrpc": "2.0", "id": 7, "result": {"text": "' + b"x" * 4_000_000 + b'"}}'
    _feed_line(line, framer, random.Random(1), most=65536)
    [item] = list(drain_messages(framer))
    assert isinstance(item, OversizedLine)
    assert item.size == len(line) and item.request_id() == 7


def test_a_streamed_direct_answer_is_taken_and_others_are_validated():
    text = "y" * 3_000_000
    taken: list[object] = []
    framer = LineFramer(10**9, stream_at=1_000_000)
    for request_id in ("sidecar-direct-1", 5):
        line = json.dumps({"jsonrpc": "2.0", "id": request_id,
                           "result": {"content": [{"type": "text", "text": text}]}}).encode()
        _feed_line(line, framer, random.Random(2), most=65536)
    items = list(drain_messages(framer, claim=lambda head: b"sidecar-direct-" in head,
                                take=lambda value: taken.append(value) is None))
    assert [value["id"] for value in taken] == ["sidecar-direct-1"]  # type: ignore[index]
    assert taken[0]["result"]["content"][0]["text"] == text  # type: ignore[index]
    [message] = items
    assert isinstance(message, SessionMessage)
    assert message.message.id == 5


def test_a_streamed_text_is_held_about_once():
    """The point of streaming: a buffered line holds its bytes and its text at once."""
    payload = ("x" * 99 + "\n") * 320_000  # 32 MB
    line = json.dumps({"jsonrpc": "2.0", "id": 1, "result": {"text": payload}}).encode()

    def peak(stream_at: int | None) -> float:
        framer = LineFramer(10**9, stream_at=stream_at)
        tracemalloc.start()
        try:
            for position in range(0, len(line), 65536):
                framer.feed(line[position : position + 65536])
            framer.feed(b"\n")
            [message] = list(drain_messages(framer))
            assert isinstance(message, SessionMessage)
            return tracemalloc.get_traced_memory()[1] / len(payload)
        finally:
            tracemalloc.stop()

    assert peak(None) > 1.9  # a copy of the line's bytes, or of its text, besides the value
    assert peak(1_000_000) < 1.15


def test_a_large_line_too_deep_to_parse_names_its_request():
    """A line over `PARSE_OFF_LOOP_AT` nested deeper than the parser follows is an
    `InvalidAnswer` naming its id (first in the object), as a short one is: the call fails at
    once, not at its timeout. (`json.loads` follows up to ~1,000 levels on Python 3.11, ~5,000
    on 3.12 and ~20,000 on 3.13: 100,000 is past all of them.)"""
    padding = "x" * framing.PARSE_OFF_LOOP_AT
    line = ('{"jsonrpc": "2.0", "id": "mcp-sidecar/9", "result": {"pad": "' + padding
            + '", "deep": ' + "[" * 100_000 + "]" * 100_000 + "}}").encode()
    framer = LineFramer(10**9)
    framer.feed(line + b"\n" + message(2))
    deferred = list(drain_messages(framer, defer_large=True))
    assert isinstance(deferred[0], LargeLine)
    framer.feed(line + b"\n")
    [error] = list(drain_messages(framer))
    assert isinstance(error, framing.InvalidAnswer) and error.request_id == "mcp-sidecar/9"
    assert "nested too deeply" in str(error)


@pytest.mark.anyio
async def test_a_line_reader_hands_lines_over_while_idle_and_keeps_their_order() -> None:
    """Whole lines from the start of the bytes go to `take` while the reader waits holding
    nothing; from the first line it refuses (and the partial line at the end) the bytes go
    through the stream, and while the reader holds part of a line, or is not waiting, all of
    them do."""
    taken: list[bytes] = []

    def take(line: bytes) -> bool:
        if line.startswith(b"fast"):
            taken.append(line)
            return True
        return False

    reader = LineReader(lambda data: take_lines(data, take, 100),
                        limit=1 << 16, loop=asyncio.get_running_loop())

    async def waiting(*, held: bool = False) -> asyncio.Task[bytes]:
        task = asyncio.ensure_future(read_chunk(reader, 100, held=held))
        await asyncio.sleep(0)  # it waits in `read` now
        return task

    reader.feed_data(b"fast 1\nfast 2\n")  # nobody waits yet
    assert taken == [] and await read_chunk(reader, 100, held=False) == b"fast 1\nfast 2\n"
    read = await waiting()
    reader.feed_data(b"fast 3\nfast 4\n")
    reader.feed_data(b"fast 5\nslow 6\nfast 7\nfast 8 (half")
    assert taken == [b"fast 3", b"fast 4", b"fast 5"]
    assert await read == b"slow 6\nfast 7\nfast 8 (half"
    read = await waiting(held=True)  # the loop holds "fast 8 (half"
    reader.feed_data(b")\nfast 9\n")
    assert taken[-1] == b"fast 5" and await read == b")\nfast 9\n"
    read = await waiting()
    reader.feed_data(b"f" * 100 + b"\n")  # a line of `limit` bytes or more: the stream's
    assert taken[-1] == b"fast 5" and await read == b"f" * 100
