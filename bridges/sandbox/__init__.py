"""Sandboxed stdio servers and `command` tools: bubblewrap, built from the ground up
(docs/sandbox.md). Imports `bridges.manifest.sandbox` (the manifest key, parsed there only);
exports `sandboxed`, `SandboxArgv`, `SandboxUnavailable`, `explain_exit`, `PROTECTED`,
`bwrap_argv`, `SandboxPlan`, `Limits`, and of `launchers` `PREPARED`, `PREPARE_TIMEOUT`,
`PreparationFailed`, `launcher_of`, `pending`, `prepare`.

    argv.py       the bwrap command line of a plan (pure)
    plan.py       what one process needs, looked up on this machine
    launchers.py  npx and uvx: their package fetched into a per-entry cache, outside
    protected.py  what no sandbox sees (state directories, other servers' working dirs)
    egress.py     the CONNECT proxy of an allow-list `network`, in the daemon
    forward.py    its in-sandbox end (standard library only)
    cgroup.py     a cgroup per sandbox: `pids` and total memory, where one can be made
    launch.py     bwrap found and tried, proxy started, argv built
"""

from bridges.sandbox.argv import Limits, SandboxPlan, bwrap_argv
from bridges.sandbox.launch import SandboxArgv, SandboxUnavailable, explain_exit, sandboxed
from bridges.sandbox.launchers import (
    PREPARE_TIMEOUT,
    PREPARED,
    PreparationFailed,
    launcher_of,
    pending,
    prepare,
)
from bridges.sandbox.protected import PROTECTED

__all__ = ["PREPARED", "PREPARE_TIMEOUT", "PROTECTED", "Limits", "PreparationFailed",
           "SandboxArgv", "SandboxPlan", "SandboxUnavailable", "bwrap_argv", "explain_exit",
           "launcher_of", "pending", "prepare", "sandboxed"]
