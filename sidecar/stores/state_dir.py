"""The state directory is private to the user the daemon runs as: everything kept there
(outcomes and permission decisions in SQLite, retained tool output, the bearer token,
`daemon.json`) may hold secrets. A new directory is created 0700 and every file in it 0600
at creation (nothing is chmod'ed afterwards, so no file is readable by others even for a
moment); an existing one is checked at every start (`prepare_state_dir`).

Imports nothing of the sidecar. Exports `prepare_state_dir`, `UnsafeStateDir`,
`create_private_file`, `write_private_file`, `PRIVATE_DIR_MODE` and `PRIVATE_FILE_MODE`.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

PRIVATE_DIR_MODE = 0o700
PRIVATE_FILE_MODE = 0o600


class UnsafeStateDir(Exception):
    """The state directory is not private and the daemon will not use it; the message says why
    and how to fix it."""


def prepare_state_dir(path: Path) -> str | None:
    """Create `path` 0700 if it does not exist (`os.mkdir` with that mode; its parents, e.g.
    `~/.local/state`, as the umask says), else check it:

    - not a directory, not owned by this user, or writable by its group or others: refused
      (`UnsafeStateDir`). Someone else could already have replaced a database, planted a
      symlink, or read the token; fixing the mode now would not undo that, so the daemon
      stops and says what to do.
    - readable or searchable by its group or others (a directory made 0755 by hand):
      tightened to 0700 with a warning. Once the directory is 0700 other users cannot reach
      any file in it, whatever the files' own modes.

    Returns that warning when an existing directory was tightened, else None.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.mkdir(path, PRIVATE_DIR_MODE)
        return None
    except FileExistsError:
        pass
    info = path.stat()
    if not stat.S_ISDIR(info.st_mode):
        raise UnsafeStateDir(f"state directory {path} is not a directory")
    mode = stat.S_IMODE(info.st_mode)
    if info.st_uid != os.geteuid():
        raise UnsafeStateDir(
            f"state directory {path} belongs to uid {info.st_uid}, not to this user "
            f"(uid {os.geteuid()}); use a directory of your own (--state-dir)"
        )
    if mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise UnsafeStateDir(
            f"state directory {path} is writable by other users (mode {mode:04o}), who could "
            f"have replaced what is in it; check its contents, then run: chmod 700 {path}"
        )
    if mode & 0o077:
        os.chmod(path, PRIVATE_DIR_MODE)
        return (f"state directory {path} was readable by other users (mode {mode:04o}); "
                f"it is now 0700")
    return None


def create_private_file(path: Path) -> None:
    """Create `path` empty and 0600 if it does not exist (never follows a symlink); an
    existing file is left as it is. For files another library opens by name: SQLite gives
    its `-wal`, `-shm` and `-journal` files the mode of the database file."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC,
                 PRIVATE_FILE_MODE)
    os.close(fd)


def write_private_file(path: Path, text: str) -> None:
    """Replace `path` with `text` atomically, the new file created 0600 (a temp file renamed
    over it)."""
    temp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC,
                 PRIVATE_FILE_MODE)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as file:
            file.write(text)
        os.replace(temp, path)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise
