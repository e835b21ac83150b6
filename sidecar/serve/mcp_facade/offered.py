"""What the facade offers, derived from its upstream servers: the capabilities it advertises
(`capabilities`) and the caching hints of merged listings (`cache_hints`).

Capabilities: `tools` always (the daemon's own tools); `resources`, `prompts`, `completions`
and `logging` only while some connected upstream server (through the profile) declares them,
each flag (`subscribe`, `listChanged`) only when the SDK's own derivation sets it AND an
upstream declares it. While a server is still on its first attempt, or when a 2026-07-28 server
was connected without `server/discover`, what it offers is not known: the SDK's full set is
kept. Asked at each `initialize` and `server/discover`.

Cache hints (2026-07-28 `ttlMs`/`cacheScope`): the smallest `ttlMs` of the upstream pages
merged, `public` only when every page said `public`; nothing merged: 0 and `private`.

Imports `mcp_types` only (`upstream` for its types). Exports `capabilities` and
`cache_hints`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import mcp_types as types

if TYPE_CHECKING:
    from sidecar.serve.mcp_facade.upstream import Upstream, Upstreams


def _declared(upstreams: Iterable[Upstream]) -> list[types.ServerCapabilities] | None:
    """What each server declares; None when one of them has not said (a 2026-07-28 server
    connected without `server/discover`, as `protocol = "2026-07-28"` does: the SDK stands in
    an empty `ServerCapabilities()` for it)."""
    found = []
    for up in upstreams:
        caps = up.connection.client.session.server_capabilities
        if caps is None or (up.connection.modern and caps == _UNSAID):
            return None
        found.append(caps)
    return found


_UNSAID = types.ServerCapabilities()


def capabilities(
    base: types.ServerCapabilities, resources: Upstreams, prompts: Upstreams,
    starting: list[str],
) -> types.ServerCapabilities:
    """`base` (the SDK's derivation from the handlers) narrowed to what the upstream servers
    (`resources`: the servers whose resources pass, `prompts`: whose prompts pass) offer."""
    of_resources = _declared(resources.all())
    of_prompts = _declared(prompts.all())
    if starting or of_resources is None or of_prompts is None:
        return base
    every = of_resources + of_prompts
    update: dict[str, Any] = {}
    offering = [c.resources for c in of_resources if c.resources is not None]
    if base.resources is None or not offering:
        update["resources"] = None
    else:
        update["resources"] = types.ResourcesCapability(
            subscribe=bool(base.resources.subscribe) and any(r.subscribe for r in offering),
            list_changed=bool(base.resources.list_changed)
            and any(r.list_changed for r in offering))
    listing = [c.prompts for c in of_prompts if c.prompts is not None]
    if base.prompts is None or not listing:
        update["prompts"] = None
    else:
        update["prompts"] = types.PromptsCapability(
            list_changed=bool(base.prompts.list_changed)
            and any(p.list_changed for p in listing))
    if not any(c.completions is not None for c in every):
        update["completions"] = None
    if not any(c.logging is not None for c in every):
        update["logging"] = None
    return base.model_copy(update=update)


def cache_hints(pages: Iterable[Any]) -> dict[str, Any]:
    """`ttl_ms` and `cache_scope` of a listing merged from `pages` (upstream list results)."""
    ttl: int | None = None
    public = True
    for page in pages:
        ttl = page.ttl_ms if ttl is None else min(ttl, page.ttl_ms)
        public = public and page.cache_scope == "public"
    if ttl is None:
        return {"ttl_ms": 0, "cache_scope": "private"}
    return {"ttl_ms": ttl, "cache_scope": "public" if public else "private"}
