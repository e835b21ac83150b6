"""Manifests: JSON or TOML files that declare MCP servers, manifest tools, permission rules,
profiles and plugins for a Location, read and validated into a `ManifestSet`. Imports its
`bridges.manifest` siblings only; exports `load_manifests`, `interpolate`, `parse_file` and
`manifest_files`, and re-exports the data model (`bridges.manifest.model`: `ManifestSet`,
`ServerConfig`, ...) and `ManifestProblem` for its importers.

A Claude-Desktop/Cursor style `{"mcpServers": {...}}` file, or a VS Code style
`{"servers": {...}}` file, loads unchanged: keys we do not know are kept and reported as notes,
never errors. `${env:VAR}`, `${file:PATH}` and `${keyring:SERVICE/NAME}` in any string value
are replaced by the secret they name (`bridges.manifest.secrets`); one that cannot be resolved
is an error naming the file, the JSON path and the reference. Loading never raises for bad
content: every fault becomes a `ManifestProblem` (file, JSON path, message, hint) and the
valid entries still load; a file that cannot be parsed contributes nothing.
"""

from __future__ import annotations

import json
import os
import re
import tomllib
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from bridges.manifest.auth import AuthConfig
from bridges.manifest.guardrails import GuardrailsConfig
from bridges.manifest.model import AnnotationPermissions as AnnotationPermissions
from bridges.manifest.model import AuditConfig as AuditConfig
from bridges.manifest.model import Decision as Decision
from bridges.manifest.model import ManifestFile as ManifestFile
from bridges.manifest.model import ManifestSet as ManifestSet
from bridges.manifest.model import PermissionsConfig as PermissionsConfig
from bridges.manifest.model import Rule as Rule
from bridges.manifest.model import ServerConfig as ServerConfig
from bridges.manifest.model import Sourced as Sourced
from bridges.manifest.model import Timeouts as Timeouts
from bridges.manifest.model import ToolFilter as ToolFilter
from bridges.manifest.openapi import OpenApiConfig
from bridges.manifest.overrides import OverrideConfig
from bridges.manifest.profiles import PROFILE_NAME, ProfileConfig, RateLimitConfig
from bridges.manifest.sandbox import apply_sandbox_default
from bridges.manifest.secrets import SecretReferenceError, resolve_references

# BoundsConfig, ManifestProblem: defined below this module and `manifest_tools.config`
from bridges.manifest.values import BoundsConfig as BoundsConfig
from bridges.manifest.values import ManifestProblem as ManifestProblem
from bridges.manifest.values import did_you_mean, model_keys

MANIFEST_SUFFIXES = (".json", ".toml")


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
