"""The Petstore 3 example spec (vendored, data/) as tools of a real Location, calling a real
Petstore server on 127.0.0.1: names, schemas, calls, errors, allow/deny, JSON and YAML, a spec
read from a file or a URL."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sidecar import Location, ToolContext
from sidecar.model.errors import ErrorKind
from tests.bridges.openapi.petstore import PETSTORE_JSON, PETSTORE_YAML, petstore

pytestmark = pytest.mark.anyio

_ids = iter(range(1_000_000))


def ctx() -> ToolContext:
    return ToolContext("s", "a", "m", f"c{next(_ids)}")


def manifest(tmp_path: Path, text: str) -> Path:
    manifests = tmp_path / "manifests"
    manifests.mkdir()
    (manifests / "pets.toml").write_text(text)
    return manifests


async def test_petstore_operations_are_tools_that_call_the_service(tmp_path: Path) -> None:
    (tmp_path / "manifests-secret").write_text("s3cret-token-value\n")
    async with petstore() as store:
        manifests = manifest(tmp_path, f"""
[openapi.pets]
spec = "{PETSTORE_JSON}"
base_url = "{store.url}"
headers = {{ Authorization = "Bearer ${{file:../manifests-secret}}" }}
timeout = 5
""")
        async with Location.open(tmp_path, state_dir=tmp_path / "state",
                                 manifests=[manifests]) as loc:
            assert not loc.manifests.errors, loc.manifests.problems
            snap = loc.snapshot()
            names = {n for n in snap.names if n.startswith("pets_")}
            assert len(names) == 19 and {"pets_getPetById", "pets_addPet",
                                         "pets_findPetsByStatus", "pets_deletePet"} <= names
            # uploadFile's body is application/octet-stream: the tool has no body to send
            definitions = {d.name: d for d in snap.definitions}
            get = definitions["pets_getPetById"]
            assert get.description == "Find pet by ID.\n\nReturns a single pet."
            assert get.input_schema["required"] == ["petId"]
            assert get.input_schema["properties"]["petId"]["type"] == "integer"
            assert get.output_schema is not None
            assert get.output_schema["required"] == ["name", "photoUrls"]
            assert "Category" in get.output_schema["$defs"]  # a $ref resolved, kept once
            assert get.annotations == {"read_only_hint": True, "idempotent_hint": True,
                                       "open_world_hint": True}
            add = definitions["pets_addPet"]
            assert add.input_schema["required"] == ["body"]
            assert add.input_schema["properties"]["body"]["$ref"] == "#/$defs/Pet"

            added = await snap.execute("pets_addPet", {"body": {
                "id": 7, "name": "doggie", "photoUrls": ["u"], "status": "available"}}, ctx())
            assert added.status == "completed", added.error
            assert added.output["name"] == "doggie"
            sent = store.requests[-1]
            assert sent["headers"]["authorization"] == "Bearer s3cret-token-value"
            assert sent["headers"]["content-type"] == "application/json"
            assert json.loads(sent["body"])["photoUrls"] == ["u"]

            got = await snap.execute("pets_getPetById", {"petId": 7}, ctx())
            assert got.status == "completed" and got.output["id"] == 7
            assert store.requests[-1]["path"] == "/api/v3/pet/7"
            assert store.requests[-1]["headers"]["accept"] == "application/json"

            found = await snap.execute("pets_findPetsByStatus", {"status": "available"}, ctx())
            assert found.status == "completed"  # an array: no output schema, JSON text
            assert json.loads(found.content[0].text)[0]["name"] == "doggie"
            assert store.requests[-1]["query"] == [("status", "available")]

            missing = await snap.execute("pets_getPetById", {"petId": 99}, ctx())
            assert missing.status == "error" and missing.error.kind is ErrorKind.TOOL_FAILURE
            assert "HTTP 404" in missing.error.message
            assert "Pet not found" in missing.error.message  # the body, bounded

            before = len(store.requests)
            wrong = await snap.execute("pets_getPetById", {"petId": "seven"}, ctx())
            assert wrong.status == "error" and wrong.error.kind is ErrorKind.INVALID_INPUT
            refused = await snap.execute("pets_findPetsByStatus", {"status": "lost"}, ctx())
            assert refused.error.kind is ErrorKind.INVALID_INPUT  # not in the enum
            assert len(store.requests) == before  # nothing went out

            denied = await snap.execute("pets_deletePet", {"petId": 7, "api_key": "x"}, ctx())
            assert "HTTP 403" in denied.error.message and "api_key refused" in denied.error.message
            assert "s3cret-token-value" not in denied.error.message
            deleted = await snap.execute("pets_deletePet",
                                         {"petId": 7, "api_key": "special-key"}, ctx())
            assert deleted.status == "completed"
            assert deleted.content[0].text == "Pet deleted"  # a text response is text
            assert store.requests[-1]["method"] == "DELETE"
            assert 7 not in store.pets


async def test_a_yaml_spec_by_url_with_allow_and_deny(tmp_path: Path) -> None:
    async with petstore() as store:
        manifests = manifest(tmp_path, f"""
[openapi.shop]
spec = "{store.url}/openapi.yaml"
namespace = "pet"

[openapi.shop.operations]
allow = ["getPetById", "GET /pet/findBy*", "GET /user/*"]
deny = ["findPetsByTags"]
""")
        async with Location.open(tmp_path, state_dir=tmp_path / "state",
                                 manifests=[manifests]) as loc:
            assert not loc.manifests.errors, loc.manifests.problems
            snap = loc.snapshot()
            # `namespace` replaces the entry's name; relative `servers` (/api/v3) resolve
            # against the spec's URL
            assert sorted(n for n in snap.names if n.startswith("pet_")) == [
                "pet_findPetsByStatus", "pet_getPetById", "pet_getUserByName", "pet_loginUser",
                "pet_logoutUser"]
            out = await snap.execute("pet_logoutUser", {}, ctx())
            assert out.status == "completed" and out.content[0].text == "logged out"
            assert store.requests[-1]["path"] == "/api/v3/user/logout"


async def test_a_spec_file_whose_server_is_relative_needs_base_url(tmp_path: Path) -> None:
    spec = tmp_path / "relative.json"
    spec.write_text(json.dumps({**json.loads(PETSTORE_JSON.read_text()),
                                "servers": [{"url": "/api/v3"}]}))
    manifests = manifest(tmp_path, f"""
[openapi.pets]
spec = "{spec}"

[openapi.gone]
spec = "no-such-spec.yaml"

[openapi.old]
spec = "{tmp_path / 'swagger.json'}"
""")
    (tmp_path / "swagger.json").write_text('{"swagger": "2.0", "paths": {}}')
    async with Location.open(tmp_path, state_dir=tmp_path / "state",
                             manifests=[manifests]) as loc:
        problems = {p.path: p.message for p in loc.manifests.errors}
        assert "set base_url" in problems["$.openapi.pets.spec"]
        assert "no-such-spec.yaml" in problems["$.openapi.gone.spec"]
        assert "(OpenAPI 2) is not supported" in problems["$.openapi.old.spec"]
        assert not [n for n in loc.snapshot().names if n.startswith(("pets_", "gone_"))]
        health = await loc.health()
        assert health["status"] == "degraded"


async def test_the_yaml_and_json_petstore_give_the_same_tools(tmp_path: Path) -> None:
    manifests = manifest(tmp_path, f"""
[openapi.a]
spec = "{PETSTORE_JSON}"
base_url = "http://127.0.0.1:9/api/v3"

[openapi.b]
spec = "{PETSTORE_YAML}"
base_url = "http://127.0.0.1:9/api/v3"
""")
    async with Location.open(tmp_path, state_dir=tmp_path / "state",
                             manifests=[manifests]) as loc:
        definitions = {d.name: d.to_json() for d in loc.snapshot().definitions}
        a = {n[2:]: {**d, "name": ""} for n, d in definitions.items() if n.startswith("a_")}
        b = {n[2:]: {**d, "name": ""} for n, d in definitions.items() if n.startswith("b_")}
        assert len(a) == 19 and a == b
