"""The provider formats replay knows, by the names the CLI and the HTTP API use."""

from __future__ import annotations

from typing import Final, Literal, get_args

Format = Literal["mcp", "openai", "openai-responses", "anthropic", "gemini"]

FORMATS: Final[tuple[Format, ...]] = get_args(Format)
"""Every format name, in documentation order."""

LABELS: Final[dict[Format, str]] = {
    "mcp": "MCP",
    "openai": "OpenAI Chat Completions",
    "openai-responses": "OpenAI Responses",
    "anthropic": "Anthropic Messages",
    "gemini": "Gemini",
}
"""Human names, used in the notes that stand in for media a provider cannot take."""


class UnknownFormat(ValueError):
    """A format name that replay does not know; the message lists the ones it does."""

    def __init__(self, name: object) -> None:
        super().__init__(f"unknown format {name!r}; expected one of {', '.join(FORMATS)}")
        self.name = name


def parse_format(name: str) -> Format:
    """`name` as a `Format`, or `UnknownFormat`."""
    for known in FORMATS:
        if name == known:
            return known
    raise UnknownFormat(name)
