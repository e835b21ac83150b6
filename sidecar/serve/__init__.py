"""Frontends: the native HTTP API (`api`, `app`, `/v1`), the MCP facade (`mcp_facade`, `/mcp`
and stdio), the web console (`console`, `/ui`), the local door (`door`, `local_door`),
security, connection limits and metrics. Design notes: README.md.

May import: the core, `sidecar.formats`, `managed_store` and the package faces `bridges.mcp`
and `bridges.mcp.oauth` (their `__init__`: MCP types of the relayed upstreams, OAuth logins);
never a backend or the composition root: frontends take a `sidecar.location.location.Location`
(its stores as `location.stores`, the upstream servers as `location.upstreams`).
"""
