"""The external guard a guardrail may call (`GuardHook`): one HTTP POST per stage of a call.

    POST <hook>  {"stage": "input" | "output", "tool": ..., "profile": ..., "content": ...}
    200 {"decision": "allow"}
        {"decision": "deny", "reason": "..."}            the reason is what the model reads
        {"decision": "replace", "content": ..., "output": ...}

Anything else (a refused connection, the timeout, another status, an answer that is not one
of these) is a `HookError`; the guardrail's `on_error` decides what the call gets then. The
client ignores proxy variables (`trust_env=False`): a guard is a service of the deployment.

Imports httpx (when a guard is first asked) only. Exports `GuardHook`, `Verdict` and `HookError`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    import httpx

MAX_REASON_CHARS = 2000


class HookError(Exception):
    """The guard did not give a usable answer (the message says why, without the URL)."""


_ABSENT: Any = object()


@dataclass(frozen=True, slots=True)
class Verdict:
    decision: Literal["allow", "deny", "replace"]
    reason: str = ""
    content: Any = None
    output: Any = _ABSENT

    @property
    def has_output(self) -> bool:
        return self.output is not _ABSENT


class GuardHook:
    """One HTTP client for every guard a Location's guardrails name (opened on first use)."""

    def __init__(self) -> None:
        self._client: httpx.AsyncClient | None = None

    async def ask(self, url: str, seconds: float, payload: dict[str, Any]) -> Verdict:
        import httpx  # here: a daemon without a hook (or HTTP tools) never imports it

        if self._client is None:
            self._client = httpx.AsyncClient(trust_env=False, follow_redirects=False)
        try:
            response = await self._client.post(url, json=payload, timeout=seconds)
        except httpx.TimeoutException:
            raise HookError(f"the guard did not answer within {seconds:g} s") from None
        except httpx.HTTPError as exc:
            raise HookError(f"the guard could not be reached ({type(exc).__name__})") from None
        if response.status_code != 200:
            raise HookError(f"the guard answered HTTP {response.status_code}")
        try:
            answer = response.json()
        except ValueError:
            raise HookError("the guard's answer is not JSON") from None
        return _verdict(answer)

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None


def _verdict(answer: Any) -> Verdict:
    decision = answer.get("decision") if isinstance(answer, dict) else None
    if decision == "allow":
        return Verdict("allow")
    if decision == "deny":
        reason = answer.get("reason")
        text = reason[:MAX_REASON_CHARS] if isinstance(reason, str) and reason else \
            "refused by the guard"
        return Verdict("deny", reason=text)
    if decision == "replace":
        if "content" not in answer:
            raise HookError('the guard answered "replace" without "content"')
        return Verdict("replace", content=answer["content"],
                       output=answer.get("output", _ABSENT) if "output" in answer else _ABSENT)
    raise HookError('the guard\'s answer has no "decision" of allow, deny or replace')
