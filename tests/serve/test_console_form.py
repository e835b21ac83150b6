"""The console's tool form (`sidecar.serve.console.tool_form`) and its metrics ring
(`minute_ring`), without a browser: which field each schema gets, what a submitted form means,
and the per-minute numbers the plots are drawn from."""

from __future__ import annotations

from typing import Any

import pytest

from sidecar.model.errors import CallError, ErrorKind
from sidecar.model.outcome import Outcome
from sidecar.serve.console.charts import line_chart
from sidecar.serve.console.minute_ring import MINUTES, MinuteRing, quantile
from sidecar.serve.console.tool_form import FormProblem, form_input, schema_fields

SCHEMA: dict[str, Any] = {
    "type": "object", "required": ["city", "days"],
    "properties": {
        "city": {"type": "string", "description": "Where"},
        "days": {"type": "integer", "default": 3},
        "scale": {"type": ["number", "null"]},
        "metric": {"type": "boolean", "default": True},
        "unit": {"enum": ["c", "f", 1]},
        "hours": {"type": "array", "items": {"type": "integer"}},
        "where": {"type": "object", "properties": {"lat": {"type": "number"}}},
        "any": {"anyOf": [{"type": "string"}, {"type": "object"}]},
    },
}


def test_each_property_gets_its_field_with_marks_and_defaults() -> None:
    html = schema_fields(SCHEMA)
    assert html.count('aria-required="true"') == 2 and html.count("abbr class=req") == 2
    assert 'type=number step="1" name="f:/days" value="3"' in html
    assert 'name="f:/scale"' in html and 'step="any"' in html
    assert '<option value="true" selected>true</option>' in html  # the boolean's default
    assert '<option value="1">1</option>' in html  # an enum keeps its values' types
    assert "<legend>where</legend>" in html and 'name="f:/where/lat"' in html
    assert "one value per line" in html and 'textarea id="f-2fany"' in html
    assert schema_fields({"type": "object"}) == ""  # nothing to make fields of: raw JSON


def test_a_submitted_form_means_typed_json_and_leaves_out_empty_fields() -> None:
    form = {"f:/city": "Oslo", "f:/days": "5", "f:/scale": "1.5", "f:/metric": "false",
            "f:/unit": "1", "f:/hours": "6\n\n18\n", "f:/where/lat": "59.9",
            "f:/any": '{"k": [1]}'}
    assert form_input(SCHEMA, form) == {
        "city": "Oslo", "days": 5, "scale": 1.5, "metric": False, "unit": 1, "hours": [6, 18],
        "where": {"lat": 59.9}, "any": {"k": [1]}}
    assert form_input(SCHEMA, {"f:/city": "", "f:/days": "", "f:/unit": ""}) == {"city": ""}
    assert form_input(SCHEMA, {"raw": '{"x": 1}', "f:/city": "ignored"}) == {"x": 1}


@pytest.mark.parametrize(("field", "text", "said"), [
    ("f:/days", "2.5", "days: '2.5' is not a whole number"),
    ("f:/hours", "6\nnoon", "hours: 'noon' is not a whole number"),
    ("f:/any", "{", "any: '{' is not JSON"),
    ("raw", "[1,", "raw JSON input: "),
])
def test_a_field_that_is_not_its_type_is_named(field: str, text: str, said: str) -> None:
    with pytest.raises(FormProblem, match=said.replace("[", r"\[").replace("{", r"\{")):
        form_input(SCHEMA, {field: text})


class Clock:
    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


def test_the_ring_keeps_an_hour_of_minutes_and_their_quantiles() -> None:
    clock = Clock()
    ring = MinuteRing(clock)
    failed = Outcome.failed("c2", "slow", CallError(ErrorKind.TIMEOUT, "too slow"))
    for ms in (1, 2, 3, 4, 100):
        ring.observe(Outcome("c1", "fast", "completed"), ms / 1000)
    ring.observe(failed, 30.0)
    hour = ring.hour()
    assert len(hour) == MINUTES and hour[-1].calls == 6
    assert hour[-1].errors == {"timeout": 1}
    p50 = quantile(hour[-1].latency["fast"], 0.5)
    p99 = quantile(hour[-1].latency["fast"], 0.99)
    assert p50 is not None and 3 <= p50 <= 3 * 1.25 and p99 is not None and 100 <= p99 <= 125
    clock.now += 61 * 60  # an hour later: the old minute is gone, the hour is empty
    ring.observe(Outcome("c3", "fast", "completed"), 0.001)
    assert sum(m.calls for m in ring.hour()) == 1 and len(ring._minutes) <= MINUTES


def test_a_chart_is_an_svg_with_a_text_alternative_or_says_it_is_empty() -> None:
    minutes = [1_800_000_000 + 60 * i for i in range(60)]
    drawn = line_chart("Calls", minutes, [("all", [None] * 58 + [1.0, 2.0])], "calls/s", "c")
    assert 'role="img"' in drawn and "Latest: all: 2 calls/s" in drawn
    assert "<polyline" in drawn and "<td>2</td>" in drawn
    empty = line_chart("Calls", minutes, [("all", [None] * 60)], "calls/s", "c")
    assert "Nothing yet in the last hour." in empty and "<svg" not in empty
