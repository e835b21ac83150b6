"""Per-step price of a call through the seam: a ladder of Locations, each adding one piece of
the per-call work a user gets by default, and single steps priced against a named baseline
(`STEPS`), all measured side by side in one process.

    .venv/bin/python bench/steps.py [--calls N] [--rounds R] [--write]

Ladder, each rung keeping the one before: the seam alone (a Python echo tool, JSON Schema
codec, no outcome log or history), + the durable outcome record, + the history row, +
redaction, + a profile with a rate limit, + pins (the echo an MCP server's tool, pinned), +
a permission ask an `allow` rule answers, + an OpenTelemetry SDK tracer provider. `STEPS`, on
the bare seam: decode, profile, pins, permission, the upstream round trip (bench/upstream.py
over stdio; its own CPU not counted), bounding, the MCP request's parse, the result's encoding.
Blocks of `--calls` sequential calls take turns, the order rotating each round; `cpu µs/call`
is this process's CPU (loop and threads) per call, the median over rounds; `price` is the
median same-round difference. `--write` updates bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import uvloop

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sidecar import Bounds, CallContext, Location, Tool, ToolContext, ToolResponse
from sidecar.backends.sqlite.call_history import SqliteCallHistory
from sidecar.backends.sqlite.outcome_log import SqliteOutcomeLog
from sidecar.model import json_depth, tracing
from sidecar.model.permissions import PermissionGate, ask_permission
from sidecar.serve.mcp_facade.fast_answers import call_params, json_bytes, plain_request
from sidecar.serve.mcp_facade.tools import bounded_result_wire

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "RESULTS.md"
UPSTREAM = ROOT / "bench" / "upstream.py"
BEGIN, END = "<!-- steps.py:begin -->", "<!-- steps.py:end -->"
IN_SCHEMA = {"type": "object", "properties": {"text": {"type": "string"},
                                              "api_key": {"type": "string"}},
             "required": ["text"]}
ARGS = {"text": "hello", "api_key": "sk-1234567890"}
PROFILE = """
[profiles.agent]
include = ["echo"]
[profiles.agent.tool_rate_limits."echo"]
calls_per_minute = 100000000
"""
ALLOW = """
[[permissions.rules]]
action = "echo"
decision = "allow"
"""
UPSTREAM_SERVER = f"""
[mcpServers.up]
command = {json.dumps(sys.executable)}
args = [{json.dumps(str(UPSTREAM))}]
"""

# decode: a schema that makes validation work (22 fields: nested objects, arrays, enums,
# patterns, bounds), and an input that passes it
WIDE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        **{f"s{i}": {"type": "string", "minLength": 1, "maxLength": 200} for i in range(6)},
        **{f"n{i}": {"type": "integer", "minimum": 0, "maximum": 10**6} for i in range(6)},
        "mode": {"enum": ["fast", "safe", "full"]},
        "email": {"type": "string", "pattern": r"^[^@\s]+@[^@\s]+\.[a-z]{2,}$"},
        "ratio": {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
        "flags": {"type": "array", "items": {"type": "boolean"}, "maxItems": 16},
        "tags": {"type": "array", "items": {"type": "string", "pattern": "^[a-z-]+$"},
                 "uniqueItems": True},
        "paths": {"type": "array", "items": {
            "type": "object", "properties": {"path": {"type": "string"},
                                             "line": {"type": "integer", "minimum": 1}},
            "required": ["path"], "additionalProperties": False}},
        "options": {"type": "object", "properties": {
            "depth": {"type": "integer", "minimum": 0}, "follow": {"type": "boolean"},
            "exclude": {"type": "array", "items": {"type": "string"}}},
            "additionalProperties": False},
        "when": {"type": "string", "format": "date-time"},
        "note": {"type": ["string", "null"]},
        "text": {"type": "string"},
    },
    "required": ["text", "mode", "s0", "n0"],
    "additionalProperties": False,
}
WIDE_ARGS: dict[str, Any] = {
    **{f"s{i}": f"value {i}" for i in range(6)}, **{f"n{i}": i * 1000 for i in range(6)},
    "mode": "safe", "email": "dev@example.org", "ratio": 0.25,
    "flags": [True, False, True, True], "tags": ["alpha", "beta-two", "gamma"],
    "paths": [{"path": f"src/mod{i}.py", "line": i + 1} for i in range(5)],
    "options": {"depth": 3, "follow": True, "exclude": ["*.pyc", "build/"]},
    "when": "2026-12-06T10:00:00Z", "note": None, "text": "hello",
}
TEXT = "".join(f"{i:06d} " + "x" * 92 + "\n" for i in range(80))  # 8,000 bytes in 80 lines
TEXT_BOUND = Bounds(max_bytes=2048)  # the default bound is 50 KiB / 2,000 lines


class Unchecked:
    """A codec that accepts anything (decode does no work)."""

    def decode(self, data: Any) -> Any:
        return data

    def encode(self, value: Any) -> Any:
        return value

    def json_schema(self) -> dict[str, Any]:
        return {"type": "object"}


async def run_echo(args: dict[str, Any], ctx: Any) -> ToolResponse:
    return ToolResponse(content=str(args["text"]))


async def run_text(args: dict[str, Any], ctx: Any) -> ToolResponse:
    return ToolResponse(content=TEXT)


def asking_echo(gate: PermissionGate) -> Callable[[dict[str, Any], CallContext],
                                                  Awaitable[ToolResponse]]:
    """The echo that asks `gate` first, as a bridged tool does (`bridges.mcp.calls`)."""
    async def run(args: dict[str, Any], ctx: CallContext) -> ToolResponse:
        await ask_permission(gate, ctx, metadata={"server": "bench", "tool": "echo"})
        return ToolResponse(content=str(args["text"]))
    return run


ECHO = Tool(description="Echo the text", input=IN_SCHEMA, execute=run_echo)
TOOLS = {
    "echo": ECHO,
    "unchecked": Tool(description="Echo the text", input=Unchecked(), execute=run_echo),
    "wide": Tool(description="Echo the text", input=WIDE_SCHEMA, execute=run_echo),
    "text": Tool(description="8,000 bytes of text", input=IN_SCHEMA, execute=run_text),
    "bounded": Tool(description="8,000 bytes of text", input=IN_SCHEMA, execute=run_text,
                    bounds=TEXT_BOUND),
}


@dataclass
class Rung:
    name: str
    durable: bool = False
    history: bool = False
    inputs: str = "none"
    profile: bool = False
    pinned: bool = False
    """The echo is an MCP server's tool (origin `mcp:bench`, pin policy `warn`), pinned."""
    permission: bool = False
    """The echo asks the Location's permission service; an `allow` rule matches."""
    traced: bool = False
    tool: str = "echo"
    """A key of `TOOLS`, or "upstream": `echo` of bench/upstream.py over stdio (manifest)."""
    parse: bool = False
    """Each call's request is parsed from its JSON-RPC line as the stdio fast path does."""
    encode: bool = False
    """Each outcome is encoded as the MCP fast path answers it (wire result, JSON line)."""
    share: float = 1.0
    """Of `--calls` per block (the slow rows: fewer calls, the same CPU per call)."""
    cpu: list[float] = field(default_factory=list)
    """CPU seconds per call, one value per round."""
    rate: list[float] = field(default_factory=list)


RUNGS = [
    Rung("seam"),
    Rung("+ outcome log", durable=True),
    Rung("+ history row", durable=True, history=True),
    Rung("+ redaction", durable=True, history=True, inputs="redacted"),
    Rung("+ profile, rate limit", durable=True, history=True, inputs="redacted", profile=True),
    Rung("+ pins", durable=True, history=True, inputs="redacted", profile=True, pinned=True),
    Rung("+ permission (allow rule)", durable=True, history=True, inputs="redacted",
         profile=True, pinned=True, permission=True),
    Rung("+ tracing", durable=True, history=True, inputs="redacted", profile=True,
         pinned=True, permission=True, traced=True),
]
SEAM = RUNGS[0]
UNCHECKED = Rung("seam, input unchecked", tool="unchecked")  # a codec that accepts anything
WIDE = Rung("decode: a 22-field schema", tool="wide")
PROFILED = Rung("seam + profile, rate limit", profile=True)
PINNED = Rung("seam + pins", pinned=True)
ALLOWED = Rung("seam + permission (allow rule)", permission=True)
UPSTREAM_ECHO = Rung("upstream round trip (stdio)", tool="upstream", share=0.4)
TEXT_RESULT = Rung("8 KB result, not bounded", tool="text")  # 8,000 bytes, 80 lines
BOUNDED = Rung("bounding: 8 KB result to 2 KB", tool="bounded", share=0.1)
PARSE = Rung("parse: MCP request line", parse=True)
ENCODE = Rung("encode: MCP result line", encode=True)
OTHERS = [UNCHECKED, WIDE, PROFILED, PINNED, ALLOWED, UPSTREAM_ECHO, TEXT_RESULT, BOUNDED,
          PARSE, ENCODE]
"""Measured on the `seam` rung's Location (no outcome log, no history), each its own."""
STEPS: list[tuple[str, Rung, Rung | None]] = [
    (UNCHECKED.name, UNCHECKED, None),
    ("decode: echo schema (the seam rung)", SEAM, UNCHECKED),
    (WIDE.name, WIDE, UNCHECKED),
    (PROFILED.name, PROFILED, SEAM),
    (PINNED.name, PINNED, SEAM),
    (ALLOWED.name, ALLOWED, SEAM),
    (UPSTREAM_ECHO.name, UPSTREAM_ECHO, SEAM),
    (TEXT_RESULT.name, TEXT_RESULT, SEAM),
    (BOUNDED.name, BOUNDED, TEXT_RESULT),
    (PARSE.name, PARSE, SEAM),
    (ENCODE.name, ENCODE, SEAM),
]
"""The second table: (row, measured, compared with)."""


def manifest(rung: Rung) -> str:
    return (f'[audit]\ninputs = "{rung.inputs}"\n' + (PROFILE if rung.profile else "")
            + (ALLOW if rung.permission else "")
            + (UPSTREAM_SERVER if rung.tool == "upstream" else ""))


@asynccontextmanager
async def opened(
    rung: Rung, base: Path,
) -> AsyncIterator[tuple[Callable[[int], Awaitable[Any]], Callable[[], Awaitable[None]]]]:
    """The rung's Location; yields `call(n)`, which makes the n-th call, and `settle()`,
    which returns once the history has written every row so far (its CPU counts)."""
    manifests = base / "manifests"
    manifests.mkdir(parents=True)
    (manifests / "bench.toml").write_text(manifest(rung))
    async with Location.open(base, state_dir=base / "state", manifests=[manifests],
                             durable=rung.durable, entry_point_plugins=False) as location:
        if not rung.history:  # no history row: the seam's audit hook goes with it
            location.stores = dataclasses.replace(location.stores, history=None)
            location._wire_audit()
        tool = TOOLS.get(rung.tool, ECHO)
        if rung.permission:
            tool = Tool(description="Echo the text", input=IN_SCHEMA,
                        execute=asking_echo(location.permissions))
        label = "mcp:bench" if rung.pinned else ""
        if rung.pinned:
            location.pins.policy = lambda server: "warn" if server == "bench" else None
        async with location.tools.register({"echo": tool}, label=label):
            profile = "agent" if rung.profile else None
            snapshot = location.snapshot(keep=False, profile=profile)
            name = "up_echo" if rung.tool == "upstream" else "echo"
            args = WIDE_ARGS if rung.tool == "wide" else ARGS
            line = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                               "params": {"name": name, "arguments": args}}).encode()
            if rung.pinned and "bench/echo" not in location.pins.pins:
                raise RuntimeError(f"{rung.name}: the echo tool was not pinned")
            seam = location.seam

            async def call(n: int) -> Any:
                tool_name, arguments = name, args
                if rung.parse:
                    taken = plain_request(json_depth.loads(line))
                    params = call_params(taken[2]) if taken is not None else None
                    if params is None:
                        raise RuntimeError(f"{rung.name}: the request line was not taken")
                    tool_name, arguments = params[0], params[1]
                context = ToolContext("s", "bench", "m", f"{rung.name}-{n}")
                outcome = await snapshot.execute(tool_name, arguments, context)
                if outcome.status != "completed":
                    raise RuntimeError(f"{rung.name}: {outcome.error}")
                if rung.tool == "bounded" and not outcome.managed:
                    raise RuntimeError(f"{rung.name}: the result was not bounded")
                if rung.encode:
                    wire = await bounded_result_wire(
                        outcome, snapshot, modern=False, store=seam.store,
                        namespace=seam.location, bounds=seam.bounds)
                    if json_bytes({"jsonrpc": "2.0", "id": n, "result": wire}) is None:
                        raise RuntimeError(f"{rung.name}: the result is not plain JSON")
                return outcome

            async def settle() -> None:
                history = location.stores.history
                if isinstance(history, SqliteCallHistory):
                    await history.flush()
                outcomes = location.seam.outcomes
                if isinstance(outcomes, SqliteOutcomeLog):  # and the outcome rows journaled
                    await outcomes.flush()

            yield call, settle


async def measure(calls: int, rounds: int) -> list[Rung]:
    provider = _provider()
    every = RUNGS + OTHERS
    async with AsyncExitStack() as stack:
        made = [await stack.enter_async_context(
            opened(rung, Path(stack.enter_context(tempfile.TemporaryDirectory()))))
            for rung in every]
        counter = 0
        for r in range(rounds + 1):  # round 0 warms up
            order = list(range(len(every)))
            order = order[r % len(order):] + order[:r % len(order)]
            for i in order:
                rung, (call, settle) = every[i], made[i]
                tracing.use_provider(provider if rung.traced else None)
                block = max(1, round(calls * rung.share))
                cpu0, wall0 = time.process_time(), time.perf_counter()
                for _ in range(block):
                    counter += 1
                    await call(counter)
                await settle()
                cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
                if r:
                    rung.cpu.append(cpu / block)
                    rung.rate.append(block / wall)
        tracing.use_provider(None)
    return every


def _provider() -> Any:
    from opentelemetry.sdk.trace import TracerProvider

    return TracerProvider()  # spans are made and ended; no processor exports them


def price(rung: Rung, against: Rung) -> str:
    return f"{statistics.median(a - b for a, b in zip(rung.cpu, against.cpu, strict=True)) * 1e6:+.0f}"


def cells(rung: Rung) -> str:
    return f"{statistics.median(rung.rate):,.0f} | {statistics.median(rung.cpu) * 1e6:.0f}"


def table(rungs: list[Rung]) -> str:
    lines = ["| step | calls/s | cpu µs/call | price µs (vs the rung above) |",
             "|---|---|---|---|"]
    for i, rung in enumerate(rungs):
        lines.append(f"| {rung.name} | {cells(rung)} | "
                     f"{price(rung, rungs[i - 1]) if i else ''} |")
    return "\n".join(lines)


def steps_table() -> str:
    lines = ["| step | calls/s | cpu µs/call | price µs | compared with |", "|---|---|---|---|---|"]
    for name, rung, against in STEPS:
        lines.append(f"| {name} | {cells(rung)} | "
                     f"{price(rung, against) if against else ''} | "
                     f"{against.name if against else ''} |")
    return "\n".join(lines)


def report(calls: int, rounds: int, load: float) -> str:
    return "\n".join([
        f"- machine: {platform.machine()}, {os.cpu_count()} CPUs, Python "
        f"{platform.python_version()}, load average {load:.2f} before the run",
        f"- command: `.venv/bin/python bench/steps.py --calls {calls} --rounds {rounds}`",
        "", table(RUNGS), "", steps_table()])


def write(text: str) -> None:
    current = RESULTS.read_text()
    block = f"{BEGIN}\n{text}\n{END}"
    if BEGIN in current and END in current:
        head, rest = current.split(BEGIN, 1)
        current = head + block + rest.split(END, 1)[1]
    else:
        current = current.rstrip("\n") + "\n\n## Per-step price of a call (bench/steps.py)\n\n" \
            + block + "\n"
    RESULTS.write_text(current)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=500, help="sequential calls per block")
    parser.add_argument("--rounds", type=int, default=15, help="blocks per row")
    parser.add_argument("--write", action="store_true", help="write into bench/RESULTS.md")
    args = parser.parse_args()
    load = os.getloadavg()[0]
    uvloop.run(measure(args.calls, args.rounds))
    text = report(args.calls, args.rounds, load)
    print(text)
    if args.write:
        write(text)


if __name__ == "__main__":
    main()
