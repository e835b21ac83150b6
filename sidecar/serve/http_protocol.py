"""The HTTP/1.1 protocol `sidecar serve` runs: uvicorn's httptools protocol, keeping the request
target as sent. Imports nothing of ours; exports `TargetKeepingHttpToolsProtocol`.

uvicorn's httptools protocol reduces an absolute-form target (`GET http://evil/v1/health`) to
its path, so the app cannot tell it from `GET /v1/health`; its h11 protocol passes the target
on in `raw_path`. This subclass does what h11 does: `raw_path` is the whole target when it is
not a path, and `SecurityMiddleware` refuses it (400) before anything else runs.
"""

from __future__ import annotations

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol


class TargetKeepingHttpToolsProtocol(HttpToolsProtocol):
    """`HttpToolsProtocol` whose `scope["raw_path"]` is the request target when that target is
    not origin-form (`/path`)."""

    def on_headers_complete(self) -> None:
        target = self.url
        super().on_headers_complete()
        # The request's task is created above but runs later, on the loop: it sees this.
        if not target.startswith(b"/") and "raw_path" in self.scope:
            self.scope["raw_path"] = target
