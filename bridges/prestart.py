"""Upstream stdio servers started before the daemon's own imports, and adopted by its pool.
Imports `bridges.child_groups` and `bridges.manifest.loading` (pydantic only, no SDK);
exports `prestart_servers`, `PRESTARTED`, `StdioSpec` and `default_environment`.

    prestart_servers(manifest_paths)   # the CLI, first thing: spawns every stdio server
    import sidecar.daemon.daemon       # ~0.7 s of imports (mostly the `mcp` SDK's models)
    ...                                # the pool's stdio transport claims each process
    PRESTARTED.discard()               # once the Location is open: stops the unclaimed ones

A prestarted process is adopted only by a transport whose `StdioSpec` is equal (command,
args, environment, cwd): a manifest that changed in between, or an entry the Location does not
start, leaves its process unclaimed, and `discard` stops it. Nothing here reports problems: an
entry that cannot be read or spawned is skipped, and the Location reports it as it would have.
Why: bridges/README.md.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from bridges.child_groups import die_with_parent, group_alive
from bridges.manifest.loading import ServerConfig, load_manifests
from bridges.manifest.sandbox import SandboxConfig, with_default

log = logging.getLogger("bridges.prestart")

INHERITED_ENV_VARS = ("HOME", "LOGNAME", "PATH", "SHELL", "TERM", "USER")
"""What a stdio server inherits from the daemon's environment, as the `mcp` SDK's
`get_default_environment` on POSIX (a test compares the two)."""


def default_environment() -> dict[str, str]:
    """The inherited part of a stdio server's environment (no exported shell functions)."""
    return {
        key: value for key in INHERITED_ENV_VARS
        if (value := os.environ.get(key)) is not None and not value.startswith("()")
    }


@dataclass(frozen=True, slots=True)
class StdioSpec:
    """How a stdio server is started; equal specs start the same process."""

    command: str
    args: tuple[str, ...]
    env: Mapping[str, str]
    cwd: str | None
    max_message_bytes: int
    sandbox: SandboxConfig | None = None
    """Run under bubblewrap (`bridges.sandbox`); such a server is never prestarted."""

    @classmethod
    def of(cls, config: ServerConfig) -> StdioSpec:
        assert config.command is not None
        return cls(command=config.command, args=tuple(config.args), env=config.env,
                   cwd=config.cwd, max_message_bytes=config.max_result_bytes,
                   sandbox=with_default(config.sandbox, None))

    def child_environment(self) -> dict[str, str]:
        return default_environment() | dict(self.env)

    def key(self) -> tuple[object, ...]:
        return (self.command, self.args, tuple(sorted(self.child_environment().items())),
                self.cwd, self.sandbox is not None)


class Prestarted:
    """Processes started ahead of the pool, each waiting for a transport with its spec."""

    def __init__(self) -> None:
        self._waiting: dict[tuple[object, ...], list[subprocess.Popen[bytes]]] = {}
        self._lock = threading.Lock()

    def start(self, specs: Iterable[StdioSpec]) -> int:
        """Spawn each spec as the pool's transport would; the number started."""
        started = 0
        for spec in specs:
            try:
                process = subprocess.Popen(
                    [spec.command, *spec.args], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE, env=spec.child_environment(), cwd=spec.cwd,
                    start_new_session=True, bufsize=0,
                    preexec_fn=die_with_parent(),  # the main thread: it lives as the daemon
                )
            except (OSError, ValueError) as exc:  # the transport will fail and report it
                log.debug("prestart of %s failed: %s", spec.command, exc)
                continue
            with self._lock:
                self._waiting.setdefault(spec.key(), []).append(process)
            started += 1
        return started

    def claim(self, spec: StdioSpec) -> subprocess.Popen[bytes] | None:
        """A waiting process started with `spec`, now the caller's; None if there is none."""
        if not self._waiting:
            return None
        with self._lock:
            waiting = self._waiting.get(spec.key())
            return waiting.pop(0) if waiting else None

    def pids(self) -> list[int]:
        """The waiting processes' pids."""
        with self._lock:
            return [p.pid for waiting in self._waiting.values() for p in waiting]

    @property
    def waiting(self) -> int:
        with self._lock:
            return sum(len(processes) for processes in self._waiting.values())

    def discard(self) -> int:
        """Stop the processes nobody claimed (their whole group) and reap them; how many."""
        with self._lock:
            processes = [p for waiting in self._waiting.values() for p in waiting]
            self._waiting.clear()
        for process in processes:
            stop(process)
        return len(processes)


STOP_WAIT = 2.0
"""How long `stop` waits for the other members of a killed group to die (seconds)."""


def stop(process: subprocess.Popen[bytes]) -> None:
    """Kill a prestarted process's group (it leads its own), reap it, wait until no member of
    the group is alive (`STOP_WAIT` at most: a process in an uninterruptible wait dies only
    when that ends) and close its pipes. Not on the event loop: it blocks."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()
    deadline = time.monotonic() + STOP_WAIT
    while group_alive(process.pid) and time.monotonic() < deadline:
        time.sleep(0.01)
    for pipe in (process.stdin, process.stdout, process.stderr):
        if pipe is not None:
            pipe.close()


PRESTARTED = Prestarted()
"""This process's prestarted servers: filled by `prestart_servers`, claimed by the stdio
transport (`bridges.mcp.stdio`)."""


def prestart_servers(manifests: Sequence[str | os.PathLike[str]]) -> int:
    """Spawn every enabled stdio server the manifests declare into `PRESTARTED`; how many.

    For a process that will open a Location on these manifests next (the daemon commands);
    unreadable manifests and invalid entries are skipped here and reported by the Location.
    """
    if sys.platform == "win32" or not manifests:  # POSIX process groups, as the transport
        return 0
    try:
        loaded = load_manifests([Path(m) for m in manifests])
    except (OSError, ValueError) as exc:
        log.debug("prestart: manifests not read: %s", exc)
        return 0
    specs = [StdioSpec.of(sourced.value) for sourced in loaded.servers.values()
             if sourced.value.transport == "stdio" and not sourced.value.disabled]
    specs = [spec for spec in specs if spec.sandbox is None]  # started by the transport
    return PRESTARTED.start(specs)
