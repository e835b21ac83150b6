"""Code Mode benchmark: direct calls vs. Code Mode, on two tasks, same answers required.

    .venv/bin/python bench/codemode.py [--rounds R] [--task synthetic|servers|both]

Each task runs twice through the real seam of a real Location: (a) direct, the model sees every
definition and reads every result; (b) Code Mode, it sees `execute`, `search_tools` and
`describe_tools`, searches, describes the tools it picked and runs one program. The script fails
unless both modes give the same answer. Task 1, "synthetic": in-process `fs`, `issues` and `calc`
tools with MCP-style schemas; of the open `bug` issues that mention source files, report the 3
whose files have the most lines, and the mean and median comment count. Task 2, "servers": three
published MCP servers (bench/codemode_servers.py). Tokens (bench/codemode_common.py): cl100k_base
of what the model holds after its last tool turn; the ratio is Code Mode's over direct's. Wall
time covers tool execution only, not model latency; the median of R rounds is reported.
"""

from __future__ import annotations

import argparse
import ast
import json
import operator
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from codemode_common import Runner, Transcript, definitions_text, executed, report

from sidecar import Location, Tool, ToolFailure, ToolResponse
from sidecar.codemode import Sandbox, codemode_snapshot
from sidecar.execution.snapshot import Snapshot

REPO = "acme/widgets"

# --- a synthetic repository and issue tracker -------------------------------------------------

WORDS = ("widget render cache parse token stream buffer layout config retry timeout handler "
         "queue worker batch index schema migrate socket encode decode flush commit").split()


@dataclass
class World:
    files: dict[str, str] = field(default_factory=dict)
    issues: list[dict[str, Any]] = field(default_factory=list)
    comments: dict[int, list[dict[str, Any]]] = field(default_factory=dict)


def sentence(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n)).capitalize() + "."


def build_world(seed: int = 7) -> World:
    rng = random.Random(seed)
    world = World()
    modules = ["core", "render", "io", "net", "cli"]
    for i in range(40):
        path = f"src/{modules[i % 5]}/{rng.choice(WORDS)}_{i}.py"
        lines = [f"def {rng.choice(WORDS)}_{j}(value):  # {sentence(rng, 6)}"
                 for j in range(rng.randint(40, 400))]
        world.files[path] = "\n".join(lines) + "\n"
    paths = sorted(world.files)
    for number in range(1, 41):
        mentioned = rng.sample(paths, rng.randint(0, 3))
        body = " ".join(sentence(rng, rng.randint(8, 16)) for _ in range(8))
        if mentioned:
            body += " Affected files: " + ", ".join(mentioned) + "."
        labels = ["bug"] if number % 2 else ["enhancement"]
        if number % 5 == 0:
            labels.append("help wanted")
        world.issues.append({
            "number": number, "title": sentence(rng, 5)[:-1],
            "state": "open" if number % 7 else "closed", "labels": labels,
            "author": f"user{rng.randint(1, 30)}",
            "created_at": f"2026-0{1 + number % 9}-1{number % 9}T10:00:00Z",
            "comments": 0, "body": body,
        })
        world.comments[number] = [
            {"id": number * 100 + k, "author": f"user{rng.randint(1, 30)}",
             "created_at": "2026-10-01T12:00:00Z", "body": sentence(rng, rng.randint(10, 30))}
            for k in range(rng.randint(0, 8))
        ]
        world.issues[-1]["comments"] = len(world.comments[number])
    return world


# --- the three "servers" ----------------------------------------------------------------------


def obj(properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {"type": "object", "properties": properties, "required": required,
            "additionalProperties": False}


STR = {"type": "string"}
PATH = {"type": "string", "description": "Path relative to the repository root, e.g. src/core/x.py"}
REPO_ARG = {"type": "string", "description": "Repository as owner/name"}
ISSUE = {
    "type": "object",
    "properties": {
        "number": {"type": "integer"}, "title": STR, "state": {"enum": ["open", "closed"]},
        "labels": {"type": "array", "items": STR}, "author": STR, "created_at": STR,
        "comments": {"type": "integer", "description": "Number of comments"}, "body": STR,
    },
    "required": ["number", "title", "state", "labels", "author", "created_at", "comments",
                 "body"],
}
COMMENT = {"type": "object", "properties": {"id": {"type": "integer"}, "author": STR,
                                            "created_at": STR, "body": STR},
           "required": ["id", "author", "created_at", "body"]}


def fs_tools(world: World) -> dict[str, Tool]:
    def need(path: str) -> str:
        if path not in world.files:
            raise ToolFailure(f"ENOENT: no such file or directory '{path}'")
        return world.files[path]

    async def list_directory(a: dict[str, Any], c: Any) -> ToolResponse:
        prefix = a["path"].rstrip("/") + "/"
        entries = sorted({p[len(prefix):].split("/")[0] + ("/" if "/" in p[len(prefix):] else "")
                          for p in world.files if p.startswith(prefix)})
        return ToolResponse(content="\n".join(
            f"[DIR] {e[:-1]}" if e.endswith("/") else f"[FILE] {e}" for e in entries))

    async def read_file(a: dict[str, Any], c: Any) -> ToolResponse:
        text = need(a["path"])
        lines = text.splitlines()
        if a.get("head"):
            lines = lines[: a["head"]]
        return ToolResponse(content="\n".join(lines))

    async def read_multiple_files(a: dict[str, Any], c: Any) -> ToolResponse:
        return ToolResponse(content="\n---\n".join(f"{p}:\n{need(p)}" for p in a["paths"]))

    async def search_files(a: dict[str, Any], c: Any) -> ToolResponse:
        hits = [p for p in world.files if a["pattern"] in p]
        return ToolResponse(content="\n".join(hits) or "No matches found")

    async def get_file_info(a: dict[str, Any], c: Any) -> ToolResponse:
        text = need(a["path"])
        info = {"path": a["path"], "size": len(text.encode()), "lines": text.count("\n"),
                "created": "2026-01-04T09:12:44Z", "modified": "2026-11-20T16:03:10Z",
                "accessed": "2026-12-01T08:00:00Z", "isDirectory": False, "isFile": True,
                "permissions": "644"}
        return ToolResponse(content="\n".join(f"{k}: {v}" for k, v in info.items()))

    async def directory_tree(a: dict[str, Any], c: Any) -> ToolResponse:
        tree: dict[str, Any] = {}
        for p in world.files:
            node = tree
            for part in p.split("/")[:-1]:
                node = node.setdefault(part, {})
            node[p.rsplit("/", 1)[1]] = None

        def render(node: dict[str, Any]) -> list[dict[str, Any]]:
            return [{"name": k, "type": "file"} if v is None else
                    {"name": k, "type": "directory", "children": render(v)}
                    for k, v in sorted(node.items())]

        return ToolResponse(content=json.dumps(render(tree), indent=2))

    def tool(desc: str, schema: dict[str, Any], run: Any) -> Tool:
        return Tool(description=desc, input=schema, execute=run)

    return {
        "list_directory": tool(
            "Get a detailed listing of all files and directories in a specified path. Results "
            "clearly distinguish between files and directories with [FILE] and [DIR] prefixes.",
            obj({"path": PATH}, ["path"]), list_directory),
        "read_file": tool(
            "Read the complete contents of a file from the file system. Handles various text "
            "encodings and provides detailed error messages if the file cannot be read. Use the "
            "'head' parameter to read only the first N lines of a file.",
            obj({"path": PATH, "head": {"type": "integer", "description":
                 "If provided, returns only the first N lines of the file"}}, ["path"]),
            read_file),
        "read_multiple_files": tool(
            "Read the contents of multiple files simultaneously. This is more efficient than "
            "reading files one by one when you need to analyze or compare multiple files.",
            obj({"paths": {"type": "array", "items": PATH}}, ["paths"]), read_multiple_files),
        "search_files": tool(
            "Recursively search for files and directories matching a pattern. Searches through "
            "all subdirectories from the starting path.",
            obj({"path": PATH, "pattern": STR}, ["path", "pattern"]), search_files),
        "get_file_info": tool(
            "Retrieve detailed metadata about a file or directory. Returns comprehensive "
            "information including size, line count, creation time, last modified time, "
            "permissions, and type.",
            obj({"path": PATH}, ["path"]), get_file_info),
        "directory_tree": tool(
            "Get a recursive tree view of files and directories as a JSON structure. Each entry "
            "includes 'name', 'type' (file/directory), and 'children' for directories.",
            obj({"path": PATH}, ["path"]), directory_tree),
    }


def issue_tools(world: World) -> dict[str, Tool]:
    def find(number: int) -> dict[str, Any]:
        for issue in world.issues:
            if issue["number"] == number:
                return issue
        raise ToolFailure(f"issue #{number} not found in {REPO}")

    async def list_issues(a: dict[str, Any], c: Any) -> dict[str, Any]:
        wanted = set(a.get("labels") or ())
        found = [i for i in world.issues
                 if a.get("state", "open") in (i["state"], "all") and wanted <= set(i["labels"])]
        return {"total_count": len(found), "issues": found[: a.get("per_page", 30)]}

    async def get_issue(a: dict[str, Any], c: Any) -> dict[str, Any]:
        return find(a["issue_number"])

    async def list_comments(a: dict[str, Any], c: Any) -> dict[str, Any]:
        find(a["issue_number"])
        return {"comments": world.comments[a["issue_number"]]}

    async def search_issues(a: dict[str, Any], c: Any) -> dict[str, Any]:
        q = a["q"].lower()
        return {"issues": [i for i in world.issues if q in (i["title"] + i["body"]).lower()]}

    async def list_labels(a: dict[str, Any], c: Any) -> dict[str, Any]:
        return {"labels": [{"name": n, "color": "d73a4a"} for n in
                           ("bug", "enhancement", "help wanted")]}

    async def add_comment(a: dict[str, Any], c: Any) -> dict[str, Any]:
        return {"id": 1, "body": a["body"]}

    def tool(desc: str, schema: dict[str, Any], out: dict[str, Any], run: Any) -> Tool:
        return Tool(description=desc, input=schema, output=out, execute=run)

    issues_out = obj({"total_count": {"type": "integer"},
                      "issues": {"type": "array", "items": ISSUE}}, ["issues"])
    number = {"type": "integer", "description": "The number of the issue"}
    return {
        "list_issues": tool(
            "List issues in a GitHub repository with filtering options: state, labels, "
            "sorting and pagination.",
            obj({"repo": REPO_ARG, "state": {"enum": ["open", "closed", "all"],
                 "description": "Filter by state"},
                 "labels": {"type": "array", "items": STR, "description": "Filter by labels"},
                 "per_page": {"type": "integer", "minimum": 1, "maximum": 100}}, ["repo"]),
            issues_out, list_issues),
        "get_issue": tool("Get details of a specific issue in a GitHub repository.",
                          obj({"repo": REPO_ARG, "issue_number": number},
                              ["repo", "issue_number"]), ISSUE, get_issue),
        "list_comments": tool(
            "Get the comments of a specific issue, oldest first.",
            obj({"repo": REPO_ARG, "issue_number": number}, ["repo", "issue_number"]),
            obj({"comments": {"type": "array", "items": COMMENT}}, ["comments"]), list_comments),
        "search_issues": tool(
            "Search for issues across GitHub repositories using the issues search syntax.",
            obj({"q": {"type": "string", "description": "Search query"}}, ["q"]),
            obj({"issues": {"type": "array", "items": ISSUE}}, ["issues"]), search_issues),
        "list_labels": tool(
            "List the labels of a repository.", obj({"repo": REPO_ARG}, ["repo"]),
            obj({"labels": {"type": "array", "items": {"type": "object"}}}, ["labels"]),
            list_labels),
        "add_issue_comment": tool(
            "Add a comment to a specific issue in a GitHub repository.",
            obj({"repo": REPO_ARG, "issue_number": number, "body": STR},
                ["repo", "issue_number", "body"]),
            {"type": "object"}, add_comment),
    }


def calc_tools() -> dict[str, Tool]:
    operators: dict[type, Callable[[float, float], float]] = {
        ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
        ast.Div: operator.truediv,
    }

    def arithmetic(node: ast.AST) -> float:
        if isinstance(node, ast.Constant) and isinstance(node.value, int | float):
            return node.value
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -arithmetic(node.operand)
        if isinstance(node, ast.BinOp) and type(node.op) in operators:
            return operators[type(node.op)](arithmetic(node.left), arithmetic(node.right))
        raise ToolFailure("only numbers and + - * / ( ) are allowed")

    async def evaluate(a: dict[str, Any], c: Any) -> dict[str, Any]:
        try:
            tree = ast.parse(a["expression"], mode="eval")
        except SyntaxError as exc:
            raise ToolFailure(f"not an expression: {exc.msg}") from None
        return {"value": arithmetic(tree.body)}

    async def stats(a: dict[str, Any], c: Any) -> dict[str, Any]:
        v = a["values"]
        return {"count": len(v), "mean": statistics.fmean(v), "median": statistics.median(v),
                "stdev": statistics.pstdev(v), "min": min(v), "max": max(v), "sum": sum(v)}

    async def percentile(a: dict[str, Any], c: Any) -> dict[str, Any]:
        v = sorted(a["values"])
        k = max(0, min(len(v) - 1, round(a["p"] / 100 * (len(v) - 1))))
        return {"value": v[k]}

    async def convert(a: dict[str, Any], c: Any) -> dict[str, Any]:
        factors = {"kb": 1024, "mb": 1024**2, "b": 1}
        return {"value": a["value"] * factors[a["from"]] / factors[a["to"]]}

    nums = {"type": "array", "items": {"type": "number"}, "minItems": 1}
    value = obj({"value": {"type": "number"}}, ["value"])
    return {
        "evaluate": Tool(description="Evaluate an arithmetic expression.",
                         input=obj({"expression": STR}, ["expression"]), output=value,
                         execute=evaluate),
        "statistics": Tool(
            description="Descriptive statistics of a list of numbers: count, mean, median, "
                        "population standard deviation, min, max and sum.",
            input=obj({"values": nums}, ["values"]),
            output=obj({k: {"type": "number"} for k in
                        ("count", "mean", "median", "stdev", "min", "max", "sum")},
                       ["count", "mean", "median"]), execute=stats),
        "percentile": Tool(description="The p-th percentile (nearest rank) of a list of numbers.",
                           input=obj({"values": nums, "p": {"type": "number", "minimum": 0,
                                                            "maximum": 100}}, ["values", "p"]),
                           output=value, execute=percentile),
        "convert_units": Tool(description="Convert a size between b, kb and mb.",
                              input=obj({"value": {"type": "number"},
                                         "from": {"enum": ["b", "kb", "mb"]},
                                         "to": {"enum": ["b", "kb", "mb"]}},
                                        ["value", "from", "to"]),
                              output=value, execute=convert),
    }


# --- the two ways to do the task ---------------------------------------------------------------

PATH_RE = r"src/[a-z]+/[a-z]+_[0-9]+\.py"


def summarize(issues: list[dict[str, Any]], lines: dict[str, int],
              comments: dict[int, int]) -> dict[str, Any]:
    import re

    rows = []
    for issue in issues:
        files = sorted(set(re.findall(PATH_RE, issue["body"])))
        if files:
            rows.append({"number": issue["number"], "title": issue["title"],
                         "lines": sum(lines[f] for f in files)})
    rows.sort(key=lambda r: (-r["lines"], r["number"]))
    counts = [comments[r["number"]] for r in rows]
    return {"top": rows[:3], "issues": len(rows),
            "mean_comments": round(statistics.fmean(counts), 2),
            "median_comments": statistics.median(counts)}


async def direct(snapshot: Snapshot, prefix: str) -> Transcript:
    import re

    t = Transcript(definitions_text(snapshot))
    run = Runner(snapshot, prefix)
    first = await run.turn([("issues_list_issues", {"repo": REPO, "state": "open",
                                                    "labels": ["bug"], "per_page": 100})])
    t.turns.append([(c, r) for c, r, _ in first])
    issues = first[0][2]["issues"]
    mentioning = [i for i in issues if re.search(PATH_RE, i["body"])]
    paths = sorted({p for i in mentioning for p in re.findall(PATH_RE, i["body"])})
    calls = [("fs_get_file_info", {"path": p}) for p in paths]
    calls += [("issues_list_comments", {"repo": REPO, "issue_number": i["number"]})
              for i in mentioning]
    second = await run.turn(calls)
    t.turns.append([(c, r) for c, r, _ in second])
    lines = {p: int(re.search(r"^lines: (\d+)$", r, re.M).group(1))  # type: ignore[union-attr]
             for p, (_, r, _) in zip(paths, second, strict=False)}
    comments = {i["number"]: len(o["comments"])
                for i, (_, _, o) in zip(mentioning, second[len(paths):], strict=True)}
    answer = summarize(issues, lines, comments)
    counts = [comments[i["number"]] for i in mentioning]
    third = await run.turn([("calc_statistics", {"values": counts})])
    t.turns.append([(c, r) for c, r, _ in third])
    answer["mean_comments"] = round(third[0][2]["mean"], 2)
    answer["median_comments"] = third[0][2]["median"]
    t.answer = answer
    return t


PROGRAM = f"""\
import re
listed = await tools.issues.list_issues(repo="{REPO}", state="open", labels=["bug"], per_page=100)
rows = []
for issue in listed["issues"]:
    files = sorted(set(re.findall(r"{PATH_RE}", issue["body"])))
    if files:
        rows.append((issue, files))
paths = sorted({{p for _, files in rows for p in files}})
infos = await asyncio.gather(*[tools.fs.get_file_info(path=p) for p in paths])
lines = {{}}
for p, info in zip(paths, infos):
    lines[p] = int(re.search(r"lines: (\\d+)", info).group(1))
threads = await asyncio.gather(*[
    tools.issues.list_comments(repo="{REPO}", issue_number=i["number"]) for i, _ in rows])
counts = [len(t["comments"]) for t in threads]
stats = await tools.calc.statistics(values=counts)
top = sorted(({{"number": i["number"], "title": i["title"], "lines": sum(lines[f] for f in fs)}}
              for i, fs in rows), key=lambda r: (-r["lines"], r["number"]))[:3]
{{"top": top, "issues": len(rows), "mean_comments": round(stats["mean"], 2),
  "median_comments": stats["median"]}}
"""


async def codemode(snapshot: Snapshot, prefix: str) -> Transcript:
    t = Transcript(definitions_text(snapshot))
    run = Runner(snapshot, prefix)
    found = await run.turn([
        ("search_tools", {"query": "list issues labels", "limit": 5}),
        ("search_tools", {"query": "file info line count", "limit": 5}),
        ("search_tools", {"query": "statistics mean median", "limit": 3}),
    ])
    t.turns.append([(c, r) for c, r, _ in found])
    described = await run.turn([("describe_tools", {"names": [
        "issues_list_issues", "issues_list_comments", "fs_get_file_info", "calc_statistics"]})])
    t.turns.append([(c, r) for c, r, _ in described])
    t.answer = executed(t, await run.turn([("execute", {"code": PROGRAM})]))
    return t


# --- main ---------------------------------------------------------------------------------------


async def synthetic(rounds: int) -> float:
    world = build_world()
    with tempfile.TemporaryDirectory() as tmp:
        async with Location.open(tmp, state_dir=Path(tmp) / "state") as location, \
                Sandbox() as sandbox:
            location.tools.register(fs_tools(world), namespace="fs")
            location.tools.register(issue_tools(world), namespace="issues")
            location.tools.register(calc_tools(), namespace="calc")
            effective = location.registry.effective()
            direct_snapshot = codemode_snapshot(location.seam, effective, mode="direct")
            code_snapshot = codemode_snapshot(location.seam, effective, mode="codemode",
                                              sandbox=sandbox)
            await codemode(code_snapshot, "warmup")  # start the worker pool
            times: dict[str, list[float]] = {"direct": [], "codemode": []}
            transcripts: dict[str, Transcript] = {}
            for r in range(rounds):
                for mode, fn, snap in (("direct", direct, direct_snapshot),
                                       ("codemode", codemode, code_snapshot)):
                    started = time.perf_counter()
                    transcripts[mode] = await fn(snap, f"{mode}-{r}")
                    times[mode].append(time.perf_counter() - started)
    ratio = report("Task 1 (synthetic): 3 tool groups (fs 6, issues 6, calc 4 tools)",
                   transcripts, times, rounds)
    calls = sum(len(turn) for turn in transcripts["direct"].turns)
    print(f"direct made {calls} tool calls in 3 turns; Code Mode made 5 model-visible calls "
          f"(3 searches, 1 describe, 1 execute) and the program made {calls} nested calls")
    return ratio


async def main(rounds: int, task: str) -> None:
    if task in ("synthetic", "both"):
        await synthetic(rounds)
    if task in ("servers", "both"):
        if task == "both":
            print()
        from codemode_servers import servers_task

        await servers_task(rounds)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--task", choices=("synthetic", "servers", "both"), default="both")
    import uvloop

    args = parser.parse_args()
    uvloop.run(main(args.rounds, args.task))
