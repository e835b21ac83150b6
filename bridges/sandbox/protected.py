"""What no sandbox may see, whatever its manifest entry binds: the daemon's state directories
(the token, the sockets, the stores) and the working directories of the other stdio servers.
Imports nothing of ours; exports `PROTECTED` (`ProtectedPaths`).

A sandbox is built from an empty root, so these are invisible unless a `read`/`write` path
(or a cwd) contains them or lies inside them: then they are masked (a tmpfs over a directory,
/dev/null over a file). A state directory is masked even over a path the entry lists inside
it; another server's working directory is not masked when it contains one of the entry's
own paths (the entry named it).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable


def _under(path: str, parent: str) -> bool:
    return path == parent or path.startswith(parent.rstrip("/") + "/")


def _touches(path: str, bound: Iterable[str]) -> bool:
    return any(_under(path, b) or _under(b, path) for b in bound)


class ProtectedPaths:
    """This process's protected paths; the composition root adds the state directory, the
    stdio transport each running server's working directory."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._always: dict[str, int] = {}
        self._working: dict[object, str] = {}

    def protect(self, path: str | os.PathLike[str]) -> None:
        real = os.path.realpath(path)
        with self._lock:
            self._always[real] = self._always.get(real, 0) + 1

    def release(self, path: str | os.PathLike[str]) -> None:
        real = os.path.realpath(path)
        with self._lock:
            left = self._always.get(real, 0) - 1
            if left > 0:
                self._always[real] = left
            else:
                self._always.pop(real, None)

    def working_dir(self, owner: object, path: str | os.PathLike[str] | None) -> None:
        """Record (or with None forget) the working directory of a running server."""
        with self._lock:
            if path is None:
                self._working.pop(owner, None)
            else:
                self._working[owner] = os.path.realpath(path)

    def masks(
        self, bound: Iterable[str], *, own: Iterable[str] = (), owner: object = None
    ) -> tuple[tuple[str, bool], ...]:
        """(path, is a directory) to mask in a sandbox that binds `bound` (resolved paths);
        `own` are the paths its entry names itself, `owner` its own working-dir record."""
        bound = list(bound)
        mine = [os.path.realpath(os.path.expanduser(p)) for p in own]
        with self._lock:
            always = list(self._always)
            others = [p for o, p in self._working.items() if o is not owner]
        found = [p for p in always if _touches(p, bound)]
        found += [p for p in others if _touches(p, bound) and p not in found
                  and not any(_under(m, p) for m in mine)]
        return tuple((p, os.path.isdir(p)) for p in sorted(found) if os.path.lexists(p))


PROTECTED = ProtectedPaths()
