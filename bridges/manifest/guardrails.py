"""The `guardrails` tables of a manifest: top level, `[profiles.NAME.guardrails]`,
`[mcpServers.KEY.guardrails]` and `[tools.KEY.guardrails]` (what they mean:
`sidecar.policy.guardrails.Guardrails` and docs/guardrails.md).

    [guardrails]
    secrets = "redact"                  # off | redact | block
    entropy = true                      # high-entropy strings too
    hook = "http://127.0.0.1:9100/guard"
    timeout = 5                         # seconds
    on_error = "deny"                   # deny | allow
    scan_limit = 4194304                # characters scanned per stage of a call

Imports pydantic only. Exports `GuardrailsConfig`.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator


# No docstring: it would become a `description` in the shipped schema/manifest.schema.json.
class GuardrailsConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    secrets: Literal["off", "redact", "block"] | None = None
    entropy: bool | None = None
    hook: str | None = None
    timeout: Annotated[float, Field(gt=0, le=300)] | None = None
    on_error: Literal["deny", "allow"] | None = None
    scan_limit: Annotated[int, Field(ge=1024)] | None = None

    @field_validator("hook")
    @classmethod
    def _http(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith(("http://", "https://")):
            raise ValueError("hook must be an http:// or https:// URL")
        return value

    def layer(self) -> dict[str, Any]:
        """The keys this table sets (`sidecar.policy.guardrails.Guardrails.set`)."""
        return self.model_dump(exclude_none=True)
