"""Per-step price of a call through the seam: a ladder of Locations, each adding one piece of
the per-call work a user gets by default, measured side by side in one process.

    .venv/bin/python bench/steps.py [--calls N] [--rounds R] [--write]

Rungs, each keeping the one before: the seam alone (a Python echo tool, JSON Schema codec, no
outcome log or history), + the durable SQLite outcome record, + the history row (inputs
"none"), + redaction (inputs "redacted", the default), + a profile with a rate limit, + an
OpenTelemetry SDK tracer provider. Blocks of `--calls` sequential calls take turns, the order
rotating each round; `cpu µs/call` is this process's CPU (loop and writer threads) per call,
the median over rounds; `price` is the median same-round difference from the rung above.
Not covered yet: the MCP transports and upstream round trip (`bench/compare.py`), permission
checks of bridged tools, pins. `--write` puts the table into bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import uvloop

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sidecar import Location, Tool, ToolContext, ToolResponse
from sidecar.backends.sqlite.call_history import SqliteCallHistory
from sidecar.model import tracing

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "RESULTS.md"
BEGIN, END = "<!-- steps.py:begin -->", "<!-- steps.py:end -->"
IN_SCHEMA = {"type": "object", "properties": {"text": {"type": "string"},
                                              "api_key": {"type": "string"}},
             "required": ["text"]}
PROFILE = """
[profiles.agent]
include = ["echo"]
[profiles.agent.tool_rate_limits."echo"]
calls_per_minute = 100000000
"""


async def run_echo(args: dict[str, Any], ctx: Any) -> ToolResponse:
    return ToolResponse(content=str(args["text"]))


ECHO = Tool(description="Echo the text", input=IN_SCHEMA, execute=run_echo)


@dataclass
class Rung:
    name: str
    durable: bool
    history: bool = False
    inputs: str = "none"
    profile: bool = False
    traced: bool = False
    cpu: list[float] = field(default_factory=list)
    """CPU seconds per call, one value per round."""
    rate: list[float] = field(default_factory=list)


RUNGS = [
    Rung("seam", durable=False),
    Rung("+ outcome log", durable=True),
    Rung("+ history row", durable=True, history=True),
    Rung("+ redaction", durable=True, history=True, inputs="redacted"),
    Rung("+ profile, rate limit", durable=True, history=True, inputs="redacted", profile=True),
    Rung("+ tracing", durable=True, history=True, inputs="redacted", profile=True,
         traced=True),
]


@asynccontextmanager
async def opened(
    rung: Rung, base: Path,
) -> AsyncIterator[tuple[Callable[[int], Any], Callable[[], Any]]]:
    """The rung's Location; yields `call(n)`, which makes the n-th call, and `settle()`,
    which returns once the history has written every row so far (its CPU counts)."""
    manifests = base / "manifests"
    manifests.mkdir(parents=True)
    text = f'[audit]\ninputs = "{rung.inputs}"\n' + (PROFILE if rung.profile else "")
    (manifests / "bench.toml").write_text(text)
    async with Location.open(base, state_dir=base / "state", manifests=[manifests],
                             durable=rung.durable, entry_point_plugins=False) as location:
        if not rung.history:  # no history row: the seam's audit hook goes with it
            location.stores = dataclasses.replace(location.stores, history=None)
            location._wire_audit()
        async with location.tools.register({"echo": ECHO}):
            profile = "agent" if rung.profile else None
            snapshot = location.snapshot(keep=False, profile=profile)
            args = {"text": "hello", "api_key": "sk-1234567890"}

            async def call(n: int) -> Any:
                context = ToolContext("s", "bench", "m", f"{rung.name}-{n}")
                outcome = await snapshot.execute("echo", args, context)
                if outcome.status != "completed":
                    raise RuntimeError(f"{rung.name}: {outcome.error}")
                return outcome

            async def settle() -> None:
                history = location.stores.history
                if isinstance(history, SqliteCallHistory):
                    await history._run(lambda: None)  # writes the rows queued before it

            yield call, settle


async def measure(calls: int, rounds: int) -> list[Rung]:
    provider = _provider()
    async with AsyncExitStack() as stack:
        made = [await stack.enter_async_context(
            opened(rung, Path(stack.enter_context(tempfile.TemporaryDirectory()))))
            for rung in RUNGS]
        counter = 0
        for r in range(rounds + 1):  # round 0 warms up
            order = list(range(len(RUNGS)))
            order = order[r % len(order):] + order[:r % len(order)]
            for i in order:
                rung, (call, settle) = RUNGS[i], made[i]
                tracing.use_provider(provider if rung.traced else None)
                cpu0, wall0 = time.process_time(), time.perf_counter()
                for _ in range(calls):
                    counter += 1
                    await call(counter)
                await settle()
                cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
                if r:
                    rung.cpu.append(cpu / calls)
                    rung.rate.append(calls / wall)
        tracing.use_provider(None)
    return RUNGS


def _provider() -> Any:
    from opentelemetry.sdk.trace import TracerProvider

    return TracerProvider()  # spans are made and ended; no processor exports them


def table(rungs: list[Rung]) -> str:
    lines = ["| step | calls/s | cpu µs/call | price µs (vs the rung above) |",
             "|---|---|---|---|"]
    for i, rung in enumerate(rungs):
        price = ""
        if i:
            above = rungs[i - 1].cpu
            price = f"{statistics.median(a - b for a, b in zip(rung.cpu, above, strict=True)) * 1e6:+.0f}"
        lines.append(f"| {rung.name} | {statistics.median(rung.rate):,.0f} | "
                     f"{statistics.median(rung.cpu) * 1e6:.0f} | {price} |")
    return "\n".join(lines)


def report(rungs: list[Rung], calls: int, rounds: int, load: float) -> str:
    return "\n".join([
        f"- machine: {platform.machine()}, {os.cpu_count()} CPUs, Python "
        f"{platform.python_version()}, load average {load:.2f} before the run",
        f"- command: `.venv/bin/python bench/steps.py --calls {calls} --rounds {rounds}`",
        "", table(rungs)])


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
    parser.add_argument("--rounds", type=int, default=15, help="blocks per rung")
    parser.add_argument("--write", action="store_true", help="write into bench/RESULTS.md")
    args = parser.parse_args()
    load = os.getloadavg()[0]
    rungs = uvloop.run(measure(args.calls, args.rounds))
    text = report(rungs, args.calls, args.rounds, load)
    print(text)
    if args.write:
        write(text)


if __name__ == "__main__":
    main()
