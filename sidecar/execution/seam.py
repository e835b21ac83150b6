"""The execution seam: the one path every call takes, from admission to the durable outcome
(`Seam`; the steps are its docstring). It knows nothing of MCP, HTTP or how tools were
registered: it sees a snapshot's captured entries and a few services.

Imports `sidecar.model`, `sidecar.registry`, `sidecar.stores`, `managed_store` and the rest of
`sidecar.execution`. Exports `Seam` and `unknown_tool_error`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from managed_store import (
    ManagedStoreError,
    OwnerLimitExceeded,
    OwnerShareExceeded,
    RetentionError,
    TextStore,
)
from sidecar.execution import behind
from sidecar.execution.bounding import PreviewPlan, apply_preview, plan_bounding
from sidecar.execution.hooks import AfterCall, BeforeCall, Hooks
from sidecar.execution.unrecorded import OutcomeKept, Unrecorded
from sidecar.model import json_depth, tracing
from sidecar.model.codec import Codec
from sidecar.model.content import Content, TextContent, content_from_json, text_from_output
from sidecar.model.errors import (
    CallError,
    CallIdConflict,
    CodecError,
    ErrorKind,
    ToolFailure,
    new_error_id,
)
from sidecar.model.events import CallProgress, CallSettled, EventSink
from sidecar.model.metadata import DEFAULT_MAX_METADATA_BYTES, bound_metadata
from sidecar.model.outcome import ManagedText, Outcome
from sidecar.model.suggest import closest
from sidecar.model.text import scrub_surrogates
from sidecar.model.tool import DEFAULT_BOUNDS, Bounds, CallContext, ToolContext, ToolResponse
from sidecar.registry.registry import Entry, Resolver
from sidecar.stores.call_history import SettledCall
from sidecar.stores.errors import DatabaseUnavailable, database_failure
from sidecar.stores.outcome_log import OutcomeLog, OutcomeLogError, call_fingerprint, call_principal

log = logging.getLogger("sidecar.execution.seam")

_MAX_NAMES_IN_ERROR = 20


class _Failed(Exception):
    """Internal: a step ended the call with this error (never escapes the seam)."""

    def __init__(self, error: CallError, partial: dict[str, Any] | None = None) -> None:
        super().__init__(error.message)
        self.error = error
        self.partial = partial


def _not_kept(tool: str, call_id: str, exc: RetentionError) -> _Failed:
    """Oversized text the store could not keep (a full disk, the store quota): operational,
    never a lossy success, and the message says why (the store's own words name the cause,
    never a path)."""
    error_id = new_error_id()
    log.error("retaining the output of %s failed (call %s, error id %s): %s", tool, call_id,
              error_id, exc, exc_info=exc)
    message = (f"the output of {tool} could not be kept whole, so the call failed: {exc} "
               f"(error id {error_id})")
    return _Failed(CallError(ErrorKind.OPERATIONAL, message, error_id=error_id))


def _operational(what: str, tool: str, call_id: str, exc: BaseException) -> _Failed:
    error_id = new_error_id()
    log.error("%s (tool %s, call %s, error id %s)", what, tool, call_id, error_id, exc_info=exc)
    message = f"internal error in the sidecar while running {tool} (error id {error_id})"
    return _Failed(CallError(ErrorKind.OPERATIONAL, message, error_id=error_id))


@dataclass(slots=True)
class Seam:
    """Services every call goes through; one per Location.

        execute(snapshot, name, raw_input, context)
          0. admission: the snapshot resolves the name (its profile) and `admission` checks
             pass (a held pin), else the call is refused; a refused call never sees a replay
             or a join
          0'. a call_id already settled -> the stored outcome; one already in flight -> wait
             for it (only for the same call: another tool, input, session, agent, token or
             profile under a used id fails `conflict` and runs nothing); in flight here: the
             in-flight map, on another replica of a fleet: the outcome log's claim
             (`OutcomeLog.claim`)
          1. before hooks (repair name/input, or reject)
          2. resolve the captured tool (unknown / final step -> explicit model-visible error)
          3. decode input (invalid input never executes; the error names the JSON path)
          4. execute (CancelledError propagates; ToolFailure is model-visible; anything else
             is operational, logged with its traceback under an error id)
          5. encode + validate output        6. normalize content
          7. bound content (oversized text retained whole, or the call fails operationally)
          8. validate + bound metadata       9. after hooks, then normalize + bound again
         10. persist the terminal event, then return the outcome
         11. the history row and the metrics (`audit`, `observers`): before returning, or,
             inside `behind.answer_first`, once its answer is written
    """

    store: TextStore
    outcomes: OutcomeLog | None = None
    location: str = "default"
    bounds: Bounds = DEFAULT_BOUNDS
    metadata_max_bytes: int = DEFAULT_MAX_METADATA_BYTES
    hooks: Hooks = field(default_factory=Hooks)
    events: EventSink | None = None
    observers: list[Callable[[Outcome, float], None]] = field(default_factory=list)
    """Called with every executed outcome and its duration in seconds (metrics); inside a
    `behind.answer_first` block, once it ends."""
    limit_refusals: list[Callable[[str], None]] = field(default_factory=list)
    """Called with the owner (`user:NAME`) whose own managed-store limit refused a call's
    output (`OwnerLimitExceeded`: `[auth.quotas] store_bytes`; the quota book counts it)."""
    audit: Callable[[SettledCall], None] | None = None
    """Called with every settled or replayed call once it is recorded (the call history); inside
    a `behind.answer_first` block, once it ends (after the answer)."""
    _inflight: dict[str, _InFlight] = field(default_factory=dict)
    """call_id -> the call running under it (duplicate callers wait for it)."""
    unrecorded: Unrecorded = field(default_factory=Unrecorded)
    """Outcomes run while the fleet database did not answer, recorded once it is back."""
    admission: list[Callable[[Entry], CallError | None]] = field(default_factory=list)
    """Checks a resolved entry passes before a call is replayed, joined or run (a held pin
    refuses a definition an older snapshot still captured)."""
    unserved: list[Callable[[str], CallError | None]] = field(default_factory=list)
    """Why a name the snapshot does not serve is missing, when something knows better than
    `unknown_tool` (a definition withdrawn until approved)."""

    async def execute(
        self, snapshot: Resolver, name: str, raw_input: Any, context: ToolContext
    ) -> Outcome:
        call_id = context.call_id
        # admission first (before hooks may repair the name: then it follows them)
        admitted = None if self.hooks.before else self._admitted(snapshot, name)
        fingerprint: str | None = None
        while (inflight := self._inflight.get(call_id)) is not None:
            if fingerprint is None:
                fingerprint = _fingerprint(name, raw_input, context, snapshot)
            if inflight.fingerprint() != fingerprint:
                return _conflict(call_id, name)
            waiter: asyncio.Future[Outcome | None] = asyncio.get_running_loop().create_future()
            inflight.waiters.append(waiter)
            settled = await waiter
            if settled is not None:
                return settled
            # the first attempt was cancelled and recorded nothing: run it ourselves
        waiters: list[asyncio.Future[Outcome | None]] = []
        running = self._inflight[call_id] = _InFlight(
            name, raw_input, context, snapshot, admitted, fingerprint, waiters)
        outcome: Outcome | None = None
        started = time.perf_counter()
        try:
            if tracing.enabled():
                outcome = await self._traced(snapshot, name, raw_input, context, running)
            elif self.outcomes is None:  # nothing to claim or record: `_run` in short
                outcome = await self._settle(snapshot, name, raw_input, context, admitted)
                self._publish(outcome, started)
            else:
                outcome = await self._run(snapshot, name, raw_input, context, running)
        except OutcomeKept as kept:  # it ran: its history row now, its outcome once recorded
            self._audit(snapshot, name, raw_input, context, kept.outcome, started)
            raise
        else:
            self._audit(snapshot, name, raw_input, context, outcome, started)
            return outcome
        finally:
            del self._inflight[call_id]
            for waiter in waiters:
                if not waiter.done():
                    waiter.set_result(outcome)

    def _admitted(self, snapshot: Resolver, name: str) -> Entry | CallError:
        """Admission: the snapshot's entry for `name`, or the error a call on it gets before
        anything else happens (not in the snapshot's profile, a final step, a definition held
        since the snapshot)."""
        entry = snapshot.resolve(name)
        if isinstance(entry, CallError):
            if entry.kind is ErrorKind.UNKNOWN_TOOL:
                for why in self.unserved:
                    if (known := why(name)) is not None:
                        return known
            return entry
        for check in self.admission:
            refused = check(entry)
            if refused is not None:
                return refused
        return entry

    def _audit(self, snapshot: Resolver, name: str, raw_input: Any, context: ToolContext,
               outcome: Outcome, started: float) -> None:
        if self.audit is not None:
            took = time.perf_counter() - started
            settled = SettledCall(name, raw_input, context, outcome, time.time() - took, took,
                                  outcome.replayed, getattr(snapshot, "profile", None))
            behind.after_answer(self.audit, settled)

    async def _traced(
        self, snapshot: Resolver, name: str, raw_input: Any, context: ToolContext,
        running: _InFlight,
    ) -> Outcome:
        """`_run` inside the call's span (see `sidecar.model.tracing`)."""
        with tracing.tracer().start_as_current_span(f"execute_tool {name}", attributes={
            "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": name,
            "gen_ai.tool.call.id": context.call_id, "mcp.method.name": "tools/call",
            "mcp.session.id": context.session_id, "sidecar.agent": context.agent,
            "sidecar.location": self.location, "sidecar.bytes_in": _input_bytes(raw_input),
        }) as span:
            outcome = await self._run(snapshot, name, raw_input, context, running)
            tracing.describe_outcome(span, outcome)
            return outcome

    async def _run(
        self, snapshot: Resolver, name: str, raw_input: Any, context: ToolContext,
        running: _InFlight,
    ) -> Outcome:
        admitted = running.admitted
        refused = admitted if isinstance(admitted, CallError) else None
        if self.outcomes is None:
            started = time.perf_counter()
            outcome = await self._settle(snapshot, name, raw_input, context, admitted)
            self._publish(outcome, started)
            return outcome
        fingerprint = running.fingerprint()
        try:  # the stored outcome, or the claim to run it (waits for another replica's run)
            stored = await self.outcomes.claim(self.location, context.call_id, fingerprint,
                                               name)
        except CallIdConflict:
            return _conflict(context.call_id, name) if refused is None \
                else _refusal(context.call_id, name, refused)
        except OutcomeLogError as exc:
            if database_failure(exc) is not None:  # the fleet database: the tool did not run
                raise DatabaseUnavailable(
                    f"call {context.call_id!r} could not be claimed, so {name} did not run; "
                    "retry with the same call id once the database is back") from exc
            failed = _operational("reading the outcome log failed", name, context.call_id, exc)
            return Outcome.failed(context.call_id, name, failed.error)
        if stored is not None:  # replayed only to a caller admitted now
            return stored if refused is None else _refusal(context.call_id, name, refused)
        recorded = False
        try:
            started = time.perf_counter()
            outcome = await self._settle(snapshot, name, raw_input, context, admitted)
            self._publish(outcome, started)
            with tracing.step("record_outcome"):
                stored = await self.outcomes.record(self.location, outcome, context, fingerprint)
            recorded = True  # recording dropped the claim
            return stored
        except CallIdConflict:  # settled meanwhile by another process's different call
            return _conflict(context.call_id, name)
        except OutcomeLogError as exc:
            if database_failure(exc) is not None:  # kept, recorded once the database is back
                self.unrecorded.keep(self.outcomes, self.location, outcome, context,
                                     fingerprint)
                recorded = True  # the claim stays held for the kept outcome
                raise OutcomeKept(outcome, context.call_id) from exc
            failed = _operational("persisting the outcome failed", name, context.call_id, exc)
            return Outcome.failed(context.call_id, outcome.tool, failed.error)
        finally:
            if not recorded:  # cancelled, or not recorded: a duplicate may run the call now
                await self.outcomes.release(self.location, context.call_id)

    def _publish(self, outcome: Outcome, started: float) -> None:
        """A settled call to the observers (with its time since `started`) and as an event."""
        if self.observers:
            elapsed = time.perf_counter() - started
            for observe in self.observers:
                behind.after_answer(observe, outcome, elapsed)
        if self.events is not None and self.events.active:
            kind = outcome.error.kind.value if outcome.error is not None else None
            self.events.publish(CallSettled(outcome.call_id, outcome.tool, outcome.status, kind))

    async def _settle(
        self, snapshot: Resolver, name: str, raw_input: Any, context: ToolContext,
        admitted: Entry | CallError | None,
    ) -> Outcome:
        """Steps 3-9 for an admitted call (`admitted`: its entry, or admission's error; None
        when before hooks run first: then the name they leave is admitted here). The tool is
        awaited here, not through a coroutine of its own (each level cost a call ~0.3 µs,
        2026-12-07); the store only for a text over its bounds (`_bounded`)."""
        call_id = context.call_id
        if self.hooks.before:
            try:
                call = await self._before(BeforeCall(name, raw_input, context))
            except _Failed as failed:
                return Outcome.failed(call_id, name, failed.error)
            name, raw_input = call.name, call.input
            admitted = self._admitted(snapshot, name)  # admitted as repaired
        try:
            if isinstance(admitted, CallError):  # not admitted: the id's outcome is the refusal
                raise _Failed(admitted)
            assert admitted is not None
            tool = admitted.tool
            bounds = tool.bounds.over(self.bounds) if tool.bounds else self.bounds
            traced = tracing.enabled()
            if traced:  # (a no-op `with` still costs a call its enter and exit)
                with tracing.step("validate_input"):
                    value = _decode(tool.input, raw_input, name)
            else:
                value = _decode(tool.input, raw_input, name)
            ctx = CallContext(context, name, self._publish_progress)
            try:
                result = await tool.execute(value, ctx)
            except Exception as exc:
                raise self._tool_failed(exc, ctx) from None
            outcome = self._completed(tool, result, ctx)
            if traced:
                with tracing.step("bound_content"):
                    outcome = await self._bounded(outcome, bounds, ctx.runner)
            elif (planned := plan_bounding(outcome.content, bounds)) is not None:
                outcome = await self._retained(outcome, planned, ctx.runner)
        except _Failed as failed:
            outcome = Outcome.failed(call_id, name, failed.error, failed.partial)
            bounds = self.bounds
        if not self.hooks.after:
            return outcome
        return await self._after(outcome, context, bounds)

    async def _before(self, call: BeforeCall) -> BeforeCall:
        for hook in self.hooks.before:
            try:
                changed = await hook(call)
            except ToolFailure as failure:
                raise _Failed(CallError(failure.kind, failure.message)) from None
            except Exception as exc:
                failed = _operational("a before hook raised", call.name, call.context.call_id, exc)
                raise failed from None
            if changed is not None:
                call = changed
        return call

    def _over_share(self, name: str, exc: OwnerShareExceeded) -> CallError:
        if isinstance(exc, OwnerLimitExceeded):
            for note in self.limit_refusals:
                note(exc.owner)
        return _over_share(name, exc)

    def _tool_failed(self, exc: Exception, ctx: CallContext) -> _Failed:
        """The call's error for an exception its tool raised (called in the `except`)."""
        name, call_id = ctx.tool_name, ctx.call_id
        if isinstance(exc, ToolFailure):
            partial = {**(ctx.last_progress or {}), **(exc.metadata or {})} or None
            partial = self._bound_meta(partial, name, call_id, "partial snapshot")
            return _Failed(CallError(exc.kind, exc.message), partial)
        if isinstance(exc, OwnerShareExceeded):  # the tool's own spool: a client's limit
            return _Failed(self._over_share(name, exc))
        if isinstance(exc, RetentionError):  # the tool's own spool: a full disk, the store quota
            return _not_kept(name, call_id, exc)
        failed = _operational(f"tool {name} raised", name, call_id, exc)
        failed.partial = self._bound_meta(ctx.last_progress, name, call_id, "partial snapshot")
        return failed

    def _completed(self, tool: Any, result: Any, ctx: CallContext) -> Outcome:
        """Steps 5-6: the tool's result checked against its output codec and its content
        normalized (not yet bounded)."""
        name = ctx.tool_name
        if isinstance(result, ToolResponse):
            value, content_value, metadata = result.output, result.content, result.metadata
        else:  # a bare value is the output
            value, content_value, metadata = result, None, None
        output = _encode(tool.output, value, name)
        return Outcome(  # positional: ~0.3 µs less than by keyword
            ctx.call_id, name, "completed",
            _normalize(content_value, tool.output is not None, output, name), output,
            None if metadata is None else self._bound_meta(metadata, name, ctx.call_id))

    async def _bounded(self, outcome: Outcome, bounds: Bounds, context: ToolContext) -> Outcome:
        """Step 7 on a completed outcome: as it is when its text fits (no await), else with
        its preview and the whole text kept in the managed store."""
        planned = plan_bounding(outcome.content, bounds)
        if planned is None:
            return outcome
        return await self._retained(outcome, planned, context)

    async def _retained(self, outcome: Outcome, planned: tuple[str, PreviewPlan],
                        context: ToolContext) -> Outcome:
        content, managed = await self._retain(outcome.content, planned, outcome.tool,
                                              outcome.call_id, context)
        return replace(outcome, content=content, managed=managed)

    async def _bound(
        self, content: Content, bounds: Bounds, name: str, call_id: str, context: ToolContext
    ) -> tuple[Content, tuple[ManagedText, ...]]:
        planned = plan_bounding(content, bounds)
        if planned is None:
            return content, ()
        return await self._retain(content, planned, name, call_id, context)

    async def _retain(
        self, content: Content, planned: tuple[str, PreviewPlan], name: str, call_id: str,
        context: ToolContext,
    ) -> tuple[Content, tuple[ManagedText, ...]]:
        """A text over its bounds (`plan_bounding`) kept whole in the managed store; the
        content with its preview."""
        joined, plan = planned
        try:
            ref = await self.store.put(joined, namespace=self.location,
                                       owner=context.store_owner)
        except OwnerShareExceeded as exc:
            raise _Failed(self._over_share(name, exc)) from None
        except RetentionError as exc:
            raise _not_kept(name, call_id, exc) from None
        except ManagedStoreError as exc:
            raise _operational("retaining oversized text failed", name, call_id, exc) from None
        retained = ManagedText(ref=ref.id, size_bytes=ref.size_bytes, lines=ref.lines)
        return apply_preview(content, joined, plan, ref.id), (retained,)

    def _bound_meta(
        self, metadata: Any, name: str, call_id: str, what: str = "metadata"
    ) -> dict[str, Any] | None:
        return bound_metadata(
            metadata, tool=name, call_id=call_id, max_bytes=self.metadata_max_bytes, what=what
        )

    async def _after(self, outcome: Outcome, context: ToolContext, bounds: Bounds) -> Outcome:
        for hook in self.hooks.after:
            try:
                changed = await hook(AfterCall(outcome, context))
                if changed is not None:
                    outcome = await self._renormalize(outcome, changed, bounds, context)
            except _Failed as failed:
                return Outcome.failed(outcome.call_id, outcome.tool, failed.error)
            except Exception as exc:
                defect = _operational("an after hook raised", outcome.tool, outcome.call_id, exc)
                return Outcome.failed(outcome.call_id, outcome.tool, defect.error)
        return outcome

    async def _renormalize(
        self, before: Outcome, changed: Outcome, bounds: Bounds, context: ToolContext
    ) -> Outcome:
        name, call_id = before.tool, before.call_id
        changed = replace(changed, call_id=call_id, tool=name)
        if changed.status == "error":
            if changed.error is None:
                raise _Failed(CallError(ErrorKind.OPERATIONAL, "an after hook returned an error "
                                        "outcome without an error"))
            partial = self._bound_meta(changed.partial, name, call_id, "partial snapshot")
            return replace(changed, content=(), output=None, metadata=None, partial=partial)
        content = _normalize(changed.content, before.output is not None, changed.output, name)
        with tracing.step("bound_content"):
            content, retained = await self._bound(content, bounds, name, call_id, context)
        return replace(
            changed,
            content=content,
            error=None,
            partial=None,
            metadata=self._bound_meta(changed.metadata, name, call_id),
            managed=tuple(dict.fromkeys(changed.managed + retained)),
        )

    def _publish_progress(self, call_id: str, name: str, snapshot: dict[str, Any]) -> None:
        if self.events is None or not self.events.active:
            return
        bounded = self._bound_meta(snapshot, name, call_id, "progress snapshot")
        if bounded is not None:
            self.events.publish(CallProgress(call_id, name, bounded))


class _InFlight:
    """A call running under its call id, and the duplicate callers waiting for it.

    Its fingerprint (`call_fingerprint`: canonical JSON + a digest, a few µs) is computed only
    when something compares it: the outcome log (claim, record) or a duplicate arriving while
    it runs. Without an outcome log a call with a unique id never pays for it."""

    __slots__ = ("_fingerprint", "admitted", "context", "name", "raw_input", "snapshot",
                 "waiters")

    def __init__(self, name: str, raw_input: Any, context: ToolContext, snapshot: Resolver,
                 admitted: Entry | CallError | None, fingerprint: str | None,
                 waiters: list[asyncio.Future[Outcome | None]]) -> None:
        self.name, self.raw_input, self.context, self.snapshot = (
            name, raw_input, context, snapshot)
        self.admitted = admitted
        """Admission's answer for this call (`Seam._admitted`: its entry, or the error it gets),
        decided before anything ran; None when before hooks run first."""
        self._fingerprint = fingerprint
        self.waiters = waiters

    def fingerprint(self) -> str:
        if self._fingerprint is None:
            self._fingerprint = _fingerprint(self.name, self.raw_input, self.context,
                                             self.snapshot)
        return self._fingerprint


def _fingerprint(name: str, raw_input: Any, context: ToolContext, snapshot: Resolver) -> str:
    """`call_fingerprint` of a call, who runs it included (`call_principal`: the context's
    owner and the snapshot's profile)."""
    return call_fingerprint(name, raw_input, context.session_id, context.agent,
                            call_principal(context.owner, getattr(snapshot, "profile", None)))


def _refusal(call_id: str, name: str, error: CallError) -> Outcome:
    """A call not admitted under an id that already has an outcome or a claim: it is refused
    as under a fresh id, and nothing of the id's call is shown or recorded."""
    return replace(Outcome.failed(call_id, name, error), refused=True)


def _conflict(call_id: str, name: str) -> Outcome:
    """A used call id sent with another call: nothing runs, nothing is recorded."""
    return replace(Outcome.failed(call_id, name, CallError(
        ErrorKind.CONFLICT,
        f"Call id {call_id!r} was already used for a different call (another tool, input, "
        f"session, agent, token or profile); {name} was not run. Send a new call id for a "
        "new call; reuse an id only to retry the very same call.",
    )), refused=True)


def _input_bytes(raw_input: Any) -> int:
    try:
        return len(json.dumps(raw_input, ensure_ascii=False, default=str).encode())
    except ValueError:
        return 0


def _decode(codec: Codec, raw: Any, name: str) -> Any:
    if isinstance(raw, str | bytes):
        try:
            raw = json_depth.loads(raw)
        except ValueError as exc:
            raise _Failed(CallError(
                ErrorKind.INVALID_INPUT,
                f"Invalid input for {name}: the arguments are not valid JSON ({exc}). "
                "The tool was not executed; retry with valid JSON.",
                path="$",
            )) from None
    try:
        return codec.decode(raw)
    except CodecError as exc:
        raise _Failed(CallError(
            ErrorKind.INVALID_INPUT,
            f"Invalid input for {name}: {exc.message}. The tool was not executed.",
            path=exc.path,
        )) from None


def _encode(codec: Codec | None, value: Any, name: str) -> Any:
    if codec is None:
        if value is not None:
            raise _Failed(CallError(
                ErrorKind.INVALID_OUTPUT,
                f"{name} returned an output value but declares no output codec; "
                "return ToolResponse(content=...) instead",
            ))
        return None
    try:
        return codec.encode(value)
    except CodecError as exc:
        raise _Failed(CallError(
            ErrorKind.INVALID_OUTPUT,
            f"{name} returned an invalid value for its output schema: {exc.message}",
            path=exc.path,
        )) from None


def _normalize(content: Any, has_output_codec: bool, output: Any, name: str) -> Content:
    """Step 6: explicit content wins; otherwise content derives from the encoded output (one
    text item, `content_from_output`'s)."""
    if content is not None:
        try:
            items = content_from_json(content)
        except CodecError as exc:
            raise _Failed(CallError(
                ErrorKind.INVALID_OUTPUT, f"{name} returned invalid content: {exc}", exc.path
            )) from None
        if items:
            for i, item in enumerate(items):
                if isinstance(item, TextContent) and not item.text.isascii():
                    clean = scrub_surrogates(item.text)
                    if clean is not item.text:
                        items = (*items[:i], TextContent(clean), *items[i + 1 :])
            return items
    if not has_output_codec:
        raise _Failed(CallError(
            ErrorKind.INVALID_OUTPUT,
            f"{name} returned no content and declares no output to derive it from",
        ))
    text = text_from_output(output)
    return (TextContent(text if text.isascii() else scrub_surrogates(text)),)


def unknown_tool_error(name: str, available: Mapping[str, Any]) -> CallError:
    """The model-visible error for a name no tool has: the closest names by edit distance,
    else (a short list) every name."""
    near = closest(name, available)
    if near:
        hint = f"Did you mean: {', '.join(near)}?"
    elif len(available) <= _MAX_NAMES_IN_ERROR:
        hint = f"Available tools: {', '.join(sorted(available)) or '(none)'}"
    else:
        hint = f"No tool has a similar name; {len(available)} tools are available."
    return CallError(ErrorKind.UNKNOWN_TOOL, f"Unknown tool: {name}. {hint}")


def _over_share(name: str, exc: OwnerShareExceeded) -> CallError:
    """A call whose output is larger than its client's share of the managed store: it fails
    (never a lossy success), model-visibly, so the caller can ask for less. Over a user's own
    limit (`[auth.quotas]` `store_bytes`) it is a quota, as the other per-user quotas."""
    if isinstance(exc, OwnerLimitExceeded):
        return CallError(ErrorKind.UNAVAILABLE, f"Quota: {exc.owner.removeprefix('user:')} may "
                         f"keep {exc.limit_bytes:,} bytes in the managed store (quota "
                         f"store_bytes); {name}'s output of {exc.size_bytes:,} bytes was not kept "
                         "whole: ask for less output")
    return CallError(ErrorKind.TOOL_FAILURE, f"{name}: the output was not kept whole: {exc}; "
                     "ask for less output (the limit is SIDECAR_STORE_OWNER_SHARE of "
                     "SIDECAR_STORE_QUOTA)")
