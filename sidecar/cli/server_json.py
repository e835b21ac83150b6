"""What a server.json document (the MCP Registry's format, schema 2025-12-11) becomes in a
manifest: one `mcpServers` entry. npm packages run as `npx -y PKG@VERSION`, PyPI packages as
`uvx PKG==VERSION` (both over stdio), remotes as HTTP (streamable-http) or SSE entries with
their headers. Inputs (environment variables, arguments, headers, URL variables) take their
fixed `value`, what the user gives, or their `default`; a secret (`isSecret`) is never put in
the entry: it becomes `${file:PATH}` and its value is returned for the caller to store.
Imports tomli_w only; exports `Install`, `Input`, `MissingInputs`, `UnsupportedServer`,
`build_install`, `summary`, `entry_key`, `manifest_text`.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tomli_w

INSTALLED_MARK = "# Installed by `sidecar add`"
"""The first line of every file `sidecar add` writes (`sidecar remove` removes only those)."""

_NPM_NAME = re.compile(r"(@[a-z0-9][a-z0-9._~-]*/)?[a-z0-9][a-z0-9._~-]*")
_PYPI_NAME = re.compile(r"[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?")
_VERSION = re.compile(r"[A-Za-z0-9][A-Za-z0-9.+!_-]*")
_DEFAULT_INDEX = {"npm": ("https://registry.npmjs.org",), "pypi": ("https://pypi.org",
                                                                   "https://pypi.python.org")}
_REMOTE_TYPES = {"streamable-http": "http", "sse": "sse"}


class UnsupportedServer(Exception):
    """A server.json that names nothing `sidecar add` can run (the message says what it has)."""


@dataclass(frozen=True, slots=True)
class Input:
    """One value a server needs: `key` is the name the user gives it by (`--secret KEY=...`,
    `--set KEY=...`)."""

    key: str
    description: str
    secret: bool
    required: bool
    default: str | None
    choices: tuple[str, ...] = ()


class MissingInputs(Exception):
    """Required inputs nobody gave (`inputs`)."""

    def __init__(self, inputs: list[Input]) -> None:
        super().__init__(", ".join(i.key for i in inputs))
        self.inputs = inputs


Supply = Callable[[Input], str | None]
"""What the user gives for an input (None: nothing)."""


@dataclass(frozen=True, slots=True)
class Install:
    """One manifest entry and the secrets it references (file name -> value)."""

    key: str
    server: dict[str, Any]
    source: str
    entry: dict[str, Any]
    secrets: dict[str, str]
    inputs: tuple[Input, ...]


def entry_key(name: str) -> str:
    """The manifest key of a registry name: its part after the `/`, in the characters tool
    names allow (`io.github.user/weather.v2` -> `weather-v2`)."""
    tail = name.rsplit("/", 1)[-1]
    key = re.sub(r"[^A-Za-z0-9_-]+", "-", tail).strip("-_")
    return key[:40] or "server"


def _secret_flags(item: Any) -> bool:
    if not isinstance(item, dict):
        return False
    if item.get("isSecret") is True:
        return True
    return any(_secret_flags(v) for v in (item.get("variables") or {}).values())


def summary(server: dict[str, Any]) -> dict[str, Any]:
    """Name, version, description, transports and whether it needs secrets (`search`)."""
    transports: list[str] = []
    secret = False
    for package in _list(server.get("packages")):
        kind = (package.get("transport") or {}).get("type", "stdio")
        transports.append(f"{package.get('registryType', '?')}:{kind}")
        items = [*_list(package.get("environmentVariables")),
                 *_list(package.get("packageArguments")),
                 *_list(package.get("runtimeArguments")),
                 *_list((package.get("transport") or {}).get("headers"))]
        secret = secret or any(_secret_flags(i) for i in items)
    for remote in _list(server.get("remotes")):
        transports.append(f"remote:{remote.get('type', '?')}")
        secret = secret or any(_secret_flags(i) for i in _list(remote.get("headers")))
        secret = secret or any(_secret_flags(v) for v in (remote.get("variables") or {}).values())
    return {"name": server.get("name", ""), "version": server.get("version", ""),
            "description": server.get("description", ""), "transports": transports,
            "secrets": secret}


def _list(value: Any) -> list[dict[str, Any]]:
    return [v for v in value if isinstance(v, dict)] if isinstance(value, list) else []


@dataclass
class _Resolver:
    """Resolves inputs: fixed values (with `{variables}`), the user's, defaults; collects
    secrets and what is missing."""

    supply: Supply
    secret_dir: Path
    secrets: dict[str, str] = field(default_factory=dict)
    missing: list[Input] = field(default_factory=list)
    asked: list[Input] = field(default_factory=list)

    def value(self, item: dict[str, Any], key: str) -> str | None:
        if isinstance(item.get("value"), str):
            return self.template(item["value"], item.get("variables") or {})
        need = Input(key=key, description=str(item.get("description") or ""),
                     secret=item.get("isSecret") is True,
                     required=item.get("isRequired") is True,
                     default=item["default"] if isinstance(item.get("default"), str) else None,
                     choices=tuple(c for c in item.get("choices") or [] if isinstance(c, str)))
        self.asked.append(need)
        given = self.supply(need)
        if not given:
            if need.default is not None:
                return need.default
            if need.required:
                self.missing.append(need)
            return None
        if not need.secret:
            return given
        self.secrets[_file_name(key)] = given
        return "${file:" + str(self.secret_dir / _file_name(key)) + "}"

    def template(self, text: str, variables: dict[str, Any]) -> str:
        def sub(match: re.Match[str]) -> str:
            name = match.group(1)
            spec = variables.get(name)
            if not isinstance(spec, dict):
                return match.group(0)  # the schema: an unknown {name} stays as it is
            resolved = self.value(spec, name)
            return resolved if resolved is not None else ""

        return re.sub(r"\{([A-Za-z_][A-Za-z0-9_]*)\}", sub, text)

    def arguments(self, items: list[dict[str, Any]]) -> list[str]:
        args: list[str] = []
        for n, item in enumerate(items):
            if item.get("type") == "named" and isinstance(item.get("name"), str):
                flag = item["name"]
                value = self.value(item, flag.lstrip("-") or flag)
                if value is not None:
                    args.append(f"{flag}={value}" if value != "" else flag)
            else:
                value = self.value(item, str(item.get("valueHint") or f"arg{n + 1}"))
                if value is not None:
                    args.append(value)
        return args

    def table(self, items: list[dict[str, Any]]) -> dict[str, str]:
        out: dict[str, str] = {}
        for item in items:
            if isinstance(item.get("name"), str):
                value = self.value(item, item["name"])
                if value is not None:
                    out[item["name"]] = value
        return out


def _file_name(key: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", key).lstrip(".") or "secret"


def build_install(
    server: dict[str, Any], key: str, secret_dir: Path, supply: Supply
) -> Install:
    """The manifest entry for `server` under `key`: its first npm or PyPI package over stdio,
    else its first remote. Raises `UnsupportedServer`, or `MissingInputs` naming every
    required input nobody gave."""
    resolver = _Resolver(supply, secret_dir)
    package = _runnable_package(server)
    if package is not None:
        source, entry = _package_entry(package, resolver)
    else:
        remote = next(iter(_list(server.get("remotes"))), None)
        if remote is None:
            raise UnsupportedServer(_unsupported(server))
        source, entry = _remote_entry(remote, resolver)
    if resolver.missing:
        raise MissingInputs(resolver.missing)
    return Install(key=key, server=server, source=source, entry=entry,
                   secrets=resolver.secrets, inputs=tuple(resolver.asked))


def _runnable_package(server: dict[str, Any]) -> dict[str, Any] | None:
    for package in _list(server.get("packages")):
        kind = (package.get("transport") or {}).get("type", "stdio")
        if package.get("registryType") in _DEFAULT_INDEX and kind == "stdio":
            return package
    return None


def _unsupported(server: dict[str, Any]) -> str:
    offered = [f"{p.get('registryType', '?')} package over "
               f"{(p.get('transport') or {}).get('type', 'stdio')}"
               for p in _list(server.get("packages"))]
    return (f"{server.get('name')} offers {', '.join(offered) or 'no package and no remote'}; "
            "sidecar add installs npm and PyPI packages over stdio, and remotes")


def _package_entry(package: dict[str, Any], resolver: _Resolver) -> tuple[str, dict[str, Any]]:
    kind = str(package["registryType"])
    ident, version = package.get("identifier"), package.get("version")
    name_rule = _NPM_NAME if kind == "npm" else _PYPI_NAME
    if not isinstance(ident, str) or not name_rule.fullmatch(ident):
        raise UnsupportedServer(f"{kind} package identifier {ident!r} is not a package name")
    if not isinstance(version, str) or not _VERSION.fullmatch(version) or version == "latest":
        raise UnsupportedServer(f"{kind} package {ident} names no exact version ({version!r})")
    base = str(package.get("registryBaseUrl") or _DEFAULT_INDEX[kind][0]).rstrip("/")
    if base not in _DEFAULT_INDEX[kind]:
        raise UnsupportedServer(f"{kind} package {ident} comes from {base}; sidecar add "
                                f"installs from {_DEFAULT_INDEX[kind][0]} only")
    runtime = resolver.arguments(_list(package.get("runtimeArguments")))
    args = resolver.arguments(_list(package.get("packageArguments")))
    env = resolver.table(_list(package.get("environmentVariables")))
    if kind == "npm":
        entry: dict[str, Any] = {"command": "npx",
                                 "args": [*runtime, "-y", f"{ident}@{version}", *args]}
    else:
        entry = {"command": "uvx", "args": [*runtime, f"{ident}=={version}", *args]}
    if env:
        entry["env"] = env
    entry["sandbox"] = True
    entry["pin"] = "hold"
    return f"{'PyPI' if kind == 'pypi' else kind} {ident} {version}", entry


def _remote_entry(remote: dict[str, Any], resolver: _Resolver) -> tuple[str, dict[str, Any]]:
    kind = _REMOTE_TYPES.get(str(remote.get("type")))
    if kind is None or not isinstance(remote.get("url"), str):
        raise UnsupportedServer(f"remote of type {remote.get('type')!r} (sidecar add installs "
                                "streamable-http and sse remotes)")
    url = resolver.template(remote["url"], remote.get("variables") or {})
    if not url.startswith(("http://", "https://")):
        raise UnsupportedServer(f"remote URL {url!r} is not http(s)")
    entry: dict[str, Any] = {"type": kind, "url": url}
    headers = resolver.table(_list(remote.get("headers")))
    if headers:
        entry["headers"] = headers
    entry["pin"] = "hold"
    return f"remote {remote['type']} {url}", entry


def manifest_text(install: Install, registry: str, secret_dir: Path | None) -> str:
    """The TOML file `sidecar add` writes: a comment saying where the entry came from, then
    the one `[mcpServers.KEY]` table."""
    server = install.server
    description = " ".join(str(server.get("description", "")).split())
    lines = [
        f"{INSTALLED_MARK} from {registry}",
        f"# {server.get('name')} {server.get('version', '')}: {description}",
        f"# runs: {install.source}",
    ]
    if install.secrets and secret_dir is not None:
        lines.append(f"# secrets: files in {secret_dir} (never in this file)")
    lines.append(f"# remove with `sidecar remove {install.key}`")
    body = tomli_w.dumps({"mcpServers": {install.key: install.entry}})
    return "\n".join(lines) + "\n\n" + body
