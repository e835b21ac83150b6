"""When to try a server again after it failed or its connection was lost."""

from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Backoff:
    """Capped exponential backoff with jitter.

    The n-th consecutive failure waits `initial * factor**(n-1)` seconds, at most `cap`, then
    scaled by a random factor in `[1 - jitter, 1 + jitter]` so that servers that failed
    together do not retry in lockstep. A connection that stayed up for `reset_after` seconds
    resets the count: the next failure starts from `initial` again.
    """

    initial: float = 0.5
    factor: float = 2.0
    cap: float = 30.0
    jitter: float = 0.2
    reset_after: float = 60.0

    def __post_init__(self) -> None:
        if self.initial <= 0 or self.cap < self.initial or self.factor < 1:
            raise ValueError("backoff needs 0 < initial <= cap and factor >= 1")
        if not 0 <= self.jitter < 1:
            raise ValueError("backoff jitter must be in [0, 1)")

    def delay(self, failures: int) -> float:
        exponent = max(0, failures - 1)
        base = self.cap if exponent > 64 else min(self.cap, self.initial * self.factor**exponent)
        return base * random.uniform(1 - self.jitter, 1 + self.jitter)


DEFAULT_BACKOFF = Backoff()
