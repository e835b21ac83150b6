"""An outcome returned to the caller survives the process being killed (SIGKILL)."""

import asyncio
import json
import os
import signal
import subprocess
import sys
import textwrap

from sidecar import Location

CHILD = textwrap.dedent(
    """
    import asyncio, json, sys, time
    from pydantic import BaseModel
    from sidecar import Location, Tool, ToolContext, ToolResponse

    class In(BaseModel):
        text: str

    async def run(args, ctx):
        return ToolResponse(content=args.text.upper(), metadata={"n": len(args.text)})

    async def main():
        async with Location.open(".", state_dir=sys.argv[1]) as loc:
            loc.tools.register({"shout": Tool(description="d", input=In, execute=run)})
            ctx = ToolContext(session_id="s", agent="a", message_id="m", call_id="killed-1")
            outcome = await loc.snapshot().execute("shout", {"text": "durable"}, ctx)
            print(json.dumps(outcome.to_json()), flush=True)
            time.sleep(3600)  # block: the parent kills us here, before any clean close

    asyncio.run(main())
    """
)


def test_outcome_survives_sigkill(tmp_path):
    state = tmp_path / "state"
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(state)], stdout=subprocess.PIPE, text=True
    )
    try:
        line = proc.stdout.readline()
        returned = json.loads(line)
        assert returned["status"] == "completed"
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait()
        proc.stdout.close()
    assert proc.returncode == -signal.SIGKILL

    async def read_back():
        async with Location.open(tmp_path, state_dir=state) as loc:
            return await loc.outcome("killed-1")

    stored = asyncio.run(read_back())
    assert stored is not None
    assert stored.content[0].text == "DURABLE"
    assert stored.metadata == {"n": 7}
