"""Guardrails on what flows through a call (`Guardrails`, whose docstring holds the manifest
keys): secrets found in inputs, outputs and error messages are redacted or refused, and an
external guard (`sidecar.policy.guard_hook`) may allow, deny or replace either stage.

A guarded tool is a profile's entry wrapped like a rate limit (`reshape_profile`, a
`sidecar.registry.profiles` wrapper): only tools a guardrail applies to are wrapped, so with no
`[guardrails]` a call costs what it cost before. The wrapper runs before the seam bounds the
content, so the text the managed store keeps whole is the redacted text. Each decision is kept
for the call's history row (`attach`) and counted (`counts`, for `/metrics`).

Imports `sidecar.model`, `sidecar.registry`, `sidecar.stores` and its `sidecar.policy`
siblings. Exports `Guardrails`, `GuardrailSettings`, `DEFAULT_SCAN_LIMIT` and `THREAD_ABOVE`.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, Literal

from sidecar.model.content import (
    Content,
    ContentItem,
    ResourceContent,
    TextContent,
    content_from_json,
    content_from_output,
    content_to_json,
)
from sidecar.model.errors import CodecError, ErrorKind, ToolFailure
from sidecar.model.tool import CallContext, Tool, ToolResponse, tool_with
from sidecar.policy.guard_hook import GuardHook, HookError, Verdict
from sidecar.policy.secret_scan import ScanBudget, SecretScanner, redact_json, redact_text
from sidecar.registry.registry import Entry
from sidecar.stores.call_history import AuditSettings, CallRecord

DEFAULT_SCAN_LIMIT = 4 * 1024 * 1024
"""Characters scanned for secrets per stage of a call (input; output, content and error);
the rest passes unscanned and the history row says how much (`unscanned_chars`)."""
THREAD_ABOVE = 64 * 1024
"""Characters above which a scan runs in a worker thread, off the event loop."""
MAX_KEPT_CALLS = 4096
"""Calls whose decisions wait for their history row (the oldest are dropped past that)."""

Stage = Literal["input", "output"]
Layer = Mapping[str, Any]
"""The keys one level of the manifests sets (the top level, a profile, a server, a tool)."""


@dataclass(frozen=True, slots=True)
class GuardrailSettings:
    """What applies to one tool in one profile, merged key by key (most specific wins)."""

    secrets: Literal["off", "redact", "block"] = "off"
    entropy: bool = True
    hook: str | None = None
    timeout: float = 5.0
    on_error: Literal["deny", "allow"] = "deny"
    scan_limit: int = DEFAULT_SCAN_LIMIT

    @property
    def active(self) -> bool:
        return self.secrets != "off" or self.hook is not None


class Guardrails:
    """The guardrails of a Location: `set` them from the manifests; `reshape_profile` wraps
    the tools they apply to.

        [guardrails]                     # every tool; [profiles.NAME.guardrails] for a profile,
        secrets = "redact"               # [mcpServers.KEY.guardrails] / [tools.KEY.guardrails]
        entropy = true                   # high-entropy strings too (off: named kinds only)
        hook = "http://127.0.0.1:9100/guard"
        timeout = 5                      # seconds per hook request
        on_error = "deny"                # the hook failed: refuse (default) or let through
        scan_limit = 4194304             # characters scanned per stage of a call

    Levels merge key by key: the top level, then the profile, then the server or tool entry.
    `secrets = "redact"` replaces each secret by `[redacted: KIND]`; `"block"` fails the call
    with error kind `guardrail` naming the rule. Inputs are checked before the tool runs (an
    upstream never sees a refused or redacted secret), outputs before the seam bounds them.
    """

    def __init__(self) -> None:
        self.top: Layer = {}
        self.profiles: Mapping[str, Layer] = {}
        self.servers: Mapping[str, Layer] = {}
        self.tools: Mapping[str, Layer] = {}
        self.configured = False
        """Whether any level sets a guardrail (else no tool is wrapped)."""
        self.counts: dict[tuple[str, str, str], int] = {}
        """(stage, decision, rule) -> decisions since start (`/metrics`)."""
        self.hook = GuardHook()
        self._notes: OrderedDict[str, _Notes] = OrderedDict()

    def set(self, top: Layer, profiles: Mapping[str, Layer], servers: Mapping[str, Layer],
            tools: Mapping[str, Layer]) -> None:
        """Swap the configured levels (the caller then recomputes the profiles' entries)."""
        self.top, self.profiles = dict(top), dict(profiles)
        self.servers, self.tools = dict(servers), dict(tools)
        self.configured = bool(self.top or self.profiles or self.servers or self.tools)

    def settings_for(self, profile: str, entry: Entry) -> GuardrailSettings:
        merged = {**self.top, **self.profiles.get(profile, {})}
        if entry.origin.startswith("mcp:"):
            merged.update(self.servers.get(entry.origin[4:], {}))
        elif entry.origin == "manifest-tools":
            merged.update(self.tools.get(entry.key, {}))
        return GuardrailSettings(**merged)

    def reshape_profile(self, profile: str, entries: Mapping[str, Entry]) -> Mapping[str, Entry]:
        """The `Profiles` wrapper: each entry a guardrail applies to, guarded."""
        if not self.configured:
            return entries
        served: dict[str, Entry] = {}
        for name, entry in entries.items():
            settings = self.settings_for(profile, entry)
            served[name] = entry if not settings.active else Entry(
                self._guarded(entry.tool, name, profile, settings), entry.key,
                entry.definition, entry.origin)
        return served

    def _guarded(self, tool: Tool, name: str, profile: str, settings: GuardrailSettings) -> Tool:
        inner = tool.execute
        scanner = SecretScanner(entropy=settings.entropy)

        async def execute(value: Any, ctx: CallContext) -> Any:
            guard = _Guard(self, settings, scanner, tool, name, profile, ctx.call_id)
            value = await guard.input(value)
            try:
                result = await inner(value, ctx)
            except ToolFailure as failure:
                raise await guard.failure(failure) from None
            return await guard.output(result)

        return tool_with(tool, execute=execute)

    def _notes_of(self, call_id: str) -> _Notes:
        notes = self._notes.get(call_id)
        if notes is None:
            notes = self._notes[call_id] = _Notes()
            while len(self._notes) > MAX_KEPT_CALLS:
                self._notes.popitem(last=False)
        return notes

    def note(self, call_id: str, stage: Stage, rule: str, decision: str,
             **detail: Any) -> None:
        key = (stage, decision, rule)
        self.counts[key] = self.counts.get(key, 0) + 1
        self._notes_of(call_id).decisions.append(
            {"stage": stage, "rule": rule, "decision": decision, **detail})

    def attach(self, record: CallRecord, audit: AuditSettings) -> CallRecord:
        """`record` with the decisions made for its call (a replay made none); when secrets
        were found in its input, the history keeps the redacted input (as `audit` says)."""
        notes = self._notes.pop(record.call_id, None)
        if notes is None or record.replayed:
            return record
        if notes.redacted is _UNSET or record.input is None:
            return replace(record, guardrail=tuple(notes.decisions))
        _, kept, kept_json = audit.keep_encoded(notes.redacted)
        return replace(record, guardrail=tuple(notes.decisions), input=kept,
                       input_json=kept_json)

    async def aclose(self) -> None:
        await self.hook.aclose()


_UNSET: Any = object()


class _Notes:
    """What the guardrails noted on one call, until its history row takes it."""

    __slots__ = ("decisions", "redacted")

    def __init__(self) -> None:
        self.decisions: list[dict[str, Any]] = []
        self.redacted: Any = _UNSET
        """The input with its secrets redacted (for the history), when it held any."""


class _Guard:
    """The guardrails of one call of one tool."""

    __slots__ = ("call_id", "name", "profile", "rails", "scanner", "settings", "tool")

    def __init__(self, rails: Guardrails, settings: GuardrailSettings, scanner: SecretScanner,
                 tool: Tool, name: str, profile: str, call_id: str) -> None:
        self.rails, self.settings, self.scanner = rails, settings, scanner
        self.tool, self.name, self.profile, self.call_id = tool, name, profile, call_id

    def _refuse(self, stage: Stage, rule: str, decision: str, message: str,
                **detail: Any) -> ToolFailure:
        self.rails.note(self.call_id, stage, rule, decision, **detail)
        return ToolFailure(message, kind=ErrorKind.GUARDRAIL)

    async def input(self, value: Any) -> Any:
        codec = self.tool.input
        try:
            args = codec.encode(value)
        except CodecError:
            args = value
        original = args
        if self.settings.secrets != "off":
            args, budget = await self._scan(lambda b: redact_json(args, self.scanner, b), args)
            if budget.kinds:
                self.rails._notes_of(self.call_id).redacted = args
            self._secrets("input", budget, f"{self.name} was not run; call it again without "
                          "the secret")
        if self.settings.hook is not None:
            verdict = await self._ask("input", args)
            if verdict is not None and verdict.decision == "replace":
                args = verdict.content
        if args is original:
            return value
        try:
            return codec.decode(args)
        except CodecError as exc:
            raise ToolFailure(
                f"Guardrail changed the input of {self.name}, and the changed input does not fit "
                f"its schema ({exc.message}); {self.name} was not run.",
                kind=ErrorKind.GUARDRAIL) from None

    async def output(self, result: Any) -> Any:
        if isinstance(result, ToolResponse):
            value, content, metadata = result.output, result.content, result.metadata
        else:
            value, content, metadata = result, None, None
        codec = self.tool.output
        try:
            encoded = codec.encode(value) if codec is not None else None
            items = content_from_json(content) if content is not None else None
        except CodecError:
            return result  # the seam fails it `invalid_output`, as without guardrails
        new_encoded, new_items, new_meta = encoded, items, metadata
        if self.settings.secrets != "off":
            def scan(budget: ScanBudget) -> tuple[Any, Content | None, Any]:
                return (redact_json(encoded, self.scanner, budget),
                        None if items is None else _redact_items(items, self.scanner, budget),
                        redact_json(metadata, self.scanner, budget))
            (new_encoded, new_items, new_meta), budget = await self._scan(
                scan, (encoded, [_text(i) for i in items or ()]))
            self._secrets("output", budget, "none of it is shown")
        if self.settings.hook is not None:
            shown = new_items if new_items is not None else content_from_output(new_encoded)
            extra = {"output": new_encoded} if codec is not None else {}
            verdict = await self._ask("output", content_to_json(shown), **extra)
            if verdict is not None and verdict.decision == "replace":
                new_items, new_encoded = self._replaced(verdict, new_encoded)
        if new_encoded is encoded and new_items is items and new_meta is metadata:
            return result
        if new_encoded is not encoded and codec is not None:
            try:
                value = codec.decode(new_encoded)
            except CodecError as exc:
                raise ToolFailure(
                    f"Guardrail changed the output of {self.name}, and the changed output does "
                    f"not fit its schema ({exc.message}); none of it is shown.",
                    kind=ErrorKind.GUARDRAIL) from None
        return ToolResponse(output=value, content=new_items, metadata=new_meta)

    def _replaced(self, verdict: Verdict, encoded: Any) -> tuple[Content, Any]:
        try:
            items = content_from_json(verdict.content)
        except CodecError as exc:
            raise self._refuse("output", "hook", "error_deny",
                               f"Guardrail \"hook\" replaced the output of {self.name} with "
                               f"content that is not valid ({exc}); none of it is shown.",
                               error="invalid replacement content") from None
        if verdict.has_output:
            return items, verdict.output
        if self.tool.output is not None:
            raise self._refuse("output", "hook", "error_deny",
                               f"Guardrail \"hook\" replaced the output of {self.name} without "
                               f"a structured \"output\", which {self.name} declares; none of "
                               "it is shown.", error="replacement without output")
        return items, encoded

    async def failure(self, failure: ToolFailure) -> ToolFailure:
        """A tool's own error message, scanned like its output."""
        if self.settings.secrets == "off":
            return failure
        text, budget = await self._scan(
            lambda b: redact_text(failure.message, self.scanner, b), failure.message)
        self._secrets("output", budget, "its error message is not shown")
        if text is failure.message:
            return failure
        return ToolFailure(text, failure.metadata, kind=failure.kind)

    async def _scan(self, work: Any, sample: Any) -> tuple[Any, ScanBudget]:
        budget = ScanBudget(self.settings.scan_limit)
        if _size(sample, THREAD_ABOVE) > THREAD_ABOVE:
            return await asyncio.to_thread(work, budget), budget
        return work(budget), budget

    def _secrets(self, stage: Stage, budget: ScanBudget, consequence: str) -> None:
        """Record the scan's decision; raise for `block` when a secret was found."""
        detail: dict[str, Any] = {}
        if budget.unscanned:
            detail["unscanned_chars"] = budget.unscanned
        if not budget.kinds:
            self.rails.note(self.call_id, stage, "secrets", "allow", **detail)
            return
        kinds = sorted(set(budget.kinds))
        if self.settings.secrets == "block":
            held = "holds" if stage == "input" else "held"
            raise self._refuse(stage, "secrets", "block",
                               f"Guardrail \"secrets\" blocked the {stage} of {self.name}: it "
                               f"{held} a secret ({', '.join(kinds)}); {consequence}.",
                               kinds=kinds, **detail)
        self.rails.note(self.call_id, stage, "secrets", "redact", kinds=kinds,
                        count=len(budget.kinds), **detail)

    async def _ask(self, stage: Stage, content: Any, **extra: Any) -> Verdict | None:
        """The guard's verdict; a denial (or a failure under `on_error = "deny"`) raises."""
        url = self.settings.hook
        assert url is not None
        payload = {"stage": stage, "tool": self.name, "profile": self.profile,
                   "content": content, **extra}
        not_run = f"; {self.name} was not run" if stage == "input" else ""
        try:
            verdict = await self.rails.hook.ask(url, self.settings.timeout, payload)
        except HookError as exc:
            if self.settings.on_error == "allow":
                self.rails.note(self.call_id, stage, "hook", "error_allow", error=str(exc))
                return None
            raise self._refuse(stage, "hook", "error_deny",
                               f"Guardrail \"hook\" refused the {stage} of {self.name}: {exc}, "
                               f"and on_error is \"deny\"{not_run}.", error=str(exc)) from None
        if verdict.decision == "deny":
            raise self._refuse(stage, "hook", "deny",
                               f"Guardrail \"hook\" denied the {stage} of {self.name}: "
                               f"{verdict.reason}{not_run}.", reason=verdict.reason)
        self.rails.note(self.call_id, stage, "hook", verdict.decision)
        return verdict


def _text(item: ContentItem) -> str:
    if isinstance(item, TextContent):
        return item.text
    return item.text or "" if isinstance(item, ResourceContent) else ""


def _redact_items(items: Content, scanner: SecretScanner, budget: ScanBudget) -> Content:
    changed: list[ContentItem] = []
    for item in items:
        if isinstance(item, TextContent):
            text = redact_text(item.text, scanner, budget)
            changed.append(item if text is item.text else TextContent(text))
        elif isinstance(item, ResourceContent) and item.text is not None:
            text = redact_text(item.text, scanner, budget)
            changed.append(item if text is item.text else replace(item, text=text))
        else:
            changed.append(item)
    same = all(a is b for a, b in zip(changed, items, strict=True))
    return items if same else tuple(changed)


def _size(value: Any, enough: int) -> int:
    """The characters of the strings in `value`, counted until past `enough`."""
    if isinstance(value, str):
        return len(value)
    total = 0
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, list | tuple):
        for item in value:
            total += _size(item, enough - total)
            if total > enough:
                break
    return total
