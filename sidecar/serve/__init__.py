"""Frontends: the MCP facade, the native HTTP API, the CLI, and provider replay."""
