"""The bubblewrap command line of one sandboxed process, from a `SandboxPlan` (pure: no file
system access). Imports nothing of ours; exports `SandboxPlan`, `Limits`, `bwrap_argv`,
`IN_SANDBOX_RUN` and `PROXY_PORT`.

Built from the ground up: an empty root (bwrap's tmpfs), then, in this order, the read-only
system directories, /proc, /dev, a private /tmp and home (tmpfs), the read-only paths, the
writable paths, a launcher's prepared cache (under /run/sidecar), the egress socket and
forwarder, and last the masks (a tmpfs over a protected directory, /dev/null over a
protected file) so that no bind above reveals them.
Every namespace is unshared (`--unshare-all`); the network is shared only for
`network = "host"`; all capabilities are dropped (bwrap keeps them for root otherwise); the
environment is cleared and only `env` is set; limits are set inside the sandbox by `prlimit`
(after bwrap made the user namespace, so RLIMIT_NPROC counts the sandbox's processes).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

IN_SANDBOX_RUN = "/run/sidecar"
"""Where the egress socket and the forwarder appear inside the sandbox."""
PROXY_PORT = 3128
"""The forwarder's port on the sandbox's own loopback (its network namespace has no other)."""


@dataclass(frozen=True, slots=True)
class Limits:
    memory_mb: int
    cpu_seconds: int
    pids: int

    def prlimit_argv(self, prlimit: str) -> list[str]:
        return [prlimit, f"--as={self.memory_mb * 1024 * 1024}",
                f"--cpu={self.cpu_seconds}:{self.cpu_seconds + 1}", f"--nproc={self.pids}", "--"]


@dataclass(frozen=True, slots=True)
class SandboxPlan:
    """Everything `bwrap_argv` needs, paths already resolved (see `bridges.sandbox.plan`)."""

    bwrap: str
    argv: tuple[str, ...]
    """The program (an absolute path) and its arguments."""
    home: str
    chdir: str
    env: Mapping[str, str]
    limits: Limits
    prlimit: str
    system: tuple[str, ...] = ()
    """Read-only system directories and /etc files (bound at the same path)."""
    symlinks: Mapping[str, str] = field(default_factory=dict)
    """Top-level symlinks to recreate (`/bin` -> `usr/bin` on merged-/usr systems)."""
    read: tuple[str, ...] = ()
    write: tuple[str, ...] = ()
    binds: tuple[tuple[str, str], ...] = ()
    """(host directory, path inside) bound writable: a launcher's prepared cache."""
    masks: tuple[tuple[str, bool], ...] = ()
    """(path, is a directory) of what must stay hidden whatever was bound above it."""
    share_net: bool = False
    egress_socket: str | None = None
    """The daemon's egress proxy socket (host path); with it, the forwarder runs first."""
    forwarder: tuple[str, ...] = ()
    """(python, script) to run the in-sandbox forwarder with (host paths, bound read-only)."""
    forwarder_binds: tuple[str, ...] = ()


def bwrap_argv(plan: SandboxPlan) -> list[str]:
    """bwrap's argv, ending with the command to run inside."""
    argv = [plan.bwrap, "--die-with-parent", "--new-session", "--unshare-all"]
    if plan.share_net:
        argv.append("--share-net")
    argv += ["--cap-drop", "ALL", "--clearenv"]
    for path in plan.system:
        argv += ["--ro-bind", path, path]
    for link, target in plan.symlinks.items():
        argv += ["--symlink", target, link]
    argv += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp", "--tmpfs", plan.home]
    for path in plan.read:
        argv += ["--ro-bind-try", path, path]
    for path in plan.write:
        argv += ["--bind-try", path, path]
    for source, inside in plan.binds:
        argv += ["--bind", source, inside]
    command = [*plan.limits.prlimit_argv(plan.prlimit), *plan.argv]
    env = dict(plan.env)
    if plan.egress_socket is not None:
        for path in plan.forwarder_binds:
            argv += ["--ro-bind", path, path]
        socket = f"{IN_SANDBOX_RUN}/egress.sock"
        script = f"{IN_SANDBOX_RUN}/forward.py"
        argv += ["--bind", plan.egress_socket, socket, "--ro-bind", plan.forwarder[1], script]
        command = [plan.forwarder[0], "-I", "-S", script, socket, str(PROXY_PORT), "--",
                   *command]
        proxy = f"http://127.0.0.1:{PROXY_PORT}"
        for name in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY",
                     "all_proxy"):
            env.setdefault(name, proxy)
    for path, is_dir in plan.masks:
        argv += ["--tmpfs", path] if is_dir else ["--ro-bind", "/dev/null", path]
    argv += ["--chdir", plan.chdir]
    for name, value in env.items():
        argv += ["--setenv", name, value]
    return [*argv, "--", *command]
