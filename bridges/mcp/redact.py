"""Keep a server's secrets out of everything we show: logs, health, error messages.

The secrets of a server are the values of its `env` and `headers` (after `${env:VAR}`
interpolation), a password or query values in its `url`, its OAuth client secret and private
key, and the access and refresh tokens it holds (added as they are obtained). Whatever text
leaves the bridge and may contain upstream words (stderr lines, error messages, log
notifications) goes through the server's `Redactor` first.

A header value such as `Bearer abc123...` is also redacted word by word, so the token alone is
caught too. Values shorter than `MIN_SECRET_LENGTH` are not treated as secrets: redacting
`"1"` or `"cat"` everywhere would garble text without protecting anything.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from urllib.parse import parse_qsl, urlsplit

MIN_SECRET_LENGTH = 4
MASK = "***"


class Redactor:
    """Replaces every occurrence of any known secret with `***`."""

    __slots__ = ("_secrets",)

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        unique = {s for s in secrets if len(s) >= MIN_SECRET_LENGTH}
        # Longest first, so a secret that contains another is masked whole.
        self._secrets = tuple(sorted(unique, key=len, reverse=True))

    @classmethod
    def for_server(
        cls,
        env: Mapping[str, str],
        headers: Mapping[str, str],
        url: str | None = None,
        extra: Iterable[str | None] = (),
    ) -> Redactor:
        """`extra`: more secrets (OAuth client secrets and keys, access and refresh tokens)."""
        values = [*env.values(), *headers.values()]
        words = [word for value in headers.values() for word in value.split()]
        more = [value for value in extra if value]
        return cls([*values, *words, *_url_secrets(url), *more])

    def __call__(self, text: str) -> str:
        for secret in self._secrets:
            if secret in text:
                text = text.replace(secret, MASK)
        return text

    def __bool__(self) -> bool:
        return bool(self._secrets)


def _url_secrets(url: str | None) -> list[str]:
    """A password in the URL's userinfo and its query values (`?api_key=...`) count too."""
    if not url:
        return []
    parts = urlsplit(url)
    found = [value for _, value in parse_qsl(parts.query)]
    if parts.password:
        found.append(parts.password)
    return found
