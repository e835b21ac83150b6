"""`codemode_snapshot`: what one model request advertises, per Code Mode setting.

    mode        advertised (direct list)                          callable from `execute`
    "direct"    every entry                                       (no execute)
    "codemode"  entries with codemode=False + the 3 built-ins     entries with codemode=True
    "both"      every entry + the 3 built-ins                     entries with codemode=True

Both snapshots are captured at the same instant from the same entries and share the seam: the
outer one is returned (and is what a runner executes against); the inner one, held by the
`execute` tool, is the only way a program reaches tools. A registry change after this call
affects later snapshots only. In the outer snapshot the tools left to Code Mode are `removed`
(calling them directly fails `unavailable`); in the inner one, the direct-only tools and the
built-ins are. Entries handed here that take a built-in's name (the registry never lets one
through) are shadowed on the direct list, with a warning; with codemode=True they stay
callable from programs.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping

from sidecar.codemode.builtins import describe_tool, execute_tool, search_tool
from sidecar.codemode.catalog import Catalog
from sidecar.codemode.limits import DEFAULT_LIMITS, CodeModeLimits
from sidecar.codemode.sandbox import Sandbox
from sidecar.execution.seam import Seam
from sidecar.execution.snapshot import Snapshot
from sidecar.model.codemode import MODES, CodeModeSetting
from sidecar.registry.registry import Entry, build_entries

BUILTIN_NAMES = ("execute", "search_tools", "describe_tools")

log = logging.getLogger("sidecar.codemode")


def codemode_snapshot(
    seam: Seam,
    entries: Mapping[str, Entry],
    *,
    mode: CodeModeSetting = "codemode",
    sandbox: Sandbox | None = None,
    limits: CodeModeLimits = DEFAULT_LIMITS,
    session_id: str | None = None,
    final_step: bool = False,
    removed: Iterable[str] = (),
) -> Snapshot:
    """The snapshot for one model request from its effective `entries` (already filtered by
    allow/deny, permissions and definitions hooks; `removed` names what they took out).
    `sandbox` is required unless `mode` is "direct"."""
    removed = frozenset(removed)
    if mode == "direct":
        return Snapshot(
            seam, entries, final_step=final_step, session_id=session_id, removed=removed
        )
    if mode not in MODES:
        raise ValueError(f"unknown Code Mode setting {mode!r}; expected one of {MODES}")
    if sandbox is None:
        raise ValueError(f"Code Mode setting {mode!r} needs a Sandbox")
    reachable = {n: e for n, e in entries.items() if e.tool.codemode}
    inner = Snapshot(
        seam, reachable, final_step=final_step, session_id=session_id,
        removed=removed | (entries.keys() - reachable.keys()) | set(BUILTIN_NAMES),
    )
    catalog = Catalog(reachable)
    builtins = build_entries({
        "execute": execute_tool(sandbox, inner, catalog, limits),
        "search_tools": search_tool(catalog),
        "describe_tools": describe_tool(catalog),
    }, None)
    direct = dict(entries) if mode == "both" else {
        n: e for n, e in entries.items() if not e.tool.codemode
    }
    for name in direct.keys() & builtins.keys():
        log.warning(
            "tool %r (%s) is shadowed on the direct list by the Code Mode built-in of the same "
            "name%s", name, direct[name].key,
            "; programs can still call it" if direct[name].tool.codemode else "",
        )
    advertised = {**direct, **builtins}
    return Snapshot(
        seam, advertised, final_step=final_step, session_id=session_id,
        removed=removed | (entries.keys() - advertised.keys()),
    )
