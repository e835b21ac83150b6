"""The manifest data model: what the tables of a manifest file validate into (`ServerConfig`
and its sub-tables, the permission rules, `[audit]`, the file's top level `ManifestFile`) and
what loading produces (`Sourced` entries merged into a `ManifestSet`). Imports its
`bridges.manifest` siblings only; exports `ServerConfig`, `ToolFilter`, `Timeouts`,
`AnnotationPermissions`, `Decision`, `Transport`, `UNFORWARDABLE`, `Rule`, `PermissionsConfig`,
`AuditConfig`, `ManifestFile`, `Sourced` and `ManifestSet`. Values that may hold secrets (`env`,
`headers`, the `oauth` table) are never shown in reprs, logs or health output.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from bridges.manifest.auth import AuthConfig
from bridges.manifest.guardrails import GuardrailsConfig
from bridges.manifest.oauth import OAuthSettings
from bridges.manifest.sandbox import SandboxConfig, SandboxSetting
from bridges.manifest.values import BoundsConfig, ManifestProblem

UNFORWARDABLE = frozenset({
    "authorization", "cookie", "host", "content-length", "content-type", "accept",
    "connection", "transfer-encoding", "mcp-session-id", "mcp-protocol-version",
    "last-event-id", "proxy-authorization"})
"""What `forward_headers` may not name: the daemon's own credentials and the transport's."""

Decision = Literal["allow", "deny", "ask"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ToolFilter(_Strict):
    allow: list[str] | None = None
    deny: list[str] = []


class Timeouts(_Strict):
    startup: Annotated[float, Field(gt=0)] = 30.0
    call: Annotated[float, Field(gt=0)] = 600.0


class AnnotationPermissions(_Strict):
    """Default decisions for a server's tools by their MCP annotations."""

    destructive: Decision | None = None
    read_only: Decision | None = None
    open_world: Decision | None = None
    default: Decision | None = None


Transport = Literal["stdio", "http", "sse"]
_TRANSPORT_ALIASES: dict[str, Transport] = {
    "stdio": "stdio",
    "http": "http",
    "streamable-http": "http",
    "streamable_http": "http",
    "streamableHttp": "http",
    "sse": "sse",
}


class ServerConfig(BaseModel):
    """One `mcpServers` entry. Unknown keys are kept (other clients' settings)."""

    model_config = ConfigDict(extra="allow", frozen=True)

    command: str | None = None
    args: list[str] = []
    env: dict[str, str] = Field(default_factory=dict, repr=False)
    cwd: str | None = None
    url: str | None = None
    headers: dict[str, str] = Field(default_factory=dict, repr=False)
    forward_headers: list[str] = []
    """Headers of the client's request (`/v1`, `/mcp`) passed on to this HTTP server with
    each call, by name; calls with the same values share one connection
    (`bridges.mcp.per_user`). Never Authorization, Cookie or a header of the protocol."""
    type: str | None = None
    namespace: str | None = None
    tools: ToolFilter = ToolFilter()
    timeouts: Timeouts = Timeouts()
    bounds: BoundsConfig = BoundsConfig()
    output_validation: Literal["strict", "warn", "off"] = "strict"
    structured_output: Literal["bounded", "full", "off"] = "bounded"
    """How the MCP facade relays `structuredContent` (docs/mcp-facade.md): `bounded` sends it
    only when it fits the result's bound with the text, `full` always, `off` never (and
    advertises no `outputSchema`)."""
    disabled: bool = False
    permissions: AnnotationPermissions = AnnotationPermissions()
    max_result_bytes: Annotated[int, Field(ge=1024)] = 256 * 1024 * 1024
    pin: Literal["hold", "warn", "off"] | None = None
    """Definition pinning (`sidecar.policy.pins`); default `hold` for http/sse, `warn` for
    stdio."""
    max_definition_bytes: Annotated[int, Field(ge=1024)] = 1024 * 1024
    """The largest tool definition (as JSON: name, description, schemas, annotations) this
    server may list; a larger tool is left out, with the reason in health."""
    max_listing_bytes: Annotated[int, Field(ge=1024 * 1024)] = 64 * 1024 * 1024
    """The largest `tools/list` answer (one page, as JSON) this server may send (over stdio,
    streamable HTTP or SSE); a larger one is refused unparsed and the server does not start
    (the reason in health)."""
    max_tools: Annotated[int, Field(ge=1)] = 10_000
    """The most tools this server offers (those `tools.allow` / `tools.deny` filter out do not
    count): the tools listed after them are left out unchecked, later pages are not asked for,
    and health's `over_max_tools` says how many (`bridges.mcp.listing`)."""
    protocol: Literal["auto", "legacy", "2026-07-28"] = "auto"
    """Protocol era: `auto` probes `server/discover` then falls back to `initialize`;
    `legacy` skips the probe (for servers that ignore unknown methods)."""
    auth: Literal["oauth", "none"] | None = None
    """`oauth`: authorize with OAuth 2.1; `none`: never; unset: OAuth when the server answers
    401 with a Bearer challenge and `headers` has no Authorization."""
    oauth: OAuthSettings | None = Field(default=None, repr=False)
    sandbox: SandboxSetting = None
    """Run the server under bubblewrap (`bridges.manifest.sandbox`; None: `sandbox_default`)."""
    guardrails: GuardrailsConfig | None = None
    """Guardrails on this server's tools (`bridges.manifest.guardrails`)."""

    @model_validator(mode="after")
    def _one_transport(self) -> ServerConfig:
        if (self.command is None) == (self.url is None):
            raise ValueError("a server needs exactly one of `command` (stdio) or `url` (http/sse)")
        if self.type is not None and self.type not in _TRANSPORT_ALIASES:
            raise ValueError(f"unknown type {self.type!r}; use stdio, http or sse")
        transport = self.transport
        if transport == "stdio" and self.command is None:
            raise ValueError("type stdio needs `command`")
        if transport != "stdio" and self.url is None:
            raise ValueError(f"type {self.type} needs `url`")
        if transport == "stdio" and (self.auth == "oauth" or self.oauth is not None):
            raise ValueError("`auth`/`oauth` apply to HTTP servers (`url`) only")
        if self.forward_headers and transport == "stdio":
            raise ValueError("`forward_headers` apply to HTTP servers (`url`) only")
        refused = [n for n in self.forward_headers if n.lower() in UNFORWARDABLE]
        if refused:
            raise ValueError(f"`forward_headers` may not name {', '.join(refused)}")
        if transport != "stdio" and self.sandbox is not None:
            raise ValueError("`sandbox` applies to stdio servers (`command`) only")
        if self.auth == "none" and self.oauth is not None:
            raise ValueError("`oauth` settings with auth = \"none\"")
        return self

    @property
    def oauth_mode(self) -> Literal["oauth", "auto", "none"]:
        """`oauth` (configured), `auto` (on a Bearer challenge) or `none`."""
        if self.transport == "stdio" or self.auth == "none":
            return "none"
        if self.auth == "oauth" or self.oauth is not None:
            return "oauth"
        if any(name.lower() == "authorization" for name in self.headers):
            return "none"
        return "auto"

    @property
    def transport(self) -> Transport:
        if self.type is not None:
            return _TRANSPORT_ALIASES[self.type]
        return "stdio" if self.command is not None else "http"

    @property
    def unknown_keys(self) -> list[str]:
        return sorted(self.model_extra or {})

    def effective_namespace(self, key: str) -> str:
        return key if self.namespace is None else self.namespace


class Rule(_Strict):
    action: str
    resource: str | None = None
    decision: Decision


class PermissionsConfig(_Strict):
    rules: list[Rule] = []
    ask_timeout: Annotated[float, Field(gt=0)] | None = None


class AuditConfig(_Strict):
    """`[audit]`: what the call history keeps of each call's input."""

    inputs: Literal["full", "redacted", "none"] = "redacted"
    mask: list[str] = []
    """Input keys masked in `redacted` mode, besides those that look like secrets."""


class ManifestFile(BaseModel):
    """The top level of one manifest file (entries are validated one by one elsewhere)."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)

    mcpServers: dict[str, Any] = Field(default_factory=dict, alias="mcpServers")
    tools: dict[str, Any] = {}
    permissions: dict[str, Any] = {}
    plugins: list[str] = []
    bounds: dict[str, Any] = {}
    codemode: Literal["direct", "codemode", "both"] | None = None
    expose: Literal["all", "search"] | None = None
    profiles: dict[str, Any] = {}
    default_profile: str | None = None
    rate_limits: dict[str, Any] = {}
    audit: dict[str, Any] = {}
    sandbox_default: SandboxSetting = None
    openapi: dict[str, Any] = {}
    guardrails: dict[str, Any] = {}
    auth: dict[str, Any] = {}


@dataclass(frozen=True, slots=True)
class Sourced:
    """A validated entry and the file it came from."""

    file: str
    key: str
    value: Any


@dataclass(slots=True)
class ManifestSet:
    """Everything the manifests of a Location declare, merged in file order."""

    servers: dict[str, Sourced] = field(default_factory=dict)
    tools: dict[str, Sourced] = field(default_factory=dict)
    rules: list[Rule] = field(default_factory=list)
    rule_sources: list[tuple[str, str]] = field(default_factory=list)
    """(file, JSON path) of each of `rules`."""
    plugins: list[Sourced] = field(default_factory=list)
    bounds: BoundsConfig = field(default_factory=BoundsConfig)
    codemode: Literal["direct", "codemode", "both"] | None = None
    expose: Literal["all", "search"] | None = None
    """The top-level `expose`: every profile's default (docs/tool-search.md)."""
    ask_timeout: float | None = None
    problems: list[ManifestProblem] = field(default_factory=list)
    files: list[str] = field(default_factory=list)
    profiles: dict[str, Sourced] = field(default_factory=dict)
    default_profile: Sourced | None = None
    rate_limits: dict[str, Sourced] = field(default_factory=dict)
    """Per-tool rate limits by effective name or glob (`[rate_limits."<glob>"]`)."""
    audit: AuditConfig | None = None
    """The call history's audit settings (`[audit]`; the last file that sets them wins)."""
    sandbox_default: SandboxConfig | None = None
    """`sandbox_default` (the last file that sets it wins), applied to the stdio servers and
    command tools that do not say (`bridges.manifest.sandbox.apply_sandbox_default`)."""
    overrides: list[Sourced] = field(default_factory=list)
    """Tool overrides in file order: `[tools.overrides."<glob>"]` and server-level ones; key =
    the glob, value = (server key or None, `OverrideConfig`)."""
    openapi: dict[str, Sourced] = field(default_factory=dict)
    """OpenAPI services (`[openapi.NAME]`, value `OpenApiConfig`; docs/openapi.md)."""
    guardrails: GuardrailsConfig | None = None
    """The top-level `[guardrails]` (the last file that sets it wins; docs/guardrails.md)."""
    auth: AuthConfig | None = None
    """The top-level `[auth]`: sign-in, roles, quotas (the last file that sets it wins;
    docs/identities.md)."""

    @property
    def errors(self) -> list[ManifestProblem]:
        return [p for p in self.problems if p.severity == "error"]
