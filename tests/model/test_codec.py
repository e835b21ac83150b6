from typing import Any

import pydantic
import pytest

from sidecar.model.codec import JsonSchemaCodec, PydanticCodec, make_codec, validator_cache_size
from sidecar.model.errors import CodecError, SchemaDefinitionError
from sidecar.model.tool import Tool


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


class Deferred(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(defer_build=True)
    later: "Later"


class Later(pydantic.BaseModel):
    n: int


def test_a_model_built_on_first_use_is_decoded_and_encoded():
    """`defer_build`: the adapter's validator and serializer are stand-ins until the first use
    builds them (the forward reference resolved by then); the codec reads them each call."""
    codec = make_codec(Deferred)
    assert codec.decode({"later": {"n": 1}}) == Deferred(later=Later(n=1))
    assert codec.encode(Deferred(later=Later(n=2))) == {"later": {"n": 2}}
    assert codec.encode({"later": {"n": 3}}) == {"later": {"n": 3}}
    with pytest.raises(CodecError) as err:
        codec.decode({"later": {"n": "x"}})
    assert err.value.path == "$.later.n"


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


# --- the jsonschema-rs fast path: it may only accept; `jsonschema` stays the reference --------


def test_a_valid_plain_json_value_is_accepted_without_the_reference_validator(monkeypatch):
    codec = make_codec({"type": "object", "properties": {"text": {"type": "string"}},
                        "required": ["text"], "additionalProperties": False})

    def refuse(self: Any, instance: Any) -> Any:
        raise AssertionError("the reference validator ran for a value the fast one accepts")

    assert codec.decode({"text": "hi"}) == {"text": "hi"}
    monkeypatch.setattr(type(codec._validator), "iter_errors", refuse)  # type: ignore[attr-defined]
    assert codec.decode({"text": "hi"}) == {"text": "hi"}
    with pytest.raises(AssertionError):  # an invalid value still reaches the reference
        codec.decode({"text": 3})


def test_values_that_are_not_plain_json_are_judged_by_jsonschema():
    array = make_codec({"type": "array", "items": {"type": "integer"}})
    with pytest.raises(CodecError):  # jsonschema-rs would read a tuple as an array
        array.encode((1, 2))
    text = make_codec({"type": "string", "maxLength": 3})
    assert text.encode("\ud800") == "\ud800"  # a lone surrogate: jsonschema-rs cannot read it
    with pytest.raises(CodecError) as err:
        text.encode("\ud800abcd")
    assert "is too long" in err.value.message


def test_where_the_two_read_a_pattern_differently_jsonschema_decides():
    # Python's `re.search` lets `$` match before a final newline; ECMA-262 does not.
    anchored = make_codec({"type": "string", "pattern": "^abc$"})
    assert anchored.decode("abc\n") == "abc\n"
    # `a{,3}` is a quantifier for Python and not a valid ECMA-262 regex: no fast twin at all.
    counted = make_codec({"type": "string", "pattern": "^a{,3}$"})
    assert counted.decode("aa") == "aa"
    with pytest.raises(CodecError):
        counted.decode("aaaa")


def test_no_reference_is_fetched_by_either_validator():
    import http.server
    import threading

    hits: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            hits.append(self.path)
            body = b'{"type": "integer"}'
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_port}/int.json"
        codec = make_codec({"type": "object", "properties": {"n": {"$ref": url}}})
        with pytest.raises(CodecError) as err:  # unresolvable: refused, never fetched
            codec.decode({"n": 1})
        assert url in err.value.message and "never fetched" in err.value.message
        assert hits == []
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def test_a_file_reference_is_not_read(tmp_path):
    secret = tmp_path / "secret.json"
    secret.write_text('{"enum": ["the-secret-value"]}')
    codec = make_codec({"type": "object", "properties": {"n": {"$ref": secret.as_uri()}}})
    with pytest.raises(CodecError) as err:
        codec.decode({"n": "guess"})
    assert "never fetched" in err.value.message
    assert "the-secret-value" not in err.value.message
