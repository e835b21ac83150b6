"""The `echo` tool the fleet benchmark's `sidecar serve` replicas load as a plugin (manifest
`plugins = ["fleet_plugin:activate"]`, with bench/ on PYTHONPATH): a Python tool in the
daemon's own process, so a call costs the seam, the durable outcome record and HTTP, nothing
of an upstream."""

from __future__ import annotations

import os

from pydantic import BaseModel

from sidecar import CallContext, Tool
from sidecar.registry.registry import Tools


class EchoIn(BaseModel):
    text: str


class EchoOut(BaseModel):
    echoed: str
    pid: int  # which replica answered


async def run_echo(args: EchoIn, context: CallContext) -> EchoOut:
    return EchoOut(echoed=args.text, pid=PID)


PID = os.getpid()
ECHO = Tool(description="Echo text", input=EchoIn, output=EchoOut, execute=run_echo)


def activate(tools: Tools) -> None:
    tools.register({"echo": ECHO})
