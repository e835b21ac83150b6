"""Issue 26 item 15: starting a second daemon on a state directory and serving on a port in
use each end in one line on stderr and a distinct exit code (a port in use before anything is
created); a reader closing stdout early (`| head`) ends the command quietly, exit 141."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from sidecar.cli.commands import EXIT_ADDRESS_IN_USE, EXIT_BROKEN_PIPE, EXIT_STATE_IN_USE
from tests.hardening.conftest import SIDECAR, Daemon


def _env(daemon: Daemon, state: Path | None = None) -> dict[str, str]:
    env = {**os.environ, "SIDECAR_STATE_DIR": str(state or daemon.state),
           "SIDECAR_MANIFESTS": str(daemon.manifests)}
    env.pop("SIDECAR_TOKEN", None)
    env.pop("SIDECAR_URL", None)
    return env


def _one_line(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.startswith("sidecar: ")]
    assert "Traceback" not in stderr, stderr
    assert len(lines) == 1, stderr
    return lines[0]


def test_a_second_serve_on_the_same_state_dir(daemon: Daemon) -> None:
    second = subprocess.run([*SIDECAR, "serve", "--port", "0"], env=_env(daemon),
                            capture_output=True, text=True, timeout=120, check=False)
    assert second.returncode == EXIT_STATE_IN_USE, second.stderr
    assert "another sidecar daemon is running on" in _one_line(second.stderr)
    assert str(daemon.state) in second.stderr
    daemon.health()  # the first one is untouched


def test_a_port_in_use(daemon: Daemon, tmp_path: Path) -> None:
    other = {**_env(daemon, tmp_path / "other-state"), "SIDECAR_TOKEN": daemon.token}
    taken = subprocess.run([*SIDECAR, "serve", "--port", str(daemon.port)], env=other,
                           capture_output=True, text=True, timeout=120, check=False)
    assert taken.returncode == EXIT_ADDRESS_IN_USE, taken.stderr
    line = _one_line(taken.stderr)
    assert f"127.0.0.1:{daemon.port} is already in use" in line
    assert not (tmp_path / "other-state").exists()  # no state directory, token or lock
    assert "token" not in taken.stderr
    daemon.health()


def test_stdout_closed_early_is_a_broken_pipe_exit(daemon: Daemon) -> None:
    env = _env(daemon)  # talks to the running daemon through the state dir's daemon.json
    read, write = os.pipe()
    os.close(read)  # the reader is gone before anything is written, as `| head` ends
    try:
        listed = subprocess.run([*SIDECAR, "tools", "--json"], env=env, stdout=write,
                                stderr=subprocess.PIPE, text=True, timeout=120, check=False)
        called = subprocess.run(
            [*SIDECAR, "call", "text", "--input", '{"line": "x", "count": 3}'], env=env,
            stdout=write, stderr=subprocess.PIPE, text=True, timeout=120, check=False)
    finally:
        os.close(write)
    for result in (listed, called):  # quietly, as `cat` or `grep` in a pipe
        assert result.returncode == EXIT_BROKEN_PIPE, result.stderr
        assert result.stderr == "", result.stderr
    daemon.health()
