"""Children never outlive the daemon: they die with it, and what is left is reaped at the next
start. Imports nothing of ours; exports `die_with_parent`, `CHILD_GROUPS` (`ChildGroups`),
`reap_leftovers`, `start_ticks` and `group_alive`.

Every command run and stdio server leads its own process group (`start_new_session`). Two
mechanisms cover a daemon that dies without stopping them (kill -9, OOM killer, a crash):
`die_with_parent()` kills the direct child with the thread that forked it, and the groups
recorded in the state directory (`CHILD_GROUPS`) are killed by the next daemon to start
(`reap_leftovers`). Not covered: a descendant that leaves its group (`setsid`, a daemonizing
server), and anything when the daemon never starts again (bridges/README.md).
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger("bridges.child_groups")

PR_SET_PDEATHSIG = 1
CHILDREN_DIR = "children"


def _load_prctl() -> Callable[..., int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl: Callable[..., int] = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    return prctl


_PRCTL = _load_prctl()  # resolved here: the forked child must not load libraries


def die_with_parent() -> Callable[[], None] | None:
    """A `preexec_fn` that makes the child get SIGKILL when this thread ends; None where
    `prctl` is unavailable. Call it once per spawn, in the thread that spawns.

    It sets `PR_SET_PDEATHSIG` (SIGKILL) in the child: Linux kills the child when the thread
    that forked it ends. Children are spawned from the event loop's thread (the main thread of
    `sidecar serve` and `sidecar stdio`) or, for prestarted servers, from the main thread
    before the loop, so that thread lives as long as the daemon. It covers the direct child
    only; what that child started (`npx` -> `node`, a shell's background job) stays in the
    group, for `reap_leftovers`."""
    prctl = _PRCTL
    if prctl is None:
        return None
    parent = os.getpid()

    def preexec() -> None:
        prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
        if os.getppid() != parent:  # the daemon died before prctl took effect
            os._exit(1)

    return preexec


def _stat_fields(pid: int) -> list[str] | None:
    """Fields 3.. of /proc/PID/stat (state first), or None when the process is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except (OSError, ValueError):
        return None
    return text.rsplit(")", 1)[1].split()


def group_alive(pgid: int) -> bool:
    """Whether the process group `pgid` has a member that has not died. A dead member stays a
    zombie until its parent reaps it, and signalling it does nothing: a server's grandchild
    whose parent was the group's leader is reaped by init, which took ~1.7 s on the machines
    here and never happens in a container whose first process reaps nothing, and `killpg(pgid,
    0)` counts it all that time. On Linux the group's members are looked up in /proc (a few
    ms: call it off the event loop); elsewhere a zombie counts."""
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    if not sys.platform.startswith("linux"):
        return True
    try:
        with os.scandir("/proc") as entries:
            for entry in entries:
                if entry.name.isdigit():
                    fields = _stat_fields(int(entry.name))
                    if fields is not None and int(fields[2]) == pgid and fields[0] not in "ZX":
                        return True
    except OSError:  # no /proc to look in: what killpg said
        return True
    return False


def start_ticks(pid: int) -> int | None:
    """When `pid` started, in clock ticks since boot; None when it is gone."""
    fields = _stat_fields(pid)
    return int(fields[19]) if fields is not None else None


def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return "unknown"


class ChildGroups:
    """The process groups this process's children lead, recorded while `record_in` is on:
    one empty 0600 file per group in `children/<boot id>/<daemon pid>-<daemon start>/` of the
    state directory, named `<pgid>-<leader start>` (start times in clock ticks since boot, from
    /proc). Recording costs an open/close and an unlink of an empty file per command run, done
    inline: less than a thread hop would cost."""

    def __init__(self) -> None:
        self._dir: Path | None = None

    def record_in(self, state_dir: Path) -> None:
        """Record from now on in `state_dir` (the daemon commands, after `reap_leftovers`)."""
        ticks = start_ticks(os.getpid()) or 0
        directory = state_dir
        for name in (CHILDREN_DIR, _boot_id(), f"{os.getpid()}-{ticks}"):
            directory = directory / name  # each level 0700 (`mkdir(parents=True)` would not)
            directory.mkdir(mode=0o700, exist_ok=True)
        self._dir = directory

    def stop_recording(self) -> None:
        """Forget the records (every child has been stopped) and stop recording."""
        directory, self._dir = self._dir, None
        if directory is not None:
            _remove_tree(directory)

    def add(self, pgid: int) -> None:
        directory = self._dir
        if directory is None:
            return
        with contextlib.suppress(OSError):  # a record is a safety net, never a reason to fail
            name = directory / f"{pgid}-{start_ticks(pgid) or 0}"
            os.close(os.open(name, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o600))

    def remove(self, pgid: int) -> None:
        directory = self._dir
        if directory is None:
            return
        for path in directory.glob(f"{pgid}-*"):
            with contextlib.suppress(OSError):
                path.unlink()


CHILD_GROUPS = ChildGroups()
"""This process's recorder: the daemon commands turn it on; spawners call `add`/`remove`."""


def reap_leftovers(state_dir: Path) -> list[int]:
    """Kill what is left of the groups recorded by daemons of `state_dir` that are no longer
    running; the pids killed. The daemon commands call it at start.

    For every recording daemon that is no longer alive, each process still in a recorded group
    that started no earlier than the group's leader is killed (SIGKILL), so a group id reused
    by an unrelated process is left alone; records of another boot are deleted. Records of a
    daemon that is still running (on the same state directory) are left alone."""
    root = state_dir / CHILDREN_DIR
    if not root.is_dir():
        return []
    boot = _boot_id()
    killed: list[int] = []
    for boot_dir in root.iterdir():
        if boot_dir.name != boot:
            _remove_tree(boot_dir)
            continue
        for daemon_dir in boot_dir.iterdir():
            pid, _, ticks = daemon_dir.name.partition("-")
            if pid.isdigit() and ticks.isdigit() and start_ticks(int(pid)) == int(ticks):
                continue  # that daemon still runs: its children are its own
            groups = [_parse(p.name) for p in daemon_dir.iterdir()]
            killed.extend(_kill_groups([g for g in groups if g is not None]))
            _remove_tree(daemon_dir)
    if killed:
        log.warning("killed %d process(es) left behind by a daemon that did not stop them: %s",
                    len(killed), killed)
    return killed


def _parse(name: str) -> tuple[int, int] | None:
    pgid, _, ticks = name.partition("-")
    return (int(pgid), int(ticks)) if pgid.isdigit() and ticks.isdigit() else None


def _kill_groups(groups: list[tuple[int, int]]) -> list[int]:
    wanted = dict(groups)
    killed = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        fields = _stat_fields(int(entry.name))
        if fields is None or fields[0] == "Z":
            continue
        pgid, started = int(fields[2]), int(fields[19])
        leader_started = wanted.get(pgid)
        if leader_started is None or started < leader_started:
            continue
        leader_now = start_ticks(pgid)
        if leader_now is not None and leader_now != leader_started:
            continue  # the group id now belongs to another leader
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(int(entry.name), signal.SIGKILL)
            killed.append(int(entry.name))
    return killed


def _remove_tree(directory: Path) -> None:
    with contextlib.suppress(OSError):
        for path in directory.iterdir():
            if path.is_dir() and not path.is_symlink():
                _remove_tree(path)
            else:
                path.unlink(missing_ok=True)
        directory.rmdir()
