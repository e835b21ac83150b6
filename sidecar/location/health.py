"""`Location.health()`: the truth about one Location, as `GET /v1/health` and `sidecar health`
show it (`health_report`, whose docstring holds what the report has and when it is "ok",
"degraded" or "unavailable").

Imports `sidecar.stores` and the rest of `sidecar.location`. Exports `health_report`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sidecar.location.state_usage import usage_report
from sidecar.stores.database_down import unless_down

if TYPE_CHECKING:
    from sidecar.location.location import Location


async def health_report(location: Location) -> dict[str, Any]:
    """The health report of `location` (JSON-ready).

    The report has the upstream servers (by manifest key), the plugins, the manifest and
    reload problems, held definition changes, rate-limit rejections, the tool count, the
    managed store (`store`) and the state directory's usage (`state`,
    `sidecar.location.state_usage`), and, in a fleet, whether the database answers
    (`database`).

    `status` is "ok" when every enabled server is ready, no plugin failed, the manifests have
    no errors, every glob of their rules, profiles, overrides and rate limits matches a tool
    (`unmatched_globs`, see `bridges.manifest.globs`; known once no server is on its first
    attempt, matched off the event loop once changed tools are checked: until then the last
    result) and no tool of a `pin = "hold"` server differs from its pin; else "degraded"
    (`definition_changes` lists every change, `warn` ones included). With a fleet database
    that does not answer, "unavailable": `database` says why, and what is read from the
    database (`store`, `state`) is left out.
    """
    database = location.stores.database
    unreachable = await database.unreachable() if database is not None else None
    usage: dict[str, Any] = {}
    if unreachable is None:  # (the check may be a second old: the read may fail first)
        usage, unreachable = await unless_down(
            usage_report(location), database, "the state's usage could not be read")
    servers = {name: h.to_json() for name, h in location.server_health().items()}
    plugins = {ref: s.to_json() for ref, s in location.plugins.status.items()}
    problems = [
        {"file": p.file, "path": p.path, "message": p.message, "severity": p.severity}
        for p in location.manifests.problems
    ]
    sources = location.sources
    pending = sources.reload_problems if sources is not None else []
    reload_problems = [{"file": p.file, "path": p.path, "message": p.message} for p in pending]
    unmatched = [
        {"file": p.file, "path": p.path, "message": p.message, "hint": p.hint}
        for p in (sources.unmatched_globs() if sources is not None else ())
    ]
    held = location.pins.held.values()
    degraded = (
        any(s["state"] not in ("ready", "disabled") for s in servers.values())
        or any(p["state"] == "failed" for p in plugins.values())
        or any(p["severity"] == "error" for p in problems)
        or bool(reload_problems)
        or bool(unmatched)
        or any(c.policy == "hold" for c in held)
    )
    registry = location.registry
    report: dict[str, Any] = {
        "status": "unavailable" if unreachable else "degraded" if degraded else "ok",
        "location": location.name,
        "servers": servers,
        "plugins": plugins,
        "manifest_problems": problems,
        "reload_problems": reload_problems,
        "unmatched_globs": unmatched,
        "definition_changes": [c.to_json() for c in held],
        "rate_limited": location.rate_limits.rejected,
        "tools": len(registry.effective()),
        "reserved_name_conflicts": [c.to_json() for c in registry.reserved_conflicts()],
    }
    if database is not None:
        report["database"] = ({"reachable": True} if unreachable is None
                              else {"reachable": False, "error": unreachable})
    report.update(usage)
    return report
