"""A small real Petstore 3 server (starlette on uvicorn, 127.0.0.1): a few operations of the
vendored `data/petstore3.yaml`, answering the shapes that document declares, and serving the
document itself (as petstore3.swagger.io does, with `servers` = `/api/v3`). It records every
request it gets, so tests can check what went out."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from tests.live_server import live_server

DATA = Path(__file__).parent / "data"
PETSTORE_JSON = DATA / "petstore3.json"
PETSTORE_YAML = DATA / "petstore3.yaml"


@dataclass
class Petstore:
    url: str
    """The API's base URL (`.../api/v3`)."""
    requests: list[dict[str, Any]] = field(default_factory=list)
    pets: dict[int, dict[str, Any]] = field(default_factory=dict)


def served_document() -> dict[str, Any]:
    document = json.loads(PETSTORE_JSON.read_text())
    return {**document, "servers": [{"url": "/api/v3"}]}


def build_app(store: Petstore) -> Starlette:
    async def record(request: Request) -> None:
        body = (await request.body()).decode()
        store.requests.append({
            "method": request.method, "path": request.url.path,
            "query": list(request.query_params.multi_items()),
            "headers": dict(request.headers), "body": body,
        })

    async def get_pet(request: Request) -> Response:
        await record(request)
        pet = store.pets.get(int(request.path_params["petId"]))
        if pet is None:
            return JSONResponse({"code": 404, "message": "Pet not found"}, status_code=404)
        return JSONResponse(pet)

    async def add_pet(request: Request) -> Response:
        await record(request)
        pet = json.loads(store.requests[-1]["body"])
        pet.setdefault("id", max(store.pets, default=0) + 1)
        store.pets[pet["id"]] = pet
        return JSONResponse(pet)

    async def find_by_status(request: Request) -> Response:
        await record(request)
        wanted = request.query_params.get("status", "available")
        return JSONResponse([p for p in store.pets.values() if p.get("status") == wanted])

    async def delete_pet(request: Request) -> Response:
        await record(request)
        if request.headers.get("api_key") != "special-key":
            return PlainTextResponse("api_key refused", status_code=403)
        store.pets.pop(int(request.path_params["petId"]), None)
        return PlainTextResponse("Pet deleted")

    async def logout(request: Request) -> Response:
        await record(request)
        return PlainTextResponse("logged out")

    async def document_json(request: Request) -> Response:
        return JSONResponse(served_document())

    async def document_yaml(request: Request) -> Response:
        text = yaml.safe_dump(served_document(), sort_keys=False)
        return Response(text, media_type="application/yaml")

    return Starlette(routes=[
        Route("/api/v3/pet", add_pet, methods=["POST"]),
        Route("/api/v3/pet/findByStatus", find_by_status, methods=["GET"]),
        Route("/api/v3/pet/{petId:int}", get_pet, methods=["GET"]),
        Route("/api/v3/pet/{petId:int}", delete_pet, methods=["DELETE"]),
        Route("/api/v3/user/logout", logout, methods=["GET"]),
        Route("/api/v3/openapi.json", document_json, methods=["GET"]),
        Route("/api/v3/openapi.yaml", document_yaml, methods=["GET"]),
    ])


@asynccontextmanager
async def petstore() -> AsyncIterator[Petstore]:
    store = Petstore(url="")
    async with live_server(build_app(store)) as port:
        store.url = f"http://127.0.0.1:{port}/api/v3"
        yield store
