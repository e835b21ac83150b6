"""`/v1/managed/{ref}`: the managed store's texts (`ManagedApi`): lines from `?offset`,
characters of one line from `?start`, or the lines matching `?pattern`, each search bounded
per client (`request_owner`).

Imports the core, `managed_store` and the rest of `sidecar.serve`. Exports `ManagedApi`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from managed_store import (
    InvalidPattern,
    InvalidRef,
    ManagedNotFound,
    SearchTimeout,
    TooManySearches,
)
from sidecar.execution.managed_read import search_owner
from sidecar.serve.api_requests import ApiError, JSONResponse, handled, query_int, request_owner

if TYPE_CHECKING:
    from sidecar.location.location import Location


class ManagedApi:
    """GET /v1/managed/{ref} of one Location's managed store."""

    def __init__(self, location: Location) -> None:
        self.location = location

    def routes(self) -> list[Route]:
        return [Route("/v1/managed/{ref}", handled(self.managed), methods=["GET"])]

    async def managed(self, request: Request) -> Response:
        ref = request.path_params["ref"]
        store = self.location.seam.store
        pattern = request.query_params.get("pattern")
        try:
            if pattern is not None:
                limit = query_int(request, "limit", 100, 1, 10_000)
                context = query_int(request, "context", 0, 0, 50)
                found = await store.grep(ref, pattern, max_matches=limit, context=context,
                                         owner=search_owner(request_owner(request)))
                return JSONResponse({
                    "ref": ref,
                    "pattern": pattern,
                    "truncated": found.truncated,
                    "matches": [
                        {"line": m.line, "text": m.text, "before": list(m.before),
                         "after": list(m.after)}
                        for m in found.matches
                    ],
                })
            offset = query_int(request, "offset", 1, 1, 2**62)
            if request.query_params.get("start") is not None:
                start = query_int(request, "start", 0, 0, 2**62)
                length = query_int(request, "length", 20_000, 1, 1_000_000)
                chars = await store.read_chars(ref, line=offset, start=start, length=length)
                return JSONResponse({
                    "ref": ref,
                    "text": chars.text,
                    "line": chars.line,
                    "start": chars.start,
                    "next_start": chars.next_start,
                    "end_of_line": chars.end_of_line,
                    "total_lines": chars.ref.lines,
                    "total_bytes": chars.ref.size_bytes,
                })
            limit = query_int(request, "limit", 200, 1, 10_000)
            part = await store.read_lines(ref, offset=offset, limit=limit)
        except InvalidRef as exc:
            raise ApiError(400, "invalid_ref", str(exc), "ref") from None
        except ManagedNotFound as exc:
            raise ApiError(404, "unknown_ref", str(exc), "ref") from None
        except InvalidPattern as exc:
            raise ApiError(400, "invalid_parameter", str(exc), "pattern") from None
        except SearchTimeout as exc:
            raise ApiError(422, "search_timeout", str(exc), "pattern") from None
        except TooManySearches as exc:
            raise ApiError(429, "too_many_searches", str(exc), "pattern") from None
        except ValueError as exc:
            raise ApiError(400, "invalid_parameter", str(exc)) from None
        return JSONResponse({
            "ref": ref,
            "text": part.text,
            "first_line": part.first_line,
            "last_line": part.last_line,
            "total_lines": part.ref.lines,
            "total_bytes": part.ref.size_bytes,
            "eof": part.eof,
        })
