"""The `managed_read` built-in: read or search a text retained by the bounding step
(`managed_read_tool`). It is trusted: it captures the managed store at construction, and
registers through the same `Tools` capability as any plugin.

Imports `sidecar.model` and `managed_store`. Exports `managed_read_tool`, `ManagedReadInput`,
`search_owner`, `Budget`, `DEFAULT_LIMIT`, `MAX_LENGTH` and `HEADER_RESERVE_BYTES`.
"""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field

from managed_store import (
    MAX_PATTERN_CHARS,
    InvalidPattern,
    InvalidRef,
    ManagedNotFound,
    SearchTimeout,
    TextStore,
    TooManySearches,
)
from sidecar.model.errors import ErrorKind, ToolFailure
from sidecar.model.text import line_count, utf8_length
from sidecar.model.tool import DEFAULT_BOUNDS, Annotations, Bounds, CallContext, Tool, ToolResponse

DEFAULT_LIMIT = 200
HEADER_RESERVE_BYTES = 512
"""Bytes of the bound kept for the `[...]` header line of a page."""
MAX_LENGTH = 10_000_000


def search_owner(owner: str | None) -> str:
    """Who a search counts against (its concurrent searches are capped): the scoped token
    (`"token:<id>"`), else the all-access token, one client however many sessions use it."""
    return owner if owner is not None else "the all-access token"


class ManagedReadInput(BaseModel):
    model_config = ConfigDict(extra="forbid")

    ref: str = Field(description="The managed reference from a truncated result (m_...).")
    offset: int = Field(1, ge=1, le=2**62, description="First line to read (1-based).")
    limit: int = Field(DEFAULT_LIMIT, ge=1, le=2000, description="How many lines to read.")
    pattern: str | None = Field(
        None,
        max_length=MAX_PATTERN_CHARS,
        description=(
            "A regular expression (RE2 syntax: no backreferences or lookaround); when given, "
            "return matching lines instead."
        ),
    )
    context: int = Field(0, ge=0, le=20, description="Lines of context around each match.")
    start: int | None = Field(
        None, ge=0, le=2**62,
        description=(
            "Character position (0-based) inside line `offset`: read that one line from here, "
            "for lines too long to read whole (a truncated result names where to start)."
        ),
    )
    length: int | None = Field(
        None, ge=1, le=MAX_LENGTH,
        description="With `start`: how many characters to read (default: as many as fit).",
    )


def managed_read_tool(store: TextStore, bounds: Bounds = DEFAULT_BOUNDS) -> Tool:
    """The tool over `store`; its pages fit `bounds` (give the Location's).

    Reads by lines (`offset`/`limit`), inside one line by characters (`offset` = the line,
    `start`/`length` in characters), or by `pattern`. Its own result always fits `bounds`: a
    page that would not fit is cut (whole lines, else characters of the first line) and the
    header says exactly where to continue, so re-reading a text never retains it again under
    a new ref. An invalid pattern fails `invalid_input`."""
    budget = Budget(max(bounds.bytes_limit - HEADER_RESERVE_BYTES, 64),
                    max(bounds.lines_limit - 2, 1))

    async def run(args: ManagedReadInput, ctx: CallContext) -> ToolResponse:
        try:
            return await _page(store, args, budget, search_owner(ctx.runner.owner))
        except InvalidPattern as exc:
            raise ToolFailure(str(exc), kind=ErrorKind.INVALID_INPUT) from None
        except SearchTimeout as exc:
            raise ToolFailure(str(exc), kind=ErrorKind.TIMEOUT) from None
        except TooManySearches as exc:
            raise ToolFailure(str(exc), kind=ErrorKind.UNAVAILABLE) from None
        except (InvalidRef, ManagedNotFound) as exc:
            raise ToolFailure(f"{exc}. Use the ref exactly as the truncated result gave it.") \
                from None
        except ValueError as exc:
            raise ToolFailure(str(exc)) from None

    return Tool(
        description=(
            "Read a text that was too long to show in full. Truncated tool results name a "
            "managed reference (m_...): pass it as `ref` with `offset`/`limit` in lines, with "
            "`offset` and `start`/`length` to read inside one long line by characters, or "
            "with `pattern` (a regular expression) to list the matching lines."
        ),
        input=ManagedReadInput,
        execute=run,
        title="Read retained text",
        annotations=Annotations(read_only_hint=True, idempotent_hint=True),
        codemode=True,
    )


async def _page(store: TextStore, args: ManagedReadInput, budget: Budget,
                owner: str) -> ToolResponse:
    if args.pattern is not None:
        return await _grep(store, args, budget, owner)
    if args.start is not None:
        return await _read_chars(store, args.ref, args.offset, args.start, args.length, budget)
    part = await store.read_lines(args.ref, offset=args.offset, limit=min(args.limit,
                                                                         budget.lines))
    total = part.ref.lines
    if part.first_line > total:
        return ToolResponse(
            content=f"[{args.ref}: offset {args.offset} is past the end ({total:,} lines)]")
    text, last = _whole_lines_within(part.text, part.first_line, budget)
    if last < part.first_line:  # the first line alone is over the bound: read it by chars
        return await _read_chars(store, args.ref, part.first_line, 0, None, budget)
    more = "" if part.eof and last == part.last_line else f"; continue with offset={last + 1}"
    header = f"[{args.ref}: lines {part.first_line:,}-{last:,} of {total:,}{more}]"
    return ToolResponse(content=f"{header}\n{text}")


@dataclass(frozen=True, slots=True)
class Budget:
    """What a page's text may take (the bound minus the header)."""

    bytes: int
    lines: int


def _whole_lines_within(text: str, first: int, budget: Budget) -> tuple[str, int]:
    """The longest run of whole lines of `text` (which starts at line `first`) within
    `budget`, and the number of its last line (`first - 1` when not even one fits)."""
    if utf8_length(text) <= budget.bytes and line_count(text) <= budget.lines:
        return text, first + line_count(text) - 1
    kept, size = 0, 0
    for line in text.splitlines(keepends=True):
        size += utf8_length(line)
        if size > budget.bytes or kept + 1 > budget.lines:
            break
        kept += 1
    if kept == 0:
        return "", first - 1
    end = 0
    for _ in range(kept):
        end = text.index("\n", end) + 1
    return text[:end], first + kept - 1


def _utf8_prefix_chars(text: str, max_bytes: int) -> str:
    if utf8_length(text) <= max_bytes:
        return text
    return text.encode()[:max_bytes].decode("utf-8", "ignore")


async def _read_chars(
    store: TextStore, ref: str, line: int, start: int, length: int | None, budget: Budget
) -> ToolResponse:
    # A character takes at most 4 bytes: ask for what could fit, then cut to the bound.
    want = min(length or budget.bytes, budget.bytes)
    part = await store.read_chars(ref, line=line, start=start, length=want)
    total = part.ref.lines
    if line > total:
        return ToolResponse(content=f"[{ref}: offset {line} is past the end ({total:,} lines)]")
    text = _utf8_prefix_chars(part.text, budget.bytes)
    end_of_line = part.end_of_line and len(text) == len(part.text)
    if not text and part.end_of_line:
        after = f"; continue with offset={line + 1}" if line < total else ""
        return ToolResponse(content=(
            f"[{ref}: line {line:,} of {total:,} has no characters from {start:,} on{after}]"))
    span = f"line {line:,} of {total:,}, characters {start:,}-{start + len(text) - 1:,}"
    if end_of_line:
        more = f"; end of the line; continue with offset={line + 1}" if line < total else (
            "; end of the text")
    else:
        more = f"; continue with offset={line}, start={start + len(text)}"
    return ToolResponse(content=f"[{ref}: {span}{more}]\n{text}")


async def _grep(store: TextStore, args: ManagedReadInput, budget: Budget,
                owner: str) -> ToolResponse:
    """Searches count against the call's client (`search_owner`), as `GET
    /v1/managed/{ref}?pattern=` does (`managed_store.search`)."""
    assert args.pattern is not None
    found = await store.grep(args.ref, args.pattern, max_matches=args.limit, context=args.context,
                             owner=owner)
    if not found.matches:
        return ToolResponse(content=f"[{args.ref}: no line matches {args.pattern!r}]")
    lines: list[str] = []
    for match in found.matches:
        first = match.line - len(match.before)
        lines.extend(f"{first + i}- {text}" for i, text in enumerate(match.before))
        lines.append(f"{match.line}: {match.text}")
        lines.extend(f"{match.line + 1 + i}- {text}" for i, text in enumerate(match.after))
    shown: list[str] = []
    size = 0
    for line in lines:  # within the bound, so the listing is never retained again
        room = budget.bytes - size
        if room <= 0 or len(shown) >= budget.lines:
            break
        if utf8_length(line) + 1 > room:
            line = _utf8_prefix_chars(line, max(room - 64, 0)) + "…[cut at the bound]"
        shown.append(line)
        size += utf8_length(line) + 1
    cut = len(lines) - len(shown)
    header = (f"[{args.ref}: {len(found.matches)} matching line(s) for {args.pattern!r}"
              + ("; more matches exist, narrow the pattern" if found.truncated else "")
              + (f"; {cut} listing line(s) past the bound not shown, narrow the pattern or "
                 "read by offset" if cut else "") + "]")
    return ToolResponse(content="\n".join([header, *shown]))
