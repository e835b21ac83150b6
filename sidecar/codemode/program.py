"""What a Code Mode program run yields: printed text, a result, or an error with its line.

Errors are values here (`ProgramError`), never exceptions: a failing program is a normal,
model-visible outcome of `execute`. `type` is the Python exception type (`ValueError`, ...),
or `LimitExceeded` when a limit ended the run (then `limit` names it), or `WorkerCrashed`.
"""

from __future__ import annotations

import ast
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from pydantic_monty import (
    Frame,
    MontyClassProxy,
    MontyCrashedError,
    MontyError,
    MontyRuntimeError,
    MontySyntaxError,
)

LimitName = Literal[
    "wall_time", "cpu_time", "memory", "tool_calls", "output", "code_size", "suspensions"
]

REFUSED_MODULES = frozenset({
    "os", "sys", "pathlib", "io", "shutil", "subprocess", "socket", "ssl", "select",
    "selectors", "signal", "ctypes", "importlib", "builtins", "urllib", "http", "ftplib",
    "smtplib", "requests", "httpx", "aiohttp", "multiprocessing", "threading", "tempfile",
    "glob", "fcntl", "pty", "resource", "mmap", "webbrowser",
})
"""Imports refused before the program starts. It is a courtesy, not the boundary: the
sandbox itself has no filesystem, network or environment, and every OS call a program makes
some other way (`open`, `exec("import os")`) is refused when it runs."""

NO_HOST_ACCESS = (
    "Code Mode programs have no filesystem, network or host access; "
    "call the tool functions (tools.<namespace>.<tool>(...)) instead"
)

_HEAD_FRAMES = 3
_TAIL_FRAMES = 5


@dataclass(frozen=True, slots=True)
class ProgramError:
    type: str
    message: str
    line: int | None = None
    limit: LimitName | None = None
    traceback: str | None = None

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {"type": self.type, "message": self.message}
        if self.line is not None:
            data["line"] = self.line
        if self.limit is not None:
            data["limit"] = self.limit
        if self.traceback is not None:
            data["traceback"] = self.traceback
        return data

    def render(self) -> str:
        if self.traceback is not None:
            return self.traceback
        where = f" (line {self.line})" if self.line is not None else ""
        return f"{self.type}: {self.message}{where}"


def limit_error(limit: LimitName, message: str, line: int | None = None) -> ProgramError:
    return ProgramError("LimitExceeded", message, line=line, limit=limit)


@dataclass(frozen=True, slots=True)
class ProgramRun:
    printed: str
    result: Any
    """The value of the program's last expression as JSON (None when there is none)."""
    error: ProgramError | None
    duration: float
    worker_pid: int | None = None


def refused_import(code: str) -> ProgramError | None:
    """A clear early error for `import os` and friends (see `REFUSED_MODULES`)."""
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError):
        return None  # the sandbox reports it, with its own dialect's view of the syntax
    for node in ast.walk(tree):
        modules: list[str] = []
        if isinstance(node, ast.Import):
            modules = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            modules = [node.module]
        else:
            continue
        for module in modules:
            if module.split(".")[0] in REFUSED_MODULES:
                return ProgramError(
                    "ImportError", f"import of {module!r} is refused: {NO_HOST_ACCESS}",
                    line=node.lineno,
                )
    return None


def from_monty(exc: MontyError, program_file: str) -> ProgramError:
    """A sandbox failure as a `ProgramError`, with the program's own line numbers."""
    if isinstance(exc, MontyCrashedError):
        return ProgramError("WorkerCrashed", f"the sandbox worker died: {exc}")
    inner = exc.exception()
    kind, message = type(inner).__name__, str(inner)
    frames: list[Frame] = []
    if isinstance(exc, MontyRuntimeError | MontySyntaxError):
        frames = [f for f in exc.traceback() if f.filename in (program_file, "<string>")]
    line = next((f.line for f in reversed(frames) if f.filename == program_file), None)
    limit = _limit_of(kind, message)
    if limit is not None:
        return limit_error(limit, _limit_message(limit, message), line)
    return ProgramError(kind, message, line=line, traceback=_render(frames, kind, message))


def _limit_of(kind: str, message: str) -> LimitName | None:
    if kind == "TimeoutError" and "time limit exceeded" in message:
        return "cpu_time"
    if kind == "MemoryError" and "memory limit exceeded" in message:
        return "memory"
    if kind == "RuntimeError" and "suspension limit" in message:
        return "suspensions"
    return None


def _limit_message(limit: LimitName, detail: str) -> str:
    what = {
        "cpu_time": "The program ran out of CPU time",
        "memory": "The program ran out of memory",
        "suspensions": "The program made too many host round trips (tool calls and sleeps)",
    }.get(limit, "The program exceeded a limit")
    return f"{what}: {detail}. The run was stopped."


def _render(frames: Sequence[Frame], kind: str, message: str) -> str:
    lines = ["Traceback (most recent call last):"]
    shown: list[Frame | None] = list(frames)
    if len(frames) > _HEAD_FRAMES + _TAIL_FRAMES + 1:
        shown = [*frames[:_HEAD_FRAMES], None, *frames[-_TAIL_FRAMES:]]
    for frame in shown:
        if frame is None:
            hidden = len(frames) - _HEAD_FRAMES - _TAIL_FRAMES
            lines.append(f"  ... {hidden} more frames ...")
            continue
        where = "<string>, " if frame.filename == "<string>" else ""
        lines.append(f"  {where}line {frame.line}, in {frame.function_name or '<module>'}")
        if frame.source_line:
            lines.append(f"    {frame.source_line.strip()}")
    lines.append(f"{kind}: {message}" if message else kind)
    return "\n".join(lines)


def to_json_value(value: Any, depth: int = 0) -> Any:
    """A sandbox value as JSON: tuples and sets become lists, class instances their
    attributes, anything else without a JSON form its repr."""
    if depth > 64:
        return repr(value)
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else repr(value)
    if isinstance(value, dict):
        return {str(k): to_json_value(v, depth + 1) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [to_json_value(v, depth + 1) for v in value]
    if isinstance(value, set | frozenset):
        items = [to_json_value(v, depth + 1) for v in value]
        try:
            return sorted(items)
        except TypeError:
            return items
    if isinstance(value, bytes):
        try:
            return value.decode()
        except UnicodeDecodeError:
            return repr(value)
    if isinstance(value, MontyClassProxy):
        return to_json_value(value.attributes, depth + 1)
    return repr(value)
