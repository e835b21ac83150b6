"""The `[openapi.NAME]` table of a manifest: an OpenAPI description whose operations become
tools (docs/openapi.md; built by `bridges.openapi`). Imports nothing of ours; exports
`OpenApiConfig` and `OperationFilter`.

`headers` may hold secrets (`${env:}`, `${file:}`, resolved by the loader like every manifest
string): they are never shown in reprs. A relative `spec` path is relative to the manifest's
directory.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

DEFAULT_OPENAPI_TIMEOUT = 30.0


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class OperationFilter(_Strict):
    """Globs over operationIds or `METHOD /path` (e.g. `GET /pet/*`); deny wins."""

    allow: list[str] | None = None
    deny: list[str] = []


class OpenApiConfig(_Strict):
    """One `[openapi.NAME]` entry."""

    spec: Annotated[str, Field(min_length=1)]
    """A path (relative to the manifest's directory) or an http(s) URL; JSON or YAML."""
    base_url: str | None = None
    """Where calls go; default: the spec's first server, resolved against the spec's URL."""
    operations: OperationFilter = OperationFilter()
    headers: dict[str, str] = Field(default_factory=dict, repr=False)
    """Sent with every call (and with the spec's request when it has base_url's origin)."""
    timeout: Annotated[float, Field(gt=0)] = DEFAULT_OPENAPI_TIMEOUT
    """Seconds for one call, from connect to the last byte (and for reading a spec URL)."""
    namespace: str | None = None
    """The tools' name prefix; default: NAME. "" exposes the operation names unprefixed."""
