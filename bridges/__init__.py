"""Sources: where tools come from besides code. The manifest format (`manifest`: loading,
values, secrets, profiles, overrides, OAuth settings, globs, its JSON Schema), MCP client bridges
(`mcp`: stdio, streamable HTTP, SSE; `mcp.oauth`), manifest tools (`manifest_tools`: `http` and
`command`), child process groups and servers started early (`prestart`). The composition root
applies manifests to a Location (`sidecar.daemon.sources`).

Owns nothing of the seam: a bridge registers tools through the same `Tools` capability a plugin
gets. May import `sidecar.model`, `sidecar.registry`, `sidecar.stores` and `managed_store`;
imported by the composition root, the CLI and (the faces `bridges.mcp`, `bridges.mcp.oauth`)
the frontends; never by the core (docs/architecture.md).
"""
