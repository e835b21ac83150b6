"""Live reload of an OpenAPI service: editing its spec file (not the manifest) changes the
tools; a spec that no longer parses keeps the last good tools and says why."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from sidecar import Location
from sidecar.model.events import ManifestsReloaded
from tests.bridges.openapi.petstore import PETSTORE_JSON

pytestmark = pytest.mark.anyio


async def next_reload(sub) -> ManifestsReloaded:
    while True:
        event = await asyncio.wait_for(sub.next(), 30)
        if isinstance(event, ManifestsReloaded):
            return event


def write(path: Path, text: str) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    tmp.replace(path)  # as editors do


async def test_editing_the_spec_file_reloads_the_tools(tmp_path: Path) -> None:
    document = json.loads(PETSTORE_JSON.read_text())
    document["paths"] = {"/pet/{petId}": document["paths"]["/pet/{petId}"]}
    spec = tmp_path / "specs" / "pets.json"
    spec.parent.mkdir()
    write(spec, json.dumps(document))
    manifests = tmp_path / "manifests"
    manifests.mkdir()
    (manifests / "pets.toml").write_text(
        '[openapi.pets]\nspec = "../specs/pets.json"\nbase_url = "http://127.0.0.1:9"\n')
    async with Location.open(tmp_path, state_dir=tmp_path / "state", manifests=[manifests],
                             watch=True) as loc:
        def tools() -> list[str]:
            return sorted(n for n in loc.snapshot().names if n.startswith("pets_"))

        assert tools() == ["pets_deletePet", "pets_getPetById", "pets_updatePetWithForm"]
        kept = loc.snapshot().definitions
        async with loc.events.subscribe() as sub:
            document["paths"]["/pet/{petId}"]["get"]["summary"] = "Look a pet up."
            document["paths"]["/pet/{petId}"].pop("delete")
            write(spec, json.dumps(document))
            applied = await next_reload(sub)
            assert applied.ok
            assert tools() == ["pets_getPetById", "pets_updatePetWithForm"]
            get = next(d for d in loc.snapshot().definitions if d.name == "pets_getPetById")
            assert get.description.startswith("Look a pet up.")
            assert any(d.name == "pets_deletePet" for d in kept)  # an old snapshot keeps it

            write(spec, '{"openapi": "3.0.4", "paths": ')  # half written
            rejected = await next_reload(sub)
            assert not rejected.ok
            assert rejected.problems[0]["path"] == "$.openapi.pets.spec"
            assert "invalid JSON" in rejected.problems[0]["message"]
            assert tools() == ["pets_getPetById", "pets_updatePetWithForm"]  # the last good
            assert (await loc.health())["reload_problems"]

            write(spec, json.dumps(document).replace("Look a pet up.", "Find one pet."))
            fixed = await next_reload(sub)
            assert fixed.ok and not (await loc.health())["reload_problems"]
        get = next(d for d in loc.snapshot().definitions if d.name == "pets_getPetById")
        assert get.description.startswith("Find one pet.")
