"""The README's tour, run as written: the block between `<!-- tour:begin -->` and
`<!-- tour:end -->` in a fresh temporary directory, each `sidecar` command's output checked.

The only change made to the text is the one the README asks of its reader: `<your ref>`
becomes the ref the `call numbers` command printed. The tour's MCP server comes from npm
through `npx` (the pinned version that `scripts/bootstrap-servers` already put in npm's cache).
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

REPO = Path(__file__).resolve().parents[2]
MARK = "@@@tour"


def tour_block() -> str:
    text = (REPO / "README.md").read_text()
    block = re.search(r"<!-- tour:begin -->\n```sh\n(.*?)```\n<!-- tour:end -->", text, re.DOTALL)
    assert block, "README.md has no tour block between the tour markers"
    return block.group(1)


def as_script(block: str) -> str:
    """Each `sidecar` line runs with its output and exit status marked; the first `m_...`
    ref printed is kept for the lines that say `<your ref>`."""
    out = ["set -u"]
    for line in block.splitlines():
        if not line.startswith("sidecar "):
            out.append(line)
            continue
        command = re.sub(r"\s+#.*$", "", line).replace("<your ref>", '"$REF"')
        out += [
            f"echo {MARK} {shlex.quote(command)}",
            f"out=$({command} 2>&1); rc=$?",
            'printf "%s\\n" "$out"',
            f'echo {MARK} rc=$rc',
            "REF=${REF:-$(printf '%s' \"$out\" | grep -o 'm_[a-z0-9]\\{12,\\}' | head -n 1)}",
        ]
    return "\n".join(out) + "\n"


def run_tour(tmp: Path) -> dict[str, tuple[int, str]]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SIDECAR_")}
    env.update(TMPDIR=str(tmp), NO_COLOR="1", REF="")
    result = subprocess.run(
        ["bash", "-c", as_script(tour_block())], cwd=REPO, env=env, capture_output=True,
        text=True, timeout=600,
    )
    assert result.returncode == 0, result.stderr
    steps: dict[str, tuple[int, str]] = {}
    pattern = rf"^{MARK} (.*?)\n(.*?)^{MARK} rc=(\d+)$"
    for command, output, rc in re.findall(pattern, result.stdout, re.DOTALL | re.MULTILINE):
        steps[command] = (int(rc), output)
    return steps


def stop_daemons_of(tmp: Path) -> None:
    """A daemon the tour's commands started for its state directory does not outlive the test."""
    for proc in psutil.process_iter(["cmdline"]):
        try:
            if str(tmp) in (proc.environ().get("SIDECAR_STATE_DIR") or ""):
                proc.kill()
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue


@pytest.fixture
def tour_tmp() -> Iterator[Path]:
    """The tour's TMPDIR: a short path, as a reader's /tmp is (its `mktemp -d` adds 15
    characters, `state/daemon.sock` 17, and a Unix socket's path has at most 107 bytes; a
    pytest-xdist worker's tmp_path is long)."""
    made = Path(tempfile.mkdtemp(prefix="tour-"))
    try:
        yield made
    finally:
        shutil.rmtree(made, ignore_errors=True)


def test_readme_tour_runs_as_written(tour_tmp: Path) -> None:
    tmp_path = tour_tmp
    try:
        steps = run_tour(tmp_path)
    finally:
        stop_daemons_of(tmp_path)

    def step(prefix: str) -> str:
        matches = [k for k in steps if k.startswith(prefix)]
        assert len(matches) == 1, f"{prefix!r} not one step of {list(steps)}"
        rc, output = steps[matches[0]]
        assert rc == 0, f"{matches[0]} exited {rc}:\n{output}"
        return output

    step("sidecar check manifests/")
    tools = step("sidecar tools")
    for name in ("everything_echo", "numbers", "managed_read"):
        assert name in tools
    assert "hello" in step("sidecar call everything_echo")
    numbers = step("sidecar call numbers")
    assert "bytes omitted" in numbers and "100000" in numbers
    assert re.search(r"^50001$", step('sidecar managed read "$REF" --offset'), re.MULTILINE)
    found = step('sidecar managed read "$REF" --pattern')
    assert "77770" in found and "77779" in found
    health = step("sidecar health")
    assert "everything" in health and "daemon: pid" in health
    config = step("sidecar client-config claude-desktop")
    assert '"mcpServers"' in config and str(tmp_path) in config  # its state dir, absolute
    assert "stopped the daemon" in step("sidecar stop")
