"""The `sandbox` manifest key of stdio servers and `command` tools, and the top-level
`sandbox_default`: parsed here and only here. Imports pydantic only; exports `SandboxConfig`,
`SandboxSetting`, `with_default`, `apply_sandbox_default`, `describe_sandbox` and the
`DEFAULT_*` limits.

    sandbox = false | true | { network = "none" | "host" | ["host:port", ...], read = [paths],
                               write = [paths], env = [names], memory_mb = N,
                               cpu_seconds = N, pids = N }

`true` is the table with every default; `false` is a `SandboxConfig` with `enabled = False`,
so an entry that says `false` stays unsandboxed whatever `sandbox_default` says, while an
entry that says nothing (`None`) takes the default (`with_default`). Paths are absolute or
start with `~` (the daemon user's home). How the sandbox is built: `bridges.sandbox`.
"""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Annotated, Any, Literal, Protocol

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, field_validator
from pydantic.json_schema import SkipJsonSchema

DEFAULT_MEMORY_MB = 2048
"""Address space (RLIMIT_AS), not resident memory: Node reserves ~1 GiB of it at start."""
DEFAULT_CPU_SECONDS = 3600
DEFAULT_PIDS = 256

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_HOST = re.compile(r"\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9]([A-Za-z0-9.-]{0,252})?")
NETWORK_HINT = 'network is "none", "host" or a list of "host:port" (e.g. ["api.github.com:443"])'


def _network(value: Any) -> Any:
    if isinstance(value, str):
        if value not in ("none", "host"):
            raise ValueError(f"{value!r} is not a network setting; {NETWORK_HINT}")
        return value
    if not isinstance(value, list | tuple) or not value:
        raise ValueError(NETWORK_HINT)
    for i, item in enumerate(value):
        if not isinstance(item, str) or split_host_port(item) is None:
            raise ValueError(f"network[{i}] = {item!r} is not \"host:port\"; {NETWORK_HINT}")
    return tuple(value)


def split_host_port(item: str) -> tuple[str, int] | None:
    """("host", port) of an allow-list entry "host:port" (IPv6 in brackets), or None."""
    host, sep, port = item.rpartition(":")
    if not sep or not port.isdigit() or not 1 <= int(port) <= 65535:
        return None
    if not _HOST.fullmatch(host):
        return None
    return host.strip("[]").lower(), int(port)


Network = Annotated[
    Literal["none", "host"] | tuple[str, ...],
    BeforeValidator(_network, json_schema_input_type=Literal["none", "host"] | list[str]),
]


# No docstring: it would become a `description` in the shipped schema/manifest.schema.json.
class SandboxConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: SkipJsonSchema[bool] = True
    network: Network = "none"
    read: list[str] = []
    write: list[str] = []
    env: list[str] = []
    memory_mb: Annotated[int, Field(ge=32)] = DEFAULT_MEMORY_MB
    cpu_seconds: Annotated[int, Field(ge=1)] = DEFAULT_CPU_SECONDS
    pids: Annotated[int, Field(ge=1)] = DEFAULT_PIDS

    @field_validator("read", "write")
    @classmethod
    def _absolute(cls, paths: list[str]) -> list[str]:
        for i, path in enumerate(paths):
            if not (path.startswith("/") or path == "~" or path.startswith("~/")):
                raise ValueError(f"[{i}] {path!r} must be an absolute path (or start with ~/)")
        return paths

    @field_validator("env")
    @classmethod
    def _names(cls, names: list[str]) -> list[str]:
        for i, name in enumerate(names):
            if not _ENV_NAME.fullmatch(name):
                raise ValueError(f"[{i}] {name!r} is not a valid variable name")
        return names


def _flag(value: Any) -> Any:
    if value is True:
        return SandboxConfig()
    if value is False:
        return SandboxConfig(enabled=False)
    if value is None or isinstance(value, dict | SandboxConfig):
        return value
    raise ValueError("sandbox must be true, false or a table {network, read, write, env, "
                     "memory_mb, cpu_seconds, pids}")


SandboxSetting = Annotated[
    SandboxConfig | None,
    BeforeValidator(_flag, json_schema_input_type=bool | SandboxConfig),
]
"""The type of a `sandbox` (or `sandbox_default`) key: None when the entry does not say."""


def with_default(setting: SandboxConfig | None, default: SandboxConfig | None) -> (
        SandboxConfig | None):
    """The sandbox an entry runs in: its own setting, else the default; None: unsandboxed."""
    chosen = setting if setting is not None else default
    return chosen if chosen is not None and chosen.enabled else None


class _Entries(Protocol):
    """The part of `bridges.manifest.model.ManifestSet` the default is applied to."""

    servers: dict[str, Any]
    tools: dict[str, Any]
    sandbox_default: SandboxConfig | None


def apply_sandbox_default(manifests: _Entries) -> None:
    """Give every stdio server and `command` tool that has no `sandbox` key the manifests'
    `sandbox_default` (in place; entries that say `false` stay unsandboxed)."""
    default = manifests.sandbox_default
    if default is None:
        return
    for entries in (manifests.servers, manifests.tools):
        for key, sourced in entries.items():
            value = sourced.value
            if not isinstance(value, BaseModel) or getattr(value, "sandbox", False) is not None:
                continue  # no such key (http entries, raw tables) or the entry says
            if getattr(value, "transport", "stdio") != "stdio":
                continue
            if getattr(value, "kind", "command") != "command":
                continue
            entries[key] = replace(sourced, value=value.model_copy(update={"sandbox": default}))


def describe_sandbox(sandbox: SandboxConfig | None) -> dict[str, Any] | None:
    """What health shows of an entry's sandbox (None: it runs unsandboxed)."""
    if sandbox is None or not sandbox.enabled:
        return None
    network = sandbox.network if isinstance(sandbox.network, str) else list(sandbox.network)
    return {"network": network, "read": sandbox.read, "write": sandbox.write,
            "env": sandbox.env, "memory_mb": sandbox.memory_mb,
            "cpu_seconds": sandbox.cpu_seconds, "pids": sandbox.pids}
