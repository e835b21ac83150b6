"""Step 7 of the seam: keep model-facing text within bounds without losing any of it
(`bound_content`; what is measured and what a preview holds is its docstring).

Guarantees (property-tested): the preview is within both limits; `head` is a prefix and `tail`
a suffix of the original; a marker appears iff the text was cut; no UTF-8 character is split;
the retained text is byte-identical to the original. If retention fails, the error propagates
and the call fails; there is never a lossy success.

Imports `sidecar.model`. Exports `bound_content`, `BoundedContent`, `plan_bounding`,
`apply_preview`, `textual`, `plan_preview`, `PreviewPlan`, `marker_text`, `render_preview`
and the marker reserves (`MARKER_RESERVE_BYTES`, `MARKER_RESERVE_LINES`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from sidecar.model.content import Content, ContentItem, ResourceContent, ResourceLink, TextContent
from sidecar.model.outcome import ManagedText
from sidecar.model.text import head_end, line_count, tail_start, utf8_length
from sidecar.model.tool import Bounds

MARKER_RESERVE_BYTES = 640
"""Bytes kept free for the marker and its blank lines (a marker is at most ~450 bytes)."""
MARKER_RESERVE_LINES = 4

Retain = Callable[[str], Awaitable[ManagedText]]


@dataclass(frozen=True, slots=True)
class PreviewPlan:
    """Where a text is cut. `head = text[:head_end]`, `tail = text[tail_start:]`."""

    total_bytes: int
    total_lines: int
    head_end: int
    tail_start: int
    omitted_bytes: int
    first_omitted_line: int
    last_omitted_line: int
    first_omitted_char: int = 0
    """Where the omission starts inside `first_omitted_line` (0: at its beginning)."""


def plan_preview(text: str, bounds: Bounds) -> PreviewPlan | None:
    """None when `text` is within bounds; else where to cut it so the preview fits."""
    if len(text) * 4 <= bounds.bytes_limit and len(text) <= bounds.lines_limit:
        return None  # fast path: even 4-byte characters, one per line, would fit
    total_bytes = utf8_length(text)
    total_lines = line_count(text)
    if total_bytes <= bounds.bytes_limit and total_lines <= bounds.lines_limit:
        return None
    budget_bytes = bounds.bytes_limit - MARKER_RESERVE_BYTES
    budget_lines = bounds.lines_limit - MARKER_RESERVE_LINES
    h_end = head_end(text, (budget_bytes + 1) // 2, (budget_lines + 1) // 2)
    t_start = max(tail_start(text, budget_bytes // 2, budget_lines // 2), h_end)
    kept = utf8_length(text[:h_end]) + utf8_length(text[t_start:])
    return PreviewPlan(
        total_bytes=total_bytes,
        total_lines=total_lines,
        head_end=h_end,
        tail_start=t_start,
        omitted_bytes=total_bytes - kept,
        first_omitted_line=text.count("\n", 0, h_end) + 1,
        last_omitted_line=text.count("\n", 0, t_start) + _partial_line(text, t_start),
        first_omitted_char=h_end - (text.rfind("\n", 0, h_end) + 1),
    )


def _partial_line(text: str, start: int) -> int:
    """1 when `start` falls inside a line (that line is partly omitted), else 0."""
    return 1 if start and text[start - 1] != "\n" else 0


def marker_text(plan: PreviewPlan, ref: str) -> str:
    """The omission marker. When the cut falls inside a line, reading on starts at that
    character of that line (`start`), so the middle of a long line is reachable."""
    if plan.first_omitted_char:
        where = (f", from character {plan.first_omitted_char:,} of line "
                 f"{plan.first_omitted_line:,}")
        read_on = (f'managed_read(ref="{ref}", offset={plan.first_omitted_line}, '
                   f"start={plan.first_omitted_char})")
    else:
        where = ""
        read_on = f'managed_read(ref="{ref}", offset={plan.first_omitted_line}, limit=200)'
    return (
        f"[... {plan.omitted_bytes:,} bytes omitted here (lines {plan.first_omitted_line:,}"
        f"-{plan.last_omitted_line:,} of {plan.total_lines:,}{where}). The full text "
        f"({plan.total_bytes:,} bytes) is kept as {ref}: read on with {read_on} or search "
        f'it with managed_read(ref="{ref}", pattern="<regex>") ...]'
    )


def render_preview(text: str, plan: PreviewPlan, ref: str) -> str:
    head = text[: plan.head_end]
    tail = text[plan.tail_start :]
    head_sep = "\n" if head.endswith("\n") or not head else "\n\n"
    return f"{head}{head_sep}{marker_text(plan, ref)}\n\n{tail}"


@dataclass(frozen=True, slots=True)
class BoundedContent:
    content: Content
    retained: ManagedText | None


def textual(item: ContentItem) -> str | None:
    """The text a model reads for `item` when it is measured (see `bound_content`), or
    None for media. An embedded text resource reads as a `[resource: uri, mime]` line and its
    text; a link as one `[resource link: ...]` line (the forms providers are given)."""
    if isinstance(item, TextContent):
        return item.text
    if isinstance(item, ResourceContent):
        if item.text is None:
            return None
        kind = f", {item.mime_type}" if item.mime_type else ""
        return f"[resource: {item.uri}{kind}]\n{item.text}"
    if isinstance(item, ResourceLink):
        fields = [item.uri] + [
            f"{label}: {value}" for label, value in
            (("name", item.name), ("type", item.mime_type), ("description", item.description))
            if value
        ]
        return f"[resource link: {'; '.join(fields)}]"
    return None


def plan_bounding(content: Content, bounds: Bounds) -> tuple[str, PreviewPlan] | None:
    """None when the measured items of `content` fit; else their joined text and the plan."""
    if len(content) == 1 and type(only := content[0]) is TextContent:  # most results: one text
        plan = plan_preview(only.text, bounds)
        return None if plan is None else (only.text, plan)
    texts = [text for item in content if (text := textual(item)) is not None]
    if not texts:
        return None
    joined = texts[0] if len(texts) == 1 else "\n".join(texts)
    plan = plan_preview(joined, bounds)
    return None if plan is None else (joined, plan)


def apply_preview(content: Content, joined: str, plan: PreviewPlan, ref: str) -> Content:
    """`content` with its measured items replaced by one preview at the first one's place."""
    preview: TextContent | None = TextContent(render_preview(joined, plan, ref))
    bounded: list[ContentItem] = []
    for item in content:
        if textual(item) is None:
            bounded.append(item)
        elif preview is not None:
            bounded.append(preview)
            preview = None
    return tuple(bounded)


async def bound_content(content: Content, bounds: Bounds, retain: Retain) -> BoundedContent:
    """Bound the text items of `content`.

    What a model reads as text is measured: `text` items, embedded *text* resources (a 5 MB
    embedded file is 5 MB of text to a model) and resource links (each is a line of text to
    a model; a result of ten thousand links is long). Media (images, audio, embedded blobs)
    pass unchanged under their producer's own limit. These items are measured together, each
    as its text form (`textual`), joined by `\\n`. When they exceed `max_bytes` (UTF-8) or
    `max_lines`, the joined text is retained whole through `retain` (the managed store), and
    they are replaced by one preview item, at the place of the first of them: `head`, a
    marker, `tail`. (Within the bounds, every item is kept as it is.) The marker says how
    much was omitted, where the omission sits in line numbers, the managed reference, and
    how to read the rest with `managed_read`. An error of `retain` propagates.
    """
    planned = plan_bounding(content, bounds)
    if planned is None:
        return BoundedContent(content, None)
    joined, plan = planned
    retained = await retain(joined)
    return BoundedContent(apply_preview(content, joined, plan, retained.ref), retained)
