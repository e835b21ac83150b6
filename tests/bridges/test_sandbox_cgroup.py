"""A sandbox's own cgroup (`bridges.sandbox.cgroup`), with real processes under bwrap: `pids`
refuses forks past the limit, `memory_mb` is a total the process tree cannot pass (OOM),
the error names the limit, and no cgroup directory is left after the run."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from bridges.manifest.loading import ServerConfig
from bridges.mcp import ServerPool
from bridges.sandbox.cgroup import cgroup_for
from sidecar import Location
from tests.bridges.manifest_tools_support.location import call, manifest_tools, open_location

pytestmark = pytest.mark.anyio

NOTHING: dict[str, Any] = {"type": "object", "properties": {}}

FORKS = """
import subprocess, sys
OUT = sys.stderr if "server" in sys.argv else sys.stdout
procs, refused = [], 0
for _ in range(20):
    try:
        procs.append(subprocess.Popen(["sleep", "30"]))
    except BlockingIOError:
        refused += 1
print("started", len(procs), "refused", refused, file=OUT, flush=True)
for p in procs:
    p.kill()
    p.wait()
raise SystemExit(1 if refused else 0)
"""

HOGS = """
import subprocess, sys
child = "import sys; b = b'x' * (120 << 20); print(1, flush=True); sys.stdin.read()"
procs = [subprocess.Popen([sys.executable, "-c", child], stdin=subprocess.PIPE,
                          stdout=subprocess.PIPE) for _ in range(4)]
for p in procs:
    p.stdout.readline()
for p in procs:
    p.stdin.close()
codes = [p.wait() for p in procs]
print("codes", codes, flush=True)
raise SystemExit(1 if -9 in codes else 0)
"""


def _leftovers(pid: int) -> list[Path]:
    return [p for p in Path("/sys/fs/cgroup").glob(f"**/sidecar/{pid}-*") if p.is_dir()]


@pytest.fixture(scope="module")
def cgroups() -> None:
    probe = cgroup_for(1, 64)
    if probe is None:
        pytest.skip("no writable cgroup here: the sandbox falls back to rlimits")
    probe.close()


def _python(script: str, **sandbox: Any) -> dict[str, Any]:
    return {"kind": "command", "description": "d", "input": NOTHING,
            "argv": [sys.executable, "-c", script], "sandbox": sandbox}


async def test_pids_refuses_forks_past_the_limit_and_says_so(
    tmp_path: Path, cgroups: None
) -> None:
    async with open_location(tmp_path) as location:
        async with manifest_tools(location, {"forks": _python(FORKS, pids=5)}):
            outcome = await call(location, "forks", {})
    assert outcome.status == "error" and outcome.error is not None
    message = outcome.error.message
    assert "it reached its sandbox pids limit (pids = 5)" in message, message
    assert "started 4 refused 16" in message, message  # the script itself is the fifth
    assert _leftovers(os.getpid()) == []


async def test_a_server_at_its_pids_limit_says_so_in_its_health(
    location: Location, cgroups: None
) -> None:
    config = ServerConfig.model_validate({
        "command": sys.executable, "args": ["-c", FORKS, "server"],
        "sandbox": {"pids": 5}, "timeouts": {"startup": 10}})
    async with ServerPool({"p": config}, location.tools) as pool:
        health = pool.health()["p"]
    assert health.state != "ready"
    error = health.last_error or ""
    assert "it reached its sandbox pids limit (pids = 5)" in error, error
    assert "started 4 refused 16" in error, error
    assert _leftovers(os.getpid()) == []


async def test_memory_mb_is_the_total_of_the_process_tree(
    tmp_path: Path, cgroups: None
) -> None:
    # each child stays under memory_mb (address space per process), four together do not
    async with open_location(tmp_path) as location:
        async with manifest_tools(location, {"hogs": _python(HOGS, memory_mb=256)}):
            outcome = await call(location, "hogs", {})
    assert outcome.status == "error" and outcome.error is not None
    message = outcome.error.message
    assert ("it was killed at its sandbox memory limit (memory_mb = 256, the sandbox's total)"
            in message), message
    assert "-9" in message, message
    assert _leftovers(os.getpid()) == []


def test_a_dead_daemons_cgroups_are_removed_at_the_next_start(cgroups: None) -> None:
    made = subprocess.run(
        [sys.executable, "-c", "from bridges.sandbox.cgroup import cgroup_for\n"
         "c = cgroup_for(3, 64)\nprint(c.dirs[0] if c else '')"],
        capture_output=True, text=True, check=True, cwd=Path(__file__).parents[2])
    left = Path(made.stdout.strip())
    assert left.is_dir(), made.stderr  # its process exited without closing it
    subprocess.run(
        [sys.executable, "-c", "from bridges.sandbox.cgroup import cgroup_for\n"
         "cgroup_for(3, 64).close()"],
        check=True, cwd=Path(__file__).parents[2])
    assert not left.exists()


def test_without_a_cgroup_mounted_the_rlimits_apply_and_a_warning_says_so_once() -> None:
    if os.geteuid() != 0 or not shutil.which("unshare"):
        pytest.skip("needs root and unshare: a mount namespace without /sys/fs/cgroup")
    script = ("import logging; logging.basicConfig(format='%(levelname)s %(message)s')\n"
              "from bridges.sandbox.cgroup import cgroup_for\n"
              "print(cgroup_for(5, 64), cgroup_for(5, 64))")
    done = subprocess.run(
        ["unshare", "-m", "sh", "-c", 'umount -l /sys/fs/cgroup || exit 99; exec "$@"', "sh",
         sys.executable, "-c", script],
        capture_output=True, text=True, check=False, cwd=Path(__file__).parents[2])
    if done.returncode == 99:
        pytest.skip(f"/sys/fs/cgroup cannot be unmounted here: {done.stderr.strip()}")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "None None", done.stdout
    assert done.stderr.strip().splitlines() == [
        "WARNING sandbox: no writable cgroup (no cgroup hierarchy with the pids controller is "
        "mounted): pids is RLIMIT_NPROC only (not applied to root) and memory_mb is address "
        "space per process"], done.stderr
