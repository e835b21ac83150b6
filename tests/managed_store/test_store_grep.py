from __future__ import annotations

import pytest

from managed_store import (
    MAX_PATTERN_CHARS,
    GrepMatch,
    InvalidPattern,
    ManagedStore,
    SearchTimeout,
)
from managed_store.reading import GREP_LINE_BYTES

pytestmark = pytest.mark.anyio

TEXT = "".join(f"{n}: {'hit' if n % 10 == 0 else 'miss'}\n" for n in range(1, 101))


async def test_grep_finds_lines_in_order(store: ManagedStore) -> None:
    ref = await store.put(TEXT)
    result = await store.grep(ref.id, r"^\d+: hit$")
    assert result.ref == ref
    assert [m.line for m in result.matches] == list(range(10, 101, 10))
    assert result.matches[0] == GrepMatch(line=10, text="10: hit", before=(), after=())
    assert not result.truncated


async def test_grep_context_and_edges(store: ManagedStore) -> None:
    ref = await store.put("a\nb\nc\nd\ne")
    result = await store.grep(ref.id, "[ace]", context=2)
    assert result.matches == (
        GrepMatch(1, "a", (), ("b", "c")),
        GrepMatch(3, "c", ("a", "b"), ("d", "e")),
        GrepMatch(5, "e", ("c", "d"), ()),
    )


async def test_grep_max_matches_sets_truncated_only_when_more_exist(store: ManagedStore) -> None:
    ref = await store.put(TEXT)
    capped = await store.grep(ref.id, "hit", max_matches=3, context=1)
    assert [m.line for m in capped.matches] == [10, 20, 30]
    assert capped.matches[-1].after == ("31: miss",)
    assert capped.truncated
    exact = await store.grep(ref.id, "hit", max_matches=10)
    assert len(exact.matches) == 10
    assert not exact.truncated


async def test_grep_strips_line_endings_and_handles_unicode(store: ManagedStore) -> None:
    ref = await store.put("naïve café\r\nplain\n😀 end")
    result = await store.grep(ref.id, r"é$|^😀")
    assert [(m.line, m.text) for m in result.matches] == [(1, "naïve café"), (3, "😀 end")]


async def test_grep_cuts_very_long_lines(store: ManagedStore) -> None:
    long_line = "€" * GREP_LINE_BYTES + "needle"
    ref = await store.put(f"before\n{long_line}\nshort needle\n")
    result = await store.grep(ref.id, "needle", context=1)
    first, second = result.matches
    size = len(long_line.encode())
    assert first.line == 2
    assert first.text.endswith(f"…[line cut: {size} bytes]")
    assert len(first.text.split("…[")[0].encode()) <= GREP_LINE_BYTES
    assert set(first.text.split("…[")[0]) == {"€"}
    assert second.before == (first.text,)


async def test_grep_rejects_bad_arguments(store: ManagedStore) -> None:
    ref = await store.put("x")
    with pytest.raises(ValueError, match=r"invalid grep pattern '\(unclosed': missing \)"):
        await store.grep(ref.id, "(unclosed")
    with pytest.raises(ValueError, match="max_matches"):
        await store.grep(ref.id, "x", max_matches=0)
    with pytest.raises(ValueError, match="context"):
        await store.grep(ref.id, "x", context=-1)


async def test_grep_uses_re2_and_names_what_it_does_not_support(store: ManagedStore) -> None:
    ref = await store.put(("a" * 28 + "!\n") * 3 + "abab\n")
    assert (await store.grep(ref.id, r"(a+)+$")).matches == ()  # linear: no backtracking
    assert [m.line for m in (await store.grep(ref.id, r"(?i)ABAB")).matches] == [4]
    for pattern, reason in ((r"(ab)\1", "backreference"), ("(?!a)", "negative lookahead"),
                            ("(?>a)", "atomic group"), ("a*+", "possessive quantifier")):
        with pytest.raises(InvalidPattern, match=reason):
            await store.grep(ref.id, pattern)
    with pytest.raises(InvalidPattern, match="4,097 characters, the limit is 4,096"):
        await store.grep(ref.id, "a" * (MAX_PATTERN_CHARS + 1))
    assert (await store.grep(ref.id, "b" * MAX_PATTERN_CHARS)).matches == ()


async def test_grep_stops_at_its_time_limit(store: ManagedStore) -> None:
    ref = await store.put("line\n" * 5000)
    with pytest.raises(SearchTimeout, match="stopped after 0 s at line 1:"):
        await store.grep(ref.id, "nothing", time_limit=0)


async def test_offsets_past_sqlite_integers_are_value_errors(store: ManagedStore) -> None:
    ref = await store.put("x\n")
    for offset in (2**63, 2**62 + 1):
        with pytest.raises(ValueError, match=r"offset must be <= 2\*\*62"):
            await store.read_lines(ref.id, offset=offset)
        with pytest.raises(ValueError, match=r"offset must be <= 2\*\*62"):
            await store.read_bytes(ref.id, offset=offset)
    assert (await store.read_lines(ref.id, offset=2**62)).text == ""
