"""The values every manifest parser shares: a reported problem and the `bounds` keys.

`bridges.manifest.loading` (the file format) and `bridges.manifest_tools.config` (tool entries) both
use them; they live here, below both, so that neither imports the other to get them.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable
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
    severity: Literal["error", "warning", "note"] = "error"
    """"warning": valid, but likely not what was meant (a glob that matches no tool,
    `bridges.manifest.globs`)."""
    unknown_key: bool = False
    """A key mcp-sidecar does not know (`sidecar check` fails on it unless --allow-unknown)."""

    def __str__(self) -> str:
        hint = f" (hint: {self.hint})" if self.hint else ""
        return f"{self.file}: {self.path}: {self.message}{hint}"


def did_you_mean(name: str, known: Iterable[str]) -> str:
    """A hint naming the known keys closest to a misspelt one ("" when none is close)."""
    close = difflib.get_close_matches(name, sorted(set(known)), n=2, cutoff=0.6)
    return ("did you mean " + " or ".join(repr(c) for c in close) + "?") if close else ""


def model_keys(*models: type[BaseModel]) -> set[str]:
    """The keys (field names and aliases) of pydantic models."""
    keys: set[str] = set()
    for model in models:
        for name, field in model.model_fields.items():
            keys.add(name)
            if field.alias:
                keys.add(field.alias)
    return keys
