"""Secrets in text and JSON values, found with detect-secrets' plugins (`SecretScanner`) and
replaced by a marker naming their kind (`redact`, `redact_json`).

The plugins are detect-secrets' own detectors, used directly (no baseline, no files): cloud keys
(AWS, Azure storage), private keys, tokens (GitHub, GitLab, Slack, Stripe, OpenAI, PyPI,
SendGrid, Square, Twilio, Telegram, Discord, Mailchimp), JSON Web Tokens, credentials in URLs
(basic auth) and, with `entropy`, quoted base64 strings above 4.5 bits of entropy per character
that pass its heuristic filters (sequences, UUIDs, ids, templates, `$VARS`). Left out on
purpose: its keyword, hex-entropy and public-IP plugins (every commit id and checksum is a hex
string) and the slow assignment-regex ones (Cloudant, IBM, SoftLayer, NPM, Artifactory).

Imports only detect-secrets. Exports `SecretScanner`, `Finding`, `ScanBudget`, `marker`,
`redact` and `redact_json`.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from detect_secrets.filters import heuristic
from detect_secrets.plugins.aws import AWSKeyDetector
from detect_secrets.plugins.azure_storage_key import AzureStorageKeyDetector
from detect_secrets.plugins.base import RegexBasedDetector
from detect_secrets.plugins.basic_auth import BasicAuthDetector
from detect_secrets.plugins.discord import DiscordBotTokenDetector
from detect_secrets.plugins.github_token import GitHubTokenDetector
from detect_secrets.plugins.gitlab_token import GitLabTokenDetector
from detect_secrets.plugins.high_entropy_strings import Base64HighEntropyString
from detect_secrets.plugins.jwt import JwtTokenDetector
from detect_secrets.plugins.mailchimp import MailchimpDetector
from detect_secrets.plugins.openai import OpenAIDetector
from detect_secrets.plugins.private_key import PrivateKeyDetector
from detect_secrets.plugins.pypi_token import PypiTokenDetector
from detect_secrets.plugins.sendgrid import SendGridDetector
from detect_secrets.plugins.slack import SlackDetector
from detect_secrets.plugins.square_oauth import SquareOAuthDetector
from detect_secrets.plugins.stripe import StripeDetector
from detect_secrets.plugins.telegram_token import TelegramBotTokenDetector
from detect_secrets.plugins.twilio import TwilioKeyDetector

_DETECTORS: tuple[RegexBasedDetector, ...] = (
    AWSKeyDetector(), AzureStorageKeyDetector(), BasicAuthDetector(), DiscordBotTokenDetector(),
    GitHubTokenDetector(), GitLabTokenDetector(), JwtTokenDetector(), MailchimpDetector(),
    OpenAIDetector(), PrivateKeyDetector(), PypiTokenDetector(), SendGridDetector(),
    SlackDetector(), SquareOAuthDetector(), StripeDetector(), TelegramBotTokenDetector(),
    TwilioKeyDetector(),
)
_VALUE_IN_GROUP = frozenset({"Basic Auth Credentials", "AWS Access Key"})
"""Detectors whose one capturing group is the secret itself (a URL's password, the value of
`aws_secret = "..."`); the others' groups are a prefix, so the whole match is the secret."""
_PRIVATE_KEY = "Private Key"
_JWT = "JSON Web Token"
_JWT_TAIL = re.compile(r"[A-Za-z0-9\-_.+/=]*")
_PEM_END = re.compile(r"-----END [A-Z0-9 ]*-----|---- END SSH2 ENCRYPTED PRIVATE KEY ----")
_ENTROPY = Base64HighEntropyString(limit=4.5)
_BASE64_VALUE = re.compile(r"[A-Za-z0-9+/\-_=]+")
MAX_ENTROPY_CHARS = 256
"""Longer quoted strings are data (an encoded file, an image), not a key: not flagged."""


@dataclass(frozen=True, slots=True)
class Finding:
    kind: str
    """detect-secrets' `secret_type` (`AWS Access Key`, `Private Key`, ...)."""
    start: int
    end: int


@dataclass(slots=True)
class ScanBudget:
    """Characters one call may still scan; what is past it is counted, not scanned."""

    remaining: int
    unscanned: int = 0
    kinds: list[str] = field(default_factory=list)

    def take(self, text: str) -> str:
        """The part of `text` to scan (its head, within the budget)."""
        if len(text) <= self.remaining:
            self.remaining -= len(text)
            return text
        head = text[: self.remaining]
        self.unscanned += len(text) - len(head)
        self.remaining = 0
        return head


def marker(kind: str) -> str:
    return f"[redacted: {kind}]"


class SecretScanner:
    """Finds secrets; `entropy` adds the high-entropy string plugin (the noisiest one)."""

    __slots__ = ("entropy",)

    def __init__(self, *, entropy: bool = True) -> None:
        self.entropy = entropy

    def find(self, text: str, *, whole: bool = False) -> list[Finding]:
        """The secrets in `text`, sorted and without overlaps (the first kind found wins).
        `whole`: `text` is one JSON string value, so all of it counts as quoted."""
        found = [*self._by_pattern(text)]
        if self.entropy:
            found.extend(self._by_entropy(text, whole))
        return _merged(found)

    @staticmethod
    def _by_pattern(text: str) -> Iterator[Finding]:
        for detector in _DETECTORS:
            kind = str(detector.secret_type)
            for regex in detector.denylist:
                for match in regex.finditer(text):
                    group = 1 if kind in _VALUE_IN_GROUP and match.lastindex else 0
                    start, end = match.span(group)
                    if kind == _PRIVATE_KEY:
                        start, end = _pem_block(text, start, end)
                    elif kind == _JWT:  # its pattern ends lazily, before the signature
                        tail = _JWT_TAIL.match(text, end)
                        end = tail.end() if tail is not None else end
                    if end > start:
                        yield Finding(kind, start, end)

    @staticmethod
    def _by_entropy(text: str, whole: bool) -> Iterator[Finding]:
        kind = str(_ENTROPY.secret_type)
        if whole and _BASE64_VALUE.fullmatch(text) and _high_entropy(text, text):
            yield Finding(kind, 0, len(text))
            return
        for match in _ENTROPY.regex.finditer(text):
            value = match.group(2)
            line_start = text.rfind("\n", 0, match.start()) + 1
            line_end = text.find("\n", match.end())
            line = text[line_start: line_end if line_end >= 0 else len(text)]
            if _high_entropy(value, line):
                yield Finding(kind, *match.span(2))


def _high_entropy(value: str, line: str) -> bool:
    if len(value) > MAX_ENTROPY_CHARS:
        return False
    if _ENTROPY.calculate_shannon_entropy(value) <= _ENTROPY.entropy_limit:
        return False
    return not (
        heuristic.is_sequential_string(value) or heuristic.is_potential_uuid(value)
        or heuristic.is_likely_id_string(value, line) or heuristic.is_templated_secret(value)
        or heuristic.is_prefixed_with_dollar_sign(value)
        or heuristic.is_not_alphanumeric_string(value)
    )


def _pem_block(text: str, start: int, end: int) -> tuple[int, int]:
    """The whole key: from the `-----BEGIN` line to its `-----END ...-----` (or the end of the
    text when the key was cut), not only the header detect-secrets matches."""
    begin = text.rfind("\n", 0, start) + 1
    closing = _PEM_END.search(text, end)
    return begin, closing.end() if closing is not None else len(text)


def _merged(found: list[Finding]) -> list[Finding]:
    merged: list[Finding] = []
    for finding in sorted(found, key=lambda f: (f.start, -f.end)):
        if merged and finding.start < merged[-1].end:
            last = merged[-1]
            if finding.end > last.end:
                merged[-1] = Finding(last.kind, last.start, finding.end)
            continue
        merged.append(finding)
    return merged


def redact(text: str, findings: list[Finding]) -> str:
    """`text` with each finding replaced by its marker."""
    parts: list[str] = []
    at = 0
    for finding in findings:
        parts.append(text[at: finding.start])
        parts.append(marker(finding.kind))
        at = finding.end
    parts.append(text[at:])
    return "".join(parts)


def redact_text(text: str, scanner: SecretScanner, budget: ScanBudget,
                *, whole: bool = False) -> str:
    """`text` redacted within `budget` (its kinds added to `budget.kinds`)."""
    head = budget.take(text)
    findings = scanner.find(head, whole=whole and head is text)
    if not findings:
        return text
    budget.kinds.extend(f.kind for f in findings)
    return redact(head, findings) + text[len(head):]


def redact_json(value: Any, scanner: SecretScanner, budget: ScanBudget) -> Any:
    """`value` (JSON) with every string value redacted; the same object when nothing was
    found (keys are not scanned)."""
    if isinstance(value, str):
        return redact_text(value, scanner, budget, whole=True)
    if isinstance(value, dict):
        changed = {k: redact_json(v, scanner, budget) for k, v in value.items()}
        same = all(changed[k] is v for k, v in value.items())
        return value if same else changed
    if isinstance(value, list):
        items = [redact_json(v, scanner, budget) for v in value]
        return value if all(a is b for a, b in zip(items, value, strict=True)) else items
    return value
