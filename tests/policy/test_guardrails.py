"""`sidecar.policy.guardrails` in a real Location (in process, Python tools with pydantic codecs,
the real managed store): nothing is wrapped without a guardrail; inputs, structured outputs,
oversized text kept in the managed store and tool failures are redacted; a redaction that
breaks the output schema fails `guardrail`; levels merge key by key."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import pytest
from pydantic import BaseModel, Field

from sidecar import Location, Tool, ToolContext, ToolFailure, ToolResponse
from sidecar.policy.guardrails import Guardrails, GuardrailSettings
from sidecar.registry.registry import Entry

pytestmark = pytest.mark.anyio
KEY = "AKIAIOSFODNN7EXAMPLE"
MARK = "[redacted: AWS Access Key]"


class Text(BaseModel):
    text: str


class Key(BaseModel):
    key: str


class StrictKey(BaseModel):
    key: Annotated[str, Field(pattern="^AKIA")]


def tools(seen: list[str]) -> dict[str, Tool]:
    async def remember(value: Text, ctx: Any) -> ToolResponse:
        seen.append(value.text)
        return ToolResponse(content="ok")

    async def leak(value: Text, ctx: Any) -> Key:
        return Key(key=f"{value.text} {KEY}")

    async def strict(value: Text, ctx: Any) -> StrictKey:
        return StrictKey(key=KEY)

    async def big(value: Text, ctx: Any) -> ToolResponse:
        filler = "line of text\n" * 10_000
        return ToolResponse(content=f"{filler}key {KEY}\n{filler}")

    async def fail(value: Text, ctx: Any) -> None:
        raise ToolFailure(f"could not log in with {KEY}")

    return {
        "remember": Tool(description="r", input=Text, execute=remember),
        "leak": Tool(description="l", input=Text, output=Key, execute=leak),
        "strict": Tool(description="s", input=Text, output=StrictKey, execute=strict),
        "big": Tool(description="b", input=Text, execute=big),
        "fail": Tool(description="f", input=Text, execute=fail),
    }


def ctx(call_id: str) -> ToolContext:
    return ToolContext("s", "a", "m", call_id)


async def test_without_a_guardrail_nothing_is_wrapped(tmp_path: Path) -> None:
    async with Location.open(tmp_path, state_dir=tmp_path / "s") as location:
        async with location.tools.register(tools([])):
            registered = location.registry.effective()["leak"].tool
            assert location.snapshot().entry("leak").tool is registered  # type: ignore[union-attr]
            location.guardrails.set({}, {}, {"other": {"secrets": "block"}}, {})
            location.profiles.changed()
            assert location.snapshot().entry("leak").tool is registered  # type: ignore[union-attr]


async def test_inputs_outputs_kept_text_and_failures_are_redacted(tmp_path: Path) -> None:
    seen: list[str] = []
    async with Location.open(tmp_path, state_dir=tmp_path / "s") as location:
        location.guardrails.set({"secrets": "redact"}, {}, {}, {})
        location.profiles.changed()
        async with location.tools.register(tools(seen)):
            snapshot = location.snapshot()
            done = await snapshot.execute("remember", {"text": f"my {KEY}"}, ctx("c1"))
            assert done.status == "completed" and seen == [f"my {MARK}"]
            leak = await snapshot.execute("leak", {"text": "k"}, ctx("c2"))
            assert leak.output == {"key": f"k {MARK}"}
            assert KEY not in leak.content[0].text  # type: ignore[union-attr]
            big = await snapshot.execute("big", {"text": "b"}, ctx("c3"))
            [kept] = big.managed
            found = await location.seam.store.grep(kept.ref, "key ")
            assert [m.text for m in found.matches] == [f"key {MARK}"]
            assert not (await location.seam.store.grep(kept.ref, "AKIA")).matches
            fail = await snapshot.execute("fail", {"text": "f"}, ctx("c4"))
            assert fail.error is not None and fail.error.message == f"could not log in with {MARK}"
            strict = await snapshot.execute("strict", {"text": "s"}, ctx("c5"))
            assert strict.error is not None and strict.error.kind.value == "guardrail"
            assert strict.error.message.startswith(
                "Guardrail changed the output of strict, and the changed output does not fit "
                "its schema")


def test_levels_merge_key_by_key_the_most_specific_winning() -> None:
    rails = Guardrails()
    rails.set({"secrets": "redact", "hook": "http://127.0.0.1:1/g"},
              {"strict": {"secrets": "block"}}, {"git": {"secrets": "off"}},
              {"weather": {"on_error": "allow"}})
    tool = Tool(description="t", input=Text, execute=lambda v, c: None)  # type: ignore[arg-type,return-value]

    def entry(origin: str, key: str = "t") -> Entry:
        return Entry(tool, key, None, origin)  # type: ignore[arg-type]

    assert rails.settings_for("default", entry("builtin")) == GuardrailSettings(
        secrets="redact", hook="http://127.0.0.1:1/g")
    assert rails.settings_for("strict", entry("mcp:files")).secrets == "block"
    assert rails.settings_for("strict", entry("mcp:git")).secrets == "off"
    weather = rails.settings_for("strict", entry("manifest-tools", "weather"))
    assert (weather.secrets, weather.on_error) == ("block", "allow")
