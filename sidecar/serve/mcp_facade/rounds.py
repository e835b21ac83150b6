"""A `tools/call` of a 2026-07-28 session that needs the client's input on the way: one
`Execution` per call, which may span several `tools/call` requests (how, and the token's
rules, are its docstring).

Imports `sidecar.model`. Exports `Execution`, `Question`, `Finished`, `Escalated`, `new_token`,
`request_digest`, `foreign_round` and `ROUND_TTL`.
"""

from __future__ import annotations

import hashlib
import json
import secrets
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import anyio
import mcp_types as types

from sidecar.model.replica import replica_id

ROUND_TTL = 300.0


@dataclass(slots=True)
class Question:
    """One request waiting for the client's answer."""

    request: Any
    key: str | None = None
    """The upstream server's key for it (kept for the client), or None: one is made up."""
    answered: anyio.Event = field(default_factory=anyio.Event)
    answer: Any = None

    def settle(self, answer: Any) -> None:
        if not self.answered.is_set():
            self.answer = answer
            self.answered.set()


@dataclass(frozen=True, slots=True)
class Escalated:
    """The upstream made a task of the call: so does the facade (`tasks`)."""


@dataclass(frozen=True, slots=True)
class Finished:
    """The call's outcome (None: it was cancelled), or the defect that ended it."""

    outcome: Any
    failure: Exception | None = None


class Execution:
    """One downstream call that may span several `tools/call` requests.

    In the 2026-07-28 era a server cannot send a request to the client in the middle of a call.
    When an upstream server asks for sampling, elicitation or roots during a call of such a
    session, the facade ends that request with an `input_required` result that carries the
    question and a `requestState` token; the client answers by sending `tools/call` again with
    `inputResponses` and the token, and the same execution continues (one call id, one outcome).

        execution = Execution(session_id, tool, arguments, call_id, snapshot)  # runs in a task
        answer = await execution.ask(request)      # inside the call: wait for the client's reply
        step = await execution.next_step()         # in the request handler: a Finished or the
                                                   # questions to send out now

    The token is 144 random bits (`new_token`), bound to the tool name and arguments of the call
    (a 2026-07-28 client over HTTP has no session to bind it to: each request stands alone; over
    stdio the token is also bound to the session), used once and valid for `ROUND_TTL` seconds.
    An unanswered question then becomes a JSON-RPC error for the upstream server, so the call
    settles instead of hanging. In a fleet the answer may reach another replica, which hands it
    to this one (`fleet_rounds`)."""

    def __init__(
        self, session_id: str, tool: str, arguments: Any, call_id: str, snapshot: Any
    ) -> None:
        self.session_id = session_id
        self.request = request_digest(tool, arguments)
        self.call_id = call_id
        self.snapshot = snapshot
        self.scope = anyio.CancelScope()
        self._items: deque[Question | Finished | Escalated] = deque()
        self._ready = anyio.Event()
        self._finished: Finished | None = None
        self.open: dict[str, Question] = {}

    # --- the call's side -------------------------------------------------------------------

    async def ask(self, request: Any, key: str | None = None) -> Any:
        """Put a question to the client (under the upstream's `key` when given); its answer,
        or an `ErrorData` when none came."""
        question = Question(request, key)
        self._put(question)
        with anyio.move_on_after(ROUND_TTL * 2):  # the round's own TTL settles it first
            await question.answered.wait()
        if not question.answered.is_set():
            question.settle(_unanswered(request))
        return question.answer

    async def run(self, work: Callable[[], Awaitable[Any]], after: Callable[[], object]) -> None:
        """Run the call (`work`) in this execution's scope, then `after()` (the caller's
        bookkeeping) and `finish` with its outcome, or with the exception it raised (a defect:
        raised again in the request that waits)."""
        outcome: Any = None
        failure: Exception | None = None
        try:
            with self.scope:
                outcome = await work()
        except Exception as exc:
            failure = exc
        finally:
            after()
            self.finish(outcome, failure)

    def became_task(self) -> None:
        self._put(Escalated())

    def finish(self, outcome: Any, failure: Exception | None = None) -> None:
        self._put(Finished(outcome, failure))

    def _put(self, item: Question | Finished | Escalated) -> None:
        self._items.append(item)
        self._ready.set()

    # --- the request handler's side --------------------------------------------------------

    async def next_step(self) -> Finished | Escalated | dict[str, Question]:
        """Wait until the call finishes, asks something or becomes a task upstream; every
        question asked by then."""
        if self._finished is not None:
            return self._finished
        while not self._items:
            self._ready = anyio.Event()
            await self._ready.wait()
        first = self._items.popleft()
        if isinstance(first, Finished | Escalated):
            return first
        asked: dict[str, Question] = {}
        question = first
        while True:
            key = question.key if question.key and question.key not in asked else _key()
            asked[key] = question
            if not self._items:
                break
            item = self._items.popleft()
            if isinstance(item, Escalated):
                self._items.appendleft(item)
                break
            if isinstance(item, Finished):
                self._finished = item
                break
            question = item
        self.open = asked
        return asked

    def asked_since(self) -> dict[str, Question]:
        """The questions asked since the last step, without waiting (a task's round takes
        those asked at about the same time: `tasks`)."""
        asked: dict[str, Question] = {}
        while self._items and isinstance(self._items[0], Question):
            question = self._items.popleft()
            assert isinstance(question, Question)
            key = question.key if question.key and question.key not in self.open else _key()
            asked[key] = question
        self.open.update(asked)
        return asked

    def answer(self, responses: dict[str, Any] | None) -> None:
        """The client's `inputResponses` for the questions sent in the last round."""
        given = responses or {}
        for key, question in self.open.items():
            reply = given.get(key)
            question.settle(reply if reply is not None else _unanswered(question.request))
        self.open = {}

    def expire(self) -> None:
        for question in self.open.values():
            question.settle(_unanswered(question.request, expired=True))
        self.open = {}


def request_digest(tool: str, arguments: Any) -> str:
    """What a retry must repeat: the tool and its arguments."""
    body = json.dumps([tool, arguments], sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(body.encode()).hexdigest()


def new_token() -> str:
    """144 random bits, then the replica that holds the paused call (`.<replica id>`): another
    replica of a fleet hands the resume to it (`fleet_rounds`), or, without a fleet database,
    says where the resumed call must go."""
    return f"{secrets.token_urlsafe(18)}.{replica_id()}"


def foreign_round(token: str) -> str | None:
    """The error for a token another replica issued (None: this replica's, or not ours)."""
    owner = token.partition(".")[2]
    if not owner or owner == replica_id():
        return None
    return (f"requestState belongs to the call paused on replica {owner!r}, not this one "
            f"({replica_id()!r}): the resumed tools/call must reach that replica")


def _key() -> str:
    return f"q-{secrets.token_hex(4)}"


def _unanswered(request: Any, *, expired: bool = False) -> types.ErrorData:
    method = getattr(request, "method", "input")
    why = f"within {ROUND_TTL:.0f} s" if expired else "in its inputResponses"
    return types.ErrorData(
        code=types.INVALID_REQUEST, message=f"the client did not answer {method} {why}"
    )
