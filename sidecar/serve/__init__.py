"""Frontends: the native HTTP API (`api`, `app`, `/v1`), the MCP facade (`mcp_facade`, `/mcp`
and stdio), provider replay (`replay`), security and metrics.

May import: the core (`sidecar`), `bridges` (the facade relays upstream MCP traffic) and
`managed_store`; never the composition root (`sidecar.daemon.daemon`): frontends take a
`sidecar.location.location.Location` and the store interfaces of `sidecar.location.ports`.
"""
