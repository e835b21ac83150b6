"""A full disk under the managed store fails the call operationally and loses nothing."""

from __future__ import annotations

import logging
import subprocess

import pytest
from pydantic import BaseModel

from sidecar import Location, Tool, ToolContext, ToolResponse
from sidecar.model.errors import ErrorKind

pytestmark = pytest.mark.anyio


class In(BaseModel):
    size: int


@pytest.fixture
def tiny_state(tmp_path):
    """A state dir whose managed objects live on a real 128 KiB tmpfs."""
    state = tmp_path / "state"
    objects = state / "managed" / "objects"
    objects.mkdir(parents=True)
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=128k", "tmpfs", str(objects)],
                             capture_output=True, text=True, check=False)
    if mounted.returncode != 0:
        pytest.fail(f"cannot mount a tmpfs (CI runs as root): {mounted.stderr.strip()}")
    try:
        yield state
    finally:
        subprocess.run(["umount", str(objects)], check=True)


async def test_enospc_while_retaining_is_operational_not_lossy(tmp_path, tiny_state, caplog):
    async def run(args: In, ctx):
        return ToolResponse(content=("z" * 99 + "\n") * (args.size // 100))

    caplog.set_level(logging.ERROR, logger="sidecar.execution.seam")
    async with Location.open(tmp_path, state_dir=tiny_state) as loc:
        loc.tools.register({"dump": Tool(description="d", input=In, execute=run)})
        snap = loc.snapshot()
        fits = await snap.execute("dump", {"size": 80_000}, ToolContext("s", "a", "m", "c1"))
        assert fits.status == "completed" and len(fits.managed) == 1
        full = await snap.execute("dump", {"size": 400_000}, ToolContext("s", "a", "m", "c2"))
        assert full.status == "error" and full.error.kind is ErrorKind.OPERATIONAL
        assert full.content == ()
        assert "No space left on device" in caplog.text or "ENOSPC" in caplog.text
        # the caller is told why, not only "internal error"
        assert "ENOSPC (No space left on device)" in full.error.message, full.error.message
        assert "could not be kept whole" in full.error.message
        stored = await loc.outcome("c2")
        assert stored is not None and stored.error.kind is ErrorKind.OPERATIONAL
        # the earlier retained text is intact and readable
        read = await snap.execute("managed_read", {"ref": fits.managed[0].ref, "limit": 1},
                                  ToolContext("s", "a", "m", "c3"))
        assert read.status == "completed" and "z" * 99 in read.content[0].text
