"""Issue 38 item 3 at the store: a search's time limit holds inside one long line, searches are
capped per owner, and batching loses no match or context line."""

from __future__ import annotations

import asyncio
import random
import time
from pathlib import Path

import pytest

from managed_store import (
    GrepMatch,
    ManagedStore,
    SearchLimits,
    SearchTimeout,
    TooManySearches,
)

pytestmark = pytest.mark.anyio

# RE2 runs this valid pattern at about 20 µs a byte on random `a`/`b` text: a 3.5 MB line
# takes over a minute (the state automaton does not fit its budget, so RE2 simulates the NFA).
SLOW = r"a.{1000}.{1000}c"


def _random_line(size: int) -> str:
    return "".join(random.Random(7).choices("ab", k=size))


async def test_the_time_limit_holds_inside_one_long_line(store: ManagedStore) -> None:
    ref = await store.put(_random_line(3_500_000) + "\nafter\n")
    started = time.monotonic()
    with pytest.raises(SearchTimeout, match=rf"search of {ref.id} stopped after 0.5 s at line 1:"):
        await store.grep(ref.id, SLOW, time_limit=0.5)
    assert time.monotonic() - started < 15  # not the minute the match alone would take
    # The killed worker is replaced: the next search of the same line answers.
    found = await store.grep(ref.id, "^after$")
    assert [m.line for m in found.matches] == [2]


async def test_matches_and_context_across_batches_and_long_lines(store: ManagedStore) -> None:
    long_line = "x" * 1_500_000 + "needle"
    lines = [f"line {n}" for n in range(1, 20_001)]
    lines[8191] = "needle at a batch edge"  # line 8,192: the last of the first batch
    lines[12_000] = long_line  # line 12,001
    ref = await store.put("\n".join(lines) + "\n")
    found = await store.grep(ref.id, "needle", context=1)
    assert [m.line for m in found.matches] == [8192, 12_001]
    assert found.matches[0] == GrepMatch(8192, "needle at a batch edge", ("line 8191",),
                                         ("line 8193",))
    assert found.matches[1].before == ("line 12000",)
    assert found.matches[1].after == ("line 12002",)
    assert found.matches[1].text.endswith("…[line cut: 1500006 bytes]")
    assert [m.line for m in (await store.grep(ref.id, r"^line 1999\d$")).matches] == list(
        range(19_990, 20_000))


async def test_searches_are_capped_per_owner(root: Path) -> None:
    limits = SearchLimits(time_limit=20, per_owner=1, workers=2)
    async with await ManagedStore.open(root, searches=limits) as store:
        big = await store.put(_random_line(3_500_000) + "\n")
        small = await store.put("one\ntwo\n")
        slow = asyncio.create_task(store.grep(big.id, SLOW, owner="token:a"))
        await asyncio.sleep(0)  # its first step admits it; the match itself takes minutes
        with pytest.raises(TooManySearches, match="token:a already runs 1, the limit is "
                                                  "1 concurrent searches per client"):
            await store.grep(small.id, "two", owner="token:a")
        other = await store.grep(small.id, "two", owner="token:b")
        assert [m.line for m in other.matches] == [2]
        slow.cancel()  # stops the scan and kills its worker; the cancellation reaches us
        with pytest.raises(asyncio.CancelledError):
            await slow
        again = await store.grep(small.id, "two", owner="token:a")
        assert [m.line for m in again.matches] == [2]


def test_search_limits_from_the_environment() -> None:
    assert SearchLimits.from_environ({}) == SearchLimits(30.0, 2, 4)
    assert SearchLimits.from_environ({"SIDECAR_SEARCH_TIME_LIMIT": "1.5",
                                      "SIDECAR_SEARCHES_PER_CLIENT": "3",
                                      "SIDECAR_SEARCH_WORKERS": "8"}) == SearchLimits(1.5, 3, 8)
    for name, raw in (("SIDECAR_SEARCH_TIME_LIMIT", "0"), ("SIDECAR_SEARCHES_PER_CLIENT", "x"),
                      ("SIDECAR_SEARCH_WORKERS", "-1"), ("SIDECAR_SEARCH_TIME_LIMIT", "inf")):
        with pytest.raises(ValueError, match=f"{name} must be a positive"):
            SearchLimits.from_environ({name: raw})
