"""An install without the `fleet` extra (no asyncpg, as the default Docker image): a failure
of the SQLite outcome log (its journal refusing the outcome line, then a real write refused by
a trigger, through the seam's record path) is an `operational` outcome from the seam, not a
`ModuleNotFoundError`. Run in a fresh interpreter where importing asyncpg fails."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

PROGRAM = r"""
import asyncio, sys
sys.modules["asyncpg"] = None  # `import asyncpg` now raises ModuleNotFoundError
from pydantic import BaseModel
from sidecar import Location, Tool, ToolContext, ToolResponse

class In(BaseModel):
    text: str

async def run(args, ctx):
    return ToolResponse(content=args.text)

async def main(root):
    async with Location.open(root, state_dir=root + "/state") as loc:
        loc.tools.register({"echo": Tool(description="e", input=In, execute=run)})
        log = loc.seam.outcomes
        await log._run(lambda: log._db().execute(
            "CREATE TRIGGER refuse BEFORE INSERT ON outcomes "
            "BEGIN SELECT RAISE(ABORT, 'disk I/O error'); END"))

        def full(row, body=None):
            raise OSError(28, "No space left on device")

        log._journal.settle = full
        outcome = await loc.snapshot().execute("echo", {"text": "hi"},
                                              ToolContext("s", "a", "m", "c1"))
        print(outcome.status, outcome.error.kind.value)
        assert "asyncpg" not in sys.modules or sys.modules["asyncpg"] is None
        # the seam told the failure apart with sidecar.stores.errors alone: no driver's
        # failures were registered, no backend but SQLite was loaded
        assert not [m for m in sys.modules if m.startswith("sidecar.backends.postgres")]

asyncio.run(main(sys.argv[1]))
"""


def test_an_outcome_log_failure_is_operational_without_asyncpg(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-c", PROGRAM, str(tmp_path)], capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["error", "operational"], done.stdout + done.stderr
    assert "ModuleNotFoundError" not in done.stderr
