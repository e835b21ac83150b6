"""A `sidecar` package in the directory an agent starts `sidecar stdio` in (its project, a
cloned repository) is never imported in place of the installed one: not by the daemon that
`sidecar stdio` starts on demand, nor by the command a client entry runs when there is no
`sidecar` script. (`python -m` puts the working directory first on the import path; the daemon
was started that way until 2026-12-07.)

Real processes: the installed `sidecar` script started in the planted directory, the daemon it
starts, the conformance fixture as its upstream.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from sidecar.cli import client_config
from tests.daemons import daemon_pid, stop_daemon
from tests.serve.mcp_facade.conftest import fixture_server, write_manifest
from tests.serve.mcp_facade.test_stdio_pipes import answers, check, conversation

PLANTED = """\
import pathlib
pathlib.Path(__file__).resolve().parents[1].joinpath("planted-ran").write_text("imported")
raise SystemExit("the planted sidecar package was imported")
"""


def planted(tmp: Path) -> Path:
    """A project directory holding a `sidecar` package (with `sidecar.cli`) that leaves a
    file behind and exits when it is imported."""
    project = tmp / "project"
    (project / "sidecar" / "cli").mkdir(parents=True)
    (project / "sidecar" / "__init__.py").write_text(PLANTED)
    (project / "sidecar" / "cli" / "__init__.py").write_text("")
    return project


def test_the_daemon_sidecar_stdio_starts_in_a_planted_project_is_the_installed_one(
    tmp_path: Path,
) -> None:
    project = planted(tmp_path)
    state = tmp_path / "state"
    manifests = write_manifest(tmp_path / "manifests", {"fixture": fixture_server()})
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "SIDECAR_STATE_DIR": str(state),
           "SIDECAR_MANIFESTS": str(manifests), "SIDECAR_IDLE_EXIT": "60"}
    script = Path(sys.executable).parent / "sidecar"
    assert script.is_file(), "the package's console script is installed beside the interpreter"
    try:
        done = subprocess.run([str(script), "stdio"], input=conversation().encode(),
                              cwd=project, env=env, capture_output=True, timeout=120,
                              check=False)
        assert not (project / "planted-ran").exists(), done.stderr.decode()[-2000:]
        assert done.returncode == 0, done.stderr.decode()[-2000:]
        check(answers(done.stdout.decode()))
        pid = daemon_pid(state)
        assert pid is not None  # the call went through the shared daemon, started here
        assert Path(f"/proc/{pid}/cwd").resolve() == project.resolve()
    finally:
        stop_daemon(state)


def test_a_client_entry_without_a_script_runs_the_installed_package(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    project = planted(tmp_path)
    monkeypatch.setattr(client_config.shutil, "which", lambda name: None)
    monkeypatch.setattr(client_config.sys, "executable", str(tmp_path / "bin" / "python3"))
    command = client_config.sidecar_command()  # no `sidecar` beside that interpreter
    assert command == [str(tmp_path / "bin" / "python3"), "-P", "-m", "sidecar.cli"]
    monkeypatch.undo()
    done = subprocess.run([sys.executable, *command[1:], "--version"], cwd=project,
                          capture_output=True, timeout=60, check=False)
    assert not (project / "planted-ran").exists(), done.stderr.decode()
    assert done.returncode == 0 and done.stdout.decode().startswith("sidecar "), done
