"""MCP bridges (issue 4)."""
