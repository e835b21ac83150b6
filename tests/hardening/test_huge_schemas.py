"""Issue 26 item 3: upstream tools with megabytes of schema, at start and by live reload. A
definition over `max_definition_bytes` is left out with the reason in health; the rest is
checked off the event loop, which keeps answering, and a hanging server's start-up timeout
still fires on time.

Health is given 10 s per answer here (before, one 5 MB schema held the loop for 30 s on this
machine): the listing message itself (10 MB of JSON) is still parsed and validated by the
transport on the loop, about 0.1 s per MB, and the test machine's cores are shared."""

from __future__ import annotations

import json
import sys
import threading
import time
from pathlib import Path
from typing import Any

from tests.hardening.conftest import Daemon, start_daemon, stop_daemon

SERVER = Path(__file__).parent / "servers" / "schema_server.py"
HANG = "import time; time.sleep(3600)"


PATIENCE = 10.0


def _server(daemon: Daemon, name: str) -> dict[str, Any]:
    servers: dict[str, Any] = daemon.health(timeout=PATIENCE)["servers"]
    return dict(servers.get(name, {}))


def _wait(daemon: Daemon, name: str, done: Any, seconds: float = 120) -> dict[str, Any]:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        state = _server(daemon, name)  # each poll: health within PATIENCE, or the test fails
        if done(state):
            return state
        time.sleep(0.2)
    raise AssertionError(f"{name}: {state}")


def test_huge_schemas_are_skipped_and_the_loop_keeps_answering(tmp_path: Path) -> None:
    manifest = {"mcpServers": {
        "schemas": {"command": sys.executable, "args": [str(SERVER)]},
        "hangs": {"command": sys.executable, "args": ["-c", HANG],
                  "timeouts": {"startup": 3}},
    }}
    started = time.time()
    daemon = start_daemon(tmp_path, manifests={"servers.json": json.dumps(manifest)})
    try:
        state = _wait(daemon, "schemas", lambda s: s.get("state") == "ready")
        skipped = {s["name"]: s["reason"] for s in state["skipped"]}
        assert list(skipped) == ["huge"]
        assert "over this server's max_definition_bytes (1,048,576)" in skipped["huge"]
        assert state["tool_count"] == 3  # fine, relist, big (~900 KB: under the cap)
        hang = _wait(daemon, "hangs", lambda s: s.get("state") not in (None, "starting"))
        assert "did not start within 3 s" in hang["last_error"], hang
        assert hang["since"] - started < 60  # the 3 s timer fired, not minutes later
        # Live reload: two more tools, one of them 5 MB, while health is polled throughout.
        answered: list[float] = []
        stop = threading.Event()

        def poll() -> None:
            while not stop.is_set():
                daemon.health(timeout=PATIENCE)
                answered.append(time.monotonic())
                time.sleep(0.05)

        poller = threading.Thread(target=poll)
        poller.start()
        try:
            assert daemon.call("schemas_relist", {}, "relist")["status"] == "completed"
            state = _wait(daemon, "schemas", lambda s: s.get("tool_count") == 4)
        finally:
            stop.set()
            poller.join(timeout=30)
        assert sorted(s["name"] for s in state["skipped"]) == ["huge", "huge2"]
        assert len(answered) >= 2
        outcome = daemon.call("schemas_fine", {}, "fine")
        assert outcome["status"] == "completed", outcome
    finally:
        stop_daemon(daemon)
