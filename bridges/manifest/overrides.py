"""Tool override tables of a manifest (`sidecar.registry.overrides` applies them).

    [tools.overrides."git_git_status"]       # an effective name or a glob over them
    name = "status"                         # the name the model sees
    title = "Repository status"
    description = "Show the working tree status."     # replaces; or:
    description_append = "Prefer this over shell git."
    annotations = { read_only = true }
    hidden = { repo_path = "/work/repo" }   # removed from the schema, always sent
    defaults = { max_count = 10 }           # filled in when the model leaves them out
    enabled = true                          # false: the tool is not served

The same table under a server entry (`[mcpServers.git.overrides."git_status"]`) matches that
server's upstream tool names; under a profile (`[profiles.NAME.overrides."..."]`) it applies
to that profile only, after the Location-wide ones.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class OverrideAnnotations(_Strict):
    title: str | None = None
    read_only: bool | None = None
    destructive: bool | None = None
    idempotent: bool | None = None
    open_world: bool | None = None


class OverrideConfig(_Strict):
    """One override table (see the module docstring)."""

    name: str | None = None
    title: str | None = None
    description: str | None = None
    description_append: str | None = None
    annotations: OverrideAnnotations | None = None
    hidden: dict[str, Any] = {}
    defaults: dict[str, Any] = {}
    enabled: bool = True
