from typing import Any

import pydantic
import pytest

from sidecar.codec import JsonSchemaCodec, PydanticCodec, make_codec, validator_cache_size
from sidecar.errors import CodecError, SchemaDefinitionError
from sidecar.tool import Tool


class Point(pydantic.BaseModel):
    x: int
    tags: list[str] = []


def test_pydantic_model_codec_round_trip_and_error_path():
    codec = make_codec(Point)
    assert isinstance(codec, PydanticCodec)
    value = codec.decode({"x": 1, "tags": ["a"]})
    assert value == Point(x=1, tags=["a"])
    assert codec.encode(value) == {"x": 1, "tags": ["a"]}
    assert codec.encode({"x": 2}) == {"x": 2, "tags": []}  # a dict is validated first
    with pytest.raises(CodecError) as err:
        codec.decode({"x": 1, "tags": ["a", 3]})
    assert err.value.path == "$.tags[1]"
    assert codec.json_schema()["properties"]["x"]["type"] == "integer"


def test_type_adapter_codec():
    codec = make_codec(pydantic.TypeAdapter(list[int]))
    assert codec.decode([1, 2]) == [1, 2]
    with pytest.raises(CodecError) as err:
        codec.encode([1, "x"])
    assert err.value.path == "$[1]"


def test_json_schema_codec_validates_and_names_the_path():
    codec = make_codec({"type": "object", "properties": {"a": {"type": "object", "properties": {
        "b": {"type": "integer", "minimum": 0}}}}})
    assert isinstance(codec, JsonSchemaCodec)
    assert codec.decode({"a": {"b": 1}}) == {"a": {"b": 1}}
    with pytest.raises(CodecError) as err:
        codec.decode({"a": {"b": -1}})
    assert err.value.path == "$.a.b"
    assert "minimum" in err.value.message or "less than" in err.value.message


def test_a_bad_schema_is_a_clear_error_when_the_tool_is_built():
    async def run(args: Any, ctx: Any) -> Any:
        return None

    with pytest.raises(SchemaDefinitionError) as err:
        Tool(description="d", input={"type": "object", "properties": {"a": {"type": "strnig"}}},
             execute=run)
    assert err.value.path == "$.properties.a.type"


def test_draft_is_chosen_by_dollar_schema():
    # `prefixItems` means something in 2020-12 (the default) and nothing in draft-07.
    modern = make_codec({"type": "array", "prefixItems": [{"type": "integer"}]})
    legacy = make_codec({"$schema": "http://json-schema.org/draft-07/schema#",
                         "type": "array", "prefixItems": [{"type": "integer"}]})
    with pytest.raises(CodecError):
        modern.decode(["x"])
    assert legacy.decode(["x"]) == ["x"]


def test_validators_are_compiled_once_per_schema():
    schema = {"type": "object", "properties": {"unique_for_cache_test": {"type": "string"}}}
    before = validator_cache_size()
    make_codec(dict(schema))
    make_codec(dict(schema))
    assert validator_cache_size() == before + 1


def test_custom_codec_protocol_objects_are_accepted():
    class Upper:
        def decode(self, data: Any) -> Any:
            if not isinstance(data, dict):
                raise CodecError("expected an object")
            return {k: str(v).upper() for k, v in data.items()}

        def encode(self, value: Any) -> Any:
            return value

        def json_schema(self) -> dict[str, Any]:
            return {"type": "object"}

    codec = make_codec(Upper())
    assert codec.decode({"a": "x"}) == {"a": "X"}


def test_not_a_codec_is_a_type_error():
    with pytest.raises(TypeError, match="codec"):
        make_codec(42)  # type: ignore[arg-type]
