"""Code Mode task 2: three published MCP servers, their real definitions and real outputs.

    .venv/bin/python bench/codemode.py --task servers [--rounds R]

Servers (installed by scripts/bootstrap-servers, started over stdio by a real Location):
`fs` = @modelcontextprotocol/server-filesystem on a copy of this repository's docs/ (bounds
raised to 128 KiB so that the largest page comes back whole in both modes), `memory` =
@modelcontextprotocol/server-memory (a knowledge graph in a fresh file each run), `time` =
mcp-server-time. Every tool of the three is advertised: 25 tools and `managed_read`.

The task: map the documentation into the knowledge graph. Each Markdown page becomes a `doc`
entity observed with its title (first `# ` heading) and line count; each link from one page to
another a `links_to` relation. Then read the graph back and report how many docs and links it
holds, the 3 most linked-to pages with their titles, the pages no page links to, and when
09:00 in Berlin is in New York today (the report's meeting time).

(a) direct: turn 1 lists docs/, turn 2 reads every page (in parallel), turn 3 creates the
    entities and converts the time, turn 4 creates the relations, turn 5 reads the graph.
(b) Code Mode: turn 1 searches three times, turn 2 describes the 6 tools it picked, turn 3
    runs one program that does all of (a) and returns the report.
"""

from __future__ import annotations

import json
import re
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from codemode_common import Runner, Transcript, definitions_text, executed, report

from sidecar import Location
from sidecar.execution.snapshot import Snapshot

ROOT = Path(__file__).resolve().parents[1]
DEPS = ROOT / ".deps"
NPM = DEPS / "npm" / "node_modules" / "@modelcontextprotocol"
SERVERS = {
    "fs": NPM / "server-filesystem" / "dist" / "index.js",
    "memory": NPM / "server-memory" / "dist" / "index.js",
    "time": DEPS / "venv-time" / "bin" / "python",
}
LINK_RE = r"\]\(([a-z0-9-]+\.md)(?:#[^)]*)?\)"
MEETING = {"source_timezone": "Europe/Berlin", "time": "09:00",
           "target_timezone": "America/New_York"}


def manifest(work: Path, memory_file: Path) -> dict[str, Any]:
    return {"mcpServers": {
        "fs": {"command": "node", "args": [str(SERVERS["fs"]), str(work)],
               "bounds": {"max_bytes": 131072, "max_lines": 4000}},
        "memory": {"command": "node", "args": [str(SERVERS["memory"])],
                   "env": {"MEMORY_FILE_PATH": str(memory_file)}},
        "time": {"command": str(SERVERS["time"]),
                 "args": ["-m", "mcp_server_time", "--local-timezone", "UTC"]},
    }}


def page_facts(name: str, text: str, pages: set[str]) -> tuple[dict[str, Any], list[str]]:
    """A page's entity and the pages it links to (what either mode works out from its text)."""
    title = next((line[2:].strip() for line in text.splitlines() if line.startswith("# ")), name)
    lines = len(text.splitlines())
    links = sorted({t for t in re.findall(LINK_RE, text) if t in pages and t != name})
    entity = {"name": name, "entityType": "doc",
              "observations": [f"title: {title}", f"lines: {lines}"]}
    return entity, links


def summary(graph: dict[str, Any], meeting: dict[str, Any]) -> dict[str, Any]:
    """The report, from the graph as the memory server gives it back."""
    titles = {e["name"]: e["observations"][0].removeprefix("title: ")
              for e in graph["entities"]}
    inbound = dict.fromkeys(titles, 0)
    for relation in graph["relations"]:
        inbound[relation["to"]] += 1
    top = sorted(inbound, key=lambda n: (-inbound[n], n))[:3]
    return {"docs": len(graph["entities"]), "links": len(graph["relations"]),
            "most_linked": [[n, titles[n], inbound[n]] for n in top],
            "unlinked": sorted(n for n, k in inbound.items() if k == 0),
            "meeting_in_new_york": meeting["target"]["datetime"]}


async def direct(snapshot: Snapshot, prefix: str, docs: str) -> Transcript:
    t = Transcript(definitions_text(snapshot))
    run = Runner(snapshot, prefix)

    async def turn(calls: list[tuple[str, dict[str, Any]]]) -> list[Any]:
        done = await run.turn(calls)
        t.turns.append([(c, r) for c, r, _ in done])
        return [text for _, text, _ in done]

    listing = (await turn([("fs_list_directory", {"path": docs})]))[0]
    pages = sorted(re.findall(r"^\[FILE\] (.+\.md)$", listing, re.M))
    texts = await turn([("fs_read_text_file", {"path": f"{docs}/{p}"}) for p in pages])
    facts = [page_facts(p, text, set(pages)) for p, text in zip(pages, texts, strict=True)]
    entities = [entity for entity, _ in facts]
    relations = [{"from": e["name"], "to": to, "relationType": "links_to"}
                 for e, links in facts for to in links]
    _, meeting = await turn([("memory_create_entities", {"entities": entities}),
                             ("time_convert_time", MEETING)])
    await turn([("memory_create_relations", {"relations": relations})])
    graph = (await turn([("memory_read_graph", {})]))[0]
    t.answer = summary(json.loads(graph), json.loads(meeting))
    return t


PROGRAM = f"""\
import re
docs = "{{docs}}"
listing = await tools.fs.list_directory(path=docs)
pages = sorted(re.findall(r"^\\[FILE\\] (.+\\.md)$", listing["content"], re.M))
texts = await asyncio.gather(*[tools.fs.read_text_file(path=docs + "/" + p) for p in pages])
entities, relations = [], []
for page, text in zip(pages, texts):
    text = text["content"]
    title = page
    for line in text.splitlines():
        if line.startswith("# "):
            title = line[2:].strip()
            break
    entities.append({{"name": page, "entityType": "doc",
                     "observations": ["title: " + title, "lines: " + str(len(text.splitlines()))]}})
    for to in sorted(set(re.findall(r"{LINK_RE}", text))):
        if to in pages and to != page:
            relations.append({{"from": page, "to": to, "relationType": "links_to"}})
_, meeting = await asyncio.gather(tools.memory.create_entities(entities=entities),
                                  tools.time_.convert_time(source_timezone="Europe/Berlin",
                                      time="09:00", target_timezone="America/New_York"))
await tools.memory.create_relations(relations=relations)
graph = await tools.memory.read_graph()
titles = {{e["name"]: e["observations"][0][len("title: "):] for e in graph["entities"]}}
inbound = {{n: 0 for n in titles}}
for r in graph["relations"]:
    inbound[r["to"]] += 1
top = sorted(inbound, key=lambda n: (-inbound[n], n))[:3]
{{"docs": len(graph["entities"]), "links": len(graph["relations"]),
  "most_linked": [[n, titles[n], inbound[n]] for n in top],
  "unlinked": sorted(n for n, k in inbound.items() if k == 0),
  "meeting_in_new_york": meeting["target"]["datetime"]}}
"""

SEARCHES = [("search_tools", {"query": "list directory read text file", "limit": 5}),
            ("search_tools", {"query": "knowledge graph create entities relations read",
                              "limit": 5}),
            ("search_tools", {"query": "convert time zone", "limit": 2})]
PICKED = ["fs_list_directory", "fs_read_text_file", "memory_create_entities",
          "memory_create_relations", "memory_read_graph", "time_convert_time"]


async def codemode(snapshot: Snapshot, prefix: str, docs: str) -> Transcript:
    t = Transcript(definitions_text(snapshot))
    run = Runner(snapshot, prefix)
    found = await run.turn(SEARCHES)
    t.turns.append([(c, r) for c, r, _ in found])
    described = await run.turn([("describe_tools", {"names": PICKED})])
    t.turns.append([(c, r) for c, r, _ in described])
    program = PROGRAM.replace("{docs}", docs)
    t.answer = executed(t, await run.turn([("execute", {"code": program})]))
    return t


async def ready(location: Location, servers: int, within: float = 60.0) -> None:
    import asyncio

    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        sources = {location.registry.source_of(n) for n in location.registry.effective()}
        if len({s for s in sources if s and s.startswith("mcp:")}) >= servers:
            return
        await asyncio.sleep(0.1)
    raise SystemExit(f"the servers did not start within {within:g} s")


async def servers_task(rounds: int) -> float | None:
    missing = [str(p) for p in SERVERS.values() if not p.exists()]
    if missing:
        print(f"Task 2 (servers) skipped: {', '.join(missing)} missing; run "
              "scripts/bootstrap-servers")
        return None
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        work = root / "work"
        shutil.copytree(ROOT / "docs", work / "docs", ignore=shutil.ignore_patterns("images"))
        memory_file = root / "memory.jsonl"
        (root / "servers.json").write_text(json.dumps(manifest(work, memory_file)))
        async with Location.open(root, state_dir=root / "state",
                                 manifests=[str(root / "servers.json")]) as location:
            await ready(location, 3)
            direct_snapshot = location.snapshot(codemode="direct")
            code_snapshot = location.snapshot(codemode="codemode")
            docs = str(work / "docs")
            memory_file.unlink(missing_ok=True)
            await codemode(code_snapshot, "warmup", docs)  # start the worker pool
            times: dict[str, list[float]] = {"direct": [], "codemode": []}
            transcripts: dict[str, Transcript] = {}
            for r in range(rounds):
                for mode, fn, snap in (("direct", direct, direct_snapshot),
                                       ("codemode", codemode, code_snapshot)):
                    memory_file.unlink(missing_ok=True)  # an empty graph for each run
                    started = time.perf_counter()
                    transcripts[mode] = await fn(snap, f"{mode}-{r}", docs)
                    times[mode].append(time.perf_counter() - started)
            tools = len(direct_snapshot.definitions)
    ratio = report(f"Task 2 (servers): server-filesystem, server-memory, mcp-server-time "
                   f"({tools} tools with managed_read), real outputs", transcripts, times, rounds)
    calls = sum(len(turn) for turn in transcripts["direct"].turns)
    print(f"direct made {calls} tool calls in 5 turns; Code Mode made 5 model-visible calls "
          f"(3 searches, 1 describe, 1 execute) and the program made {calls} nested calls")
    return ratio
