"""Issue 38 item 8: with `env` fixed by an override (`hidden`), input keys that differ from it
only by case, whitespace or look-alike characters are refused on a real daemon; before, they
reached the upstream as extra arguments next to the fixed one."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.hardening.conftest import Daemon, start_daemon, stop_daemon

SERVER = Path(__file__).parent / "servers" / "args_server.py"
OVERRIDE = '''
[tools.overrides."args_deploy"]
hidden = { env = "staging" }
'''


@pytest.fixture
def fixed(tmp_path: Path) -> Iterator[Daemon]:
    servers = {"mcpServers": {"args": {"command": sys.executable, "args": [str(SERVER)]}}}
    running = start_daemon(tmp_path, manifests={"servers.json": json.dumps(servers),
                                                "override.toml": OVERRIDE})
    try:
        yield running
    finally:
        stop_daemon(running)


LOOKALIKES = ["Env", "ENV", "env ", " env", "e nv", "\u0435nv", "\uff45nv", "e\u200bnv",
              "\u0415NV"]  # Cyrillic e, full-width e, a zero-width space, Cyrillic E


def test_keys_that_only_look_like_a_fixed_one_are_refused(fixed: Daemon) -> None:
    for n, key in enumerate(LOOKALIKES):
        outcome = fixed.call("args_deploy", {"target": "web", key: "production"}, f"k{n}")
        assert outcome["status"] == "error", (key, outcome)
        assert outcome["error"]["kind"] == "invalid_input"
        message = outcome["error"]["message"]
        assert repr(key) in message and "look-alike" in message
        assert "staging" not in message  # the fixed value is not told


def test_the_fixed_value_and_unrelated_keys_reach_the_upstream(fixed: Daemon) -> None:
    outcome = fixed.call("args_deploy", {"target": "web", "env": "production",
                                         "environment": "x"}, "ok")
    assert outcome["status"] == "completed", outcome
    sent = json.loads(outcome["content"][0]["text"])
    assert sent == {"target": "web", "env": "staging", "environment": "x"}
