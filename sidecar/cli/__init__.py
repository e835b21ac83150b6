"""The `sidecar` command: `main` parses the arguments and runs one subcommand.

The console script is `sidecar.cli:main`; `main` is loaded on first use so that importing one
subcommand's module does not import them all.
"""

from __future__ import annotations

from typing import Any

__all__ = ["main"]


def __getattr__(name: str) -> Any:
    if name == "main":
        from sidecar.cli.commands import main

        return main
    raise AttributeError(f"module 'sidecar.cli' has no attribute {name!r}")
