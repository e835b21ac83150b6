"""The process's resident memory: current and peak (VmHWM, resettable via clear_refs)."""

from __future__ import annotations

from pathlib import Path

MB = 1024 * 1024


def _status_kib(key: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"no {key} in /proc/self/status")


def reset_peak() -> None:
    """Make VmHWM start again from the current RSS."""
    Path("/proc/self/clear_refs").write_text("5")


def peak_rss() -> int:
    return _status_kib("VmHWM") * 1024


def rss() -> int:
    return _status_kib("VmRSS") * 1024
