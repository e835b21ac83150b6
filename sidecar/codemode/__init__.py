"""Code Mode: one `execute` tool that runs model-written Python against the whole catalog, with
`search_tools` and `describe_tools` beside it (README.md here; users: docs/codemode.md).
Part of the core, above execution: imports the lower core packages and `managed_store` only.

Exports `codemode_snapshot` (what a request advertises), `Sandbox`, `RunGuard` and
`SandboxClosed` (the worker pool), `CodeModeLimits` and `DEFAULT_LIMITS`, `ProgramRun` and
`ProgramError`, `Catalog` and `CatalogTool`, `CodeModeSetting` and `MODES`, `BUILTIN_NAMES`
and the three built-ins' descriptions.
"""

from __future__ import annotations

from sidecar.codemode.builtins import (
    DESCRIBE_DESCRIPTION,
    EXECUTE_DESCRIPTION,
    SEARCH_DESCRIPTION,
)
from sidecar.codemode.catalog import Catalog, CatalogTool
from sidecar.codemode.limits import DEFAULT_LIMITS, CodeModeLimits
from sidecar.codemode.program import ProgramError, ProgramRun
from sidecar.codemode.sandbox import RunGuard, Sandbox, SandboxClosed
from sidecar.codemode.snapshot import BUILTIN_NAMES, codemode_snapshot
from sidecar.model.codemode import MODES, CodeModeSetting

__all__ = [
    "BUILTIN_NAMES",
    "DEFAULT_LIMITS",
    "DESCRIBE_DESCRIPTION",
    "EXECUTE_DESCRIPTION",
    "MODES",
    "SEARCH_DESCRIPTION",
    "Catalog",
    "CatalogTool",
    "CodeModeLimits",
    "CodeModeSetting",
    "ProgramError",
    "ProgramRun",
    "RunGuard",
    "Sandbox",
    "SandboxClosed",
    "codemode_snapshot",
]
