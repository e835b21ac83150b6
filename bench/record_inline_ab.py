"""Experiment: `sidecar stdio` with the outcome record's insert on the event loop, against as is.

    .venv/bin/python bench/record_inline_ab.py [--blocks 40] [--calls 50]

Not a change the daemon makes: STYLE.md keeps SQLite off the event loop. This measures what
breaking that rule would buy, to decide on it with numbers. Two `sidecar stdio` daemons run the
same manifest (the bench upstream, `protocol: legacy`); in one, a `sitecustomize` module (written
to a temp dir on its PYTHONPATH) makes `SqliteOutcomeLog` run the record's insert inline
instead of in its writer thread. One `mcp.Client` each; they take turns in blocks of `--calls`
sequential `echo` calls, the order alternating, and the ratio is the median over blocks of the
inline daemon's rate over the other's in the same block (the VM's speed swings hit both alike).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

from compare import SIDECAR, find_tool, mcp_client, stdio_params, write_manifest
from stdio_ab import summary, take_turns

INLINE = '''
import os
if os.environ.get("SIDECAR_INLINE_RECORD"):
    import sidecar.outcome_log as log

    run_in_writer = log.SqliteOutcomeLog._run

    async def _run(self, fn):
        if getattr(fn, "__name__", "") == "write" and self._conn is not None:
            return fn()  # the record's insert, on the event loop
        return await run_in_writer(self, fn)

    log.SqliteOutcomeLog._run = _run
'''


async def main(blocks: int, calls: int) -> None:
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        (tmp / "site").mkdir()
        (tmp / "site" / "sitecustomize.py").write_text(INLINE)
        manifests = write_manifest(tmp / "manifests", protocol="legacy")
        async with AsyncExitStack() as stack:
            clients: dict[str, tuple[Any, str]] = {}
            for name, extra in (("thread", {}), ("inline", {"SIDECAR_INLINE_RECORD": "1"})):
                state = tmp / f"state-{name}"
                env = {**os.environ, "SIDECAR_STATE_DIR": str(state),
                       "PYTHONPATH": str(tmp / "site"), **extra}
                params = stdio_params(str(SIDECAR), ["stdio", "--manifests", str(manifests),
                                                     "--state-dir", str(state)], env=env)
                client = await stack.enter_async_context(mcp_client(params))
                tool = await find_tool(client, "echo")
                for _ in range(100):
                    await client.call_tool(tool, {"text": "hi"})
                clients[name] = (client, tool)
            ratios, rates = await take_turns(clients, ("thread", "inline"), blocks, calls)
    print(f"{blocks} blocks of {calls} sequential calls: inline / thread {summary(ratios)}; "
          f"calls/s thread {statistics.median(rates['thread']):.0f}, "
          f"inline {statistics.median(rates['inline']):.0f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=40)
    parser.add_argument("--calls", type=int, default=50)
    opts = parser.parse_args()
    asyncio.run(main(opts.blocks, opts.calls))
