"""Code Mode: one `execute` tool that runs model-written Python against the whole catalog.

With dozens of servers a model drowns in tool definitions and pays for every intermediate
result. In Code Mode a request advertises `execute` (a stable description, so provider prompt
caches survive), `search_tools` and `describe_tools` instead of the tools themselves; the model
writes a short program, intermediate values stay in the sandbox, and only what the program
prints or returns reaches the model.

    async with Sandbox() as sandbox:
        snapshot = codemode_snapshot(location.seam, location.registry.effective(),
                                     mode="codemode", sandbox=sandbox)
        outcome = await snapshot.execute("execute", {"code": PROGRAM}, context)

Inside a program (a Python subset run by pydantic-monty in a worker process):

    files = await tools.fs.list_dir(path="src")            # tools.<namespace>.<tool>(**input)
    texts = await asyncio.gather(*[tools.fs.read_file(path=f) for f in files["entries"]])
    try:
        await call_tool("issues_create", title="x")        # any tool by its effective name
    except RuntimeError as e:                               # "<tool> failed [<kind>]: <message>"
        print(e)
    len(texts)                                              # the last expression is the result

Modules: `snapshot` (what a request advertises) · `builtins` (the three tools) · `sandbox`
(the worker pool, limits, cancellation) · `nested` (tool calls through the seam, derived call
ids) · `catalog` (Python paths) · `search` (ranking) · `stubs` (JSON Schema -> Python) ·
`program` (run results and errors) · `limits`. Part of the core: may import the core and
`managed_store` only.
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
