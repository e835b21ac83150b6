"""`_HeadWithBody`, the transport under `sidecar serve`'s HTTP protocol: an answer's head and
its body's first part leave in one write when they come in one turn of the event loop; a head
alone leaves at the end of that turn; nothing is reordered or lost, a close included. On a real
socket pair; the writes reaching the socket's transport are recorded as they pass."""

from __future__ import annotations

import asyncio
import socket
from typing import Any, cast

import pytest

from sidecar.serve.http_protocol import _HeadWithBody

pytestmark = pytest.mark.anyio

HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 9\r\n\r\n"
BODY = b'{"ok": 1}'


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class _Recorded:
    """The socket's own transport, with each write it is given kept in `writes`."""

    def __init__(self, transport: asyncio.Transport) -> None:
        self.transport = transport
        self.writes: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.writes.append(bytes(data))
        self.transport.write(data)

    def is_closing(self) -> bool:
        return self.transport.is_closing()

    def close(self) -> None:
        self.transport.close()


async def _pair() -> tuple[_Recorded, _HeadWithBody, socket.socket]:
    ours, theirs = socket.socketpair()
    loop = asyncio.get_running_loop()
    transport, _ = await loop.connect_accepted_socket(asyncio.Protocol, ours)
    recorded = _Recorded(cast(asyncio.Transport, transport))
    theirs.setblocking(False)
    return recorded, _HeadWithBody(cast(asyncio.Transport, recorded)), theirs


async def _read_all(sock: socket.socket, size: int) -> bytes:
    loop = asyncio.get_running_loop()
    data = b""
    while len(data) < size:
        chunk = await asyncio.wait_for(loop.sock_recv(sock, size - len(data)), 5)
        if not chunk:
            break
        data += chunk
    return data


async def test_a_head_and_its_body_in_one_turn_leave_in_one_write() -> None:
    recorded, transport, peer = await _pair()
    transport.write(HEAD)
    assert recorded.writes == []  # held for the body
    transport.write(BODY)
    assert recorded.writes == [HEAD + BODY]
    assert await _read_all(peer, len(HEAD + BODY)) == HEAD + BODY
    transport.close()
    peer.close()


async def test_a_head_alone_leaves_at_the_end_of_the_turn() -> None:
    """An SSE stream with nothing to send yet: its client gets the head at once."""
    recorded, transport, peer = await _pair()
    transport.write(HEAD)
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert recorded.writes == [HEAD]
    assert await _read_all(peer, len(HEAD)) == HEAD
    transport.write(b"event: message\n\n")  # later parts go as they come
    assert recorded.writes == [HEAD, b"event: message\n\n"]
    transport.close()
    peer.close()


async def test_a_close_sends_the_held_head_first() -> None:
    recorded, transport, peer = await _pair()
    transport.write(HEAD)
    transport.close()
    assert recorded.writes == [HEAD]
    assert await _read_all(peer, len(HEAD) + 1) == HEAD  # then the end of the stream
    await asyncio.sleep(0)  # the turn's end finds nothing left to send
    assert recorded.writes == [HEAD]
    peer.close()


async def test_a_body_that_looks_like_a_head_keeps_its_place() -> None:
    recorded, transport, peer = await _pair()
    transport.write(b"plain ")
    transport.write(HEAD)  # text that happens to spell a head: held like one
    transport.write(b"tail")
    assert recorded.writes == [b"plain ", HEAD + b"tail"]
    assert await _read_all(peer, 10 + len(HEAD)) == b"plain " + HEAD + b"tail"
    transport.close()
    peer.close()


def test_anything_else_is_the_transports_own() -> None:
    class Plain:
        def get_extra_info(self, name: str, default: Any = None) -> Any:
            return {"peername": ("127.0.0.1", 1)}.get(name, default)

    transport = _HeadWithBody(cast(asyncio.Transport, Plain()))
    assert transport.get_extra_info("peername") == ("127.0.0.1", 1)
