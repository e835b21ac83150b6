"""The Code Mode setting of a snapshot, as a value (the snapshots themselves: `sidecar.codemode`).

Exports `CodeModeSetting` and `MODES`, its values in order. Imports nothing of ours.
"""

from __future__ import annotations

from typing import Literal

CodeModeSetting = Literal["direct", "codemode", "both"]
"""How a snapshot advertises tools: each directly, through Code Mode's `execute`, or both."""
MODES: tuple[CodeModeSetting, ...] = ("direct", "codemode", "both")
