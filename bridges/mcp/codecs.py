"""Output codecs for `output_validation = "warn"` and `"off"`.

`strict` uses the core's `JsonSchemaCodec`: an output that does not match the tool's
`outputSchema` fails the call (`invalid_output`). The two codecs here advertise the same schema
but let any value through: `WarnCodec` logs each mismatch (naming the server, the tool and the
JSON path), `PassCodec` checks nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from sidecar.model.codec import JsonSchemaCodec
from sidecar.model.errors import CodecError

log = logging.getLogger("bridges.mcp")


class PassCodec:
    """Advertises `schema`; decodes and encodes every value unchanged."""

    __slots__ = ("_schema",)

    def __init__(self, schema: Mapping[str, Any]) -> None:
        self._schema = dict(schema)

    def decode(self, data: Any) -> Any:
        return data

    def encode(self, value: Any) -> Any:
        return value

    def json_schema(self) -> dict[str, Any]:
        return self._schema


class WarnCodec:
    """Like `JsonSchemaCodec`, but a mismatch is logged as a warning and the value passes."""

    __slots__ = ("_checker", "_what")

    def __init__(self, schema: Mapping[str, Any], *, server: str, tool: str) -> None:
        self._checker = JsonSchemaCodec(schema)
        self._what = f"MCP server {server!r}, tool {tool!r}"

    def decode(self, data: Any) -> Any:
        return self._check(data)

    def encode(self, value: Any) -> Any:
        return self._check(value)

    def json_schema(self) -> dict[str, Any]:
        return self._checker.json_schema()

    def _check(self, value: Any) -> Any:
        try:
            self._checker.encode(value)
        except CodecError as exc:
            log.warning(
                "%s: structured output does not match its outputSchema (%s); passed on because "
                "output_validation is 'warn'",
                self._what,
                exc.message,
            )
        return value
