"""Measuring and cutting text in UTF-8 bytes and lines; pure functions, no I/O.

Owns: `utf8_length`, `line_count`, `scrub_surrogates`, `head_end`, `tail_start` (used by the
seam's bounding, `managed_read`, the MCP facade and the manifest tools' output capture).
Imports nothing of ours.
"""

from __future__ import annotations

_CHUNK = 1 << 20


def utf8_length(text: str) -> int:
    """Length in UTF-8 bytes without an extra full-size copy for long texts."""
    if text.isascii():
        return len(text)
    return sum(len(text[i : i + _CHUNK].encode()) for i in range(0, len(text), _CHUNK))


def line_count(text: str) -> int:
    """Lines as an editor counts them: "a\\nb" and "a\\nb\\n" have 2, "" has 0."""
    if not text:
        return 0
    return text.count("\n") + (0 if text.endswith("\n") else 1)


def scrub_surrogates(text: str) -> str:
    """Lone surrogates cannot be UTF-8; they become U+FFFD (rare: malformed producers)."""
    if text.isascii():
        return text
    try:
        utf8_length(text)
    except UnicodeEncodeError:
        return text.encode("utf-8", "replace").decode("utf-8")
    return text


def _utf8_prefix(text: str, max_bytes: int) -> str:
    """The longest prefix of at most `max_bytes` UTF-8 bytes (whole characters only)."""
    if text.isascii():
        return text[:max_bytes]
    return text.encode()[:max_bytes].decode("utf-8", "ignore")


def _utf8_suffix(text: str, max_bytes: int) -> str:
    if max_bytes <= 0:
        return ""
    if text.isascii():
        return text[max(0, len(text) - max_bytes) :]
    encoded = text.encode()
    return encoded[max(0, len(encoded) - max_bytes) :].decode("utf-8", "ignore")


def head_end(text: str, max_bytes: int, max_lines: int) -> int:
    """Index where a head of at most `max_bytes` and `max_lines` ends (whole lines preferred)."""
    window = text[:max_bytes]  # a character takes at least one byte
    pos = -1
    for _ in range(max_lines):
        pos = window.find("\n", pos + 1)
        if pos == -1:
            break
    else:
        window = window[: pos + 1]
    window = _utf8_prefix(window, max_bytes)
    if len(window) < len(text) and not window.endswith("\n"):
        cut = window.rfind("\n")
        if cut + 1 >= len(window) // 2 and cut != -1:
            window = window[: cut + 1]
    return len(window)


def tail_start(text: str, max_bytes: int, max_lines: int) -> int:
    """Index where a tail of at most `max_bytes` and `max_lines` starts (whole lines preferred)."""
    window = text[len(text) - max_bytes :] if max_bytes < len(text) else text
    pos = len(window) - (1 if window.endswith("\n") else 0)
    for _ in range(max_lines):
        pos = window.rfind("\n", 0, pos)
        if pos == -1:
            break
    else:
        window = window[pos + 1 :]
    window = _utf8_suffix(window, max_bytes)
    start = len(text) - len(window)
    if start > 0 and text[start - 1] != "\n":
        cut = window.find("\n")
        if cut != -1 and len(window) - cut - 1 >= len(window) // 2:
            start += cut + 1
    return start
