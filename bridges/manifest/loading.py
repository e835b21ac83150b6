"""Manifests: JSON or TOML files that declare MCP servers, manifest tools, permission rules,
profiles and plugins for a Location. Imports its `bridges.manifest` siblings only; exports
`load_manifests`, `ManifestSet`, `ManifestFile`, `ServerConfig`, `ManifestProblem`,
`interpolate`, `parse_file` and `manifest_files`.

A Claude-Desktop/Cursor style `{"mcpServers": {...}}` file, or a VS Code style
`{"servers": {...}}` file, loads unchanged: their keys mean what they mean there, keys we do
not know are kept and reported as notes, never errors, and sidecar keys extend a server entry
(`ServerConfig`). `${env:VAR}`, `${file:PATH}` and `${keyring:SERVICE/NAME}` in any string
value are replaced by the secret they name (`bridges.manifest.secrets`); one that cannot be
resolved is an error naming the file, the JSON path and the reference. Values that may hold
secrets (`env`, `headers`, the `oauth` table) are never shown in reprs, logs or health output.
Loading never raises for bad content: every fault becomes a `ManifestProblem` (file, JSON path,
message, hint) and the valid entries still load; a file that cannot be parsed contributes
nothing.
"""

from __future__ import annotations

import json
import os
import re
import tomllib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from bridges.manifest.auth import AuthConfig
from bridges.manifest.guardrails import GuardrailsConfig
from bridges.manifest.oauth import OAuthSettings
from bridges.manifest.openapi import OpenApiConfig
from bridges.manifest.overrides import OverrideConfig
from bridges.manifest.profiles import PROFILE_NAME, ProfileConfig, RateLimitConfig
from bridges.manifest.sandbox import SandboxConfig, SandboxSetting, apply_sandbox_default
from bridges.manifest.secrets import SecretReferenceError, resolve_references

# BoundsConfig, ManifestProblem: defined below this module and `manifest_tools.config`
from bridges.manifest.values import BoundsConfig as BoundsConfig
from bridges.manifest.values import ManifestProblem as ManifestProblem
from bridges.manifest.values import did_you_mean, model_keys

MANIFEST_SUFFIXES = (".json", ".toml")
_SECRET_KEYS = frozenset({"env", "headers", "oauth"})
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


# --- parsing -------------------------------------------------------------------------------


def manifest_files(entries: Iterable[str | os.PathLike[str]]) -> list[Path]:
    """The manifest files named by `entries` (files, or directories scanned one level)."""
    found: list[Path] = []
    for entry in entries:
        path = Path(entry)
        if path.is_dir():
            found.extend(
                sorted(p for p in path.iterdir() if p.suffix in MANIFEST_SUFFIXES and p.is_file())
            )
        else:
            found.append(path)
    return found


def _json_path(base: str, loc: Iterable[Any]) -> str:
    path = base
    for part in loc:
        path += f"[{part}]" if isinstance(part, int) else f".{part}"
    return path


def _key_path(base: str, key: str) -> str:
    return f"{base}.{key}" if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_-]*", key) else f'{base}["{key}"]'


def interpolate(
    value: Any, path: str, environ: Mapping[str, str], base_dir: Path | None = None
) -> Any:
    """Resolve `${env:...}`, `${file:...}` and `${keyring:...}` in every string inside
    `value` (`bridges.manifest.secrets`); one that cannot be resolved raises `SecretReferenceError`.
    Relative `${file:}` paths are relative to `base_dir`."""
    if isinstance(value, str):
        return resolve_references(value, path, environ, base_dir) if "${" in value else value
    if isinstance(value, dict):
        return {k: interpolate(v, _key_path(path, k), environ, base_dir)
                for k, v in value.items()}
    if isinstance(value, list):
        return [interpolate(v, f"{path}[{i}]", environ, base_dir) for i, v in enumerate(value)]
    return value


def parse_file(path: Path) -> tuple[dict[str, Any] | None, ManifestProblem | None]:
    """The raw top-level object of a manifest file, or the problem that prevents reading it."""
    name = str(path)
    try:
        raw = path.read_bytes()
    except OSError as exc:
        return None, ManifestProblem(name, "$", f"cannot read: {exc.strerror or exc}")
    try:
        if path.suffix == ".toml":
            data: Any = tomllib.loads(raw.decode("utf-8"))
        else:
            data = json.loads(raw)
    except UnicodeDecodeError as exc:
        return None, ManifestProblem(name, "$", f"not UTF-8: {exc}")
    except tomllib.TOMLDecodeError as exc:
        return None, ManifestProblem(name, "$", f"invalid TOML: {exc}")
    except json.JSONDecodeError as exc:
        return None, ManifestProblem(
            name, "$", f"invalid JSON at line {exc.lineno}, column {exc.colno}: {exc.msg}"
        )
    if not isinstance(data, dict):
        return None, ManifestProblem(name, "$", "a manifest must be an object/table at the top")
    return data, None


def _validation_problems(
    file: str, base: str, exc: ValidationError, hint: str = ""
) -> list[ManifestProblem]:
    problems = []
    for err in exc.errors(include_url=False):
        loc = [p for p in err["loc"] if p not in ("function-after[_one_transport()]",)]
        message = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden" and loc:
            problems.append(ManifestProblem(
                file, _json_path(base, loc), "unknown key",
                did_you_mean(str(loc[-1]), _known_keys()) or hint, unknown_key=True))
            continue
        problems.append(ManifestProblem(file, _json_path(base, loc), message, hint))
    return problems


def _known_keys() -> set[str]:
    """Every key of the manifest format (for "did you mean ...?")."""
    return model_keys(ServerConfig, ToolFilter, Timeouts, AnnotationPermissions, Rule,
                      PermissionsConfig, ManifestFile, BoundsConfig, OpenApiConfig,
                      GuardrailsConfig)


ToolValidator = Callable[[str, str, Any], tuple[Any, list[ManifestProblem]]]
"""(file, JSON path, raw entry) -> (validated entry or None, problems)"""


def load_manifests(
    entries: Iterable[str | os.PathLike[str]],
    *,
    environ: Mapping[str, str] | None = None,
    tool_validator: ToolValidator | None = None,
) -> ManifestSet:
    """Read and validate every manifest named by `entries`; never raises for bad content.

    `tool_validator(file, path, raw)` validates one `tools` entry and returns (value,
    problems); without it, tool entries are kept raw.
    """
    env = os.environ if environ is None else environ
    result = ManifestSet()
    try:
        files = manifest_files(entries)
    except OSError as exc:
        result.problems.append(ManifestProblem(str(exc.filename), "$", f"cannot list: {exc}"))
        return result
    for path in files:
        _load_one(path, env, result, tool_validator)
    _check_profiles(result)
    apply_sandbox_default(result)
    return result


def _load_one(
    path: Path, env: Mapping[str, str], result: ManifestSet, tool_validator: ToolValidator | None
) -> None:
    name = str(path)
    if not path.exists():
        result.problems.append(ManifestProblem(name, "$", "no such file or directory"))
        return
    data, problem = parse_file(path)
    if problem is not None or data is None:
        result.problems.append(problem or ManifestProblem(name, "$", "empty"))
        return
    result.files.append(name)
    if "servers" in data and "mcpServers" not in data and isinstance(data["servers"], dict):
        data = {**data, "mcpServers": data["servers"]}  # VS Code's spelling
        data.pop("servers")
    try:
        top = ManifestFile.model_validate(data)
    except ValidationError as exc:
        result.problems.extend(_validation_problems(name, "$", exc))
        return
    for key in sorted(top.model_extra or {}):
        if key != "inputs":
            result.problems.append(ManifestProblem(
                name, f"$.{key}", "unknown top-level key, ignored", severity="note",
                hint=did_you_mean(key, [*model_keys(ManifestFile), "servers"]) or (
                    "known keys: mcpServers (or servers), tools, permissions, plugins, bounds, "
                    "codemode, expose, profiles, default_profile, rate_limits, audit, openapi, "
                    "sandbox_default, guardrails, auth"),
                unknown_key=True,
            ))
    for key, raw in top.mcpServers.items():
        _load_server(name, key, raw, env, result)
    for key, raw in top.tools.items():
        if key == "overrides" and isinstance(raw, dict) and "kind" not in raw:
            for glob, table in raw.items():
                _load_override(name, _key_path("$.tools.overrides", glob), None, glob, table,
                               result)
            continue
        _load_tool(name, key, raw, env, result, tool_validator)
    for key, raw in top.profiles.items():
        _load_profile(name, key, raw, env, result)
    for key, raw in top.openapi.items():
        _load_openapi(name, key, raw, env, result)
    for key, raw in top.rate_limits.items():
        base = _key_path("$.rate_limits", key)
        try:
            result.rate_limits[key] = Sourced(name, key, RateLimitConfig.model_validate(raw))
        except ValidationError as exc:
            result.problems.extend(_validation_problems(name, base, exc))
    if top.default_profile is not None:
        result.default_profile = Sourced(name, "default_profile", top.default_profile)
    _load_permissions(name, top.permissions, env, result)
    if top.audit:
        try:
            result.audit = AuditConfig.model_validate(top.audit)
        except ValidationError as exc:
            result.problems.extend(_validation_problems(name, "$.audit", exc))
    if top.guardrails and (guardrails := _secret_table(
            name, "$.guardrails", top.guardrails, GuardrailsConfig, env, result)) is not None:
        result.guardrails = guardrails
    if top.auth and (auth := _secret_table(
            name, "$.auth", top.auth, AuthConfig, env, result)) is not None:
        result.auth = auth
    for i, plugin in enumerate(top.plugins):
        if not re.fullmatch(r"[\w.]+:[\w.]+", plugin):
            result.problems.append(ManifestProblem(
                name, f"$.plugins[{i}]", f"{plugin!r} is not a plugin reference",
                hint="write it as 'package.module:function'",
            ))
        else:
            result.plugins.append(Sourced(name, plugin, plugin))
    if top.codemode is not None:
        result.codemode = top.codemode
    if top.expose is not None:
        result.expose = top.expose
    if top.sandbox_default is not None:
        result.sandbox_default = top.sandbox_default
    if top.bounds:
        try:
            result.bounds = BoundsConfig.model_validate(top.bounds)
        except ValidationError as exc:
            result.problems.extend(_validation_problems(name, "$.bounds", exc))


_T = TypeVar("_T", bound=BaseModel)


def _secret_table(name: str, path: str, raw: Any, model: type[_T], env: Mapping[str, str],
                  result: ManifestSet) -> _T | None:
    """A top-level table whose values may name secrets (`${env:}`, `${file:}`), resolved and
    validated as `model`; None, with problems recorded, when either fails."""
    table = _interpolated(name, path, raw, env, result)
    if table is None:
        return None
    try:
        return model.model_validate(table)
    except ValidationError as exc:
        result.problems.extend(_validation_problems(name, path, exc))
        return None


def _interpolated(
    file: str, base: str, raw: Any, env: Mapping[str, str], result: ManifestSet
) -> Any | None:
    try:
        return interpolate(raw, base, env, Path(file).parent)
    except SecretReferenceError as missing:
        result.problems.append(ManifestProblem(file, missing.path, missing.message,
                                               hint=missing.hint))
        return None


def _load_server(
    file: str, key: str, raw: Any, env: Mapping[str, str], result: ManifestSet
) -> None:
    base = _key_path("$.mcpServers", key)
    if key in result.servers:
        result.problems.append(ManifestProblem(
            file, base, f"server {key!r} is already defined in {result.servers[key].file}",
            hint="server keys must be unique across the manifests of a Location; this one is "
            "ignored",
        ))
        return
    value = _interpolated(file, base, raw, env, result)
    if value is None:
        return
    if isinstance(value, dict) and isinstance(value.get("overrides"), dict):
        value = dict(value)
        for glob, table in value.pop("overrides").items():
            path = _key_path(f"{base}.overrides", glob)
            _load_override(file, path, key, glob, table, result)
    try:
        config = ServerConfig.model_validate(value)
    except ValidationError as exc:
        result.problems.extend(_validation_problems(
            file, base, exc, hint="see schema/manifest.schema.json for the keys of a server"
        ))
        _unknown_server_keys(file, base, value, result)  # every problem of the entry at once
        return
    _unknown_server_keys(file, base, value, result)
    result.servers[key] = Sourced(file, key, config)


def _unknown_server_keys(file: str, base: str, value: Any, result: ManifestSet) -> None:
    known = model_keys(ServerConfig)
    extras = sorted(k for k in value if k not in known) if isinstance(value, dict) else []
    for extra in extras:
        result.problems.append(ManifestProblem(
            file, f"{base}.{extra}", "key not used by mcp-sidecar, kept as is", severity="note",
            hint=did_you_mean(extra, known), unknown_key=True,
        ))


def _load_tool(
    file: str,
    key: str,
    raw: Any,
    env: Mapping[str, str],
    result: ManifestSet,
    tool_validator: ToolValidator | None,
) -> None:
    base = _key_path("$.tools", key)
    if key in result.tools:
        result.problems.append(ManifestProblem(
            file, base, f"tool {key!r} is already defined in {result.tools[key].file}",
            hint="this one is ignored",
        ))
        return
    value = _interpolated(file, base, raw, env, result)
    if value is None:
        return
    if tool_validator is None:
        result.tools[key] = Sourced(file, key, value)
        return
    parsed, problems = tool_validator(file, base, value)
    result.problems.extend(problems)
    if parsed is not None:
        result.tools[key] = Sourced(file, key, parsed)


def _load_openapi(
    file: str, key: str, raw: Any, env: Mapping[str, str], result: ManifestSet
) -> None:
    base = _key_path("$.openapi", key)
    if key in result.openapi:
        result.problems.append(ManifestProblem(
            file, base, f"openapi {key!r} is already defined in {result.openapi[key].file}",
            hint="this one is ignored"))
        return
    value = _interpolated(file, base, raw, env, result)
    if value is None:
        return
    try:
        result.openapi[key] = Sourced(file, key, OpenApiConfig.model_validate(value))
    except ValidationError as exc:
        result.problems.extend(_validation_problems(
            file, base, exc, hint="see docs/openapi.md for the keys of an openapi entry"))


def _load_override(
    file: str, base: str, server: str | None, glob: str, raw: Any, result: ManifestSet
) -> None:
    try:
        config = OverrideConfig.model_validate(raw)
        result.overrides.append(Sourced(file, glob, (server, config)))
    except ValidationError as exc:
        result.problems.extend(_validation_problems(
            file, base, exc, hint="see docs/profiles.md for the keys of a tool override"
        ))


def _load_profile(
    file: str, key: str, raw: Any, env: Mapping[str, str], result: ManifestSet
) -> None:
    base = _key_path("$.profiles", key)
    if not PROFILE_NAME.fullmatch(key):
        result.problems.append(ManifestProblem(
            file, base, f"profile name {key!r} is not allowed",
            hint="use 1-64 letters, digits, '_' or '-' (it becomes a URL path: /mcp/NAME)",
        ))
        return
    if key in result.profiles:
        result.problems.append(ManifestProblem(
            file, base, f"profile {key!r} is already defined in {result.profiles[key].file}",
            hint="this one is ignored",
        ))
        return
    value = _interpolated(file, base, raw, env, result)
    if value is None:
        return
    try:
        config = ProfileConfig.model_validate(value)
    except ValidationError as exc:
        result.problems.extend(_validation_problems(
            file, base, exc, hint="see docs/profiles.md for the keys of a profile"
        ))
        return
    result.profiles[key] = Sourced(file, key, config)


def _check_profiles(result: ManifestSet) -> None:
    """Cross-file checks: profiles name declared servers; `default_profile` is declared."""
    for key, sourced in list(result.profiles.items()):
        config: ProfileConfig = sourced.value
        base = _key_path("$.profiles", key)
        lists = [("servers", config.servers or [])]
        for which in ("resources", "prompts"):
            value = getattr(config, which)
            if isinstance(value, list):
                lists.append((which, value))
        for which, servers in lists:
            for i, server in enumerate(servers):
                if server not in result.servers:
                    known = ", ".join(sorted(result.servers)) or "(none)"
                    result.problems.append(ManifestProblem(
                        sourced.file, f"{base}.{which}[{i}]",
                        f"profile {key!r} names server {server!r}, which no manifest defines",
                        hint=f"known servers: {known}",
                    ))
    chosen = result.default_profile
    if chosen is not None and chosen.value not in result.profiles:
        known = ", ".join(sorted(result.profiles)) or "(none)"
        result.problems.append(ManifestProblem(
            chosen.file, "$.default_profile",
            f"default_profile {chosen.value!r} is not a declared profile",
            hint=f"declare [profiles.{chosen.value}] or use one of: {known}",
        ))


def _load_permissions(
    file: str, raw: dict[str, Any], env: Mapping[str, str], result: ManifestSet
) -> None:
    if not raw:
        return
    value = _interpolated(file, "$.permissions", raw, env, result)
    if value is None:
        return
    try:
        config = PermissionsConfig.model_validate(value)
    except ValidationError as exc:
        result.problems.extend(_validation_problems(file, "$.permissions", exc))
        return
    result.rules.extend(config.rules)
    result.rule_sources.extend((file, f"$.permissions.rules[{i}]")
                               for i in range(len(config.rules)))
    if config.ask_timeout is not None:
        result.ask_timeout = config.ask_timeout
