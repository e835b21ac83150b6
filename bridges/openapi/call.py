"""One OpenAPI operation as a tool value: its input put back into a request, sent like a
manifest `http` tool. Imports `bridges.manifest_tools` (the http tool's call, whose response
handling it shares: bounded capture, JSON output, errors with the status and a bounded,
redacted excerpt of the body, timeouts), `bridges.openapi.operations` and `sidecar.model`;
exports `operation_tool`.

Serialization follows OpenAPI's defaults: path parameters `simple` (arrays comma-joined, a
value percent-encoded whole, so it stays one segment); query parameters `form` (arrays repeat
the name when exploded, else comma-joined; objects become their properties), `deepObject`
(`name[key]=value`), `spaceDelimited`/`pipeDelimited`; header and cookie values `simple`. A
parameter declared with a JSON `content` is sent as JSON text. The body is JSON, a form or text,
as the operation declares.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from bridges.manifest.openapi import OpenApiConfig
from bridges.manifest_tools.config import HttpRequestConfig, HttpToolConfig
from bridges.manifest_tools.http_tool import HttpCall
from bridges.manifest_tools.redaction import Redactor
from bridges.manifest_tools.templates import value_text
from bridges.openapi.operations import Operation, Parameter
from managed_store import TextStore
from sidecar.model import tracing
from sidecar.model.errors import ToolFailure
from sidecar.model.permissions import PermissionGate
from sidecar.model.tool import Annotations, Tool

if TYPE_CHECKING:
    import httpx

_DELIMITERS = {"form": ",", "simple": ",", "spaceDelimited": " ", "pipeDelimited": "|"}


def operation_tool(
    operation: Operation,
    config: OpenApiConfig,
    base_url: str,
    *,
    client: httpx.AsyncClient,
    store: TextStore,
    store_namespace: str,
    permissions: PermissionGate | None,
) -> Tool:
    method = operation.method
    http = HttpToolConfig(
        kind="http", description=operation.description, input=operation.input_schema,
        output=operation.output_schema,
        request=HttpRequestConfig(method=method, url=base_url,  # type: ignore[arg-type]
                                  headers=dict(config.headers), timeout=config.timeout),
    )
    call = OperationCall(http, operation, config, base_url, client, store, store_namespace,
                         permissions)
    return Tool(
        description=operation.description,
        input=operation.input_schema,
        output=operation.output_schema,
        execute=call,
        annotations=Annotations(
            read_only_hint=method in ("GET", "HEAD", "OPTIONS") or None,
            destructive_hint=True if method == "DELETE" else None,
            idempotent_hint=method in ("GET", "HEAD", "OPTIONS", "PUT", "DELETE") or None,
            open_world_hint=True,
        ),
        meta={"sidecar/openapi": {"method": method, "path": operation.path}},
    )


class OperationCall(HttpCall):
    """The http tool's call with the request built from an operation (only `_build` differs)."""

    def __init__(
        self,
        http: HttpToolConfig,
        operation: Operation,
        config: OpenApiConfig,
        base_url: str,
        client: httpx.AsyncClient,
        store: TextStore,
        store_namespace: str,
        permissions: PermissionGate | None,
    ) -> None:
        super().__init__(http, client, store, store_namespace, permissions)
        self._operation = operation
        self._base_url = base_url.rstrip("/")
        self._fixed_headers = dict(config.headers)
        values = list(config.headers.values())
        self._redact = Redactor(values, values)

    def _build(self, args: dict[str, Any], tool: str) -> httpx.Request:
        import httpx  # here: a daemon without HTTP tools never imports it

        op = self._operation
        path = op.path
        params: list[tuple[str, str | int | float | bool | None]] = []
        headers = dict(self._fixed_headers)
        cookies: list[str] = []
        for param in op.parameters:
            value = args.get(param.prop)
            if value is None:
                continue
            if param.location == "path":
                path = path.replace(f"{{{param.name}}}", quote(_simple(param, value), safe=""))
            elif param.location == "query":
                params.extend(_query(param, value))
            elif param.location == "header":
                headers[param.name] = _header_text(tool, param, _simple(param, value))
            else:
                cookies.append(f"{param.name}={quote(_simple(param, value), safe='')}")
        if cookies:
            headers["Cookie"] = "; ".join(cookies)
        if op.accept and not any(h.lower() == "accept" for h in headers):
            headers["Accept"] = op.accept
        if not any(h.lower() == "accept-encoding" for h in headers):
            headers["Accept-Encoding"] = "identity"
        tracing.inject_into(headers)
        body = op.body
        value = args.get(body.prop) if body is not None else None
        content: dict[str, Any] = {}
        if body is not None and value is not None:
            headers.setdefault("Content-Type", body.media_type)
            if body.kind == "json":
                content["json"] = value
            elif body.kind == "form":
                content["data"] = {k: v if isinstance(v, str) else value_text(v)
                                   for k, v in value.items()} if isinstance(value, dict) else {}
            else:
                content["content"] = value_text(value).encode()
        try:
            url = httpx.URL(self._base_url + path)
            if params:
                url = url.copy_merge_params(params)
            return self._client.build_request(
                op.method, url, headers=headers, timeout=httpx.Timeout(self._request.timeout),
                **content,
            )
        except (httpx.InvalidURL, httpx.UnsupportedProtocol, ValueError) as exc:
            raise ToolFailure(self._redact(f"{tool}: cannot build the request: {exc}")) from None


def _text(value: Any) -> str:
    return value_text(value)


def _simple(param: Parameter, value: Any) -> str:
    if param.json_content:
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    if isinstance(value, list):
        return ",".join(_text(v) for v in value)
    if isinstance(value, dict):
        sep = ("=", ",") if param.explode else (",", ",")
        return sep[1].join(f"{k}{sep[0]}{_text(v)}" for k, v in value.items())
    return _text(value)


def _query(param: Parameter, value: Any) -> list[tuple[str, str | int | float | bool | None]]:
    name = param.name
    if param.json_content:
        return [(name, _simple(param, value))]
    if isinstance(value, dict):
        if param.style == "deepObject":
            return [(f"{name}[{k}]", _text(v)) for k, v in value.items()]
        if param.explode:
            return [(k, _text(v)) for k, v in value.items()]
        return [(name, ",".join(f"{k},{_text(v)}" for k, v in value.items()))]
    if isinstance(value, list):
        if param.explode and param.style == "form":
            return [(name, _text(v)) for v in value]
        return [(name, _DELIMITERS.get(param.style, ",").join(_text(v) for v in value))]
    return [(name, _text(value))]


def _header_text(tool: str, param: Parameter, text: str) -> str:
    if any(c in text for c in "\r\n\x00"):
        raise ToolFailure(f"{tool}: header parameter {param.name!r} contains a line break or "
                          "NUL, which a header cannot carry")
    return text
