"""`http` manifest tools: one request per call, through the registrar's shared client.

    input -> URL (placeholders percent-encoded) + headers + query + body -> permission ask
    -> send (stream) -> non-2xx: tool_failure with status and a bounded, redacted excerpt
                     -> 2xx: body captured (memory -> managed store -> hard cap, see capture)
                        -> JSON output (when `output` is declared) or text content

Errors: a connect or read error is `upstream`; a timeout (`request.timeout`, the whole call
from connect to the last byte) is `timeout`; a JSON body that does not match `output` is the
seam's `invalid_output`. Bodies are asked for with `Accept-Encoding: identity` (unless the
manifest sets that header), so Content-Length counts the same bytes we count and a truncation
can say exactly how many bytes were dropped.
"""

from __future__ import annotations

import asyncio
import base64
import json
from typing import Any

import httpx

from bridges.manifest_tools.capture import Captured, OutputCapture, known_encoding
from bridges.manifest_tools.config import HttpToolConfig
from bridges.manifest_tools.redaction import Redactor
from bridges.manifest_tools.templates import (
    RenderError,
    render_headers,
    render_url,
    value_text,
)
from managed_store import TextStore
from sidecar.model import tracing
from sidecar.model.content import AudioContent, ContentItem, ImageContent
from sidecar.model.errors import ErrorKind, ToolFailure
from sidecar.model.permissions import PermissionGate, ask_permission
from sidecar.model.tool import CallContext, Tool, ToolResponse

EXCERPT_BYTES = 1000
EXCERPT_LINES = 20


def http_tool(
    config: HttpToolConfig,
    *,
    client: httpx.AsyncClient,
    store: TextStore,
    store_namespace: str,
    permissions: PermissionGate | None,
) -> Tool:
    call = HttpCall(config, client, store, store_namespace, permissions)
    return Tool(
        description=config.description,
        input=config.input,
        output=config.output,
        execute=call,
        title=config.title,
        namespace=config.namespace,
        codemode=config.codemode,
        annotations=config.tool_annotations(open_world=True),
        bounds=config.tool_bounds(),
    )


class HttpCall:
    """The `execute` of one http tool value."""

    def __init__(
        self,
        config: HttpToolConfig,
        client: httpx.AsyncClient,
        store: TextStore,
        store_namespace: str,
        permissions: PermissionGate | None,
    ) -> None:
        self._config = config
        self._request = config.request
        self._client = client
        self._store = store
        self._namespace = store_namespace
        self._permissions = permissions
        self._url = config.request.url_template
        self._headers = config.request.header_templates
        self._redact = Redactor.for_headers(config.request.headers.values())
        consumed = set(self._url.fields) | set(self._request.query.values())
        consumed.update(name for t in self._headers.values() for name in t.fields)
        self._consumed = frozenset(consumed)

    async def __call__(self, args: dict[str, Any], ctx: CallContext) -> ToolResponse:
        tool = ctx.tool_name
        request = self._build(args, tool)
        url = str(request.url)
        await ask_permission(
            self._permissions, ctx, resources=(url,),
            metadata={"kind": "http", "method": request.method, "url": url},
            default=self._config.permission,
        )
        what = f"{tool}: {request.method} {url}"
        deadline = asyncio.timeout(self._request.timeout)
        try:
            async with deadline:
                response = await self._client.send(
                    request, stream=True, follow_redirects=self._request.follow_redirects
                )
                try:
                    return await self._respond(response, what, ctx.store_owner)
                finally:
                    await response.aclose()
        except TimeoutError:
            if not deadline.expired():
                raise
            raise self._timeout(what) from None
        except httpx.TimeoutException:
            raise self._timeout(what) from None
        except httpx.TooManyRedirects as exc:
            raise ToolFailure(self._redact(f"{what}: {exc}")) from None
        except httpx.UnsupportedProtocol as exc:
            raise ToolFailure(self._redact(f"{what}: {exc}")) from None
        except httpx.RequestError as exc:  # connect, read, protocol and decoding errors
            reason = str(exc) or type(exc).__name__
            raise ToolFailure(
                self._redact(f"{what} failed: {reason}"), kind=ErrorKind.UPSTREAM
            ) from None

    def _timeout(self, what: str) -> ToolFailure:
        return ToolFailure(
            self._redact(f"{what} timed out after {self._request.timeout:g} s "
                         "(request.timeout covers the whole call)"),
            kind=ErrorKind.TIMEOUT,
        )

    # --- the request ------------------------------------------------------------------------

    def _build(self, args: dict[str, Any], tool: str) -> httpx.Request:
        try:
            url = render_url(self._url, args)
            headers = dict(render_headers(self._headers, args))
        except RenderError as exc:
            raise ToolFailure(f"{tool}: {exc}") from None
        if not any(h.lower() == "accept-encoding" for h in headers):
            headers["Accept-Encoding"] = "identity"
        tracing.inject_into(headers)  # W3C traceparent, when tracing is on
        params: dict[str, str | list[str]] = {}
        for param, name in self._request.query.items():
            value = args.get(name)
            if value is not None:
                params[param] = (
                    [value_text(v) for v in value] if isinstance(value, list) else value_text(value)
                )
        body = self._body(args)
        form = self._request.body_format == "form"
        try:
            # merged by hand: httpx's `params=` would replace a query written in the URL
            target = httpx.URL(url).copy_merge_params(params) if params else httpx.URL(url)
            return self._client.build_request(
                self._request.method,
                target,
                headers=headers,
                json=None if form else body,
                data=_form(body) if form and body is not None else None,
                timeout=httpx.Timeout(self._request.timeout),
            )
        except (httpx.InvalidURL, httpx.UnsupportedProtocol, ValueError) as exc:
            raise ToolFailure(self._redact(f"{tool}: cannot build the request: {exc}")) from None

    def _body(self, args: dict[str, Any]) -> Any:
        spec = self._request.body
        if spec is None:
            if not self._request.sends_default_body:
                return None
            rest = {k: v for k, v in args.items() if k not in self._consumed}
            return rest or None
        if isinstance(spec, str):
            return args.get(spec)
        picked = {key: args[name] for key, name in spec.items() if name in args}
        return picked or None

    # --- the response -----------------------------------------------------------------------

    async def _respond(
        self, response: httpx.Response, what: str, owner: str
    ) -> ToolResponse:
        status = response.status_code
        if not 200 <= status < 300:
            raise await self._status_failure(response, what)
        content_type = response.headers.get("content-type", "")
        media = content_type.split(";", 1)[0].strip().lower()
        meta: dict[str, Any] = {"status": status}
        if content_type:
            meta["content_type"] = content_type
        if self._config.output is None and media.startswith(("image/", "audio/")):
            return await self._media(response, media, meta, what)
        capture = OutputCapture(
            self._store,
            namespace=self._namespace,
            owner=owner,
            memory_cap=self._request.memory_cap_bytes,
            hard_cap=self._request.max_response_bytes,
            encoding=known_encoding(response.charset_encoding),
        )
        async with capture:
            truncated = False
            async for chunk in response.aiter_bytes():
                if len(chunk) > capture.room:
                    truncated = True
                    await capture.feed(chunk)
                    break
                await capture.feed(chunk)
            body = await capture.finish()
        meta["bytes"] = body.kept_bytes
        notes: list[str] = []
        if truncated:
            notes.append(self._truncation(response, body, meta))
        if body.ref is not None:
            meta["body"] = {"ref": body.ref.id, "size_bytes": body.ref.size_bytes,
                            "lines": body.ref.lines}
        if body.replaced:
            meta["replaced_invalid_bytes"] = True
            notes.append(f"[the body is not valid {response.charset_encoding or 'UTF-8'}: "
                         "invalid bytes were replaced with U+FFFD]")
        if self._config.output is not None:
            return self._json_output(body, truncated, what, media, meta)
        text = body.preview("response body") or f"[HTTP {status}: empty body]"
        return ToolResponse(content="\n".join([*notes, text]), metadata=meta)

    def _json_output(
        self, body: Captured, truncated: bool, what: str, media: str, meta: dict[str, Any]
    ) -> ToolResponse:
        if body.text is None or truncated:
            limit = "max_response_bytes" if truncated else "memory_cap_bytes"
            raise ToolFailure(
                f"{what}: the JSON response is larger than request.{limit} "
                f"({body.kept_bytes:,} bytes kept) and cannot be parsed as the output; "
                f"raise request.{limit}",
                metadata=meta,
            )
        try:
            value = json.loads(body.text)
        except ValueError as exc:
            excerpt = self._redact(_excerpt(body.text))
            raise ToolFailure(
                f"{what}: expected a JSON response, got {media or 'no content type'} that does "
                f"not parse ({exc}): {excerpt}",
                metadata=meta,
                kind=ErrorKind.UPSTREAM,
            ) from None
        return ToolResponse(output=value, metadata=meta)

    def _truncation(self, response: httpx.Response, body: Captured, meta: dict[str, Any]) -> str:
        limit = self._request.max_response_bytes
        length = response.headers.get("content-length", "")
        encoding = response.headers.get("content-encoding", "identity").strip().lower()
        info: dict[str, Any] = {"limit": limit, "kept_bytes": body.kept_bytes}
        head = f"[response truncated at request.max_response_bytes = {limit:,} bytes:"
        if length.isdigit() and encoding in ("", "identity"):
            dropped = int(length) - body.kept_bytes
            info.update(content_length=int(length), dropped_bytes=dropped)
            note = f"{head} {dropped:,} of its {int(length):,} bytes were dropped (not kept)]"
        elif length.isdigit():
            unread = int(length) - response.num_bytes_downloaded
            info.update(content_length=int(length), unread_encoded_bytes=unread)
            note = (f"{head} the rest was not read: {unread:,} of its {int(length):,} "
                    f"{encoding}-encoded bytes were not downloaded]")
        else:
            info["dropped_bytes"] = None
            note = f"{head} the rest was not read (no Content-Length, so its size is unknown)]"
        meta["truncated"] = info
        return note

    async def _media(
        self, response: httpx.Response, media: str, meta: dict[str, Any], what: str
    ) -> ToolResponse:
        limit = min(self._request.memory_cap_bytes, self._request.max_response_bytes)
        data = bytearray()
        async for chunk in response.aiter_bytes():
            data += chunk
            if len(data) > limit:
                raise ToolFailure(
                    f"{what}: the {media} response is larger than {limit:,} bytes "
                    "(request.memory_cap_bytes / max_response_bytes); media is returned whole "
                    "or not at all",
                    metadata=meta,
                )
        meta["bytes"] = len(data)
        encoded = base64.b64encode(data).decode("ascii")
        item: ContentItem = (
            ImageContent(encoded, media)
            if media.startswith("image/")
            else AudioContent(encoded, media)
        )
        return ToolResponse(content=[item], metadata=meta)

    async def _status_failure(self, response: httpx.Response, what: str) -> ToolFailure:
        status = response.status_code
        message = f"{what}: HTTP {status} {response.reason_phrase}".rstrip()
        location = response.headers.get("location")
        if 300 <= status < 400 and location and not self._request.follow_redirects:
            message += (f" (a redirect to {location}; redirects are not followed unless "
                        "request.follow_redirects = true)")
        data = bytearray()
        async for chunk in response.aiter_bytes():
            data += chunk
            if len(data) >= EXCERPT_BYTES * 4:
                break
        text = data.decode(known_encoding(response.charset_encoding), "replace")
        if text.strip():
            message += f": {_excerpt(text)}"
        return ToolFailure(self._redact(message), metadata={"status": status})


def _excerpt(text: str) -> str:
    """The start of `text`, within `EXCERPT_BYTES` characters and `EXCERPT_LINES` lines."""
    lines = text[: EXCERPT_BYTES * 4].strip().splitlines()
    excerpt = "\n".join(lines[:EXCERPT_LINES])
    cut = len(lines) > EXCERPT_LINES or len(text) > EXCERPT_BYTES * 4
    if len(excerpt) > EXCERPT_BYTES:
        excerpt, cut = excerpt[:EXCERPT_BYTES], True
    return excerpt + ("..." if cut else "")


def _form(body: Any) -> dict[str, str | list[str]]:
    if not isinstance(body, dict):
        return {}
    return {
        key: [value_text(v) for v in value] if isinstance(value, list) else value_text(value)
        for key, value in body.items()
        if value is not None
    }
