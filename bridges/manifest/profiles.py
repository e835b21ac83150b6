"""The `[profiles.NAME]` tables of a manifest (see `sidecar.registry.profiles` for what they mean).

    [profiles.coding]
    servers = ["git", "files"]          # MCP server keys
    include = ["web_fetch"]             # globs over effective names (added to `servers`)
    exclude = ["git_reset"]
    read_only = true                    # filters: read_only, destructive, idempotent, open_world
    codemode = "both"
    expose = "search"                   # list search_tools/call_tool instead of every tool
    always = ["git_status"]             # ... and these (globs), with managed_read
    bounds = { max_bytes = 20000 }
    guardrails = { secrets = "block" }  # docs/guardrails.md
    resources = true                    # or false, or a list of server keys (prompts: same)
    [[profiles.coding.permissions.rules]]
    action = "git_commit"
    decision = "ask"

`default_profile = "NAME"` (top level) makes NAME what `/mcp` and `sidecar stdio` serve;
`expose = "search"` (top level) is the default of every profile (docs/tool-search.md).
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from bridges.manifest.guardrails import GuardrailsConfig
from bridges.manifest.overrides import OverrideConfig

PROFILE_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class RateLimitConfig(_Strict):
    """A token bucket (`calls_per_minute`, refilled evenly, at most `burst` at once: default
    `calls_per_minute`) and/or a cap on calls running at the same time (`concurrency`)."""

    calls_per_minute: Annotated[int, Field(gt=0)] | None = None
    burst: Annotated[int, Field(gt=0)] | None = None
    concurrency: Annotated[int, Field(gt=0)] | None = None


class ProfileRule(_Strict):
    action: str
    resource: str | None = None
    decision: Literal["allow", "deny", "ask"]


class ProfilePermissions(_Strict):
    rules: list[ProfileRule] = []


class ProfileBounds(_Strict):
    max_bytes: Annotated[int, Field(ge=1024)] | None = None
    max_lines: Annotated[int, Field(ge=16)] | None = None


class ProfileConfig(_Strict):
    """One `[profiles.NAME]` table."""

    description: str = ""
    include: list[str] | None = None
    exclude: list[str] = []
    servers: list[str] | None = None
    read_only: bool | None = None
    destructive: bool | None = None
    idempotent: bool | None = None
    open_world: bool | None = None
    codemode: Literal["direct", "codemode", "both"] | None = None
    expose: Literal["all", "search"] | None = None
    always: list[str] = []
    """With `expose = "search"`: globs of tools listed beside the search built-ins."""
    bounds: ProfileBounds = ProfileBounds()
    permissions: ProfilePermissions = ProfilePermissions()
    resources: bool | list[str] = True
    prompts: bool | list[str] = True
    rate_limit: RateLimitConfig | None = None
    """Calls through the whole profile (every tool together)."""
    tool_rate_limits: dict[str, RateLimitConfig] = {}
    """Per tool of this profile, by effective name or glob (each matching tool its own)."""
    overrides: dict[str, OverrideConfig] = {}
    """Tool overrides for this profile only (see `bridges.manifest.overrides`)."""
    guardrails: GuardrailsConfig | None = None
    """Guardrails on calls through this profile (`bridges.manifest.guardrails`)."""

    @model_validator(mode="after")
    def _one_search(self) -> ProfileConfig:
        if self.expose == "search" and self.codemode in ("codemode", "both"):
            raise ValueError(
                'expose = "search" and codemode = "codemode"/"both" both replace the tool '
                "list with a search; choose one")
        return self

    def hints(self) -> dict[str, bool]:
        found = {
            "read_only": self.read_only, "destructive": self.destructive,
            "idempotent": self.idempotent, "open_world": self.open_world,
        }
        return {k: v for k, v in found.items() if v is not None}
