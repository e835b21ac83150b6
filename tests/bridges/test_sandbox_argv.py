"""The bwrap command line of a sandbox plan, and what a plan binds and masks on this machine."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from bridges.manifest.sandbox import SandboxConfig
from bridges.sandbox import PROTECTED, Limits, SandboxPlan, bwrap_argv
from bridges.sandbox.plan import plan_sandbox

PLAN = SandboxPlan(
    bwrap="/usr/bin/bwrap", argv=("/usr/bin/node", "server.js"), home="/home/me",
    chdir="/srv/app", env={"PATH": "/usr/bin", "HOME": "/home/me"},
    limits=Limits(memory_mb=512, cpu_seconds=60, pids=32), prlimit="/usr/bin/prlimit",
    system=("/usr", "/etc/ssl"), symlinks={"/bin": "usr/bin"}, read=("/srv/app",),
    write=("/srv/data",), masks=(("/srv/app/state", True), ("/srv/app/token", False)),
)


def _after(argv: list[str], first: list[str], then: list[str]) -> bool:
    text = "\0".join(argv)
    return text.index("\0".join(first)) < text.index("\0".join(then))


def test_no_network_no_capabilities_no_environment() -> None:
    argv = bwrap_argv(PLAN)
    assert argv[:4] == ["/usr/bin/bwrap", "--die-with-parent", "--new-session",
                        "--unshare-all"]
    assert "--share-net" not in argv
    assert argv[4:7] == ["--cap-drop", "ALL", "--clearenv"]
    assert argv[argv.index("--") + 1:] == [
        "/usr/bin/prlimit", f"--as={512 << 20}", "--cpu=60:61", "--nproc=32", "--",
        "/usr/bin/node", "server.js"]
    setenv = [argv[i + 1] for i, a in enumerate(argv) if a == "--setenv"]
    assert setenv == ["PATH", "HOME"]


def test_mount_order_keeps_masks_last() -> None:
    argv = bwrap_argv(PLAN)
    assert _after(argv, ["--ro-bind", "/usr", "/usr"], ["--tmpfs", "/home/me"])
    assert _after(argv, ["--tmpfs", "/home/me"], ["--ro-bind-try", "/srv/app", "/srv/app"])
    assert _after(argv, ["--ro-bind-try", "/srv/app"], ["--bind-try", "/srv/data"])
    assert _after(argv, ["--bind-try", "/srv/data"], ["--tmpfs", "/srv/app/state"])
    assert _after(argv, ["--tmpfs", "/srv/app/state"],
                  ["--ro-bind", "/dev/null", "/srv/app/token"])
    assert ["--symlink", "usr/bin", "/bin"] == argv[argv.index("--symlink"):][:3]
    assert argv[argv.index("--chdir") + 1] == "/srv/app"


def test_host_network_is_shared_and_an_allow_list_goes_through_the_forwarder() -> None:
    from dataclasses import replace

    assert "--share-net" in bwrap_argv(replace(PLAN, share_net=True))
    proxied = bwrap_argv(replace(PLAN, egress_socket="/tmp/x/egress.sock",
                                 forwarder=("/opt/py/bin/python3", "/src/forward.py"),
                                 forwarder_binds=("/opt/py",)))
    assert "--share-net" not in proxied
    assert ["--bind", "/tmp/x/egress.sock", "/run/sidecar/egress.sock"] == (
        proxied[proxied.index("/tmp/x/egress.sock") - 1:][:3])
    command = proxied[proxied.index("--") + 1:]
    assert command[:7] == ["/opt/py/bin/python3", "-I", "-S", "/run/sidecar/forward.py",
                           "/run/sidecar/egress.sock", "3128", "--"]
    assert command[7] == "/usr/bin/prlimit"
    setenv = {proxied[i + 1]: proxied[i + 2] for i, a in enumerate(proxied) if a == "--setenv"}
    assert setenv["HTTPS_PROXY"] == setenv["http_proxy"] == "http://127.0.0.1:3128"


def test_a_plan_binds_the_interpreter_and_masks_protected_paths(tmp_path: Path) -> None:
    state = tmp_path / "state"
    (state / "sub").mkdir(parents=True)
    other = tmp_path / "other-server"
    other.mkdir()
    PROTECTED.protect(state)
    PROTECTED.working_dir("other", other)
    try:
        config = SandboxConfig(read=[str(tmp_path)], write=[str(state / "sub")],
                               env=["LISTED", "ABSENT"])
        plan = plan_sandbox(
            config, [sys.executable, "-V"], cwd=None, env={"OWN": "1"},
            environ={"PATH": "/usr/bin:/bin", "LISTED": "yes", "SECRET": "no"},
            bwrap="/usr/bin/bwrap", prlimit="/usr/bin/prlimit")
    finally:
        PROTECTED.release(state)
        PROTECTED.working_dir("other", None)
    real = os.path.realpath(sys.executable)
    assert any(real.startswith(p + "/") for p in plan.read), (real, plan.read)
    assert plan.masks == ((str(other), True), (str(state), True))
    assert plan.env == {"PATH": "/usr/bin:/bin", "HOME": str(Path.home()), "TMPDIR": "/tmp",
                        "LISTED": "yes", "OWN": "1"}
    assert plan.chdir == str(Path.home())
    assert not plan.share_net and "/etc/resolv.conf" not in plan.system
    assert "/etc/shadow" not in plan.system
