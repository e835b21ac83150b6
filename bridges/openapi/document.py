"""Reading an OpenAPI description: a file or an http(s) URL, JSON or YAML, OpenAPI 3.0 or 3.1.
Imports nothing of ours; exports `open_spec`, `Spec`, `SpecError`, `same_origin`,
`resolve_url` and `MAX_SPEC_BYTES`.

`open_spec` is blocking (a worker thread runs it and what reads the spec inside it). The
document and every other document its `$ref`s name (files beside a file spec, URLs beside a
URL spec) are kept in one `referencing.Registry`, read when a reference first needs them, so a
reference is resolved the way JSON Schema resolves it (relative URIs, JSON pointers with
`~0`/`~1`). `digest` covers every byte read so far: two reads with the same digest describe the
same operations.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urldefrag, urljoin, urlsplit

import referencing
import yaml

if TYPE_CHECKING:
    import httpx

MAX_SPEC_BYTES = 32 * 1024 * 1024
SUPPORTED = ("3.0", "3.1")


class SpecError(Exception):
    """A spec that cannot be read, parsed or used; the message says which and why."""


@dataclass(slots=True)
class Spec:
    """One OpenAPI description and the documents its references reach."""

    uri: str
    """Where it was read (a `file://` or http(s) URL): relative references resolve from it."""
    data: dict[str, Any]
    version: str
    """"3.0" or "3.1"."""
    registry: referencing.Registry[Any]
    _reader: _Reader

    @property
    def stamps(self) -> tuple[tuple[str, int, int], ...]:
        """(path, mtime_ns, size) of each local file read so far, taken before reading it
        (for live reload: a later change differs)."""
        return tuple(self._reader.stamps)

    @property
    def digest(self) -> str:
        return self._reader.digest()


@contextmanager
def open_spec(
    location: str, base_dir: Path, *, timeout: float, headers: dict[str, str] | None = None
) -> Iterator[Spec]:
    """The spec at `location` (a path relative to `base_dir`, or an http(s) URL), readable
    until the block ends; `headers` go with requests to `location`'s origin only."""
    reader = _Reader(timeout, headers or {}, location)
    try:
        uri = location if _is_url(location) else (base_dir / location).resolve().as_uri()
        data = reader.document(uri)
        version = _version(data, location)
        registry: referencing.Registry[Any] = referencing.Registry(
            retrieve=reader.retrieve  # type: ignore[call-arg]
        ).with_resource(uri, referencing.Resource.opaque(data))
        yield Spec(uri, data, version, registry, reader)
    finally:
        reader.close()


def _is_url(location: str) -> bool:
    return urlsplit(location).scheme in ("http", "https")


def _version(data: dict[str, Any], location: str) -> str:
    if "swagger" in data:
        raise SpecError(f"{location}: Swagger {data['swagger']} (OpenAPI 2) is not supported; "
                        "convert it to OpenAPI 3 (e.g. with swagger2openapi)")
    declared = str(data.get("openapi", ""))
    version = declared[:3]
    if version not in SUPPORTED:
        raise SpecError(f"{location}: not an OpenAPI 3.0 or 3.1 document "
                        f"(openapi: {declared or 'missing'})")
    if not isinstance(data.get("paths", {}), dict):
        raise SpecError(f"{location}: `paths` must be an object")
    return version


class _Reader:
    """Reads documents by URI and remembers what it read (for `digest` and `files`)."""

    def __init__(self, timeout: float, headers: dict[str, str], location: str) -> None:
        self._timeout = timeout
        self._headers = headers
        self._origin = _origin(location) if _is_url(location) else None
        self._client: httpx.Client | None = None
        self._hash = hashlib.sha256()
        self._read_before: dict[str, dict[str, Any]] = {}
        self.stamps: list[tuple[str, int, int]] = []

    def digest(self) -> str:
        return self._hash.hexdigest()

    def close(self) -> None:
        if self._client is not None:
            self._client.close()

    def retrieve(self, uri: str) -> referencing.Resource[Any]:
        """`referencing`'s hook for a document a `$ref` names (a `SpecError` becomes the
        cause of `referencing`'s `Unretrievable`)."""
        return referencing.Resource.opaque(self.document(uri))

    def document(self, uri: str) -> dict[str, Any]:
        uri = urldefrag(uri).url
        if uri in self._read_before:
            return self._read_before[uri]
        raw = self._fetch(uri) if _is_url(uri) else self._read(uri)
        self._hash.update(uri.encode() + b"\0" + raw)
        data = _parse(raw, uri)
        if not isinstance(data, dict):
            raise SpecError(f"{uri}: expected an object at the top")
        self._read_before[uri] = data
        return data

    def _read(self, uri: str) -> bytes:
        if not uri.startswith("file://"):
            raise SpecError(f"{uri}: only files and http(s) URLs can be read")
        path = Path(urlsplit(uri).path)
        try:
            with path.open("rb") as f:
                st = os.fstat(f.fileno())
                self.stamps.append((str(path), st.st_mtime_ns, st.st_size))
                raw = f.read(MAX_SPEC_BYTES + 1)
        except OSError as exc:
            raise SpecError(f"cannot read {path}: {exc.strerror or exc}") from None
        if len(raw) > MAX_SPEC_BYTES:
            raise SpecError(f"{path} is larger than {MAX_SPEC_BYTES:,} bytes")
        return raw

    def _fetch(self, url: str) -> bytes:
        import httpx  # here: a daemon without HTTP tools never imports it

        if self._client is None:
            self._client = httpx.Client(timeout=self._timeout, follow_redirects=True)
        headers = self._headers if _origin(url) == self._origin else {}
        data = bytearray()
        try:
            with self._client.stream("GET", url, headers=headers) as response:
                if response.status_code != 200:
                    raise SpecError(f"GET {url}: HTTP {response.status_code} "
                                    f"{response.reason_phrase}".rstrip())
                for chunk in response.iter_bytes():
                    data += chunk
                    if len(data) > MAX_SPEC_BYTES:
                        raise SpecError(f"{url} is larger than {MAX_SPEC_BYTES:,} bytes")
        except httpx.HTTPError as exc:
            raise SpecError(f"GET {url} failed: {exc or type(exc).__name__}") from None
        return bytes(data)


def _origin(url: str) -> tuple[str, str, int | None]:
    parts = urlsplit(url)
    port = parts.port or {"http": 80, "https": 443}.get(parts.scheme)
    return parts.scheme, (parts.hostname or "").lower(), port


def same_origin(a: str, b: str) -> bool:
    return _origin(a) == _origin(b)


def _parse(raw: bytes, uri: str) -> Any:
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise SpecError(f"{uri}: not UTF-8") from None
    if text.lstrip().startswith(("{", "[")):
        try:
            return json.loads(text)
        except ValueError as exc:
            raise SpecError(f"{uri}: invalid JSON: {exc}") from None
    try:
        data = yaml.load(text, Loader=_Loader)  # a safe loader
    except yaml.YAMLError as exc:
        raise SpecError(f"{uri}: invalid YAML: {exc}") from None
    return _json_like(data)


_Loader: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def _json_like(value: Any) -> Any:
    """YAML's extra types made JSON: keys as strings (`200:` is an int in YAML), dates as ISO
    text."""
    if isinstance(value, dict):
        return {str(k) if not isinstance(k, bool) else str(k).lower(): _json_like(v)
                for k, v in value.items()}
    if isinstance(value, list):
        return [_json_like(v) for v in value]
    if isinstance(value, datetime.date | datetime.datetime):
        return value.isoformat()
    return value


def resolve_url(base: str, reference: str) -> str:
    """`reference` (a server URL, maybe relative) resolved against `base` (the spec's URI)."""
    return urljoin(base, reference)
