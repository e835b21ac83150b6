"""The limits of one Code Mode run; every violation ends the run with a clear error.

    wall_time           seconds for the whole run, nested tool calls included     120 s
    cpu_time            seconds the interpreter itself may execute (time spent      10 s
                        waiting on tools does not count)
    memory_bytes        the sandbox heap                                          128 MiB
    max_tool_calls      nested tool calls per run                                  200
    max_concurrent_calls  nested calls in flight at once (more wait their turn)      8
    max_output_bytes    what the program prints plus its result (UTF-8)          256 KiB
    max_code_bytes      the program itself (UTF-8)                                64 KiB

The model-facing text of `execute` is then bounded by the seam like any other result
(50 KiB by default, the rest retained in the managed store).
"""

from __future__ import annotations

from dataclasses import dataclass

MIB = 1024 * 1024


@dataclass(frozen=True, slots=True)
class CodeModeLimits:
    wall_time: float = 120.0
    cpu_time: float = 10.0
    memory_bytes: int = 128 * MIB
    max_tool_calls: int = 200
    max_concurrent_calls: int = 8
    max_output_bytes: int = 256 * 1024
    max_code_bytes: int = 64 * 1024

    def __post_init__(self) -> None:
        for name in ("wall_time", "cpu_time"):
            if not getattr(self, name) > 0:
                raise ValueError(f"CodeModeLimits.{name} must be a positive number of seconds")
        positive = (
            "memory_bytes", "max_tool_calls", "max_concurrent_calls", "max_output_bytes",
            "max_code_bytes",
        )
        for name in positive:
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"CodeModeLimits.{name} must be a positive integer")


DEFAULT_LIMITS = CodeModeLimits()
