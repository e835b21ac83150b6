"""The registrar of a Location's OpenAPI services (`[openapi.NAME]`): one registration per
service, labelled `openapi:NAME`, its tools named `NAME_<operation>`. Imports
`bridges.manifest`, `bridges.manifest_tools`, its `bridges.openapi` siblings, `managed_store`,
`sidecar.model` and `sidecar.registry`; exports `OpenApiTools`, `Prepared`, `Service`.

    openapi = OpenApiTools(location.tools, store, permissions)
    problems = await openapi.apply(loaded.openapi)   # a spec that cannot be read: no tools
    prepared = await openapi.prepare(reloaded.openapi)  # reads every spec, registers nothing
    openapi.commit(prepared)                            # swaps the registrations in place
    await openapi.aclose()

`prepare` reads each spec in a worker thread and builds every tool, so `commit` cannot fail
half way: a reload either applies all services or none. A service whose config and spec bytes
did not change keeps its tool values. Operations no tool can call are left out with a
`warning` problem saying why. `stamps` say which local spec files the last `prepare` read and
their (mtime, size) then: a reload is due when one differs.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from bridges.manifest.loading import Sourced
from bridges.manifest.openapi import OpenApiConfig
from bridges.manifest.values import ManifestProblem
from bridges.manifest_tools.registrar import LazyClient
from bridges.openapi.document import SpecError, open_spec, resolve_url, same_origin
from bridges.openapi.operations import Operation, Skipped, read_operations
from managed_store import TextStore
from sidecar.model.errors import RegistrationError, SchemaDefinitionError
from sidecar.model.permissions import PermissionGate
from sidecar.model.tool import Tool
from sidecar.registry.registry import Scope, Tools, build_entries

if TYPE_CHECKING:
    import httpx

log = logging.getLogger("sidecar.openapi")


@dataclass(frozen=True, slots=True)
class Service:
    """One service as read: its tools by operation name."""

    key: str
    config: OpenApiConfig
    digest: str
    base_url: str
    tools: Mapping[str, Tool]
    skipped: tuple[Skipped, ...]

    @property
    def namespace(self) -> str:
        return self.key if self.config.namespace is None else self.config.namespace


@dataclass(slots=True)
class Prepared:
    """What `prepare` read: the services that can be registered and the problems found."""

    services: dict[str, Service] = field(default_factory=dict)
    problems: list[ManifestProblem] = field(default_factory=list)
    stamps: list[tuple[str, int, int]] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class _Read:
    operations: list[Operation]
    skipped: list[Skipped]
    base_url: str
    digest: str
    stamps: tuple[tuple[str, int, int], ...]


class OpenApiTools:
    """Registers a Location's OpenAPI services (see the module docstring)."""

    def __init__(
        self,
        tools: Tools,
        store: TextStore,
        permissions: PermissionGate | None = None,
        *,
        store_namespace: str = "default",
        client: httpx.AsyncClient | None = None,
    ) -> None:
        self._tools = tools
        self._store = store
        self._permissions = permissions
        self._namespace = store_namespace
        self._client = LazyClient(client)
        self._services: dict[str, Service] = {}
        self._scopes: dict[str, Scope] = {}
        self._stamps: tuple[tuple[str, int, int], ...] = ()
        self._closed = False

    @property
    def services(self) -> Mapping[str, Service]:
        return dict(self._services)

    @property
    def stamps(self) -> tuple[tuple[str, int, int], ...]:
        """(path, mtime_ns, size) of the local spec files the last `prepare` read."""
        return self._stamps

    async def apply(self, entries: Mapping[str, Sourced]) -> list[ManifestProblem]:
        """Register exactly the services of `entries` that can be read; the problems."""
        prepared = await self.prepare(entries)
        self.commit(prepared)
        return prepared.problems

    async def prepare(self, entries: Mapping[str, Sourced]) -> Prepared:
        prepared = Prepared()
        for key, sourced in entries.items():
            config: OpenApiConfig = sourced.value
            where = f"$.openapi.{key}"
            try:
                read = await asyncio.to_thread(_read, config, Path(sourced.file).parent)
            except SpecError as exc:
                prepared.stamps.extend(_stamp_of(config.spec, Path(sourced.file).parent))
                prepared.problems.append(ManifestProblem(
                    sourced.file, f"{where}.spec", f"openapi {key!r}: {exc}",
                    hint="the spec is read again at the next reload (a change to a manifest "
                         "or to a spec file)"))
                continue
            prepared.stamps.extend(read.stamps)
            service = self._service(key, config, read, prepared, sourced.file, where)
            prepared.services[key] = service
        self._stamps = tuple(prepared.stamps)
        return prepared

    def _service(
        self, key: str, config: OpenApiConfig, read: _Read, prepared: Prepared, file: str,
        where: str,
    ) -> Service:
        previous = self._services.get(key)
        if previous is not None and previous.config == config and previous.digest == read.digest:
            return previous
        skipped = list(read.skipped)
        tools: dict[str, Tool] = {}
        namespace = key if config.namespace is None else config.namespace
        from bridges.openapi.call import operation_tool  # imports httpx

        for operation in read.operations:
            try:
                tool = operation_tool(
                    operation, config, read.base_url, client=self._client.get(),
                    store=self._store, store_namespace=self._namespace,
                    permissions=self._permissions)
                build_entries({**tools, operation.key: tool}, namespace)
            except (SchemaDefinitionError, RegistrationError, ValueError) as exc:
                what = f"{operation.key} ({operation.method} {operation.path})"
                skipped.append(Skipped(what, str(exc)))
                continue
            tools[operation.key] = tool
        for skip in skipped:
            prepared.problems.append(ManifestProblem(
                file, where, f"openapi {key!r}: operation {skip.what} left out: {skip.reason}",
                severity="warning"))
        return Service(key, config, read.digest, read.base_url, tools, tuple(skipped))

    def commit(self, prepared: Prepared) -> None:
        """Make `prepared.services` the registered ones (unchanged services are not touched)."""
        if self._closed:
            raise RegistrationError("the OpenAPI registrar is closed")
        for key in [k for k in self._scopes if k not in prepared.services]:
            self._scopes.pop(key).close()
        for key, service in prepared.services.items():
            scope = self._scopes.get(key)
            if scope is not None and self._services.get(key) is service:
                continue
            if scope is None:
                self._scopes[key] = self._tools.register(
                    service.tools, namespace=service.namespace, label=f"openapi:{key}")
            else:
                scope.replace(service.tools, namespace=service.namespace)
            log.info("openapi %s: %d tool(s) calling %s", key, len(service.tools),
                     service.base_url)
        self._services = dict(prepared.services)

    async def aclose(self) -> None:
        """Remove the tools and close the HTTP client (if this registrar created it)."""
        if self._closed:
            return
        self._closed = True
        for scope in self._scopes.values():
            scope.close()
        self._scopes = {}
        self._services = {}
        await self._client.aclose()


def _read(config: OpenApiConfig, base_dir: Path) -> _Read:
    """Read a spec and its operations (blocking: a worker thread runs it)."""
    headers = dict(config.headers)
    explicit = config.base_url
    with open_spec(config.spec, base_dir, timeout=config.timeout,
                   headers=headers if explicit and same_origin(explicit, config.spec)
                   else None) as spec:
        base_url = _base_url(config, spec.uri, spec.data)
        operations, skipped = read_operations(spec, config.operations.allow,
                                              config.operations.deny)
        return _Read(operations, skipped, base_url, spec.digest, spec.stamps)


def _base_url(config: OpenApiConfig, uri: str, data: Mapping[str, object]) -> str:
    """`base_url`, else the spec's first server (its variables at their defaults), resolved
    against the spec's URI."""
    chosen = config.base_url
    if chosen is None:
        servers = data.get("servers")
        first = servers[0] if isinstance(servers, list) and servers else {}
        url = first.get("url", "/") if isinstance(first, dict) else "/"
        variables = first.get("variables", {}) if isinstance(first, dict) else {}
        chosen = str(url)
        for name, variable in (variables.items() if isinstance(variables, dict) else ()):
            if isinstance(variable, dict) and "default" in variable:
                chosen = chosen.replace(f"{{{name}}}", str(variable["default"]))
    resolved = resolve_url(uri, chosen)
    if not resolved.startswith(("http://", "https://")):
        raise SpecError(
            f"the base URL {chosen!r} is not an http(s) URL (resolved against the spec: "
            f"{resolved!r}); set base_url")
    return resolved


def _stamp_of(spec: str, base_dir: Path) -> list[tuple[str, int, int]]:
    """The stamp of a local spec that could not be read (a later fix is then noticed)."""
    if resolve_url("file:///", spec).startswith(("http://", "https://")):
        return []
    path = (base_dir / spec).resolve()
    try:
        st = path.stat()
    except OSError:
        return [(str(path), -1, -1)]
    return [(str(path), st.st_mtime_ns, st.st_size)]
