"""Codecs: wire JSON <-> the values a tool sees, plus the JSON Schema that describes them.

Exports `make_codec` (from a pydantic model class or `TypeAdapter`, a raw JSON Schema dict, or
any `Codec`), `Codec`, `CodecLike`, `PydanticCodec`, `JsonSchemaCodec` and `json_path`.
Imports `sidecar.model.errors` only. Building a codec needs no services.

Pydantic: decode = validate JSON-compatible data; encode = validate, then dump in JSON mode.
A JSON Schema dict is checked when the codec is built (draft from `$schema`, default 2020-12;
validators compiled once and cached by schema; no remote `$ref` is ever fetched). `jsonschema`
is the reference: a value of plain JSON types is first offered to `jsonschema-rs` (the same
drafts, about 50x faster), what it accepts is accepted, and anything else is judged by
`jsonschema`, which writes every error message. Every failure is a `CodecError` whose `path`
is a JSON path (`$.items[2].name`) into the value, or into the schema for
`SchemaDefinitionError`.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterable, Mapping
from typing import Any, Protocol, runtime_checkable

import jsonschema
import jsonschema.exceptions
import jsonschema.protocols
import jsonschema_rs
import pydantic
import pydantic_core
import referencing
import referencing.exceptions
from jsonschema.validators import validator_for

from sidecar.model.errors import CodecError, SchemaDefinitionError

_DEFAULT_DRAFT = jsonschema.Draft202012Validator
_MAX_REPORTED_ERRORS = 10
"""How many errors of one value a `CodecError` lists (the rest are counted)."""


@runtime_checkable
class Codec(Protocol):
    """The small codec protocol; anything with these three methods is a codec."""

    def decode(self, data: Any) -> Any:
        """Wire JSON -> the value a tool sees. Raises `CodecError`."""
        ...

    def encode(self, value: Any) -> Any:
        """A tool's value -> validated wire JSON. Raises `CodecError`."""
        ...

    def json_schema(self) -> dict[str, Any]: ...


def json_path(parts: Iterable[Any]) -> str:
    path = "$"
    for part in parts:
        path += f"[{part}]" if isinstance(part, int) else f".{part}"
    return path


class PydanticCodec:
    """A codec over a pydantic `TypeAdapter` (models are wrapped in one)."""

    __slots__ = ("_adapter", "_model", "_schema")

    def __init__(self, target: type[pydantic.BaseModel] | pydantic.TypeAdapter[Any]) -> None:
        if isinstance(target, pydantic.TypeAdapter):
            self._adapter: pydantic.TypeAdapter[Any] = target
            self._model: type[pydantic.BaseModel] | None = None
        else:
            self._adapter = pydantic.TypeAdapter(target)
            self._model = target
        self._schema: dict[str, Any] | None = None

    # The adapter's own validator and serializer, called as `TypeAdapter.validate_python` and
    # `dump_python` call them with their defaults, without those wrappers' ~0.2 and ~0.3 µs a
    # call (read from the adapter each time: a deferred build replaces them when it is done).

    def decode(self, data: Any) -> Any:
        try:
            return self._adapter.validator.validate_python(data)
        except pydantic.ValidationError as exc:
            raise _pydantic_error(exc) from None

    def encode(self, value: Any) -> Any:
        # A model instance was validated when it was built; anything else is validated first.
        if self._model is None or not isinstance(value, self._model):
            try:
                value = self._adapter.validator.validate_python(value)
            except pydantic.ValidationError as exc:
                raise _pydantic_error(exc) from None
        try:
            return self._adapter.serializer.to_python(value, mode="json")
        except pydantic_core.PydanticSerializationError as exc:
            raise CodecError(f"cannot serialize output: {exc}") from None

    def json_schema(self) -> dict[str, Any]:
        if self._schema is None:
            self._schema = self._adapter.json_schema()
        return self._schema


def _pydantic_error(exc: pydantic.ValidationError) -> CodecError:
    errors = exc.errors(include_url=False)
    first = errors[0]
    path = json_path(first["loc"])
    parts = [f"{json_path(e['loc'])}: {e['msg']}" for e in errors[:_MAX_REPORTED_ERRORS]]
    return CodecError(_listed(parts, len(errors)), path)


def _listed(parts: list[str], total: int) -> str:
    """Errors joined by "; ", counting those past `_MAX_REPORTED_ERRORS`."""
    more = total - len(parts)
    head = f"{total} errors: " if total > 1 else ""
    return head + "; ".join(parts) + (f"; and {more} more not shown" if more > 0 else "")


class _Compiled:
    """A checked schema's `jsonschema` validator, and its `jsonschema-rs` twin, built on first
    use (a catalog of thousands of tools only pays for the tools that are called)."""

    __slots__ = ("_fast", "_schema", "reference")

    def __init__(self, schema: str, reference: jsonschema.protocols.Validator) -> None:
        self._schema: str | None = schema  # its canonical JSON: a later change cannot reach it
        self._fast: jsonschema_rs.Validator | None = None
        self.reference = reference

    def fast(self) -> jsonschema_rs.Validator | None:
        if self._schema is not None:  # a race builds it twice at worst
            self._fast, self._schema = _fast_validator(self._schema), None
        return self._fast


_validator_cache: dict[str, _Compiled] = {}
# jsonschema's default registry still fetches an unknown `$ref` URI with urlopen (deprecated;
# file:// included). A registry of its own (the drafts' meta-schemas are always added) fetches
# nothing: such a reference is unresolvable.
_NO_RETRIEVAL: referencing.Registry[Any] = referencing.Registry()
_validator_lock = threading.Lock()
_JSON_SCALARS = frozenset({str, int, float, bool, type(None)})


def _plain_json(value: Any) -> bool:
    """Whether `value` is built from exactly dict (str keys), list, str, int, float, bool and
    None: the values on which both validators read the same JSON (`jsonschema-rs` also takes a
    tuple as an array, `jsonschema` does not)."""
    stack = [value]
    while stack:
        item = stack.pop()
        kind = type(item)
        if kind in _JSON_SCALARS:
            continue
        if kind is dict:
            for key in item:
                if type(key) is not str:
                    return False
            stack.extend(item.values())
        elif kind is list:
            stack.extend(item)
        else:
            return False
    return True


def _fast_validator(schema: str) -> jsonschema_rs.Validator | None:
    """The `jsonschema-rs` twin of an already checked schema; None when it cannot build one
    (then `jsonschema` alone decides). Offline: no `$ref` is fetched, as on the Python side."""
    try:
        return jsonschema_rs.validator_for(schema, validate_formats=False, offline=True)
    except (ValueError, TypeError, jsonschema_rs.ReferencingError):
        return None


_KNOWN_DEFAULT = "https://json-schema.org/draft/2020-12/schema"
_KNOWN_METASCHEMAS = frozenset(
    f"{scheme}://json-schema.org/{path}{end}"
    for scheme in ("http", "https")
    for path in ("draft-04/schema", "draft-06/schema", "draft-07/schema",
                 "draft/2019-09/schema", "draft/2020-12/schema")
    for end in ("", "#")
)


def _meta_valid_fast(schema: Mapping[str, Any]) -> bool:
    # Only for a draft it knows: given another `$schema` URL, it would try to fetch it.
    draft = schema.get("$schema", _KNOWN_DEFAULT)
    if not isinstance(draft, str) or draft not in _KNOWN_METASCHEMAS:
        return False
    try:
        return bool(jsonschema_rs.meta.is_valid(dict(schema)))
    except Exception:  # an unknown $schema, a value it cannot read: the reference decides
        return False


def _compiled_validator(schema: Mapping[str, Any]) -> _Compiled:
    try:
        key = json.dumps(schema, sort_keys=True, separators=(",", ":"))
    except (TypeError, ValueError) as exc:
        raise SchemaDefinitionError(f"schema is not JSON: {exc}") from None
    cached = _validator_cache.get(key)
    if cached is not None:
        return cached
    cls = validator_for(schema, default=_DEFAULT_DRAFT)
    try:
        # The Rust meta-validator checks a 5 MB schema in ~50 ms where `check_schema` takes
        # ~30 s; only a schema it refuses (or cannot judge) gets the reference check, which
        # also names the failing path.
        if not _meta_valid_fast(schema):
            cls.check_schema(dict(schema))
    except jsonschema.exceptions.SchemaError as exc:
        path = json_path(exc.absolute_path)
        raise SchemaDefinitionError(f"invalid JSON Schema: {exc.message}", path) from None
    compiled = _Compiled(key, cls(schema, registry=_NO_RETRIEVAL))
    with _validator_lock:
        return _validator_cache.setdefault(key, compiled)


class JsonSchemaCodec:
    """A codec over a JSON Schema dict; values pass through unchanged when valid."""

    __slots__ = ("_compiled", "_schema", "_validator")

    def __init__(self, schema: Mapping[str, Any]) -> None:
        if not isinstance(schema, Mapping):
            raise SchemaDefinitionError("a JSON Schema must be an object")
        self._schema = dict(schema)
        self._compiled = _compiled_validator(self._schema)
        self._validator = self._compiled.reference

    def _check(self, value: Any) -> Any:
        fast = self._compiled.fast()
        if fast is not None and _plain_json(value):
            try:
                if fast.is_valid(value):
                    return value
            except ValueError:  # e.g. a lone surrogate it cannot encode: jsonschema decides
                pass
        try:
            errors = list(self._validator.iter_errors(value))
        except referencing.exceptions.Unresolvable as exc:
            raise CodecError(
                f"the schema's {exc} (references outside the schema are never fetched)"
            ) from None
        if not errors:
            return value
        best = jsonschema.exceptions.best_match(errors)
        assert best is not None
        path = json_path(best.absolute_path)
        # Every error, the most relevant first, so a model can fix them all in one retry.
        ordered = [best, *(e for e in errors if e is not best)]
        parts = [f"{json_path(e.absolute_path)}: {e.message}"
                 for e in ordered[:_MAX_REPORTED_ERRORS]]
        raise CodecError(_listed(parts, len(errors)), path)

    def decode(self, data: Any) -> Any:
        return self._check(data)

    def encode(self, value: Any) -> Any:
        return self._check(value)

    def json_schema(self) -> dict[str, Any]:
        return self._schema


CodecLike = type[pydantic.BaseModel] | pydantic.TypeAdapter[Any] | Mapping[str, Any] | Codec


def make_codec(spec: CodecLike) -> Codec:
    """Build a codec from any accepted form; a bad schema raises `SchemaDefinitionError`."""
    if isinstance(spec, PydanticCodec | JsonSchemaCodec):
        return spec
    if isinstance(spec, pydantic.TypeAdapter) or (
        isinstance(spec, type) and issubclass(spec, pydantic.BaseModel)
    ):
        return PydanticCodec(spec)
    if isinstance(spec, Mapping):
        return JsonSchemaCodec(spec)
    if isinstance(spec, Codec):
        return spec
    raise TypeError(
        "a codec must be a pydantic model or TypeAdapter, a JSON Schema dict, or an object "
        f"with decode/encode/json_schema; got {type(spec).__name__}"
    )


def validator_cache_size() -> int:
    """How many distinct schemas have been compiled (for tests of the cache)."""
    return len(_validator_cache)

