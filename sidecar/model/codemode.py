"""The Code Mode and tool-search settings of a snapshot, as values (the snapshots themselves:
`sidecar.codemode`).

Exports `CodeModeSetting` and `MODES`, its values in order, and `ExposeSetting` with
`EXPOSE_SETTINGS`. Imports nothing of ours.
"""

from __future__ import annotations

from typing import Literal

CodeModeSetting = Literal["direct", "codemode", "both"]
"""How a snapshot advertises tools: each directly, through Code Mode's `execute`, or both."""
MODES: tuple[CodeModeSetting, ...] = ("direct", "codemode", "both")

ExposeSetting = Literal["all", "search"]
"""Which tools a direct snapshot lists: every one, or `search_tools`, `call_tool`,
`managed_read` and the profile's `always` tools (the rest found by search: docs/tool-search.md)."""
EXPOSE_SETTINGS: tuple[ExposeSetting, ...] = ("all", "search")
