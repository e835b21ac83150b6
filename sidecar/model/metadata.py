"""Step 8 of the seam: metadata is a small JSON object for UIs, bounded on its own.

Invalid metadata (not an object, not JSON-serializable, NaN or infinity) or metadata over the
limit is dropped with a logged warning; it never fails the call. Absent stays absent.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from typing import Any

DEFAULT_MAX_METADATA_BYTES = 8 * 1024

log = logging.getLogger("sidecar.model.metadata")


def bound_metadata(
    metadata: Any,
    *,
    tool: str,
    call_id: str,
    max_bytes: int = DEFAULT_MAX_METADATA_BYTES,
    what: str = "metadata",
) -> dict[str, Any] | None:
    """`metadata` as a plain JSON object when valid and within `max_bytes`, else None."""
    if metadata is None:
        return None
    if not isinstance(metadata, Mapping):
        log.warning(
            "dropped %s of %s (call %s): expected a JSON object, got %s",
            what, tool, call_id, type(metadata).__name__,
        )
        return None
    try:
        encoded = json.dumps(metadata, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    except (TypeError, ValueError) as exc:
        log.warning("dropped %s of %s (call %s): not JSON: %s", what, tool, call_id, exc)
        return None
    size = len(encoded.encode("utf-8", "surrogatepass"))
    if size > max_bytes:
        log.warning(
            "dropped %s of %s (call %s): %d bytes encoded, over the %d byte limit",
            what, tool, call_id, size, max_bytes,
        )
        return None
    # A round trip gives plain dicts/lists with string keys (json.dumps turned int keys to
    # strings), so what is stored is exactly what was measured.
    result: dict[str, Any] = json.loads(encoded)
    return result
