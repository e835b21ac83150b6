"""The values every manifest parser shares: a reported problem and the `bounds` keys.

`bridges.manifest` (the file format) and `bridges.manifest_tools.config` (tool entries) both
use them; they live here, below both, so that neither imports the other to get them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field


# `bounds = { max_bytes = ..., max_lines = ... }` on a Location, a server or a tool. No
# docstring: it would become a `description` in the shipped schema/manifest.schema.json.
class BoundsConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    max_bytes: Annotated[int, Field(ge=1024)] | None = None
    max_lines: Annotated[int, Field(ge=16)] | None = None


@dataclass(frozen=True, slots=True)
class ManifestProblem:
    """One fault in a manifest: the file, the JSON path, what is wrong and how to fix it."""

    file: str
    path: str
    message: str
    hint: str = ""
    severity: Literal["error", "note"] = "error"

    def __str__(self) -> str:
        hint = f" (hint: {self.hint})" if self.hint else ""
        return f"{self.file}: {self.path}: {self.message}{hint}"
