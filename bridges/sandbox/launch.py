"""Running one process sandboxed: bubblewrap found and tried once, the launcher prepared
(`launchers`: npx, uvx), the egress proxy started for an allow-list, the bwrap argv built.
Imports its `bridges.sandbox` siblings and `bridges.manifest.sandbox`; exports `sandboxed`,
`SandboxUnavailable`, `explain_exit`, `SandboxArgv`.

    async with sandboxed(config, ["node", "server.js"], cwd=..., env=..., name="fs") as argv:
        proc = await asyncio.create_subprocess_exec(*argv, ...)   # bwrap, maybe behind sh

Where a cgroup can be made (`cgroup`), the argv first joins the sandbox's own cgroup
(`pids`, total memory); it is removed on exit, its counters kept for `explain_exit`.

Where bwrap cannot run (not Linux, not installed, no user namespaces) entering raises
`SandboxUnavailable`, a `PermissionError` whose text is one line naming why: the caller's
"cannot start" path reports it, and nothing runs unsandboxed. A failed preparation raises
`PreparationFailed` (an `OSError`), also one line.
"""

from __future__ import annotations

import functools
import logging
import os
import shutil
import subprocess
import sys
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path

import anyio

from bridges.manifest.sandbox import SandboxConfig
from bridges.sandbox.argv import bwrap_argv
from bridges.sandbox.cgroup import CGROUP_OVERHEAD, SandboxCgroup, cgroup_for, joining_argv
from bridges.sandbox.egress import EgressProxy
from bridges.sandbox.launchers import prepare
from bridges.sandbox.plan import allowed_destinations, plan_sandbox

FORWARDER = str(Path(__file__).with_name("forward.py"))
_MEMORY_SIGNS = ("MemoryError", "out of memory", "Cannot allocate memory", "bad_alloc",
                 "Failed to reserve virtual memory", "allocation failed", "Out of memory")
log = logging.getLogger("bridges.sandbox")
_tried: dict[str, str | None] = {}
"""bwrap path -> None (it runs here) or why it does not."""


class SandboxArgv(list[str]):
    """The argv `sandboxed` yields, with the sandbox's cgroup (None: rlimits only)."""

    cgroup: SandboxCgroup | None = None


class SandboxUnavailable(PermissionError):
    """bubblewrap cannot run here; `str()` is one line naming why."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.strerror = reason

    def __str__(self) -> str:
        return str(self.args[0])


def _try_bwrap(bwrap: str) -> str | None:
    try:
        done = subprocess.run(
            [bwrap, "--unshare-all", "--cap-drop", "ALL", "--ro-bind", "/", "/", "--dev", "/dev",
             "--proc", "/proc", "true"], capture_output=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"sandbox: bwrap cannot run here: {exc}"
    if done.returncode != 0:
        first = (done.stderr.decode(errors="replace").strip().splitlines() or ["(no output)"])[0]
        return f"sandbox: bwrap cannot run here (user namespaces unavailable?): {first}"
    return None


async def _tools() -> tuple[str, str]:
    """(bwrap, prlimit), or SandboxUnavailable."""
    if not sys.platform.startswith("linux"):
        raise SandboxUnavailable(f"sandbox: bubblewrap needs Linux, this is {sys.platform}")
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        raise SandboxUnavailable("sandbox: bwrap is not installed (Debian package bubblewrap; "
                                 "scripts/bootstrap-system installs it)")
    prlimit = shutil.which("prlimit")
    if prlimit is None:
        raise SandboxUnavailable("sandbox: prlimit is not installed (Debian package "
                                 "util-linux), needed for the sandbox's limits")
    if bwrap not in _tried:
        _tried[bwrap] = await anyio.to_thread.run_sync(_try_bwrap, bwrap)
    reason = _tried[bwrap]
    if reason is not None:
        raise SandboxUnavailable(reason)
    return bwrap, prlimit


@asynccontextmanager
async def sandboxed(
    config: SandboxConfig,
    argv: Iterable[str],
    *,
    cwd: str | os.PathLike[str] | None,
    env: Mapping[str, str],
    name: str,
    owner: object = None,
    entry: str | None = None,
) -> AsyncIterator[SandboxArgv]:
    """The argv that runs `argv` in `config`'s sandbox, valid (its egress proxy serving)
    until exit. `env`: what the entry sets itself; `name` names it in the proxy's log;
    `entry` keys its prepared cache (`launchers`; default: `name`). Raises
    SandboxUnavailable, PreparationFailed, or FileNotFoundError when the program is not
    found."""
    bwrap, prlimit = await _tools()
    argv = list(argv)
    environ = dict(os.environ)
    prepared = await prepare(argv, name=entry or name, cwd=cwd, environ=environ)
    async with AsyncExitStack() as stack:
        socket = None
        allowed = allowed_destinations(config)
        if allowed:
            socket = (await stack.enter_async_context(EgressProxy(allowed, name))).path
        plan = await anyio.to_thread.run_sync(functools.partial(
            plan_sandbox, config, argv, cwd=cwd, env=env, environ=environ,
            bwrap=bwrap, prlimit=prlimit, egress_socket=socket,
            forwarder=(sys.executable, FORWARDER), owner=owner, prepared=prepared))
        command = SandboxArgv(bwrap_argv(plan))
        overhead = CGROUP_OVERHEAD + (socket is not None)  # the forwarder: one more
        try:
            cgroup = await anyio.to_thread.run_sync(functools.partial(
                cgroup_for, config.pids, config.memory_mb, overhead=overhead))
        except OSError as exc:
            raise SandboxUnavailable(f"sandbox: cannot create its cgroup: "
                                     f"{exc.strerror or exc}") from None
        if cgroup is not None:
            stack.push_async_callback(_close_cgroup, cgroup, config, name)
            command = SandboxArgv(joining_argv(cgroup, command))
            command.cgroup = cgroup
        yield command


async def _close_cgroup(cgroup: SandboxCgroup, config: SandboxConfig, name: str) -> None:
    await anyio.to_thread.run_sync(cgroup.close)
    what = cgroup.exceeded(config.pids, config.memory_mb)
    if what is not None:
        log.warning("[%s] sandbox: %s", name, what)


def explain_exit(config: SandboxConfig, returncode: int | None, output: str,
                 argv: Sequence[str] = ()) -> str | None:
    """Why a sandboxed process probably ended, when a sandbox limit is the likely cause;
    `argv` is what `sandboxed` yielded (its cgroup's counters tell)."""
    cgroup = getattr(argv, "cgroup", None)
    if isinstance(cgroup, SandboxCgroup):
        what = cgroup.exceeded(config.pids, config.memory_mb)
        if what is not None:
            return what
    if returncode in (128 + 24, -24):  # SIGXCPU: RLIMIT_CPU
        return f"it reached its sandbox cpu_seconds limit ({config.cpu_seconds} s)"
    if any(sign in output for sign in _MEMORY_SIGNS):
        return (f"it ran out of memory at its sandbox limit (memory_mb = {config.memory_mb}, "
                "address space)")
    return None
