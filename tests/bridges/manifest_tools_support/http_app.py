"""A real Starlette app served by uvicorn on 127.0.0.1 (a free port) in a thread of its own.

The server runs its own event loop, so the tests' loops (asyncio, uvloop) only ever act as the
client, and its memory is steady: streamed bodies repeat one shared chunk.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import (
    JSONResponse,
    PlainTextResponse,
    RedirectResponse,
    Response,
    StreamingResponse,
)
from starlette.routing import Route

SECRET_TOKEN = "s3cr3t-t0ken-value-42"
CHUNK = (b"0123456789abcdef" * 4)[:-1] + b"\n"
MiB = 1024 * 1024
BIG_CHUNK = CHUNK * (MiB // len(CHUNK))  # 1 MiB of 64-byte lines
PNG = bytes.fromhex(
    "89504e470d0a1a0a0000000d4948445200000001000000010806000000"
    "1f15c4890000000d49444154789c6360000002000154a24f5d0000000049454e44ae426082"
)


async def item(request: Request) -> Response:
    return JSONResponse({
        "name": request.path_params["name"],
        "raw_path": request.scope["raw_path"].decode(),
        "query": request.scope["query_string"].decode(),
    })


async def echo(request: Request) -> Response:
    raw = await request.body()
    content_type = request.headers.get("content-type", "")
    body: Any
    if content_type.startswith("application/json"):
        body = await request.json()
    elif content_type.startswith("application/x-www-form-urlencoded"):
        body = dict((await request.form()).multi_items())
    else:
        body = raw.decode()
    return JSONResponse({
        "method": request.method,
        "body": body,
        "query": request.scope["query_string"].decode(),
        "x_trace": request.headers.get("x-trace"),
        "accept_encoding": request.headers.get("accept-encoding"),
    })


async def auth(request: Request) -> Response:
    given = request.headers.get("authorization", "")
    if given == f"Bearer {SECRET_TOKEN}":
        return JSONResponse({"ok": True})
    return PlainTextResponse(f"bad credentials: {given}", status_code=401)


async def leak(request: Request) -> Response:
    """A misbehaving server that echoes the credentials it received in an error."""
    given = request.headers.get("authorization", "")
    return PlainTextResponse(f"upstream exploded while using {given}", status_code=500)


async def weather(request: Request) -> Response:
    if request.query_params.get("bad"):
        return JSONResponse({"city": request.query_params.get("city"), "temperature": "hot"})
    return JSONResponse({"city": request.query_params.get("city"), "temperature": 21.5})


async def text(request: Request) -> Response:
    return PlainTextResponse("hello\nworld\n")


async def not_json(request: Request) -> Response:
    return Response("<html>oops</html>", media_type="text/html")


async def status(request: Request) -> Response:
    code = int(request.path_params["code"])
    return PlainTextResponse(f"failure {code}: " + "detail line\n" * 200, status_code=code)


async def slow(request: Request) -> Response:
    await asyncio.sleep(2)
    return PlainTextResponse("late")


async def redirect(request: Request) -> Response:
    return RedirectResponse("/text", status_code=302)


async def big(request: Request) -> Response:
    size = int(request.query_params["size"])

    async def chunks() -> Any:
        left = size
        while left > 0:
            piece = BIG_CHUNK if left >= len(BIG_CHUNK) else BIG_CHUNK[:left]
            left -= len(piece)
            yield piece

    headers = {"content-length": str(size)} if request.query_params.get("length") else {}
    return StreamingResponse(chunks(), media_type="text/plain", headers=headers)


async def image(request: Request) -> Response:
    return Response(PNG, media_type="image/png")


async def latin1(request: Request) -> Response:
    return Response("café".encode("latin-1"), media_type="text/plain; charset=latin-1")


async def binary(request: Request) -> Response:
    return Response(b"ok \xff\xfe bytes", media_type="application/octet-stream")


app = Starlette(routes=[
    Route("/items/{name:path}", item),
    Route("/echo", echo, methods=["GET", "POST", "PUT", "DELETE"]),
    Route("/auth", auth),
    Route("/leak", leak),
    Route("/weather", weather),
    Route("/text", text),
    Route("/not-json", not_json),
    Route("/status/{code}", status),
    Route("/slow", slow),
    Route("/redirect", redirect),
    Route("/big", big),
    Route("/image", image),
    Route("/latin1", latin1),
    Route("/binary", binary),
])


class ServerThread:
    """uvicorn serving `app` on 127.0.0.1 in a thread; `url` once started."""

    def __init__(self) -> None:
        self._socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._socket.bind(("127.0.0.1", 0))
        self.port: int = self._socket.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(
            app, lifespan="off", log_level="warning", access_log=False,
            timeout_graceful_shutdown=1, loop="asyncio", http="h11", ws="none",
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._run, name="test-http-server", daemon=True)

    def _run(self) -> None:
        asyncio.run(self._server.serve(sockets=[self._socket]))

    def start(self) -> None:
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError("the test HTTP server did not start")
            time.sleep(0.01)

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(10)
        self._socket.close()


def closed_port() -> int:
    """A port on 127.0.0.1 where nothing listens (connections are refused)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port
