"""The pin store's port: pinned tool definitions, one per `<server>/<upstream name>` key.

Imports nothing of the sidecar. Exports `Pin` and `PinStore` (implementations:
`sidecar.backends.sqlite.pins`, `sidecar.backends.postgres.pins`; the pinning itself is
`sidecar.policy.pins`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

__all__ = ["Pin", "PinStore"]


@dataclass(frozen=True, slots=True)
class Pin:
    key: str
    fingerprint: str
    definition: Mapping[str, Any]
    pinned_at: float


class PinStore(Protocol):
    async def load(self) -> list[Pin]: ...

    async def put(self, pin: Pin) -> None: ...

    async def put_many(self, pins: Sequence[Pin]) -> None:
        """`put` of each pin, in one transaction (a first listing pins thousands)."""

    async def aclose(self) -> None: ...
