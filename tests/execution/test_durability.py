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


def test_a_loop_of_calls_that_never_waits_keeps_every_outcome_without_rewriting_the_journal(
    tmp_path, monkeypatch
):
    """In-process tools awaited in a row never let the event loop turn, so the writer's
    commits reach the start journal only afterwards. The journal must not copy the rows still
    waiting again at every line: until 2026-12-07 it did once they passed 1 MiB (here after
    ~1,500 calls), 1,434 rewrites in 5,000 calls of `bench/seam.py`. Every outcome is kept."""
    from pydantic import BaseModel

    from sidecar import Tool, ToolContext, ToolResponse
    from sidecar.backends.sqlite.start_journal import StartJournal

    rewrites = []
    rotate = StartJournal._rotate

    def counted(self):
        rewrites.append(self._live)
        rotate(self)

    monkeypatch.setattr(StartJournal, "_rotate", counted)

    class In(BaseModel):
        text: str

    async def run(args, ctx):
        return ToolResponse(content=args.text)

    async def calls():
        async with Location.open(tmp_path, state_dir=tmp_path / "state") as loc:
            loc.tools.register({"echo": Tool(description="d", input=In, execute=run)})
            snap = loc.snapshot()
            for i in range(3000):
                ctx = ToolContext(session_id="s", agent="a", message_id="m", call_id=f"c{i}")
                outcome = await snap.execute("echo", {"text": f"{i:05d} " + "x" * 600}, ctx)
                assert outcome.status == "completed"
        async with Location.open(tmp_path, state_dir=tmp_path / "state") as loc:
            return [await loc.outcome(f"c{i}") for i in (0, 1499, 2999)]

    first, middle, last = asyncio.run(calls())
    assert len(rewrites) <= 3, rewrites
    assert [o.content[0].text[:5] for o in (first, middle, last)] == ["00000", "01499", "02999"]
