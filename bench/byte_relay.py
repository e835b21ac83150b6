"""The floor for any Python stdio proxy: relays bytes between its stdin/stdout and a child's,
parsing nothing. `python bench/byte_relay.py -- COMMAND [ARGS...]`.

Two asyncio pipe pairs and a child process, nothing else: every message still crosses one more
process and two more pipes than a direct connection, which is what no proxy can avoid.
"""

from __future__ import annotations

import asyncio
import os
import sys

CHUNK = 1 << 20


async def pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    while chunk := await reader.read(CHUNK):
        writer.write(chunk)
        await writer.drain()
    writer.close()


async def main(argv: list[str]) -> None:
    loop = asyncio.get_running_loop()
    child = await asyncio.create_subprocess_exec(
        *argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE)
    assert child.stdin is not None and child.stdout is not None
    ours = asyncio.StreamReader(limit=CHUNK)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(ours),
                                 os.fdopen(0, "rb", buffering=0))
    transport, protocol = await loop.connect_write_pipe(
        lambda: asyncio.streams.FlowControlMixin(loop=loop), os.fdopen(1, "wb", buffering=0))
    out = asyncio.StreamWriter(transport, protocol, None, loop)
    down = asyncio.create_task(pump(child.stdout, out))
    await pump(ours, child.stdin)
    await child.wait()
    await down


if __name__ == "__main__":
    args = sys.argv[1:]
    if args[:1] == ["--"]:
        args = args[1:]
    asyncio.run(main(args))
