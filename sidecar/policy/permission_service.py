"""The permission service of a Location: rule layers, pending asks, replies, persistence
(`PermissionService`, the `PermissionGate` of `sidecar.model.permissions`, which holds the
model of rules and replies).

Imports `sidecar.model` and `sidecar.stores`. Exports `PermissionService` and `UnknownAsk`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

from sidecar.model import tracing
from sidecar.model.errors import SidecarError, ToolFailure
from sidecar.model.events import EventSink, PermissionAsked, PermissionReplied
from sidecar.model.permissions import (
    SCOPE_RULES,
    Decision,
    PendingAsk,
    PermissionRequest,
    PermissionRule,
    Reply,
    decide,
    declined,
    denied,
    new_ask_id,
)
from sidecar.stores.asks import SharedAnswer, SharedAsks
from sidecar.stores.permissions import PermissionStore

RuleScope = Literal["session", "location"]
log = logging.getLogger("sidecar.policy.permission_service")


class UnknownAsk(SidecarError):
    """A reply named a permission ask that is not pending (answered, expired or never made)."""


@dataclass(slots=True)
class _Waiting:
    ask: PendingAsk
    future: asyncio.Future[None]
    shared: bool = False
    """Listed for the fleet (`SharedAsks.raised` succeeded): answered through it only."""


class PermissionService:
    """Implements `PermissionGate` for one Location.

    `always` replies are kept in the Location's `PermissionStore` (embedded:
    `<state>/permissions.sqlite`) as session rules (the default) or Location rules, and
    loaded again when the Location opens, so they survive a restart. Before it raises an ask
    the service reads the store again: an `always` reply given through another replica of a
    fleet (a shared PostgreSQL store) then applies here too.

    Pending asks live in this process (the embedded default). Given a `SharedAsks` (fleet
    mode), each ask is also listed for every replica (`listed`), may be answered on any
    (`reply` stores the first answer there), and the answer reaches the replica whose call
    waits; the other replicas apply what it means for their own asks (an `always` rule, a
    session's rejection)."""

    def __init__(
        self,
        store: PermissionStore | None,
        *,
        location: str = "default",
        defaults: Sequence[PermissionRule] = (),
        ask_timeout: float | None = None,
        events: EventSink | None = None,
        shared: SharedAsks | None = None,
    ) -> None:
        self._store = store
        self._shared = shared
        self._applying: set[asyncio.Task[None]] = set()
        self._closed = False
        self._location = location
        self.defaults: tuple[PermissionRule, ...] = tuple(defaults)
        self.location_rules: tuple[PermissionRule, ...] = ()
        self.ask_timeout = ask_timeout
        self._events = events
        self._always_location: list[PermissionRule] = []
        self._always_session: dict[str, list[PermissionRule]] = {}
        self._session_rules: dict[str, tuple[PermissionRule, ...]] = {}
        self._pending: dict[str, _Waiting] = {}

    @classmethod
    async def open(cls, store: PermissionStore | None, **options: object) -> PermissionService:
        """A service whose `always` rules are loaded from, and kept in, `store` (None: kept in
        memory only). The store stays its owner's to close."""
        service = cls(store, **options)  # type: ignore[arg-type]
        await service._load()
        if service._shared is not None:
            await service._shared.start(service._answered)
        return service

    async def _load(self) -> None:
        """Take in the store's `always` rules this service does not hold yet (on open, and
        those another replica of a fleet stored since)."""
        if self._store is None:
            return
        for stored in await self._store.rules(self._location):
            held = (self._always_session.setdefault(stored.session_id, [])
                    if stored.session_id else self._always_location)
            if stored.rule not in held:
                held.append(stored.rule)

    # --- rules ---------------------------------------------------------------------------

    def set_location_rules(self, rules: Iterable[PermissionRule]) -> None:
        """The Location manifest layer (replaced whole on a manifest reload)."""
        self.location_rules = tuple(rules)

    def set_session_rules(self, session_id: str, rules: Iterable[PermissionRule]) -> None:
        """The session layer: the highest precedence, kept in memory for the session."""
        self._session_rules[session_id] = tuple(rules)

    def layers(self, session_id: str) -> list[Sequence[PermissionRule]]:
        return [
            self.defaults,
            self.location_rules,
            self._always_location,
            self._always_session.get(session_id, ()),
            self._session_rules.get(session_id, ()),
            SCOPE_RULES.get(),
        ]

    def decision(
        self, session_id: str, action: str, resources: tuple[str, ...] = (),
        default: Decision | None = None,
    ) -> Decision:
        found = decide(self.layers(session_id), action, resources)
        return found or default or "allow"

    def outright_denial(
        self, session_id: str, extra: Sequence[PermissionRule] = ()
    ) -> Callable[[str], bool]:
        """A test of whether a rule without a resource condition denies an action, for
        catalog hiding; the session's rules are gathered once, not per tool. `extra`: a
        profile's rules (the last layer)."""
        layers = [*self.layers(session_id), extra]
        rules = [r for layer in layers for r in layer if r.resource is None]
        if not any(r.decision == "deny" for r in rules):
            return lambda action: False
        return lambda action: decide([rules], action, ()) == "deny"

    # --- asking --------------------------------------------------------------------------

    async def ask(self, request: PermissionRequest) -> None:
        decision = self.decision(
            request.session_id, request.action, request.resources, request.default
        )
        if decision == "ask" and self._store is not None:
            try:
                await self._load()
            except Exception as exc:  # ask on what is known here
                log.warning("reading the stored permission rules failed: %s", exc)
            decision = self.decision(
                request.session_id, request.action, request.resources, request.default
            )
        if decision == "allow":
            return
        if decision == "deny":
            raise denied(request.action)
        waiting = _Waiting(
            PendingAsk(new_ask_id(), request, time.time()),
            asyncio.get_running_loop().create_future(),
        )
        self._pending[waiting.ask.id] = waiting
        if self._shared is not None:
            try:
                await self._shared.raised(waiting.ask, self.ask_timeout)
                waiting.shared = True
            except Exception as exc:  # still answerable on this replica
                log.warning("could not list the ask %s for the fleet: %s", waiting.ask.id, exc)
        if self._events is not None:
            self._events.publish(PermissionAsked(waiting.ask.to_json()))
        try:
            with tracing.step("permission_wait", attributes={"sidecar.action": request.action}):
                async with asyncio.timeout(self.ask_timeout):
                    await asyncio.shield(waiting.future)
        except TimeoutError:
            if waiting.future.done() and waiting.future.exception() is None:
                return
            raise declined(request.action, f"no answer to the permission request within "
                           f"{self.ask_timeout:g} s") from None
        finally:
            self._pending.pop(waiting.ask.id, None)
            if waiting.shared:
                await self._unlist(waiting.ask.id)

    async def _unlist(self, ask_id: str) -> None:
        assert self._shared is not None
        try:
            await self._shared.finished(ask_id)
        except Exception as exc:  # the row expires with this replica's heartbeat
            log.warning("could not unlist the ask %s: %s", ask_id, exc)

    def pending(self, session_id: str | None = None) -> list[PendingAsk]:
        """Asks still waiting for an answer (an answered one leaves at once, before its
        caller has woken up)."""
        return [
            w.ask for w in self._pending.values()
            if not w.future.done()
            and (session_id is None or w.ask.request.session_id == session_id)
        ]

    async def listed(self, session_id: str | None = None) -> list[PendingAsk]:
        """`pending`, and with `SharedAsks` every replica's asks too (oldest first)."""
        local = self.pending(session_id)
        if self._shared is None:
            return local
        shared = await self._shared.pending(session_id)
        ids = {a.id for a in shared}
        return sorted([*shared, *(a for a in local if a.id not in ids)],
                      key=lambda a: a.created_at)

    async def reply(
        self,
        ask_id: str,
        reply: Reply,
        *,
        feedback: str | None = None,
        scope: RuleScope = "session",
    ) -> None:
        waiting = self._pending.get(ask_id)
        if self._shared is not None and (waiting is None or waiting.shared):
            # the first answer stored for the fleet wins; the replica whose call waits
            # (perhaps this one) resolves it
            answer = await self._shared.answer(ask_id, reply, scope=scope, feedback=feedback)
            if answer is None:
                raise UnknownAsk(f"no pending permission request {ask_id!r}")
            if waiting is None or waiting.future.done():  # resolved where it waits
                return
        elif waiting is None or waiting.future.done():
            raise UnknownAsk(f"no pending permission request {ask_id!r}")
        await self._resolve(waiting, reply, feedback, scope)

    async def _resolve(self, waiting: _Waiting, reply: Reply, feedback: str | None,
                       scope: str) -> None:
        request = waiting.ask.request
        if reply == "reject":
            self._reject_session(request.session_id, waiting, feedback)
        else:
            waiting.future.set_result(None)
            if reply == "always":
                rule = PermissionRule(request.action, "allow")
                await self._persist(rule, request.session_id if scope == "session" else "")
                self._release_now_allowed(request.session_id)
        self._publish_reply(waiting.ask, reply)

    def _answered(self, answer: SharedAnswer) -> None:
        """`SharedAsks` delivers an answer given on any replica (maybe more than once)."""
        if self._closed:  # between this service's close and the shared asks' close
            return
        task = asyncio.get_running_loop().create_task(self._apply(answer))
        self._applying.add(task)
        task.add_done_callback(self._applying.discard)

    async def _apply(self, answer: SharedAnswer) -> None:
        waiting = self._pending.get(answer.ask_id)
        if waiting is not None:  # raised here: this replica's call waits for it
            if not waiting.future.done():
                await self._resolve(waiting, answer.reply, answer.feedback, answer.scope)
            return
        if answer.mine:
            return  # no longer waiting here
        # another replica's ask: what the answer means for this replica's asks
        if answer.reply == "reject":
            for other in list(self._pending.values()):
                if other.future.done() or other.ask.request.session_id != answer.session_id:
                    continue
                other.future.set_exception(declined(
                    other.ask.request.action, "another request of this session was rejected"))
                self._publish_reply(other.ask, "reject")
        elif answer.reply == "always":
            # the asking replica stores the rule; held here at once, without storing it twice
            rule = PermissionRule(answer.action, "allow")
            held = (self._always_session.setdefault(answer.session_id, [])
                    if answer.scope == "session" else self._always_location)
            if rule not in held:
                held.append(rule)
            self._release_now_allowed(answer.session_id)

    def _reject_session(
        self, session_id: str, first: _Waiting, feedback: str | None
    ) -> None:
        action = first.ask.request.action
        error: ToolFailure = (
            ToolFailure(f"The user rejected {action} with this feedback: {feedback}")
            if feedback else declined(action)
        )
        first.future.set_exception(error)
        for other in list(self._pending.values()):
            if other is first or other.future.done():
                continue
            if other.ask.request.session_id == session_id:
                other.future.set_exception(declined(
                    other.ask.request.action, "another request of this session was rejected"
                ))
                self._publish_reply(other.ask, "reject")

    def _release_now_allowed(self, session_id: str) -> None:
        for other in list(self._pending.values()):
            r = other.ask.request
            if other.future.done() or r.session_id != session_id:
                continue
            if self.decision(session_id, r.action, r.resources, r.default) == "allow":
                other.future.set_result(None)
                self._publish_reply(other.ask, "always")

    def _publish_reply(self, ask: PendingAsk, reply: str) -> None:
        if self._events is not None:
            self._events.publish(PermissionReplied(ask.id, ask.request.session_id, reply))

    # --- persistence ---------------------------------------------------------------------

    async def _persist(self, rule: PermissionRule, session_id: str) -> None:
        if session_id:
            self._always_session.setdefault(session_id, []).append(rule)
        else:
            self._always_location.append(rule)
        if self._store is not None:
            await self._store.add(self._location, session_id, rule)

    async def aclose(self) -> None:
        self._closed = True
        applying = list(self._applying)
        if applying:  # answers being applied finish (their rules are stored), or stop
            _, unfinished = await asyncio.wait(applying, timeout=5)
            for task in unfinished:
                task.cancel()
            if unfinished:
                await asyncio.wait(unfinished)
        for waiting in list(self._pending.values()):
            if not waiting.future.done():
                waiting.future.set_exception(
                    declined(waiting.ask.request.action, "the sidecar is shutting down")
                )
