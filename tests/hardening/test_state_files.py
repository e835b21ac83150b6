"""Issue 26 item 7: the state directory is 0700 and every file in it 0600, created that way; a
state directory others can write (or own) is refused. Real daemon processes, real files.

The daemon runs with umask 000: a file created without an explicit private mode would then be
0666 (a directory 0777), so the modes seen here can only come from how each file was created.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

from tests.hardening.daemon_process import SIDECAR, run_cli, serving, sidecar_env

EXIT_USAGE = 2


def _modes(root: Path) -> dict[str, int]:
    """Mode bits by path, with 0o40000 added for directories."""
    modes = {".": stat.S_IMODE(root.stat().st_mode) | stat.S_IFDIR}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in [*dirnames, *filenames]:
            info = (Path(dirpath) / name).lstat()
            kind = stat.S_IFDIR if stat.S_ISDIR(info.st_mode) else 0
            modes[str((Path(dirpath) / name).relative_to(root))] = stat.S_IMODE(
                info.st_mode) | kind
    return modes


def _not_private(modes: dict[str, int]) -> dict[str, str]:
    """Directories that are not 0700 and files that are not 0600."""
    return {name: oct(mode) for name, mode in modes.items()
            if mode not in (stat.S_IFDIR | 0o700, 0o600)}


def _big_output_manifest(tmp_path: Path) -> Path:
    manifests = tmp_path / "manifests"
    manifests.mkdir()
    (manifests / "big.toml").write_text(f'''
[tools.big]
kind = "command"
description = "prints 200,000 characters (spooled to the managed store)"
input = {{ type = "object", properties = {{}} }}
argv = ["{sys.executable}", "-c", "print('secret ' * 40000)"]
''')
    return manifests


def test_every_state_file_is_private_from_creation(tmp_path: Path) -> None:
    state = tmp_path / "fresh" / "state"
    manifests = _big_output_manifest(tmp_path)
    with serving(state, manifests=manifests, umask=0) as daemon:
        called = run_cli("call", "big", "--json", env=sidecar_env(state, manifests))
        assert called.returncode == 0, called.stderr
        assert '"ref"' in called.stdout or "managed_read" in called.stdout
        modes = _modes(state)  # while the daemon runs: WAL and SHM files exist
        assert daemon.proc.poll() is None
    for name in ("token", "daemon.json", "outcomes.sqlite", "outcomes.sqlite-wal",
                 "outcomes.sqlite-shm", "permissions.sqlite", "managed/lock"):
        assert name in modes, sorted(modes)
    assert any(name.startswith("managed/objects/") for name in modes), sorted(modes)
    assert _not_private(modes) == {}


def test_a_state_dir_others_can_write_is_refused_before_anything_is_written(
    tmp_path: Path,
) -> None:
    state = tmp_path / "shared"
    state.mkdir()
    state.chmod(0o777)
    for command in (["serve", "--port", "0"], ["stdio", "--standalone"],
                    ["tools", "--embedded"]):
        refused = run_cli(*command, env=sidecar_env(state))
        assert refused.returncode == EXIT_USAGE, (command, refused.stderr)
        assert f"state directory {state} is writable by other users (mode 0777)" in (
            refused.stderr)
        assert "Traceback" not in refused.stderr
    assert list(state.iterdir()) == []
    assert stat.S_IMODE(state.stat().st_mode) == 0o777  # refused, not silently changed
    state.chmod(0o770)  # group-writable is refused too
    refused = run_cli("serve", "--port", "0", env=sidecar_env(state))
    assert refused.returncode == EXIT_USAGE and "writable by other users" in refused.stderr


def test_a_state_dir_of_another_user_is_refused(tmp_path: Path) -> None:
    state = tmp_path / "theirs"
    state.mkdir(mode=0o700)
    os.chown(state, 65534, 65534)  # the tests run as root; nobody's uid
    refused = run_cli("serve", "--port", "0", env=sidecar_env(state))
    assert refused.returncode == EXIT_USAGE, refused.stderr
    assert "belongs to uid 65534" in refused.stderr
    assert list(state.iterdir()) == []


def test_a_readable_state_dir_from_before_is_made_private_with_a_warning(tmp_path: Path) -> None:
    state = tmp_path / "old"
    state.mkdir()
    state.chmod(0o755)
    with serving(state) as daemon:
        assert stat.S_IMODE(state.stat().st_mode) == 0o700
        assert any(f"state directory {state} was readable by other users (mode 0755)" in line
                   for line in daemon.stderr)


def test_sidecar_stdio_creates_its_state_private_too(tmp_path: Path) -> None:
    state = tmp_path / "stdio-state"
    done = subprocess.run([*SIDECAR, "stdio", "--standalone"], env=sidecar_env(state), umask=0,
                          stdin=subprocess.DEVNULL, capture_output=True, timeout=120,
                          check=False)
    assert done.returncode == 0, done.stderr
    modes = _modes(state)
    assert "outcomes.sqlite" in modes
    assert _not_private(modes) == {}
