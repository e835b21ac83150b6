"""The `guardrails` tables of a manifest: each level parsed into the keys it sets, and every
bad value named by its JSON path."""

from __future__ import annotations

from pathlib import Path

from bridges.manifest.loading import load_manifests
from bridges.manifest_tools import manifest_tool_validator
from sidecar.daemon.sources import guardrails_of

GOOD = """
[guardrails]
secrets = "redact"
hook = "http://127.0.0.1:9100/guard"
[profiles.strict.guardrails]
secrets = "block"
[mcpServers.git]
command = "git-server"
guardrails = { secrets = "off" }
[tools.weather]
kind = "http"
description = "weather"
input = { type = "object" }
request = { url = "http://127.0.0.1:9/w" }
guardrails = { on_error = "allow", timeout = 2 }
"""

BAD = """
[guardrails]
secrets = "maybe"
hook = "ftp://x"
[profiles.p.guardrails]
secret = "block"
[mcpServers.a]
command = "true"
guardrails = { on_error = "sometimes" }
"""


def test_each_level_gives_the_keys_it_sets(tmp_path: Path) -> None:
    (tmp_path / "m.toml").write_text(GOOD)
    loaded = load_manifests([tmp_path], tool_validator=manifest_tool_validator(tmp_path))
    assert loaded.problems == []
    assert guardrails_of(loaded) == (
        {"secrets": "redact", "hook": "http://127.0.0.1:9100/guard"},
        {"strict": {"secrets": "block"}}, {"git": {"secrets": "off"}},
        {"weather": {"on_error": "allow", "timeout": 2.0}})


def test_bad_values_are_named_by_their_path(tmp_path: Path) -> None:
    (tmp_path / "m.toml").write_text(BAD)
    loaded = load_manifests([tmp_path])
    found = sorted((p.path, p.message) for p in loaded.errors)
    assert found == [
        ("$.guardrails.hook", "hook must be an http:// or https:// URL"),
        ("$.guardrails.secrets", "Input should be 'off', 'redact' or 'block'"),
        ("$.mcpServers.a.guardrails.on_error", "Input should be 'deny' or 'allow'"),
        ("$.profiles.p.guardrails.secret", "unknown key"),
    ]
    assert loaded.guardrails is None and "a" not in loaded.servers
