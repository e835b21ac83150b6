"""Bounding: hypothesis properties of the preview, plus the content-level rules."""

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sidecar.execution.bounding import (
    bound_content,
    marker_text,
    plan_preview,
    render_preview,
)
from sidecar.model.content import ImageContent, TextContent
from sidecar.model.outcome import ManagedText
from sidecar.model.text import line_count, utf8_length
from sidecar.model.tool import Bounds

REF = "m_" + "a" * 26
# Texts rich in newlines and multi-byte characters, long enough to cross small bounds.
line = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=300)
texts = st.lists(line, max_size=400).map("\n".join) | st.text(
    alphabet=st.characters(blacklist_categories=("Cs",)), min_size=0, max_size=6000
)
bounds = st.builds(
    Bounds,
    max_bytes=st.integers(min_value=1024, max_value=8192),
    max_lines=st.integers(min_value=16, max_value=200),
)


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(texts, bounds)
def test_preview_properties(text, limits):
    plan = plan_preview(text, limits)
    within = utf8_length(text) <= limits.bytes_limit and line_count(text) <= limits.lines_limit
    assert (plan is None) == within  # a marker iff truncated
    if plan is None:
        return
    preview = render_preview(text, plan, REF)
    head, tail = text[: plan.head_end], text[plan.tail_start :]
    assert text.startswith(head) and text.endswith(tail)
    assert plan.head_end <= plan.tail_start
    assert marker_text(plan, REF) in preview
    assert preview.startswith(head) and preview.endswith(tail)
    assert utf8_length(preview) <= limits.bytes_limit
    assert line_count(preview) <= limits.lines_limit
    # UTF-8 safe: the preview encodes (no half characters were produced by byte cuts)
    preview.encode("utf-8")
    assert plan.omitted_bytes == utf8_length(text) - utf8_length(head) - utf8_length(tail)
    assert plan.total_bytes == utf8_length(text)


def test_marker_states_what_was_omitted_and_how_to_read_it():
    text = "".join(f"line {i}\n" for i in range(1, 10001))
    plan = plan_preview(text, Bounds(4096, 100))
    assert plan is not None
    marker = marker_text(plan, REF)
    assert f"{plan.omitted_bytes:,} bytes omitted" in marker
    assert f"of {line_count(text):,})" in marker
    assert f'managed_read(ref="{REF}", offset={plan.first_omitted_line}' in marker
    preview = render_preview(text, plan, REF)
    # whole lines: the head ends at a line break and the tail starts at one
    assert text[: plan.head_end].endswith("\n")
    assert text[plan.tail_start - 1] == "\n"
    first_hidden = text.splitlines()[plan.first_omitted_line - 1]
    assert first_hidden not in preview.split("[...")[0]


def test_when_lines_cut_first_the_tail_keeps_its_full_line_budget():
    # Short lines: the line limit binds, not the byte limit; head and tail get half each.
    text = "".join(f"{i}\n" for i in range(10_000))
    plan = plan_preview(text, Bounds(50 * 1024, 100))
    assert plan is not None
    tail = text[plan.tail_start :]
    head = text[: plan.head_end]
    assert line_count(tail) == (100 - 4) // 2 == line_count(head)
    assert tail.endswith("9999\n")


def test_one_giant_line_is_cut_inside_the_line_without_splitting_characters():
    text = "é" * 100_000  # 200,000 bytes, one line
    plan = plan_preview(text, Bounds(2048, 100))
    assert plan is not None
    preview = render_preview(text, plan, REF)
    assert utf8_length(preview) <= 2048
    assert plan.first_omitted_line == plan.last_omitted_line == 1


class FakeRetainer:
    def __init__(self):
        self.texts = []

    async def __call__(self, text):
        self.texts.append(text)
        return ManagedText(ref=REF, size_bytes=utf8_length(text), lines=line_count(text))


@pytest.mark.anyio
async def test_small_content_is_untouched_and_nothing_is_retained():
    retain = FakeRetainer()
    content = (TextContent("hello"), ImageContent("aGk=", "image/png"))
    bounded = await bound_content(content, Bounds(), retain)
    assert bounded.content == content
    assert bounded.retained is None and retain.texts == []


@pytest.mark.anyio
async def test_text_items_are_measured_together_and_media_passes_unchanged():
    retain = FakeRetainer()
    image = ImageContent("x" * 200_000, "image/png")  # media is never measured
    parts = ["a" * 30_000, "b" * 30_000]
    content = (TextContent(parts[0]), image, TextContent(parts[1]))
    bounded = await bound_content(content, Bounds(50 * 1024, 2000), retain)
    assert retain.texts == ["\n".join(parts)]  # retained whole, byte-identical
    assert bounded.retained is not None and bounded.retained.ref == REF
    assert len(bounded.content) == 2
    preview, kept_image = bounded.content
    assert isinstance(preview, TextContent) and REF in preview.text
    assert kept_image is image
    assert utf8_length(preview.text) <= 50 * 1024


@pytest.mark.anyio
async def test_media_only_content_is_fine():
    retain = FakeRetainer()
    content = (ImageContent("x" * 100_000, "image/png"),)
    bounded = await bound_content(content, Bounds(), retain)
    assert bounded.content == content and retain.texts == []
