"""A search worker process: matches batches of lines against one RE2 pattern at a time.

`managed_store.search` runs this file as `python -I search_worker.py` and kills it when a
search passes its time limit (an RE2 search cannot be interrupted from outside). It imports
only the standard library and `re2`, so it starts in tens of milliseconds.

Frames on stdin, each a kind byte and a payload length (`!cI`), then the payload:
`P` + a UTF-8 pattern (no answer), `L` + lines joined by `\\n` (answer: `F` + one byte per
line, 1 where the pattern matches). The process exits at the end of stdin, and within a second
of its parent's death (its watchdog polls the parent id), even in the middle of a search.
"""

import os
import struct
import sys
import threading
import time
from typing import Any, BinaryIO

import re2

HEADER = struct.Struct("!cI")
# The options of `managed_store.pattern.compile_pattern`, which already accepted the pattern.
_MAX_PROGRAM_BYTES = 8 * 1024 * 1024


def main() -> None:
    os.nice(10)  # a search never takes the CPU from the daemon's event loop
    parent = os.getppid()
    threading.Thread(target=_exit_with_parent, args=(parent,), daemon=True).start()
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    regexp: Any = None
    while True:
        header = _read_exactly(stdin, HEADER.size)
        if header is None:
            return
        kind, size = HEADER.unpack(header)
        payload = _read_exactly(stdin, size)
        if payload is None:
            return
        if kind == b"P":
            regexp = _compile(payload)
            continue
        flags = bytes(regexp.search(line) is not None for line in payload.split(b"\n"))
        stdout.write(HEADER.pack(b"F", len(flags)) + flags)
        stdout.flush()


def _compile(pattern: bytes) -> Any:
    options = re2.Options()
    options.log_errors = False
    options.never_capture = True
    options.max_mem = _MAX_PROGRAM_BYTES
    return re2.compile(pattern, options)


def _read_exactly(stream: BinaryIO, size: int) -> bytes | None:
    data = stream.read(size)
    return data if len(data) == size else None


def _exit_with_parent(parent: int) -> None:
    while True:
        time.sleep(1)
        if os.getppid() != parent:
            os._exit(0)


if __name__ == "__main__":
    main()
