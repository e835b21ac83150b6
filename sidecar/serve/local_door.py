"""The local door of the daemon that owns a state directory, and its clients' side. One state
directory has one owning daemon, which holds `<state>/daemon.lock` (`OwnerLock`) for its
whole life, listens on `<state>/daemon.sock` (HTTP: /v1 and /mcp, for `sidecar tools`, `call`,
`health`, `managed read`) and `<state>/stdio.sock` (MCP sessions of `sidecar stdio`), both
mode 0600, and says who it is in `<state>/daemon.json` (`DaemonInfo`). Clients attach to it or
start one on demand (`ensure_daemon`, `start_daemon`); the hello on `stdio.sock` is
`attach_stdio`'s docstring.

Imports the standard library only: `sidecar stdio` runs it before, and instead of, importing
the daemon. Exports `attach_stdio`, `ensure_daemon`, `connect`, `start_daemon`, `stop_daemon`,
`read_info`, `OwnerLock`, `DaemonInfo`, `DoorError`, the refusals (`manifests_mismatch`,
`database_mismatch`, `already_owned`), `database_of`, `pipes_available` and the file names
(`LOCK_FILE`, `HTTP_SOCKET`, `STDIO_SOCKET`, `INFO_FILE`, `LOG_FILE`).
"""

from __future__ import annotations

import array
import contextlib
import fcntl
import json
import os
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

LOCK_FILE = "daemon.lock"
HTTP_SOCKET = "daemon.sock"
STDIO_SOCKET = "stdio.sock"
INFO_FILE = "daemon.json"
LOG_FILE = "daemon.log"
DEFAULT_IDLE_EXIT = 300.0
"""Seconds a daemon started on demand stays up without any client (`$SIDECAR_IDLE_EXIT`)."""
START_TIMEOUT = 60.0
"""How long a client waits for a daemon it started to open its door."""
MAX_SOCKET_PATH = 104  # sun_path is 104 bytes on macOS, 108 on Linux


class DoorError(Exception):
    """The daemon could not be reached, started, or refused this client (the message says
    which daemon and why). `daemon_exit`: the exit status of a daemon that did not start."""

    def __init__(self, message: str, *, daemon_exit: int | None = None) -> None:
        super().__init__(message)
        self.daemon_exit = daemon_exit


@dataclass(frozen=True, slots=True)
class DaemonInfo:
    """What `<state>/daemon.json` says about the daemon that owns the state directory."""

    pid: int
    state_dir: str
    manifests: tuple[str, ...]
    started: str
    """"serve" (`sidecar serve`), "daemon" (`sidecar daemon`, run by hand), or "on demand"
    (started by `sidecar stdio` or a CLI command; it exits when idle)."""
    idle_exit: float | None
    url: str | None
    """The TCP address of `sidecar serve`, else None."""
    database: str = ""
    """Where it keeps its records: "" (the state directory), or the fleet database as
    `database_of` names it (host, port and database name: never a user or password)."""

    @classmethod
    def from_json(cls, value: dict[str, Any]) -> DaemonInfo:
        idle = value.get("idle_exit")
        return cls(
            pid=int(value["pid"]), state_dir=str(value.get("state_dir", "")),
            manifests=tuple(str(m) for m in value.get("manifests") or ()),
            started=str(value.get("started", "serve")),
            idle_exit=float(idle) if idle is not None else None,
            url=value.get("url") if isinstance(value.get("url"), str) else None,
            database=str(value.get("database") or ""),
        )

    def to_json(self) -> dict[str, Any]:
        return {"pid": self.pid, "state_dir": self.state_dir, "manifests": list(self.manifests),
                "started": self.started, "idle_exit": self.idle_exit, "url": self.url,
                "database": self.database,
                "http_socket": str(Path(self.state_dir) / HTTP_SOCKET),
                "stdio_socket": str(Path(self.state_dir) / STDIO_SOCKET)}

    def describe(self) -> str:
        manifests = ", ".join(self.manifests) or "no manifests"
        how = "started on demand" if self.started == "on demand" else (
            f"started by `sidecar {self.started}`")
        return f"daemon pid {self.pid} on {self.state_dir} ({how}; manifests: {manifests})"


def resolve_manifests(manifests: Sequence[str | os.PathLike[str]]) -> list[str]:
    """Manifest entries as absolute paths: what a daemon and its clients compare."""
    return [str(Path(m).expanduser().resolve()) for m in manifests]


def manifests_mismatch(info: DaemonInfo, wanted: Sequence[str] | None) -> str | None:
    """The refusal for a client that asked for `wanted` (None: whatever runs), or None."""
    if wanted is None or list(wanted) == list(info.manifests):
        return None
    asked = ", ".join(wanted) or "no manifests"
    return (f"the {info.describe()} serves other manifests than the ones asked for ({asked}); "
            "stop it, or use another --state-dir for these manifests")


def database_of(url: str) -> str:
    """A fleet database URL as daemons and clients compare it, without secrets:
    `host:port/name` ("" for no URL)."""
    if not url:
        return ""
    parts = urlsplit(url)
    try:
        port = parts.port or 5432
    except ValueError:
        port = 5432
    host = parts.hostname or parse_qs(parts.query).get("host", [""])[0]
    return f"{host}:{port}/{parts.path.lstrip('/')}"


def database_mismatch(info: DaemonInfo, wanted: str | None, doing: str) -> str | None:
    """The refusal for a command that means to use the fleet database URL `wanted` ("": the
    state directory; None: whatever the daemon uses) while `info`'s daemon uses another, or
    None. `doing`: what the command would do otherwise, for the message."""
    if wanted is None or database_of(wanted) == info.database:
        return None
    def where(database: str) -> str:
        return f"the fleet database {database}" if database else "the state directory"
    return (f"the {info.describe()} keeps its records in {where(info.database)}, and this "
            f"command {doing} {where(database_of(wanted))}: give it the daemon's database "
            "(--store, $SIDECAR_DATABASE_URL), or stop the daemon")


def read_info(state: Path) -> DaemonInfo | None:
    """The running daemon's `daemon.json`, if its pid is alive."""
    try:
        info = DaemonInfo.from_json(json.loads((state / INFO_FILE).read_text()))
        os.kill(info.pid, 0)
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return info


def socket_path(state: Path, name: str) -> str:
    path = str(state / name)
    if len(path.encode()) >= MAX_SOCKET_PATH:
        raise DoorError(f"the state directory {state} is too long a path for a Unix socket "
                        f"({len(path.encode())} bytes with {name!r}); use a shorter --state-dir")
    return path


def pipes_available() -> bool:
    """Whether fds 0 and 1 are both pipes or stream sockets (what an event loop can watch,
    so the daemon can serve them directly); a regular file or a terminal is not."""
    return all(_watchable(fd) for fd in (0, 1))


def _watchable(fd: int) -> bool:
    try:
        mode = os.fstat(fd).st_mode
    except OSError:
        return False
    if not stat.S_ISSOCK(mode):
        return stat.S_ISFIFO(mode)
    sock = socket.socket(fileno=fd)
    try:
        return sock.type == socket.SOCK_STREAM
    finally:
        sock.detach()


def idle_exit_default() -> float:
    raw = os.environ.get("SIDECAR_IDLE_EXIT", "")
    try:
        return float(raw) if raw else DEFAULT_IDLE_EXIT
    except ValueError:
        return DEFAULT_IDLE_EXIT


class OwnerLock:
    """`<state>/daemon.lock`, held (flock, exclusive) by the daemon that owns the state."""

    def __init__(self, fd: int) -> None:
        self._fd = fd

    @classmethod
    def acquire(cls, state: Path) -> OwnerLock | None:
        """The lock, or None when another process holds it."""
        fd = os.open(state / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return None
        return cls(fd)

    def release(self, *sockets: Path) -> None:
        """Remove the owner's sockets (while still holding the lock), then let go."""
        for path in sockets:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
        os.close(self._fd)


def already_owned(state: Path) -> str:
    """What a second daemon on `state` says (one line, naming the owner)."""
    info = read_info(state)
    return (f"another sidecar daemon is running on {state}"
            + (f" ({info.describe()})" if info is not None else "")
            + "; one daemon per state directory: `sidecar health` talks to it; stop it, or use "
            "another --state-dir")


def stop_daemon(state: Path, timeout: float = 30.0) -> DaemonInfo | None:
    """`sidecar stop`: SIGTERM the daemon that owns `state` and wait until it has exited
    (it stops its upstream servers first); the daemon it stopped, None when none ran. Raises
    `DoorError` when it is still running after `timeout` seconds."""
    info = read_info(state)
    if info is None:
        return None
    try:
        os.kill(info.pid, signal.SIGTERM)
    except ProcessLookupError:
        return info
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(info.pid, 0)
        except ProcessLookupError:
            return info
        time.sleep(0.05)
    raise DoorError(f"the {info.describe()} is still running {timeout:g} s after SIGTERM")


# --- finding or starting the daemon --------------------------------------------------------


def _connect(path: str) -> socket.socket | None:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(path)
    except (FileNotFoundError, ConnectionRefusedError):
        sock.close()
        return None
    return sock


def start_daemon(
    state: Path, manifests: Sequence[str], *, idle_exit: float
) -> subprocess.Popen[bytes]:
    """Start `sidecar daemon` on exactly `manifests` for `state`, detached (its own session,
    output to `<state>/daemon.log`); it exits once it has had no client for `idle_exit`
    seconds. `-P`: `-m` would put the working directory (the agent's project, whatever it
    holds) first on the daemon's import path, and a `sidecar` package there would be imported
    instead of this installation's."""
    state.mkdir(mode=0o700, parents=True, exist_ok=True)
    command = [sys.executable, "-P", "-m", "sidecar.cli", "daemon", "--state-dir", str(state),
               "--idle-exit", f"{idle_exit:g}"]
    for manifest in manifests:
        command += ["--manifests", manifest]
    if not manifests:
        command.append("--no-manifests")
    fd = os.open(state / LOG_FILE, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        return subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=fd, stderr=fd,
                                start_new_session=True, close_fds=True)
    finally:
        os.close(fd)


def connect(
    state: Path, name: str, start_with: Sequence[str], *, idle_exit: float,
    timeout: float = START_TIMEOUT,
) -> tuple[socket.socket, bool]:
    """A connection to the daemon's socket `name` (`HTTP_SOCKET` or `STDIO_SOCKET`), starting
    the daemon on demand on the manifests `start_with`; (socket, whether this call started
    it)."""
    path = socket_path(state, name)
    sock = _connect(path)
    if sock is not None:
        return sock, False
    process = start_daemon(state, start_with, idle_exit=idle_exit)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        sock = _connect(path)
        if sock is not None:
            _reap_later(process)
            return sock, True
        code = process.poll()
        if code == 0:
            # it found the state owned by another daemon, which is still starting or was
            # just exiting (idle): try again shortly
            time.sleep(0.2)
            process = start_daemon(state, start_with, idle_exit=idle_exit)
        elif code is not None:
            raise DoorError(f"the daemon for {state} did not start (exit {code}); "
                            f"see {state / LOG_FILE}:\n{_tail(state / LOG_FILE)}",
                            daemon_exit=code)
        time.sleep(0.02)
    _reap_later(process)
    raise DoorError(f"the daemon for {state} did not open {path} within {timeout:g} s; "
                    f"see {state / LOG_FILE}")


def _reap_later(process: subprocess.Popen[bytes]) -> None:
    """The daemon outlives us; a thread reaps it should it end first (no zombie)."""
    threading.Thread(target=process.wait, daemon=True).start()


def _tail(path: Path, lines: int = 8) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def ensure_daemon(
    state: Path, manifests: Sequence[str] | None, start_with: Sequence[str], *, idle_exit: float,
    database: str | None = None,
) -> tuple[DaemonInfo, bool]:
    """The daemon that owns `state` (started on demand on `start_with`), checked against
    `manifests` (None: whichever it serves) and `database` (`database_mismatch`)."""
    sock, started = connect(state, HTTP_SOCKET, start_with, idle_exit=idle_exit)
    sock.close()
    info = read_info(state)
    if info is None:
        raise DoorError(f"the daemon for {state} answers but {state / INFO_FILE} is missing")
    refusal = (manifests_mismatch(info, manifests)
               or database_mismatch(info, database, "was asked to use"))
    if refusal is not None:
        raise DoorError(refusal)
    return info, started


# --- `sidecar stdio`: hand the client to the daemon ----------------------------------------


def _read_line(sock: socket.socket) -> bytes:
    data = b""
    while not data.endswith(b"\n"):
        chunk = sock.recv(4096)
        if not chunk:
            break
        data += chunk
    return data


def attach_stdio(
    state: Path, manifests: Sequence[str] | None, start_with: Sequence[str], *, idle_exit: float,
    profile: str | None = None, database: str | None = None,
) -> int:
    """`sidecar stdio`: serve this process's MCP client from the daemon that owns `state`
    (started on demand on `start_with`; `manifests` and `database` as in `ensure_daemon`).

    On pipes the daemon receives our stdin and stdout and serves them itself (no bytes pass
    through this process); otherwise the bytes are relayed through the socket. Returns when the
    daemon ends the session. Raises `DoorError` when the daemon refuses or cannot start (a
    client that names other manifests than the running daemon's is refused with an error that
    names the daemon, its pid and its manifests).

    The hello on `stdio.sock` is one JSON line from the client, `{"mode": "fds" | "stream",
    "manifests": [absolute paths] | null, "pid": N, "profile": name | null}` (with the two
    descriptors attached in "fds" mode), answered by one JSON line, `{"ok": true, "daemon":
    {...}}` or `{"ok": false, "error": "..."}`. In "fds" mode (stdin and stdout are pipes or
    stream sockets) the connection then only says when the session ended (the daemon closes
    it); in "stream" mode (either is a regular file, a terminal, anything an event loop cannot
    watch) it carries the MCP bytes both ways, relayed by `sidecar stdio`, whose end of input
    it passes on as a half-close."""
    sock, _ = connect(state, STDIO_SOCKET, start_with, idle_exit=idle_exit)
    with sock:
        info = read_info(state) if database is not None else None
        refusal = database_mismatch(info, database, "was asked to use") if info else None
        if refusal is not None:
            raise DoorError(refusal)
        mode = "fds" if pipes_available() else "stream"
        hello = json.dumps({"mode": mode, "manifests": None if manifests is None
                            else list(manifests), "pid": os.getpid(),
                            "profile": profile}).encode() + b"\n"
        if mode == "fds":
            sock.sendmsg([hello], [(socket.SOL_SOCKET, socket.SCM_RIGHTS,
                                    array.array("i", [0, 1]))])
        else:
            sock.sendall(hello)
        try:
            reply = json.loads(_read_line(sock) or b"{}")
        except ValueError:
            reply = {}
        if not reply.get("ok"):
            raise DoorError(str(reply.get("error") or f"the daemon for {state} closed the door"))
        if mode == "fds":
            _let_go_of_stdio()
            with contextlib.suppress(OSError):
                while sock.recv(4096):  # nothing is sent; the end says the session ended
                    pass
            return 0
        return _relay(sock)


def _let_go_of_stdio() -> None:
    """The daemon holds the client's pipes now: keep no copy, so that the client sees the end
    of our stdout exactly when the daemon closes it."""
    devnull = os.open(os.devnull, os.O_RDWR)
    try:
        os.dup2(devnull, 0)
        os.dup2(devnull, 1)
    finally:
        os.close(devnull)


def _relay(sock: socket.socket) -> int:
    def upstream() -> None:
        with contextlib.suppress(OSError):
            while chunk := os.read(0, 1 << 16):
                sock.sendall(chunk)
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_WR)

    threading.Thread(target=upstream, daemon=True).start()
    with contextlib.suppress(OSError):
        while chunk := sock.recv(1 << 16):
            view = memoryview(chunk)
            while view:
                view = view[os.write(1, view):]
    return 0
