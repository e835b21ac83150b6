"""The prepared npx/uvx caches of entries a manifest no longer has are deleted: by a real
`sidecar serve` at start and after a reload that removes an entry; the caches of entries
still there, and anything in the directory that is not an entry's cache, stay."""

from __future__ import annotations

import re
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from bridges.sandbox.launchers import PreparedCaches
from tests.hardening.daemon_process import SIDECAR, sidecar_env

TOOL = """
[tools.{name}]
kind = "command"
description = "say"
input = {{ type = "object" }}
argv = ["echo", "hi"]
"""


def _wait(predicate: Callable[[], bool], what: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"not within {timeout} s: {what}"
        time.sleep(0.05)


def _cache(root: Path, name: str) -> Path:
    caches = PreparedCaches()
    caches.use(root)
    where = caches.entry_dir(name)
    (where / "npm").mkdir(parents=True)
    (where / "prepared.json").write_text('{"argv": ["npx", "-y", "pkg"]}')
    return where


def test_caches_of_removed_entries_are_deleted_at_start_and_reload(tmp_path: Path) -> None:
    manifests, state, log = tmp_path / "manifests", tmp_path / "state", tmp_path / "serve.log"
    manifests.mkdir()
    (manifests / "tools.toml").write_text(TOOL.format(name="kept") + TOOL.format(name="later"))
    root = state / "sandbox"
    gone = _cache(root, "removed-server")
    kept, later = _cache(root, "tool:kept"), _cache(root, "tool:later")
    stray = root / "notes.txt"
    stray.write_text("not a cache")
    state.chmod(0o700)
    with log.open("w") as err:
        proc = subprocess.Popen([*SIDECAR, "serve", "--port", "0"], stderr=err,
                                stdout=subprocess.DEVNULL, env=sidecar_env(state, manifests))
    try:
        _wait(lambda: "listening on" in log.read_text() or proc.poll() is not None, "listening")
        assert re.search(r"listening on (\S+)", log.read_text()), log.read_text()
        assert not gone.exists()
        assert kept.is_dir() and later.is_dir() and stray.is_file()
        assert f"deleted the prepared cache of a removed entry ({gone.name})" in log.read_text()

        (manifests / "tools.toml").write_text(TOOL.format(name="kept"))
        _wait(lambda: not later.exists(), "the reload's sweep")
        assert kept.is_dir() and stray.is_file()
    finally:
        proc.terminate()
        proc.wait(timeout=30)
