"""`StderrTail.read(after)`: what a server wrote after a mark, redacted, bounded by what is kept
(the console's and `sidecar logs -f`'s follow rests on it)."""

from __future__ import annotations

from bridges.mcp.redact import Redactor
from bridges.mcp.stderr_tail import StderrTail

SECRET = "sk-live-0123456789abcdef"


def test_read_gives_what_came_after_a_mark_redacted() -> None:
    tail = StderrTail("s", Redactor([SECRET]))
    assert tail.read() == (0, "")
    tail.feed(b"starting\n")
    mark, text = tail.read()
    assert (mark, text) == (9, "starting\n")
    assert tail.read(mark) == (9, "")  # nothing new
    tail.feed(f"token {SECRET} refused\n".encode())
    mark, text = tail.read(mark)
    assert text == "token *** refused\n" and mark == 9 + len(f"token {SECRET} refused\n")


def test_read_past_what_is_kept_gives_all_that_is_kept() -> None:
    tail = StderrTail("s", Redactor(), limit=10)
    tail.feed(b"0123456789abcdef")
    assert tail.read(0) == (16, "6789abcdef")  # 16 bytes fed, the last 10 kept
    assert tail.read(99) == (16, "6789abcdef")  # a mark from before a restart of the tail
    tail.feed(b"XY")
    assert tail.read(16) == (18, "XY")
