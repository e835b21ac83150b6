"""OpenAPI 3.0 and 3.1 schemas as tool schemas: the 3.0 dialect translated, `$ref`s across
files resolved, recursion kept finite, names derived without an operationId; checked on the
definitions a real Location advertises and on the input its seam accepts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from sidecar import Location, ToolContext
from sidecar.model.errors import ErrorKind

pytestmark = pytest.mark.anyio

NODE_30 = {
    "type": "object",
    "properties": {
        "label": {"type": "string", "nullable": True, "example": "root"},
        "weight": {"type": "number", "minimum": 0, "exclusiveMinimum": True},
        "children": {"type": "array", "items": {"$ref": "#/components/schemas/Node"}},
        "owner": {"$ref": "shared.yaml#/Owner"},
    },
    "xml": {"name": "node"},
    "x-internal": True,
}


def spec(version: str, node: dict) -> dict:
    return {
        "openapi": version,
        "info": {"title": "trees", "version": "1"},
        "servers": [{"url": "http://127.0.0.1:9/{base}",
                     "variables": {"base": {"default": "v2"}}}],
        "paths": {
            "/trees/{tree.id}": {
                "parameters": [{"name": "tree.id", "in": "path", "required": True,
                                "schema": {"type": "string"}}],
                "put": {
                    "summary": "Replace a tree",
                    "parameters": [{"$ref": "#/components/parameters/Dry"}],
                    "requestBody": {"required": True, "content": {
                        "application/json": {"schema": {"$ref": "#/components/schemas/Node"}}}},
                    "responses": {"200": {"description": "ok", "content": {"application/json": {
                        "schema": {"$ref": "#/components/schemas/Node"}}}}},
                },
            },
        },
        "components": {
            "schemas": {"Node": node},
            "parameters": {"Dry": {"name": "dry", "in": "query",
                                   "schema": {"type": "boolean"}}},
        },
    }


async def test_30_and_31_schemas_become_the_same_json_schema(tmp_path: Path) -> None:
    node_31 = json.loads(json.dumps(NODE_30))
    node_31["properties"]["label"] = {"type": ["string", "null"], "examples": ["root"]}
    node_31["properties"]["weight"] = {"type": "number", "exclusiveMinimum": 0}
    (tmp_path / "v30.yaml").write_text(yaml.safe_dump(spec("3.0.3", NODE_30)))
    (tmp_path / "v31.json").write_text(json.dumps(spec("3.1.0", node_31)))
    (tmp_path / "shared.yaml").write_text(yaml.safe_dump(
        {"Owner": {"type": "object", "properties": {"name": {"type": "string"}},
                   "required": ["name"]}}))
    manifests = tmp_path / "manifests"
    manifests.mkdir()
    (manifests / "trees.toml").write_text(
        '[openapi.old]\nspec = "../v30.yaml"\n[openapi.new]\nspec = "../v31.json"\n')
    async with Location.open(tmp_path, state_dir=tmp_path / "state",
                             manifests=[manifests]) as loc:
        assert not loc.manifests.problems, loc.manifests.problems
        definitions = {d.name: d for d in loc.snapshot().definitions}
        # no operationId: the method and the path; `tree.id` is a property as written
        old, new = definitions["old_put_trees_tree_id"], definitions["new_put_trees_tree_id"]
        assert old.input_schema == new.input_schema
        assert old.output_schema == new.output_schema
        schema = old.input_schema
        assert schema["required"] == ["tree.id", "body"]
        assert set(schema["properties"]) == {"tree.id", "dry", "body"}
        node = schema["$defs"]["Node"]
        assert node["properties"]["label"] == {"type": ["string", "null"], "examples": ["root"]}
        assert node["properties"]["weight"] == {"type": "number", "exclusiveMinimum": 0}
        assert node["properties"]["children"]["items"] == {"$ref": "#/$defs/Node"}  # finite
        assert node["properties"]["owner"] == {"$ref": "#/$defs/Owner"}  # from shared.yaml
        assert schema["$defs"]["Owner"]["required"] == ["name"]
        assert "xml" not in node and "x-internal" not in node
        # the output's top-level $ref is the object it names, so it can be an output schema
        assert old.output_schema is not None and old.output_schema["type"] == "object"
        assert old.description == "Replace a tree"

        snap = loc.snapshot()
        context = ToolContext("s", "a", "m", "c1")
        bad = await snap.execute("new_put_trees_tree_id", {"tree.id": "t", "body": {
            "weight": 0, "owner": {}}}, context)
        assert bad.error.kind is ErrorKind.INVALID_INPUT
        assert "$.body.weight" in bad.error.message or "$.body.owner" in bad.error.message
        # valid (null label, nested children): it goes out, to a port where nothing listens
        sent = await snap.execute("old_put_trees_tree_id", {"tree.id": "a/b", "body": {
            "label": None, "children": [{"label": "leaf", "children": []}]}},
            ToolContext("s", "a", "m", "c2"))
        assert sent.error.kind is ErrorKind.UPSTREAM
        assert "PUT http://127.0.0.1:9/v2/trees/a%2Fb" in sent.error.message
