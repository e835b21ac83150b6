"""Sources: where tools come from besides code. MCP client bridges (`mcp`: stdio, streamable
HTTP, SSE; `mcp.oauth`), manifest tools (`manifest_tools`: `http` and `command`), the manifest
format (`manifest`, `manifest_values`, `manifest_profiles`, `manifest_overrides`) and the
manifests applied to a Location (`manifest_sources`), servers started early (`prestart`).

Owns nothing of the seam: a bridge registers tools through the same `Tools` capability a
plugin gets. May import: the core (`sidecar`, not `sidecar.serve`, `sidecar.cli.main*` or
`sidecar.daemon.daemon`) and `managed_store`. Imported by the composition root and the frontends;
never by the core (`tests/test_architecture.py`).
"""
