"""The call history's port (audit trail): one row for every call the seam settled or
replayed, and the value types its implementations share.

    seam settles a call ──► SettledCall ──► CallHistory.add (never waits) ──► the store
    GET /v1/calls, `sidecar calls`, the console ──► CallHistory.query (filters, cursor)

A row (`CallRecord`) says who called what and how it ended; the input is kept as the audit
setting says (`AuditSettings`: `full`, `redacted` (default) or `none`). The history is written
after the answer, off the call's path, and keeps every settlement (a replay is a row of its
own); rows older than the retention period are pruned in batches.

Imports `sidecar.model` only. Exports `CallHistory`, `SettledCall`, `CallRecord`, `CallQuery`,
`InvalidQuery`, `AuditSettings`, `record_of`, `user_of_owner`, `parse_time`,
`content_tokens` (for writers) and the stored row's shape (`COLUMNS`, `FILTERS`,
`record_of_row`, `encode_cursor`, `decode_cursor`, `guardrail_json`).
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal, NamedTuple, Protocol

from sidecar.model.audit_redaction import Redaction
from sidecar.model.content import TextContent
from sidecar.model.frozen import quick_init
from sidecar.model.json_text import compact
from sidecar.model.outcome import Outcome
from sidecar.model.token_count import count_tokens, result_text
from sidecar.model.tool import ToolContext

log = logging.getLogger("sidecar.stores.call_history")

AuditInputs = Literal["full", "redacted", "none"]

MAX_STORED_INPUT = 64 * 1024
"""Bytes of input JSON kept per row, in any mode; a larger copy is replaced by a note."""
MAX_LIMIT = 1000
GATHER_SECONDS = 0.1
"""How long the history's writer gathers rows before writing them in one transaction: a
sequential caller's calls then cost one wake-up of the writer and one commit per ~100 ms
instead of one each (83-117 µs of daemon CPU a call for `sidecar stdio`, 2026-12-04; 50 ms
until 2026-12-06, when 100 ms took the writer's share from ~20 to ~16 µs a call)."""


class SettledCall(NamedTuple):
    """What the seam knows when a call has settled (or was replayed). A named tuple: the seam
    makes one per call, and a frozen dataclass took ~1 µs to build (2026-12-04)."""

    name: str
    raw_input: Any
    context: ToolContext
    outcome: Outcome
    started_at: float
    """Wall-clock seconds since the epoch."""
    duration: float
    replayed: bool
    profile: str | None = None


@quick_init  # built for every call
@dataclass(frozen=True, slots=True)
class CallRecord:
    call_id: str
    tool: str
    server: str | None
    profile: str | None
    session_id: str
    agent: str
    message_id: str
    status: str
    error_kind: str | None
    started_at: float
    duration_ms: float
    input_bytes: int
    input: Any
    """The input as the audit setting keeps it (None with `none`)."""
    content_bytes: int
    retained: tuple[str, ...]
    replayed: bool
    error: str | None = None
    """A failed call's error message as its caller saw it (cut to `MAX_STORED_ERROR`
    characters); None for a success."""
    seq: int = 0
    """Order of insertion; the cursor of a query."""
    input_json: str | None = field(default=None, compare=False, repr=False)
    """`input` already encoded as JSON when the record was made (the writer stores it as is;
    None: the writer encodes `input`)."""
    content_tokens: int | None = None
    """Tokens of what the call returned to the model (`sidecar.model.token_count`), counted
    by the history's writer, off the call's path; None when not counted (a row written
    before the history counted tokens)."""
    outcome: Outcome | None = field(default=None, compare=False, repr=False)
    """The settled outcome, for the writer to count `content_tokens` (never stored)."""
    guardrail: tuple[dict[str, Any], ...] | None = None
    """The guardrails' decisions on this call, in order (`sidecar.policy.guardrails`: stage,
    rule, decision and what they found); None when no guardrail applied."""
    username: str | None = None
    """The signed-in user who made the call (`ToolContext.owner` `user:<name>`: an identity
    provider's access token, docs/identities.md); None for the all-access or a scoped token."""

    def to_json(self) -> dict[str, Any]:
        data = {name: getattr(self, name) for name in _SHOWN}
        data["retained"] = list(self.retained)
        data["guardrail"] = list(self.guardrail) if self.guardrail is not None else None
        data["started_at"] = _iso(self.started_at)
        return data


_SHOWN = tuple(n for n in CallRecord.__dataclass_fields__
               if n not in ("seq", "input_json", "outcome"))
"""The fields of a row `/v1/calls` shows, in order."""


@dataclass(frozen=True, slots=True)
class CallQuery:
    tool: str | None = None
    server: str | None = None
    status: str | None = None
    session: str | None = None
    agent: str | None = None
    profile: str | None = None
    user: str | None = None
    since: float | None = None
    until: float | None = None
    limit: int = 100
    cursor: str | None = None
    """Opaque; from the previous page. Pages go from the newest call to the oldest."""

    @classmethod
    def from_params(cls, params: Mapping[str, str], *, limit: int = 100) -> CallQuery:
        """From query parameters (`/v1/calls`, the console): `tool`, `server`, `status`,
        `session`, `agent`, `profile`, `user`, `since`/`until` (ISO 8601, UTC unless an offset is
        given, or epoch seconds), `limit` (1-1000), `cursor`. Raises InvalidQuery."""
        def text(name: str) -> str | None:
            value = params.get(name) or None
            if value is not None and len(value) > MAX_FILTER_CHARS:
                raise InvalidQuery(name, f"longer than {MAX_FILTER_CHARS} characters")
            return value

        raw_limit = params.get("limit")
        if raw_limit:
            if not (raw_limit.isascii() and raw_limit.isdigit()) or not 1 <= int(raw_limit) \
                    <= MAX_LIMIT:
                raise InvalidQuery("limit", f"a whole number from 1 to {MAX_LIMIT}")
            limit = int(raw_limit)
        cursor = params.get("cursor")
        if cursor is not None:  # present but empty is an error too: the page is unknown
            decode_cursor(cursor)
        return cls(
            tool=text("tool"), server=text("server"), status=text("status"),
            session=text("session"), agent=text("agent"), profile=text("profile"),
            user=text("user"), since=parse_time(params.get("since"), "since"),
            until=parse_time(params.get("until"), "until"), limit=limit, cursor=cursor,
        )


def parse_time(value: str | None, name: str) -> float | None:
    """Epoch seconds from an ISO 8601 date or time (UTC unless it has an offset) or a number."""
    if not value:
        return None
    if len(value) > 64:
        raise InvalidQuery(name, "longer than 64 characters")
    try:
        number = float(value)
    except ValueError:
        pass
    else:
        if not (math.isfinite(number) and 0 <= number <= MAX_EPOCH):
            raise InvalidQuery(name, f"{value!r} is not epoch seconds from 0 to {MAX_EPOCH:g}")
        return number
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise InvalidQuery(name, f"{value[:40]!r} is not a date, a time or epoch seconds") \
            from None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return parsed.timestamp()


class InvalidQuery(ValueError):
    """A filter or cursor that cannot be read; the message and `field` name it."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


MAX_FILTER_CHARS = 512
MAX_EPOCH = 1e11




class CallHistory(Protocol):
    def add(self, record: CallRecord) -> None:
        """Queue a row; never blocks and never fails the call (a write error is logged)."""
        ...

    async def query(self, query: CallQuery) -> tuple[list[CallRecord], str | None]:
        """Rows matching `query`, newest first, and the cursor of the next page (or None)."""
        ...

    async def prune(self, older_than: float, batch: int = 500) -> int:
        """Delete rows started before `older_than` (epoch seconds), in batches; how many."""
        ...

    async def aclose(self) -> None: ...


def _iso(ts: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ts)) + f".{int(ts % 1 * 1000):03d}Z"


_COMPACT = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"))
_COMPACT_ANY = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), default=str)
"""Built once: `json.dumps` with any argument builds an encoder per call (~1 µs each)."""
@dataclass(slots=True)
class AuditSettings:
    """Manifest `[audit]`: `inputs = "full" | "redacted" | "none"`, `mask = ["field", ...]`."""

    inputs: AuditInputs = "redacted"
    mask: frozenset[str] = field(default_factory=frozenset)
    _redaction: Redaction = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self._redaction = Redaction(self.mask)

    def keep(self, raw_input: Any) -> tuple[int, Any]:
        """The input's size in bytes of JSON, and the copy the setting keeps of it."""
        size, kept, _ = self.keep_encoded(raw_input)
        return size, kept

    def keep_encoded(self, raw_input: Any) -> tuple[int, Any, str | None]:
        """As `keep`, plus the kept copy as JSON (None when nothing is kept): the input is
        encoded once, and that text is reused when the copy is the input itself."""
        data = compact(raw_input)
        if data is not None:
            encoded: str | None = data.decode()
            size = len(data)
        else:
            try:
                encoded = _COMPACT.encode(raw_input)
            except (TypeError, ValueError):
                encoded = None
            text = repr(raw_input) if encoded is None else encoded
            size = len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))
        if self.inputs == "none":
            return size, None, None
        kept = raw_input if self.inputs == "full" else self._redaction.copy(raw_input)
        if kept is raw_input and encoded is not None:
            kept_json = encoded
        else:
            kept_data = compact(kept)
            try:
                kept_json = (kept_data.decode() if kept_data is not None
                             else _COMPACT_ANY.encode(kept))
            except (TypeError, ValueError):  # e.g. a circular structure: keep its size only
                kept_json = None
        if kept_json is None or len(kept_json) > MAX_STORED_INPUT:
            omitted = {"_omitted": f"input of {size} bytes is larger than the audit copy"}
            return size, omitted, _COMPACT.encode(omitted)
        return size, kept, kept_json


def record_of(
    call: SettledCall, settings: AuditSettings, server_of: Callable[[str], str | None]
) -> CallRecord:
    outcome = call.outcome
    size, kept, kept_json = settings.keep_encoded(call.raw_input)
    shown = sum(len(i.text.encode()) for i in outcome.content if isinstance(i, TextContent))
    return CallRecord(
        call_id=call.context.call_id, tool=outcome.tool or call.name,
        server=server_of(outcome.tool or call.name), profile=call.profile,
        session_id=call.context.session_id, agent=call.context.agent,
        message_id=call.context.message_id, status=outcome.status,
        error_kind=outcome.error.kind.value if outcome.error is not None else None,
        started_at=call.started_at, duration_ms=round(call.duration * 1000, 3),
        input_bytes=size, input=kept, content_bytes=shown,
        retained=tuple(m.ref for m in outcome.managed), replayed=call.replayed,
        error=_error_text(outcome), input_json=kept_json, outcome=outcome,
        username=user_of_owner(call.context.owner),
    )


def user_of_owner(owner: str | None) -> str | None:
    """The user name of a call's owner (`user:<name>`), or None."""
    return owner[5:] if owner is not None and owner.startswith("user:") else None


MAX_STORED_ERROR = 4000
"""Characters of a failed call's error message the history keeps."""


def _error_text(outcome: Outcome) -> str | None:
    if outcome.error is None:
        return None
    message = outcome.error.message
    return message if len(message) <= MAX_STORED_ERROR else message[:MAX_STORED_ERROR] + "…"


COLUMNS = ("seq", "call_id", "tool", "server", "profile", "session_id", "agent", "message_id",
            "status", "error_kind", "started_at", "duration_ms", "input_bytes", "input",
            "content_bytes", "retained", "replayed", "error", "content_tokens", "guardrail",
           "username")
FILTERS = {"tool": "tool", "server": "server", "status": "status", "session": "session_id",
            "agent": "agent", "profile": "profile", "user": "username"}


def content_tokens(record: CallRecord) -> int | None:
    """On the history's writer (a thread, or a thread hop per batch): the tokens of what the
    call returned to the model, as `CallRecord.content_tokens` says. Never raises: a row is
    written without a count rather than not at all."""
    if record.content_tokens is not None or record.outcome is None:
        return record.content_tokens
    outcome = record.outcome
    try:
        return count_tokens(result_text(
            outcome.content, outcome.error.message if outcome.error is not None else None))
    except Exception:  # e.g. the encoding's package missing: say so once
        if not _count_failed:
            _count_failed.append(True)
            log.exception("counting the tokens of call results failed; rows are written "
                          "without them")
        return None


_count_failed: list[bool] = []


def encode_cursor(seq: int) -> str:
    return f"c{seq}"


def decode_cursor(cursor: str) -> int:
    if not (cursor.startswith("c") and cursor[1:].isascii() and cursor[1:].isdigit()
            and len(cursor) <= 19):
        raise InvalidQuery("cursor", f"{cursor[:40]!r} is not a cursor this daemon gives out "
                           "(c followed by digits)")
    return int(cursor[1:])


def record_of_row(row: tuple[Any, ...]) -> CallRecord:
    data = dict(zip(COLUMNS, row, strict=True))
    data["input"] = json.loads(data["input"]) if data["input"] is not None else None
    data["retained"] = tuple(json.loads(data["retained"]))
    data["replayed"] = bool(data["replayed"])
    if data["guardrail"] is not None:
        data["guardrail"] = tuple(json.loads(data["guardrail"]))
    return CallRecord(**data)


def guardrail_json(record: CallRecord) -> str | None:
    """The stored form of `CallRecord.guardrail` (JSON text; None when absent)."""
    if record.guardrail is None:
        return None
    return _COMPACT_ANY.encode(list(record.guardrail))
