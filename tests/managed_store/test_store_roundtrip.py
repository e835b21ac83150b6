"""put / spool → read_lines / read_bytes round trips, including UTF-8 split across chunks."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from store_helpers import editor_lines

from managed_store import ManagedStore, ManagedStoreError, SpoolWriter, StoreStats
from managed_store.spool import WINDOW

pytestmark = pytest.mark.anyio


@pytest.mark.parametrize(
    ("text", "lines"),
    [
        ("", 0),
        ("a", 1),
        ("a\n", 1),
        ("a\nb", 2),
        ("a\nb\n", 2),
        ("\n", 1),
        ("\n\n", 2),
        ("a\r\nb", 2),
        ("a\rb", 1),
        ("é\n😀", 2),
    ],
)
async def test_lines_and_bytes_are_counted_like_an_editor(
    store: ManagedStore, text: str, lines: int
) -> None:
    ref = await store.put(text, namespace="tests")
    assert (ref.lines, ref.size_bytes, ref.namespace) == (lines, len(text.encode()), "tests")
    assert await store.stat(ref.id) == ref
    whole = await store.read_lines(ref.id, 1, lines + 1)
    assert (whole.text, whole.eof, whole.first_line, whole.last_line) == (text, True, 1, lines)


async def test_read_lines_pages(store: ManagedStore) -> None:
    ref = await store.put("one\ntwo\nthree\nfour")
    page = await store.read_lines(ref.id, offset=2, limit=2)
    assert page.text == "two\nthree\n"
    assert (page.first_line, page.last_line, page.offset_bytes, page.end_bytes) == (2, 3, 4, 14)
    assert not page.eof
    rest = await store.read_lines(ref.id, offset=page.last_line + 1)
    assert (rest.text, rest.first_line, rest.last_line, rest.eof) == ("four", 4, 4, True)
    past = await store.read_lines(ref.id, offset=9)
    assert (past.text, past.first_line, past.last_line, past.eof) == ("", 9, 8, True)
    assert past.offset_bytes == past.end_bytes == ref.size_bytes


async def test_read_bytes_never_splits_a_character(store: ManagedStore) -> None:
    text = "a€b\n😀c"  # € is 3 bytes (1..3), 😀 is 4 bytes (6..9)
    ref = await store.put(text)
    inside_euro = await store.read_bytes(ref.id, offset=2, limit=10)
    assert inside_euro.text == "b\n😀c"
    assert (inside_euro.offset_bytes, inside_euro.first_line, inside_euro.last_line) == (4, 1, 2)
    cut_emoji = await store.read_bytes(ref.id, offset=0, limit=8)
    assert (cut_emoji.text, cut_emoji.end_bytes, cut_emoji.eof) == ("a€b\n", 6, False)
    too_small = await store.read_bytes(ref.id, offset=6, limit=3)
    assert (too_small.text, too_small.first_line, too_small.last_line) == ("", 2, 1)
    past = await store.read_bytes(ref.id, offset=100)
    assert (past.text, past.eof, past.offset_bytes) == ("", True, ref.size_bytes)


async def test_argument_validation_names_the_parameter(store: ManagedStore) -> None:
    ref = await store.put("x")
    with pytest.raises(ValueError, match="offset"):
        await store.read_lines(ref.id, offset=0)
    with pytest.raises(ValueError, match="limit"):
        await store.read_lines(ref.id, limit=0)
    with pytest.raises(ValueError, match="offset"):
        await store.read_bytes(ref.id, offset=-1)
    with pytest.raises(ValueError, match="limit"):
        await store.read_bytes(ref.id, limit=0)
    with pytest.raises(TypeError, match="offset"):
        await store.read_lines(ref.id, offset=True)
    with pytest.raises(ValueError, match="namespace"):
        await store.put("x", namespace="")
    with pytest.raises(ValueError, match="namespace"):
        store.open_spool(namespace="a\nb")
    with pytest.raises(TypeError):
        await store.put(b"bytes")  # type: ignore[arg-type]


async def test_put_larger_than_a_window_with_multibyte_text(store: ManagedStore) -> None:
    text = ("é€😀x\n" * (WINDOW // 3))[: WINDOW * 2 + 7]
    ref = await store.put(text)
    data = text.encode()
    assert (ref.size_bytes, ref.lines) == (len(data), len(editor_lines(data)))
    back = await store.read_bytes(ref.id, 0, ref.size_bytes)
    assert back.text == text


async def test_bytes_chunk_larger_than_a_window_split_inside_a_character(
    store: ManagedStore,
) -> None:
    data = b"a" * (WINDOW - 1) + "€".encode() + b"\nz" * 10
    async with store.open_spool() as spool:
        await spool.write(data)
        ref = await spool.commit()
    assert (await store.read_bytes(ref.id, 0, len(data))).text.encode() == data


async def test_spool_mixes_str_and_bytes(store: ManagedStore) -> None:
    async with store.open_spool(namespace="mixed") as spool:
        await spool.write("héllo ")
        await spool.write("😀".encode()[:1])
        await spool.write("😀".encode()[1:])
        await spool.write(" wörld\n")
        await spool.write(b"")
        ref = await spool.commit()
    assert (await store.read_lines(ref.id)).text == "héllo 😀 wörld\n"
    assert (ref.lines, ref.namespace) == (1, "mixed")


async def test_empty_spool_commits_an_empty_object(store: ManagedStore) -> None:
    async with store.open_spool() as spool:
        ref = await spool.commit()
    assert (ref.size_bytes, ref.lines) == (0, 0)
    assert (await store.read_bytes(ref.id)).text == ""
    assert (await store.grep(ref.id, "")).matches == ()


async def test_spool_misuse_is_reported(store: ManagedStore) -> None:
    spool = store.open_spool()
    with pytest.raises(ManagedStoreError, match="async with"):
        await spool.write("x")
    async with spool:
        await spool.write("x")
        await spool.commit()
        with pytest.raises(ManagedStoreError, match="committed"):
            await spool.write("y")
        with pytest.raises(ManagedStoreError, match="committed"):
            await spool.commit()
    with pytest.raises(ManagedStoreError, match="once"):
        async with spool:
            pass
    with pytest.raises(TypeError):
        async with store.open_spool() as other:
            await other.write(1)  # type: ignore[arg-type]
    assert await store.stats() == StoreStats(count=1, bytes=1)


async def test_spool_satisfies_the_protocol(store: ManagedStore) -> None:
    async with store.open_spool() as spool:
        assert isinstance(spool, SpoolWriter)
        await spool.abort()
        await spool.abort()  # idempotent
    assert await store.stats() == StoreStats(0, 0)


# -- property: any chunking of any text reads back byte-identical ------------------------------

TEXT = st.text(
    alphabet=st.one_of(
        st.sampled_from(["\n", "\r", "a", "é", "€", "😀", "\x00"]),
        st.characters(exclude_categories=["Cs"]),
    ),
    max_size=300,
)


@st.composite
def chunked(draw: st.DrawFn) -> tuple[bytes, list[str | bytes]]:
    data = draw(TEXT).encode()
    cuts = sorted(set(draw(st.lists(st.integers(0, len(data)), max_size=12))))
    pieces = [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)], strict=True)]
    chunks: list[str | bytes] = []
    for piece in pieces:
        try:
            as_text = piece.decode()
        except UnicodeDecodeError:
            chunks.append(piece)  # starts or ends inside a character: must stay bytes
            continue
        chunks.append(as_text if draw(st.booleans()) else piece)
    return data, chunks


PROPERTY = settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


@PROPERTY
@given(case=chunked(), window=st.tuples(st.integers(0, 1300), st.integers(1, 1300)))
async def test_any_chunking_reads_back_identical(
    store: ManagedStore, case: tuple[bytes, list[str | bytes]], window: tuple[int, int]
) -> None:
    data, chunks = case
    async with store.open_spool() as spool:
        for chunk in chunks:
            await spool.write(chunk)
        ref = await spool.commit()
    lines = editor_lines(data)
    assert (ref.size_bytes, ref.lines) == (len(data), len(lines))
    assert (await store.read_bytes(ref.id, 0, len(data) + 1)).text.encode() == data
    assert (await store.read_lines(ref.id, 1, len(lines) + 1)).text.encode() == data

    offset, limit = window
    got = await store.read_bytes(ref.id, offset, limit)
    boundaries = [i for i in range(len(data) + 1) if i == len(data) or data[i] & 0xC0 != 0x80]
    start = next(b for b in boundaries if b >= min(offset, len(data)))
    end = max(start, max(b for b in boundaries if b <= min(offset + limit, len(data))))
    assert got.text.encode() == data[start:end]
    assert (got.offset_bytes, got.end_bytes, got.eof) == (start, end, end == len(data))
    assert got.first_line == data[:start].count(b"\n") + 1


@PROPERTY
@given(data=TEXT.map(str.encode), offset=st.integers(1, 60), limit=st.integers(1, 60))
async def test_read_lines_matches_editor_lines(
    store: ManagedStore, data: bytes, offset: int, limit: int
) -> None:
    ref = await store.put(data.decode())
    lines = editor_lines(data)
    got = await store.read_lines(ref.id, offset, limit)
    want = lines[offset - 1 : offset - 1 + limit]
    assert got.text.encode() == b"".join(want)
    assert (got.first_line, got.last_line) == (offset, offset + len(want) - 1)
    assert got.offset_bytes == min(len(b"".join(lines[: offset - 1])), len(data))
    assert got.eof == (got.end_bytes == len(data))
