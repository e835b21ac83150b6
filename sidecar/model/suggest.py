"""Closest names to a misspelt one, by edit distance (for `unknown_tool` errors).

`closest(name, candidates)` ranks candidates by Levenshtein distance to `name` (a candidate
that ends with `_<name>`, i.e. the name under a namespace, counts as distance 1), keeps those
within `max(2, len(name) // 3)` edits, and returns at most `limit` of them, nearest first, ties
in name order. The distance is computed in a band of that width and abandoned as soon as it
cannot stay within it, so a registry of thousands of tools costs a few milliseconds.
"""

from __future__ import annotations

from collections.abc import Iterable

DEFAULT_LIMIT = 5


def closest(name: str, candidates: Iterable[str], *, limit: int = DEFAULT_LIMIT) -> list[str]:
    bound = max(2, len(name) // 3)
    folded = name.casefold()
    scored: list[tuple[int, str]] = []
    for candidate in candidates:
        other = candidate.casefold()
        if other.endswith("_" + folded) or other.endswith("-" + folded):
            scored.append((1, candidate))
            continue
        distance = bounded_distance(folded, other, bound)
        if distance is not None:
            scored.append((distance, candidate))
    scored.sort()
    return [candidate for _, candidate in scored[:limit]]


def bounded_distance(a: str, b: str, bound: int) -> int | None:
    """The Levenshtein distance of `a` and `b` if it is at most `bound`, else None."""
    if abs(len(a) - len(b)) > bound:
        return None
    if a == b:
        return 0
    big = bound + 1
    previous = [j if j <= bound else big for j in range(len(b) + 1)]
    for i, char in enumerate(a, start=1):
        low, high = max(1, i - bound), min(len(b), i + bound)
        current = [big] * (len(b) + 1)
        current[0] = i if i <= bound else big
        best = current[0]
        for j in range(low, high + 1):
            cost = 0 if char == b[j - 1] else 1
            value = min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + cost)
            current[j] = value if value <= bound else big
            best = min(best, current[j])
        if best > bound:
            return None
        previous = current
    return previous[len(b)] if previous[len(b)] <= bound else None
