"""A cgroup per sandbox, where this process may create one: `pids` as the sandbox's process
count (`pids.max`) and `memory_mb` as its total memory (v1 `memory.limit_in_bytes`, v2
`memory.max`, swap included). Imports nothing of ours; exports `SandboxCgroup`, `cgroup_for`,
`joining_argv`, `CGROUP_OVERHEAD`.

Where: under this process's own cgroup of each hierarchy, `<mount><own>/sidecar/<pid>-<n>`
(v2 when a cgroup2 hierarchy offers `pids`, its controllers enabled with
`cgroup.subtree_control`; else the v1 `pids` and `memory` hierarchies). The sandbox joins
before bwrap runs: `joining_argv` puts `/bin/sh -c 'echo $$ > .../cgroup.procs; exec bwrap
...'` in front, so no process of it ever runs outside (a failed join runs nothing). Closing
kills what is left in it, keeps its counters (`exceeded`) and removes it; the first use in a
process removes the directories of processes that are gone. Where no writable cgroup exists,
`cgroup_for` returns None and logs once why: the rlimits alone apply (docs/sandbox.md).
"""

from __future__ import annotations

import itertools
import logging
import os
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger("bridges.sandbox.cgroup")

CGROUP_OVERHEAD = 2
"""bwrap's own processes in the cgroup (its monitor and the PID namespace's init), added to
`pids` so that the number counts the command's processes."""
REMOVE_DEADLINE = 5.0
_JOIN = ('while [ "$1" != -- ]; do echo $$ > "$1" || exit 125; shift; done; shift; '
         'exec "$@"')
_counter = itertools.count(1)
_lock = threading.Lock()


@dataclass(frozen=True, slots=True)
class _Hierarchies:
    version: int
    pids: Path
    """The directory holding this process's sandbox cgroups (`.../sidecar`) for pids."""
    memory: Path | None
    """Likewise for memory (v2: the same directory); None: no memory controller."""


_found: list[_Hierarchies | None] = []


def _mounts() -> list[tuple[str, str, set[str]]]:
    found = []
    try:
        lines = Path("/proc/self/mounts").read_text().splitlines()
    except OSError:
        return []
    for line in lines:
        parts = line.split()
        if len(parts) >= 4 and parts[2] in ("cgroup", "cgroup2"):
            found.append((parts[2], parts[1].replace("\\040", " "), set(parts[3].split(","))))
    return found


def _own(controller: str) -> str | None:
    """This process's cgroup path in the v1 hierarchy of `controller` ("" for v2)."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, names, path = line.split(":", 2)
        if names.split(",") == [""] if controller == "" else controller in names.split(","):
            return path
    return None


def _prepare(base: Path, enable: str | None = None) -> Path:
    """`base/sidecar`, created (and for v2 its controllers enabled); OSError when not writable."""
    if enable is not None:
        (base / "cgroup.subtree_control").write_text(enable)
    where = base / "sidecar"
    where.mkdir(exist_ok=True)
    if enable is not None:
        (where / "cgroup.subtree_control").write_text(enable)
    if not os.access(where, os.W_OK):
        raise PermissionError(13, "not writable", str(where))
    return where


def _find() -> tuple[_Hierarchies | None, str]:
    mounts = _mounts()
    why = "no cgroup hierarchy with the pids controller is mounted"
    for kind, mount, _ in mounts:
        if kind != "cgroup2":
            continue
        try:
            offered = set((Path(mount) / "cgroup.controllers").read_text().split())
        except OSError:
            continue
        if "pids" not in offered:
            continue
        own = _own("")
        base = Path(mount + (own or "/").rstrip("/"))
        enable = " ".join(f"+{c}" for c in ("pids", "memory") if c in offered)
        try:
            where = _prepare(base, enable)
        except OSError as exc:
            why = f"cgroup2 at {base} is not writable ({exc.strerror or exc})"
            continue
        return _Hierarchies(2, where, where if "memory" in offered else None), ""
    found: dict[str, Path] = {}
    for controller in ("pids", "memory"):
        for kind, mount, options in mounts:
            if kind == "cgroup" and controller in options:
                own = _own(controller) or "/"
                base = Path(mount + own.rstrip("/"))
                try:
                    found[controller] = _prepare(base)
                except OSError as exc:
                    why = f"cgroup {base} is not writable ({exc.strerror or exc})"
                break
    if "pids" in found:
        return _Hierarchies(1, found["pids"], found.get("memory")), ""
    return None, why


def _hierarchies() -> _Hierarchies | None:
    with _lock:
        if not _found:
            found, why = _find()
            _found.append(found)
            if found is None:
                log.warning("sandbox: no writable cgroup (%s): pids is RLIMIT_NPROC only (not "
                            "applied to root) and memory_mb is address space per process", why)
            else:
                for place in {found.pids, found.memory} - {None}:
                    assert place is not None
                    _sweep(place)
        return _found[0]


def _alive(pid: int) -> bool:
    return Path(f"/proc/{pid}").exists()


def _sweep(place: Path) -> None:
    """Remove the sandbox cgroups of processes that are gone (killing what is left in them)."""
    try:
        entries = list(place.iterdir())
    except OSError:
        return
    for entry in entries:
        owner, _, _ = entry.name.partition("-")
        if entry.is_dir() and owner.isdigit() and not _alive(int(owner)):
            _remove(entry)


def _procs(where: Path) -> list[int]:
    try:
        return [int(p) for p in (where / "cgroup.procs").read_text().split()]
    except (OSError, ValueError):
        return []


def _remove(where: Path) -> None:
    deadline = time.monotonic() + REMOVE_DEADLINE
    while True:
        try:
            where.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:
            if time.monotonic() > deadline:
                log.warning("sandbox: cannot remove cgroup %s: processes remain in it", where)
                return
        for pid in _procs(where):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        time.sleep(0.01)


def _read(path: Path, key: str) -> int:
    try:
        for line in path.read_text().splitlines():
            name, _, value = line.partition(" ")
            if name == key:
                return int(value)
    except (OSError, ValueError):
        pass
    return 0


@dataclass(slots=True)
class SandboxCgroup:
    """One sandbox's cgroup directories (one per hierarchy: v1 has two)."""

    version: int
    pids: int
    memory_mb: int | None
    dirs: tuple[Path, ...]
    _final: dict[str, int] = field(default_factory=dict)

    def procs_files(self) -> list[str]:
        return [str(d / "cgroup.procs") for d in self.dirs]

    def counters(self) -> dict[str, int]:
        """`pids_refused` (forks refused at pids.max) and `oom_kills`, live or as at close."""
        if self._final:
            return dict(self._final)
        pids_dir = self.dirs[0]
        memory_dir = self.dirs[-1] if self.memory_mb is not None else None
        found = {"pids_refused": _read(pids_dir / "pids.events", "max"), "oom_kills": 0}
        if memory_dir is not None:
            events = "memory.events" if self.version == 2 else "memory.oom_control"
            found["oom_kills"] = _read(memory_dir / events, "oom_kill")
        return found

    def exceeded(self, pids: int, memory_mb: int) -> str | None:
        """Which limit of this cgroup the sandbox ran into, in words, or None."""
        counters = self.counters()
        if counters["oom_kills"]:
            return (f"it was killed at its sandbox memory limit (memory_mb = {memory_mb}, "
                    "the sandbox's total)")
        if counters["pids_refused"]:
            return f"it reached its sandbox pids limit (pids = {pids}): forks were refused"
        return None

    def close(self) -> None:
        """Keep the counters, kill what is left and remove the directories."""
        if not self._final:
            self._final = self.counters()
        for where in self.dirs:
            _remove(where)


def cgroup_for(pids: int, memory_mb: int, *, overhead: int = CGROUP_OVERHEAD) -> (
        SandboxCgroup | None):
    """A new cgroup limited to `pids` (+ `overhead`) processes and `memory_mb` in total, or
    None where no writable cgroup exists (logged once). Blocking: run it in a thread."""
    found = _hierarchies()
    if found is None:
        return None
    name = f"{os.getpid()}-{next(_counter)}"
    places = [found.pids] if found.version == 2 or found.memory is None else [
        found.pids, found.memory]
    made: list[Path] = []
    try:
        for place in places:
            where = place / name
            where.mkdir()
            made.append(where)
        pids_dir = made[0]
        (pids_dir / "pids.max").write_text(str(pids + overhead))
        memory = None
        if found.memory is not None:
            memory = made[-1]
            limit = str(memory_mb * 1024 * 1024)
            if found.version == 2:
                (memory / "memory.max").write_text(limit)
                if (memory / "memory.swap.max").exists():
                    (memory / "memory.swap.max").write_text("0")
            else:
                (memory / "memory.limit_in_bytes").write_text(limit)
                if (memory / "memory.memsw.limit_in_bytes").exists():
                    (memory / "memory.memsw.limit_in_bytes").write_text(limit)
    except OSError:
        for where in made:
            _remove(where)
        raise
    return SandboxCgroup(found.version, pids, memory_mb if memory is not None else None,
                         tuple(made))


def joining_argv(cgroup: SandboxCgroup, argv: list[str]) -> list[str]:
    """`argv` run by a shell that first moves itself into `cgroup`, then execs it."""
    return ["/bin/sh", "-c", _JOIN, "sidecar-sandbox", *cgroup.procs_files(), "--", *argv]
