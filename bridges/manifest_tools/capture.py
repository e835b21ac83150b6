"""Capturing a producer's bytes with bounded memory: in memory, then spooled, then dropped.
Imports `managed_store` and `sidecar.model.text`; exports `OutputCapture`, `Captured`,
`spooled_preview`, `tail_start`, `known_encoding` and the preview and spool sizes.

    feed(bytes) ...                          finish() -> Captured
    |<- memory_cap ->|<------ spooled to the managed store ------>|<- dropped (counted) ->|
    0            memory_cap                                    hard_cap

Up to `memory_cap` bytes stay in memory and become the whole text (the seam bounds it as
usual); past it, everything goes to a managed-store spool as valid UTF-8 and only a head and
a tail stay in memory, for the preview; past `hard_cap`, bytes are counted and discarded (a
producer limit, reported exactly, never retained). Bytes are decoded as `encoding` (UTF-8 by
default): invalid bytes become U+FFFD and `Captured.replaced` says so; the store keeps text,
never raw binary. How the spool is fed: `OutputCapture`.
"""

from __future__ import annotations

import asyncio
import codecs
import collections
from contextlib import AsyncExitStack
from dataclasses import dataclass
from types import TracebackType
from typing import Self

from managed_store import Drained, FdSpool, ManagedRef, TextSpool, TextStore
from sidecar.model.text import head_end, utf8_length

SPOOL_BATCH = 1024 * 1024
"""UTF-8 bytes gathered before one spool write."""
SPOOL_DEPTH = 2
"""Spool writes in flight at most; memory holds this many batches plus the one being read."""
PREVIEW_BYTES = 8 * 1024
"""UTF-8 bytes of the head, and of the tail, in a spooled preview."""
PREVIEW_LINES = 100
"""Lines of the head, and of the tail, in a spooled preview."""
_KEEP_CHARS = PREVIEW_BYTES + 1  # a character takes at least one byte; +1 for the one before


class _Decoder:
    """Incremental decoding that starts strict and turns to replacement at the first bad byte."""

    __slots__ = ("_encoding", "_lenient", "_strict", "_utf8", "replaced")

    def __init__(self, encoding: str) -> None:
        self._encoding = encoding
        self._utf8 = codecs.lookup(encoding).name == "utf-8"
        self._strict = codecs.getincrementaldecoder(encoding)("strict")
        self._lenient: codecs.IncrementalDecoder | None = None
        self.replaced = False

    def passes_through(self, data: bytes) -> bool:
        """Whether `data` is already the UTF-8 its decoding would give: ASCII, in a UTF-8
        stream with no character left open by earlier bytes."""
        return data.isascii() and self.at_utf8_boundary()

    def at_utf8_boundary(self) -> bool:
        """Whether the stream is UTF-8 and no character is left open by the bytes so far."""
        decoder = self._strict if self._lenient is None else self._lenient
        return self._utf8 and not decoder.getstate()[0]

    def decode(self, data: bytes, final: bool = False) -> str:
        if self._lenient is None:
            state = self._strict.getstate()
            try:
                return self._strict.decode(data, final)
            except UnicodeDecodeError:
                self.replaced = True
                self._lenient = codecs.getincrementaldecoder(self._encoding)("replace")
                self._lenient.setstate(state)
        return self._lenient.decode(data, final)


def known_encoding(name: str | None) -> str:
    """`name` if Python knows the codec, else UTF-8."""
    if name:
        try:
            return codecs.lookup(name).name
        except LookupError:
            pass
    return "utf-8"


@dataclass(frozen=True, slots=True)
class Captured:
    """What a capture kept.

    `text` is the whole kept text when it stayed in memory; otherwise `ref` names the whole kept
    text in the managed store and `head`/`tail` are its first and last characters (up to
    `PREVIEW_BYTES` each). `kept_bytes` and `dropped_bytes` count the producer's raw bytes.
    """

    text: str | None
    ref: ManagedRef | None
    head: str
    tail: str
    kept_bytes: int
    dropped_bytes: int
    replaced: bool

    @property
    def empty(self) -> bool:
        return self.kept_bytes == 0 and self.dropped_bytes == 0

    def tail_excerpt(self, max_bytes: int = 2000, max_lines: int = 20) -> str:
        """The last lines of the kept text, within `max_bytes` and `max_lines`."""
        tail = self.tail.rstrip("\n")
        excerpt = tail[tail_start(tail, max_bytes, max_lines) :]
        return excerpt if len(excerpt) == len(tail) else "..." + excerpt

    def preview(self, label: str) -> str:
        """The text for the model: the whole text, or a head + tail preview naming the ref."""
        if self.ref is None:
            return self.text or ""
        return spooled_preview(label, self.head, self.tail, self.ref)


def tail_start(text: str, max_bytes: int, max_lines: int) -> int:
    """Index where the last `max_lines` lines of `text` within `max_bytes` UTF-8 bytes start
    (at a line start when that keeps at least half of it)."""
    pos = len(text) - 1 if text.endswith("\n") else len(text)
    for _ in range(max_lines):
        pos = text.rfind("\n", 0, pos)
        if pos == -1:
            break
    start = pos + 1
    encoded = text[start:].encode("utf-8", "surrogatepass")
    if len(encoded) > max_bytes:
        kept = encoded[len(encoded) - max_bytes :].decode("utf-8", "ignore")
        start = len(text) - len(kept)
        newline = text.find("\n", start)
        if 0 < start and text[start - 1] != "\n" and newline != -1 and (
            len(text) - newline - 1 >= (len(text) - start) // 2
        ):
            start = newline + 1
    return start


def spooled_preview(label: str, head: str, tail: str, ref: ManagedRef) -> str:
    """A header naming `ref`, then head, an omission marker with line numbers, and tail.

    `tail` must hold more than `PREVIEW_BYTES` characters (the character before the shown tail
    tells whether the last omitted line is whole). The header comes first so that the ref
    survives even if the seam bounds the preview again.
    """
    head = head[: head_end(head, PREVIEW_BYTES, PREVIEW_LINES)]
    start = max(1, tail_start(tail, PREVIEW_BYTES, PREVIEW_LINES))
    shown_tail = tail[start:]
    kept = utf8_length(head) + utf8_length(shown_tail)
    newlines = ref.lines if tail.endswith("\n") else ref.lines - 1
    first = head.count("\n") + 1
    last = newlines - shown_tail.count("\n") + (0 if tail[start - 1] == "\n" else 1)
    read = f'managed_read(ref="{ref.id}"'
    header = (
        f"[{label}: {ref.size_bytes:,} bytes in {ref.lines:,} lines, kept whole as {ref.id}; "
        f'read it with {read}, offset=1, limit=200) or search it with {read}, pattern="<regex>")]'
    )
    marker = (
        f"[... {ref.size_bytes - kept:,} bytes omitted here (lines {first:,}-{max(first, last):,}"
        f" of {ref.lines:,}); read on with {read}, offset={first}, limit=200) ...]"
    )
    head_sep = "" if head.endswith("\n") or not head else "\n"
    return f"{header}\n{head}{head_sep}{marker}\n{shown_tail}"


class OutputCapture:
    """One producer stream, captured as the module docstring draws it.

    Once spooling, text goes to the spool in batches of `SPOOL_BATCH` UTF-8 bytes, queued to
    the spool's own thread while the next batch is read (at most `SPOOL_DEPTH` in flight). A
    UTF-8 capture passes ASCII chunks through as the producer's bytes (`bytes.isascii()` proves
    them valid without decoding); anything else is decoded and re-encoded. A producer with a
    file descriptor (a command's output pipe) can hand it over: `feed_from` lets the spool's
    own threads read the rest (`FdSpool.write_from`), so the event loop touches none of those
    bytes; only UTF-8 takes that path, and at the first invalid byte the spool hands the rest
    back and `feed` goes on, with replacement.

    Use it as `async with`: leaving the block without `finish()` aborts the spool, so a
    cancelled or failed call leaves nothing behind.
    """

    def __init__(
        self,
        store: TextStore,
        *,
        namespace: str,
        memory_cap: int,
        hard_cap: int,
        encoding: str = "utf-8",
        owner: str | None = None,
    ) -> None:
        self._store = store
        self._namespace = namespace
        self._owner = owner  # the managed store's per-owner share (the call's client)
        self._memory_cap = memory_cap
        self._hard_cap = hard_cap
        self._decoder = _Decoder(encoding)
        self._stack = AsyncExitStack()
        self._chunks: list[bytes] = []
        self._buffered = 0
        self._kept = 0
        self._dropped = 0
        self._spool: TextSpool | None = None
        # `_spool` when it reads descriptors itself: checked once (a Protocol isinstance check
        # costs 10-35 us, and `takes_fd` is asked after every chunk).
        self._fd_spool: FdSpool | None = None
        self._pending: list[bytes] = []
        self._pending_bytes = 0
        self._writing: collections.deque[asyncio.Task[None]] = collections.deque()
        self._head = ""
        self._tail = ""
        self._fd_refused = False

    @property
    def kept_bytes(self) -> int:
        return self._kept

    @property
    def dropped_bytes(self) -> int:
        return self._dropped

    @property
    def room(self) -> int:
        """Bytes that may still be kept before the hard cap."""
        return self._hard_cap - self._kept

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Abort the spool unless `finish()` committed it."""
        self._chunks.clear()
        self._pending.clear()
        writing = list(self._writing)
        self._writing.clear()
        for task in writing:
            task.cancel()  # the spool aborts itself when a write is cancelled
        if writing:
            await asyncio.wait(writing)
        for task in writing:
            if not task.cancelled():
                task.exception()  # retrieved: the caller is already failing for its own reason
        await self._stack.aclose()

    def drop(self, count: int) -> None:
        """Count `count` bytes the producer sent that were not fed (past the hard cap)."""
        self._dropped += count

    async def feed(self, data: bytes) -> None:
        room = self._hard_cap - self._kept
        if len(data) > room:
            self._dropped += len(data) - max(room, 0)
            data = data[: max(room, 0)]
        if not data:
            return
        self._kept += len(data)
        if self._spool is None:
            self._chunks.append(data)
            self._buffered += len(data)
            if self._buffered > self._memory_cap:
                await self._start_spool()
            return
        await self._to_spool(data)

    @property
    def takes_fd(self) -> bool:
        """Whether `feed_from` may read the producer's file descriptor now: spooling (with the
        preview's head complete), to a spool that reads descriptors itself, in UTF-8 with no
        character open, and no earlier `feed_from` stopped at bytes that are not UTF-8."""
        return (
            self._fd_spool is not None
            and not self._fd_refused
            and len(self._head) >= _KEEP_CHARS
            and self._decoder.at_utf8_boundary()
        )

    async def feed_from(self, fd: int) -> bool:
        """Feed what `fd` yields, read in the spool's own thread, until its end (True) or until
        its bytes are not valid UTF-8 (False: feed the rest with `feed`). Only when `takes_fd`.

        The hard cap holds as with `feed` (bytes past it are read and counted). A cancellation
        leaves the capture consistent: what was read until then is kept and can be finished.
        """
        spool = self._fd_spool
        if spool is None or not self.takes_fd:
            raise RuntimeError("feed_from() needs a capture for which takes_fd is true")
        await self._flush()
        await self._drain()  # the thread appends after the batches in flight; fail before it
        drained = Drained(limit=max(self.room, 0))
        try:
            await spool.write_from(fd, drained)
        finally:
            self._kept += drained.kept
            self._dropped += drained.dropped
            if drained.tail:
                tail = drained.tail.decode("utf-8", "ignore")  # it may start inside a character
                self._tail = (self._tail + tail)[-_KEEP_CHARS:]
            self._take(drained.leftover)
        if not drained.ended:
            self._fd_refused = True
        if self._pending_bytes >= SPOOL_BATCH:
            await self._flush()
        return drained.ended

    async def finish(self) -> Captured:
        """Commit what was kept and describe it; the capture cannot be fed afterwards."""
        if self._spool is None:
            data = b"".join(self._chunks)
            self._chunks.clear()
            text = self._decoder.decode(data, final=True)
            return Captured(
                text=text,
                ref=None,
                head=text[:_KEEP_CHARS],
                tail=text[-_KEEP_CHARS:],
                kept_bytes=self._kept,
                dropped_bytes=self._dropped,
                replaced=self._decoder.replaced,
            )
        await self._to_spool(b"", final=True)
        await self._flush()
        await self._drain()
        ref = await self._spool.commit()
        return Captured(
            text=None,
            ref=ref,
            head=self._head,
            tail=self._tail,
            kept_bytes=self._kept,
            dropped_bytes=self._dropped,
            replaced=self._decoder.replaced,
        )

    async def _start_spool(self) -> None:
        spool = self._store.open_spool(namespace=self._namespace, owner=self._owner)
        self._spool = await self._stack.enter_async_context(spool)
        self._fd_spool = self._spool if isinstance(self._spool, FdSpool) else None
        data = b"".join(self._chunks)
        self._chunks.clear()
        self._buffered = 0
        await self._to_spool(data)

    async def _to_spool(self, data: bytes, final: bool = False) -> None:
        self._take(data, final)
        if self._pending_bytes >= SPOOL_BATCH:
            await self._flush()

    def _take(self, data: bytes, final: bool = False) -> None:
        """Decode `data` into the pending batch and the preview's head and tail."""
        if self._decoder.passes_through(data):
            if len(self._head) < _KEEP_CHARS:
                self._head += data[: _KEEP_CHARS - len(self._head)].decode("ascii")
            last = data[-_KEEP_CHARS:].decode("ascii")
        else:
            text = self._decoder.decode(data, final)
            if len(self._head) < _KEEP_CHARS:
                self._head += text[: _KEEP_CHARS - len(self._head)]
            last = text[-_KEEP_CHARS:]
            data = text.encode("utf-8")
        if not data:
            return
        self._tail = (self._tail + last)[-_KEEP_CHARS:]
        self._pending.append(data)
        self._pending_bytes += len(data)

    async def _flush(self) -> None:
        """Queue the pending batch, once fewer than `SPOOL_DEPTH` batches are in flight."""
        if not self._pending or self._spool is None:
            return
        data = self._pending[0] if len(self._pending) == 1 else b"".join(self._pending)
        self._pending.clear()
        self._pending_bytes = 0
        await self._drain(keep=SPOOL_DEPTH - 1)
        self._writing.append(asyncio.create_task(self._spool.write(data)))

    async def _drain(self, keep: int = 0) -> None:
        """Wait, oldest first, until at most `keep` batches are in flight; a failure (e.g.
        `RetentionError`) raises here."""
        while len(self._writing) > keep:
            await self._writing[0]
            self._writing.popleft()
