"""Where `sidecar search` and `sidecar add` find servers: an MCP Registry over HTTP (the
official one by default; `GET /v0.1/servers?search=&cursor=&version=latest` and
`GET /v0.1/servers/{name}/versions/{version}`, `/v0` where `/v0.1` is not served) or a local
catalog file (a `{"servers": [...]}` list as the API answers, entries either `{"server": ...}`
or bare server.json documents). Imports httpx only (when it asks); exports `Registry`,
`open_registry`, `RegistryError`, `DEFAULT_REGISTRY`, `load_server_json`.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

if TYPE_CHECKING:
    import httpx

DEFAULT_REGISTRY = "https://registry.modelcontextprotocol.io"
_OFFICIAL = "io.modelcontextprotocol.registry/official"
_PAGE = 100
_MAX_PAGES = 20


class RegistryError(Exception):
    """A registry that cannot be read, or that does not know a server (the message says
    which, naming the registry)."""


class Registry:
    """A source of server.json documents (`where`: its URL or file, for messages)."""

    where: str

    def search(self, query: str, limit: int) -> list[dict[str, Any]]:
        """The latest version of each server whose name or description holds `query`
        (case-insensitive), as server.json documents."""
        raise NotImplementedError

    def get(self, name: str, version: str | None) -> dict[str, Any]:
        """The server.json of `name` at `version` (None: the latest)."""
        raise NotImplementedError


def open_registry(where: str | None) -> Registry:
    """The registry at an http(s) URL, else the catalog file at that path."""
    where = where or DEFAULT_REGISTRY
    if where.startswith(("http://", "https://")):
        return HttpRegistry(where.rstrip("/"))
    return CatalogFile(Path(where).expanduser())


def load_server_json(path: Path) -> dict[str, Any]:
    """A server.json file (or an API answer wrapping one in `server`)."""
    return _server_of(_read_json(path), str(path))


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise RegistryError(f"cannot read {path}: {exc.strerror or exc}") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise RegistryError(f"{path} is not JSON: {exc}") from None


def _server_of(entry: Any, where: str) -> dict[str, Any]:
    server = entry.get("server", entry) if isinstance(entry, dict) else None
    if not isinstance(server, dict) or not isinstance(server.get("name"), str):
        raise RegistryError(f"{where}: not a server.json document (no `name`)")
    return server


def _is_latest(entry: dict[str, Any]) -> bool | None:
    official = (entry.get("_meta") or {}).get(_OFFICIAL) or {}
    latest = official.get("isLatest")
    return latest if isinstance(latest, bool) else None


def _matches(server: dict[str, Any], query: str) -> bool:
    text = f"{server.get('name', '')}\n{server.get('description', '')}".lower()
    return query.lower() in text


class CatalogFile(Registry):
    """A local catalog: the servers of one file, searched like the official registry does
    (substring of name or description)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.where = str(path)

    def _entries(self) -> list[dict[str, Any]]:
        data = _read_json(self.path)
        entries = data.get("servers") if isinstance(data, dict) else data
        if not isinstance(entries, list):
            raise RegistryError(f"{self.path}: a catalog is {{\"servers\": [...]}}")
        return [e for e in entries if isinstance(e, dict)]

    def _latest(self) -> dict[str, dict[str, Any]]:
        """Per name, the entry marked latest, else the last one listed."""
        latest: dict[str, dict[str, Any]] = {}
        marked: set[str] = set()
        for entry in self._entries():
            server = _server_of(entry, self.where)
            name = server["name"]
            if name in marked:
                continue
            if _is_latest(entry):
                marked.add(name)
            latest[name] = server
        return latest

    def search(self, query: str, limit: int) -> list[dict[str, Any]]:
        found = [s for s in self._latest().values() if _matches(s, query)]
        return found[:limit]

    def get(self, name: str, version: str | None) -> dict[str, Any]:
        if version is None:
            server = self._latest().get(name)
        else:
            servers = (_server_of(e, self.where) for e in self._entries())
            server = next((s for s in servers
                           if s["name"] == name and s.get("version") == version), None)
        if server is None:
            raise RegistryError(_unknown(name, version, self.where))
        return server


class HttpRegistry(Registry):
    """A registry serving the MCP Registry API (`/v0.1`, or `/v0` where that is all it
    serves; a URL that already ends in a version is used as it is)."""

    def __init__(self, where: str) -> None:
        self.where = where
        self._prefix: str | None = None

    def _base(self) -> str:
        if self._prefix is None:
            tail = self.where.rsplit("/", 1)[-1]
            self._prefix = "" if tail in ("v0", "v0.1") else "/v0.1"
        return self.where + self._prefix

    def _get(self, path: str, params: dict[str, str] | None = None) -> httpx.Response:
        import httpx  # not on the path of every `sidecar` command's start

        try:
            with httpx.Client(timeout=30, follow_redirects=True,
                              headers={"accept": "application/json"}) as client:
                answer = client.get(self._base() + path, params=params)
                if answer.status_code == 404 and self._prefix == "/v0.1" and path == "/servers":
                    self._prefix = "/v0"  # a registry of the first API version
                    answer = client.get(self._base() + path, params=params)
        except httpx.HTTPError as exc:
            raise RegistryError(f"cannot reach the registry {self.where}: {exc}") from None
        return answer

    def _json(self, answer: httpx.Response) -> Any:
        if answer.status_code != 200:
            raise RegistryError(f"the registry {self.where} answered {answer.status_code} "
                                f"to {answer.request.url}: {answer.text[:200]}")
        try:
            return answer.json()
        except ValueError:
            raise RegistryError(f"the registry {self.where} answered with no JSON to "
                                f"{answer.request.url}") from None

    def _pages(self, query: str) -> Iterator[dict[str, Any]]:
        cursor: str | None = None
        for _ in range(_MAX_PAGES):
            params = {"search": query, "version": "latest", "limit": str(_PAGE)}
            if cursor:
                params["cursor"] = cursor
            page = self._json(self._get("/servers", params))
            for entry in page.get("servers") or []:
                if isinstance(entry, dict) and _is_latest(entry) is not False:
                    yield _server_of(entry, self.where)
            meta = page.get("metadata") or {}
            cursor = meta.get("nextCursor") or meta.get("next_cursor")
            if not cursor:
                return

    def search(self, query: str, limit: int) -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = []
        for server in self._pages(query):
            found.append(server)
            if len(found) >= limit:
                break
        return found

    def get(self, name: str, version: str | None) -> dict[str, Any]:
        path = f"/servers/{quote(name, safe='')}/versions/{quote(version or 'latest', safe='')}"
        answer = self._get(path)
        if answer.status_code == 404:
            raise RegistryError(_unknown(name, version, self.where))
        return _server_of(self._json(answer), self.where)


def _unknown(name: str, version: str | None, where: str) -> str:
    what = f"{name} {version}" if version else name
    return f"the registry {where} has no server {what} (`sidecar search` lists them)"
