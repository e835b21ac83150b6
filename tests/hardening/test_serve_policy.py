"""Issue 26 items 8 and 9: weak tokens, loose token files and `--no-auth` off loopback, each
tried on a real `sidecar serve` process."""

from __future__ import annotations

import secrets
import subprocess
import sys
import time
import uuid
from pathlib import Path

from tests.hardening.daemon_process import (
    SIDECAR,
    processes_with,
    raw_request,
    run_cli,
    serving,
    sidecar_env,
)

EXIT_USAGE = 2


def _health(port: int, token: str | None) -> int:
    auth = f"Authorization: Bearer {token}\r\n" if token is not None else ""
    request = f"GET /v1/health HTTP/1.1\r\nHost: localhost\r\n{auth}Connection: close\r\n\r\n"
    return raw_request(port, request.encode())[0]


def _sleeper_manifest(tmp_path: Path, marker: str) -> Path:
    """A manifest whose stdio server the CLI spawns before anything is checked."""
    manifests = tmp_path / "manifests"
    manifests.mkdir()
    code = f"import time; time.sleep(120)  # {marker}"
    (manifests / "sleeper.json").write_text(
        '{"mcpServers": {"sleeper": {"command": %r, "args": ["-c", %r]}}}'
        .replace("%r", '"%s"') % (sys.executable, code)
    )
    return manifests


def test_a_short_sidecar_token_is_refused_and_nothing_is_left_running(tmp_path: Path) -> None:
    marker = f"weak-token-{uuid.uuid4().hex}"
    manifests = _sleeper_manifest(tmp_path, marker)
    for weak in ("x", "hunter2hunter2", str(uuid.uuid4()), "ab" * 64):
        env = sidecar_env(tmp_path / "state", manifests, SIDECAR_TOKEN=weak)
        refused = run_cli("serve", "--port", "0", env=env)
        assert refused.returncode == EXIT_USAGE, refused.stderr
        assert "refusing the bearer token from SIDECAR_TOKEN" in refused.stderr
        assert "--allow-weak-token" in refused.stderr
        assert "Traceback" not in refused.stderr
        if len(weak) > 1:
            assert weak not in refused.stderr  # the token is never printed
    assert processes_with(marker) == []  # the server spawned before the check was stopped
    assert not (tmp_path / "state" / "daemon.json").exists()


def test_a_weak_token_is_served_only_when_explicitly_allowed(tmp_path: Path) -> None:
    state = tmp_path / "state"
    with serving(state, "--allow-weak-token",
                 env=sidecar_env(state, SIDECAR_TOKEN="x")) as daemon:
        assert _health(daemon.port, "x") == 200
        assert _health(daemon.port, "y") == 401
    env = sidecar_env(state, SIDECAR_TOKEN="x", SIDECAR_ALLOW_WEAK_TOKEN="1")
    with serving(state, env=env) as daemon:
        assert _health(daemon.port, "x") == 200


def test_random_tokens_of_32_bytes_are_accepted(tmp_path: Path) -> None:
    state = tmp_path / "state"
    for strong in (secrets.token_hex(32), secrets.token_urlsafe(32)):
        with serving(state, env=sidecar_env(state, SIDECAR_TOKEN=strong)) as daemon:
            assert _health(daemon.port, strong) == 200


def test_a_weak_loose_or_linked_token_file_is_refused(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    token_file = state / "token"
    token_file.write_text("password\n")
    token_file.chmod(0o600)
    refused = run_cli("serve", "--port", "0", env=sidecar_env(state))
    assert refused.returncode == EXIT_USAGE, refused.stderr
    assert f"refusing the bearer token from {token_file}" in refused.stderr
    strong = secrets.token_urlsafe(32)
    token_file.write_text(strong + "\n")
    token_file.chmod(0o644)  # issue 38 item 8: refused, not warned about
    refused = run_cli("serve", "--port", "0", env=sidecar_env(state))
    assert refused.returncode == EXIT_USAGE, refused.stderr
    assert f"refusing the token file {token_file}: other users may read" in refused.stderr
    assert "mode 0644" in refused.stderr and strong not in refused.stderr
    assert "Traceback" not in refused.stderr
    elsewhere = tmp_path / "elsewhere"
    token_file.rename(elsewhere)
    elsewhere.chmod(0o600)
    token_file.symlink_to(elsewhere)
    refused = run_cli("serve", "--port", "0", env=sidecar_env(state))
    assert refused.returncode == EXIT_USAGE, refused.stderr
    assert f"refusing the token file {token_file}: it is not a regular file" in refused.stderr
    assert not (state / "daemon.json").exists()
    token_file.unlink()
    elsewhere.rename(token_file)
    with serving(state) as daemon:
        assert _health(daemon.port, strong) == 200
        assert "token file" not in "".join(daemon.stderr)


def test_no_auth_off_loopback_is_refused_without_the_second_flag(tmp_path: Path) -> None:
    marker = f"no-auth-{uuid.uuid4().hex}"
    manifests = _sleeper_manifest(tmp_path, marker)
    state = tmp_path / "state"
    for host in ("0.0.0.0", "::", "example.invalid"):
        refused = run_cli("serve", "--no-auth", "--host", host, "--port", "0",
                          env=sidecar_env(state, manifests))
        assert refused.returncode == EXIT_USAGE, refused.stderr
        assert f"refusing --no-auth on {host}" in refused.stderr
        assert "--allow-no-auth-on-network" in refused.stderr
        assert "Traceback" not in refused.stderr
    assert processes_with(marker) == []
    assert not (state / "daemon.json").exists()


def test_no_auth_prints_a_warning_on_loopback_and_off_it(tmp_path: Path) -> None:
    state = tmp_path / "state"
    with serving(state, "--no-auth") as daemon:
        assert any("warning: --no-auth" in line for line in daemon.stderr)
        assert _health(daemon.port, None) == 200
    with serving(state, "--no-auth", "--host", "0.0.0.0",
                 "--allow-no-auth-on-network") as daemon:
        assert any("warning: --no-auth on 0.0.0.0, which is not a loopback" in line
                   for line in daemon.stderr)
        assert _health(daemon.port, None) == 200


def test_a_weak_token_is_accepted_by_a_daemon_without_tcp(tmp_path: Path) -> None:
    """`sidecar stdio` starts `sidecar daemon` on demand: it serves only the 0600 sockets in the
    private state directory, which no other user can reach, so the token's strength does not
    matter there."""
    state = tmp_path / "state"
    hello = ('{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":'
             '"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}\n')
    done = subprocess.run([*SIDECAR, "stdio", "--idle-exit", "1"], input=hello, text=True,
                          capture_output=True, env=sidecar_env(state, SIDECAR_TOKEN="x"),
                          timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert '"id":1,"result"' in done.stdout.replace(" ", "")
    end = time.monotonic() + 60  # the on-demand daemon leaves after a second without clients
    while (state / "daemon.json").exists():
        assert time.monotonic() < end, "the on-demand daemon did not leave"
        time.sleep(0.1)


def test_a_new_token_is_not_written_into_a_log(tmp_path: Path) -> None:
    """stderr to a pipe, as a service manager or `daemon.log` gets it: a newly created token
    is named by its file, never printed (the terminal case prints it, for the person there)."""
    state = tmp_path / "state"
    env = sidecar_env(state)
    env.pop("SIDECAR_TOKEN", None)
    with serving(state, env=env) as daemon:
        token = daemon.token
        said = "".join(daemon.stderr)
        assert f"new bearer token in {state / 'token'}" in said
        assert token not in said
        assert _health(daemon.port, token) == 200


def test_a_new_token_is_printed_to_a_terminal(tmp_path: Path) -> None:
    """stderr a terminal (a pseudo-terminal here): the person starting `sidecar serve` sees
    the new token once."""
    import os
    import pty
    import select
    import signal

    state = tmp_path / "state"
    env = sidecar_env(state)
    env.pop("SIDECAR_TOKEN", None)
    leader, follower = pty.openpty()
    proc = subprocess.Popen([*SIDECAR, "serve", "--port", "0"], env=env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=follower)
    os.close(follower)
    said = b""
    try:
        while b"listening on" not in said:
            assert select.select([leader], [], [], 30)[0], said  # never waits forever
            chunk = os.read(leader, 4096)
            assert chunk, said
            said += chunk
        token = (state / "token").read_text().strip()
        assert f"new bearer token (also in {state / 'token'}): {token}" in said.decode()
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
        os.close(leader)
