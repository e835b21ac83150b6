"""Tool search quality, cost and speed (`expose = "search"`, docs/tool-search.md).

    python bench/tool_search.py [--json] [--misses SET]

Catalog: bench/data/tool_catalog.json, the real `tools/list` of published MCP servers, in a real
Location. Tasks: bench/data/tool_search_tasks.json, requests as a user types them with the tool
to call, the query a model wrote for each as its first search given only `search_tools`'
definition, and their set: `tuning` (developed against), `held-out`, `held-out-2`, `held-out-3`
(written before any ranker ran on them; the last two from the definitions alone: `blind`).
Rankers: `hybrid` (`search_tools` through the seam), `bm25` (words alone), `-plain` (without the
glossary), `-model` (on the model's query), `codemode` (Code Mode's search), `substring` (query
words found in name and description). Misses are listed (and kept in `--json`) only for the
sets `--misses` names. Reported: recall@1, recall@5, MRR (first 10) per set; definition tokens
(cl100k_base) with `expose` all and search; loading the model, building an index of 5,000 tools
and one search (median, p99).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import statistics
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from sidecar import Location, Tool, ToolContext, ToolResponse
from sidecar.codemode.catalog import Catalog
from sidecar.codemode.embedding import load_embedder
from sidecar.codemode.search import SearchIndex
from sidecar.codemode.tool_index import ToolIndex
from sidecar.model.token_count import ENCODING, count_tokens, definition_text
from sidecar.registry.registry import Entry, ToolDefinition, build_entries

DATA = Path(__file__).resolve().parent / "data"
CATALOG = DATA / "tool_catalog.json"
TASKS = DATA / "tool_search_tasks.json"
RANKED = 10
SCALE = 5000

Ranker = Callable[[str], list[str]]


async def _never(value: Any, ctx: Any) -> ToolResponse:
    raise AssertionError("the benchmark never runs a catalog tool")


def catalog_tools() -> dict[str, dict[str, Tool]]:
    """Each server's tools as registrations (their real definitions; nothing runs)."""
    servers: dict[str, dict[str, Tool]] = {}
    for item in json.loads(CATALOG.read_text())["tools"]:
        raw = item["tool"]
        servers.setdefault(item["server"], {})[raw["name"]] = Tool(
            description=raw.get("description", ""), input=raw["inputSchema"],
            title=raw.get("title"), execute=_never)
    return servers


def substring_ranker(entries: Mapping[str, Entry]) -> Ranker:
    texts = {n: f"{n} {e.definition.description}".lower() for n, e in entries.items()}

    def rank(query: str) -> list[str]:
        words = [w for w in re.findall(r"[a-z0-9]+", query.lower()) if len(w) >= 3]
        scored = [(sum(w in text for w in words), n) for n, text in texts.items()]
        return [n for s, n in sorted(scored, key=lambda p: (-p[0], p[1])) if s > 0][:RANKED]

    return rank


def codemode_ranker(entries: Mapping[str, Entry]) -> Ranker:
    index = SearchIndex(Catalog(entries))
    return lambda query: [hit.tool.name for hit in index.search(query, RANKED)[0]]


def scores(ranker: Ranker, tasks: list[dict[str, Any]]) -> dict[str, float]:
    at1 = at5 = reciprocal = 0.0
    for task in tasks:
        ranked = ranker(task["query"])
        ranks = [ranked.index(e) + 1 for e in task["expected"] if e in ranked]
        best = min(ranks, default=0)
        at1 += best == 1
        at5 += 0 < best <= 5
        reciprocal += 1 / best if best else 0.0
    n = len(tasks)
    return {"recall@1": at1 / n, "recall@5": at5 / n, "mrr": reciprocal / n}


SETS = ("held-out-3", "held-out-2", "held-out", "tuning")
"""The honest figures first: the sets ranked the fewest times."""
BLIND = ("held-out-3", "held-out-2")
"""The sets written from the definitions alone, before any ranker ran on them."""


def sets(tasks: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """The tasks of each set, the `blind` sets together, then all of them."""
    return {**{name: [t for t in tasks if t["set"] == name] for name in SETS},
            "blind": [t for t in tasks if t["set"] in BLIND], "all": tasks}


def tokens_of(definitions: tuple[ToolDefinition, ...]) -> int:
    return sum(count_tokens(definition_text(d.name, d.description, dict(d.input_schema)))
               for d in definitions)


def scaled_entries(servers: dict[str, dict[str, Tool]]) -> dict[str, Entry]:
    """The catalog repeated under other namespaces until it holds `SCALE` tools."""
    entries: dict[str, Entry] = {}
    copy = 0
    while len(entries) < SCALE:
        for server, tools in servers.items():
            entries.update(build_entries(tools, f"{server}{copy or ''}"))
        copy += 1
    return dict(list(entries.items())[:SCALE])


def search_timings(index: ToolIndex, tasks: list[dict[str, Any]], embedding: bool) -> list[float]:
    timings: list[float] = []
    for _ in range(5):
        for task in tasks:
            t0 = time.perf_counter()
            index.search(task["query"], 5, embedding=embedding)
            timings.append(time.perf_counter() - t0)
    return sorted(timings)


def speed(servers: dict[str, dict[str, Tool]], tasks: list[dict[str, Any]]) -> dict[str, float]:
    entries = scaled_entries(servers)
    started = time.perf_counter()
    load_embedder.__wrapped__()  # a fresh load, not the process's cached model
    load = time.perf_counter() - started
    started = time.perf_counter()
    index = ToolIndex(entries, {})
    build = time.perf_counter() - started
    result = {"tools": len(entries), "model_load_s": load, "build_s": build}
    for label, embedding in (("search", True), ("bm25", False)):
        timings = search_timings(index, tasks, embedding)
        result[f"{label}_median_ms"] = statistics.median(timings) * 1000
        result[f"{label}_p99_ms"] = timings[int(len(timings) * 0.99) - 1] * 1000
    return result


async def measure() -> dict[str, Any]:
    if load_embedder() is None:
        raise SystemExit("the embedding model did not load (see the warning above)")
    servers = catalog_tools()
    tasks = json.loads(TASKS.read_text())["tasks"]
    with tempfile.TemporaryDirectory() as root:
        async with Location.open(root=root, state_dir=Path(root) / "state") as loc:
            for server, tools in servers.items():
                loc.tools.register(tools, namespace=server, label=f"mcp:{server}")
            every = loc.snapshot(session_id="bench", expose="all")
            search = loc.snapshot(session_id="bench", expose="search")
            catalog = {n: e for n in every.names if (e := every.entry(n)) is not None
                       and n != "managed_read"}
            missing = sorted({e for t in tasks for e in t["expected"]} - catalog.keys())
            if missing:
                raise SystemExit(f"tasks name tools the catalog lacks: {missing}")
            calls = iter(range(10**9))

            async def search_tools(query: str) -> list[str]:
                outcome = await search.execute(
                    "search_tools", {"query": query, "limit": RANKED},
                    ToolContext("bench", "bench", "m", f"search-{next(calls)}"))
                assert outcome.status == "completed", outcome.error
                return [tool["name"] for tool in outcome.output["tools"]]

            hybrid = {t["query"]: await search_tools(t["query"]) for t in tasks}
            if any("model_query" not in t for t in tasks):
                raise SystemExit("every task needs its model_query")
            by_model = {t["query"]: await search_tools(t["model_query"]) for t in tasks}
            model_query = {t["query"]: t["model_query"] for t in tasks}
            index = ToolIndex(catalog, {})

            def ranked(glossary: bool, embedding: bool) -> Ranker:
                return lambda q: [n for n, _ in index.search(
                    q, RANKED, embedding=embedding, **({} if glossary else {"glossary": {}}))]

            words, code, substring = (ranked(True, False), codemode_ranker(catalog),
                                      substring_ranker(catalog))
            rankers: dict[str, Ranker] = {
                "hybrid": lambda q: hybrid[q], "bm25": words,
                "hybrid-plain": ranked(False, True), "bm25-plain": ranked(False, False),
                "codemode": code, "substring": substring,
                "hybrid-model": lambda q: by_model[q],
                "bm25-model": lambda q: words(model_query[q]),
                "codemode-model": lambda q: code(model_query[q]),
                "substring-model": lambda q: substring(model_query[q])}
            quality = {name: {part: scores(ranker, chosen) for part, chosen in sets(tasks).items()}
                       for name, ranker in rankers.items()}
            token_all = tokens_of(every.definitions)
            token_search = tokens_of(search.definitions)
    return {
        "catalog": {"tools": len(catalog), "servers": len(servers)},
        "tasks": {part: len(chosen) for part, chosen in sets(tasks).items()}, "quality": quality,
        "tokens": {"encoding": ENCODING, "all": token_all, "search": token_search,
                   "fewer": 1 - token_search / token_all},
        "speed": speed(servers, tasks),
        "misses": [{"set": t["set"], "query": t["query"], "expected": t["expected"],
                    "top5": hybrid[t["query"]][:5]}
                   for t in tasks if not set(t["expected"]) & set(hybrid[t["query"]][:5])],
    }


def report(result: dict[str, Any]) -> str:
    c, q, tok, sp = result["catalog"], result["quality"], result["tokens"], result["speed"]
    counts = ", ".join(f"{n} {part}" for part, n in result["tasks"].items())
    lines = [f"catalog: {c['tools']} tools from {c['servers']} published servers; "
             f"tasks: {counts}", "",
             f"{'set':<12}{'ranker':<17}{'recall@1':>10}{'recall@5':>10}{'MRR':>8}"]
    for part in result["tasks"]:
        for name, by_set in q.items():
            s = by_set[part]
            lines.append(f"{part:<12}{name:<17}{s['recall@1']:>10.3f}{s['recall@5']:>10.3f}"
                         f"{s['mrr']:>8.3f}")
    lines += ["", f"definition tokens ({tok['encoding']}): all {tok['all']:,}, search "
              f"{tok['search']:,} ({tok['fewer']:.1%} fewer)",
              f"embedding model loaded in {sp['model_load_s']:.2f} s; {sp['tools']:,} tools: "
              f"index built in {sp['build_s']:.2f} s; one search {sp['search_median_ms']:.2f} "
              f"ms median, {sp['search_p99_ms']:.2f} ms p99 (by words alone "
              f"{sp['bm25_median_ms']:.2f} / {sp['bm25_p99_ms']:.2f} ms)"]
    for miss in result["misses"]:
        lines.append(f"miss ({miss['set']}): {miss['query']!r} -> {miss['top5']} "
                     f"(want {miss['expected']})")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description="tool search quality, tokens and speed")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.add_argument("--misses", action="append", default=[], choices=SETS, metavar="SET",
                        help="also list the requests of SET whose tool is not in the top 5")
    args = parser.parse_args()
    result = asyncio.run(measure())
    # a set whose misses are read while the ranker changes is no longer held out
    result["misses"] = [m for m in result["misses"] if m["set"] in args.misses]
    print(json.dumps(result, indent=2) if args.json else report(result))


if __name__ == "__main__":
    main()
