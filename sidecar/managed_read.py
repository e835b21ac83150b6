"""The `managed_read` built-in: read or search a text retained by the bounding step.

It is trusted: it captures the managed store at construction. It registers through the same
`Tools` capability as any plugin, and its own result is bounded like any other.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from managed_store import (
    MAX_PATTERN_CHARS,
    InvalidPattern,
    InvalidRef,
    ManagedNotFound,
    SearchTimeout,
    TextStore,
)
from sidecar.errors import ErrorKind, ToolFailure
from sidecar.tool import Annotations, CallContext, Tool, ToolResponse

DEFAULT_LIMIT = 200


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


def managed_read_tool(store: TextStore) -> Tool:
    async def run(args: ManagedReadInput, ctx: CallContext) -> ToolResponse:
        try:
            if args.pattern is not None:
                return await _grep(store, args)
            part = await store.read_lines(args.ref, offset=args.offset, limit=args.limit)
        except InvalidPattern as exc:
            raise ToolFailure(str(exc), kind=ErrorKind.INVALID_INPUT) from None
        except SearchTimeout as exc:
            raise ToolFailure(str(exc), kind=ErrorKind.TIMEOUT) from None
        except (InvalidRef, ManagedNotFound) as exc:
            raise ToolFailure(f"{exc}. Use the ref exactly as the truncated result gave it.") \
                from None
        except ValueError as exc:
            raise ToolFailure(str(exc)) from None
        total = part.ref.lines
        if part.first_line > total:
            header = f"[{args.ref}: offset {args.offset} is past the end ({total:,} lines)]"
            return ToolResponse(content=header)
        more = "" if part.eof else f"; continue with offset={part.last_line + 1}"
        header = f"[{args.ref}: lines {part.first_line:,}-{part.last_line:,} of {total:,}{more}]"
        return ToolResponse(content=f"{header}\n{part.text}")

    return Tool(
        description=(
            "Read a text that was too long to show in full. Truncated tool results name a "
            "managed reference (m_...): pass it as `ref` with `offset`/`limit` in lines, or "
            "with `pattern` (a regular expression) to list the matching lines."
        ),
        input=ManagedReadInput,
        execute=run,
        title="Read retained text",
        annotations=Annotations(read_only_hint=True, idempotent_hint=True),
        codemode=True,
    )


async def _grep(store: TextStore, args: ManagedReadInput) -> ToolResponse:
    assert args.pattern is not None
    found = await store.grep(args.ref, args.pattern, max_matches=args.limit, context=args.context)
    if not found.matches:
        return ToolResponse(content=f"[{args.ref}: no line matches {args.pattern!r}]")
    lines = [f"[{args.ref}: {len(found.matches)} matching line(s) for {args.pattern!r}"
             + ("; more matches exist, narrow the pattern" if found.truncated else "") + "]"]
    for match in found.matches:
        first = match.line - len(match.before)
        lines.extend(f"{first + i}- {text}" for i, text in enumerate(match.before))
        lines.append(f"{match.line}: {match.text}")
        lines.extend(f"{match.line + 1 + i}- {text}" for i, text in enumerate(match.after))
    return ToolResponse(content="\n".join(lines))
