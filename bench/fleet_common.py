"""What the fleet benchmark's sections share: tables, verdicts, the fleet variables set while
a Location opens, and the CPU of a process tree."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any

import psutil

MB = 1_000_000


def table(header: list[str], rows: list[list[Any]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def verdict(ok: bool) -> str:
    return "met" if ok else "MISS"


@contextlib.contextmanager
def environment(values: dict[str, str]) -> Iterator[None]:
    """`values` in os.environ while the block runs (the composition root reads the fleet
    variables when a Location opens its stores)."""
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, old in saved.items():
            if old is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = old


def process_cpu(pid: int, tree: bool = True) -> float:
    """CPU seconds of a process; with `tree`, also of its live descendants and of the
    children it has reaped (a PostgreSQL backend that exited is in its postmaster's children
    times)."""
    try:
        proc = psutil.Process(pid)
        times = proc.cpu_times()
        if not tree:
            return times.user + times.system
        total = times.user + times.system + times.children_user + times.children_system
        for child in proc.children(recursive=True):
            with contextlib.suppress(psutil.Error):
                ct = child.cpu_times()
                total += ct.user + ct.system
    except psutil.Error:
        return 0.0
    return total
