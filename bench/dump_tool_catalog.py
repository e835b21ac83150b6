"""Dump the `tools/list` of published MCP servers into bench/data/tool_catalog.json, the catalog
`bench/tool_search.py` measures. Run once; the JSON is committed, so the benchmark needs none
of these servers.

    python bench/dump_tool_catalog.py --install     # npm + PyPI into .deps/catalog/, then dump

Each server is started over stdio with dummy credentials (their `tools/list` needs none) in an
empty directory; a server that fails to list is reported and left out. Each tool keeps its
server, package and package version.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mcp import Client, StdioServerParameters

ROOT = Path(__file__).resolve().parent.parent
DEPS = ROOT / ".deps" / "catalog"
NPM = DEPS / "npm"
OUT = ROOT / "bench" / "data" / "tool_catalog.json"


@dataclass(frozen=True)
class Server:
    key: str
    package: str
    version: str
    registry: str  # "npm" | "pypi"
    command: list[str]
    env: dict[str, str] = field(default_factory=dict)
    venv: str = ""


def npm(key: str, package: str, version: str, binary: str, *args: str, **env: str) -> Server:
    bin_path = str(NPM / "node_modules" / ".bin" / binary)
    return Server(key, package, version, "npm", [bin_path, *args], env)


def pypi(key: str, package: str, version: str, module: str, *args: str, **env: str) -> Server:
    """`module` run with `-m`, or (a name with a dash) the venv's console script."""
    venv = f"venv-{key}"  # their pins conflict with each other: one venv each
    bin_dir = DEPS / venv / "bin"
    command = [str(bin_dir / module)] if "-" in module else [str(bin_dir / "python"), "-m",
                                                             module]
    return Server(key, package, version, "pypi", [*command, *args], env, venv)


SERVERS = [
    npm("github", "@modelcontextprotocol/server-github", "2025.4.8", "mcp-server-github",
        GITHUB_PERSONAL_ACCESS_TOKEN="dummy"),
    npm("gitlab", "@modelcontextprotocol/server-gitlab", "2025.4.25", "mcp-server-gitlab",
        GITLAB_PERSONAL_ACCESS_TOKEN="dummy"),
    npm("filesystem", "@modelcontextprotocol/server-filesystem", "2026.8.31",
        "mcp-server-filesystem", "{workdir}"),
    npm("memory", "@modelcontextprotocol/server-memory", "2026.8.31", "mcp-server-memory"),
    npm("everything", "@modelcontextprotocol/server-everything", "2026.8.31",
        "mcp-server-everything"),
    npm("sequential_thinking", "@modelcontextprotocol/server-sequential-thinking", "2026.8.31",
        "mcp-server-sequential-thinking"),
    npm("playwright", "@playwright/mcp", "0.0.83", "playwright-mcp"),
    npm("puppeteer", "@modelcontextprotocol/server-puppeteer", "2025.5.12",
        "mcp-server-puppeteer"),
    npm("chrome_devtools", "chrome-devtools-mcp", "1.11.0", "chrome-devtools-mcp"),
    npm("notion", "@notionhq/notion-mcp-server", "2.5.2", "notion-mcp-server",
        NOTION_TOKEN="dummy"),
    npm("slack", "@modelcontextprotocol/server-slack", "2025.4.25", "mcp-server-slack",
        SLACK_BOT_TOKEN="dummy", SLACK_TEAM_ID="T000"),
    npm("google_maps", "@modelcontextprotocol/server-google-maps", "0.6.2",
        "mcp-server-google-maps", GOOGLE_MAPS_API_KEY="dummy"),
    npm("brave_search", "@modelcontextprotocol/server-brave-search", "0.6.2",
        "mcp-server-brave-search", BRAVE_API_KEY="dummy"),
    npm("desktop_commander", "@wonderwhy-er/desktop-commander", "0.2.52", "desktop-commander"),
    npm("kubernetes", "mcp-server-kubernetes", "4.1.7", "mcp-server-kubernetes"),
    npm("firecrawl", "firecrawl-mcp", "3.26.0", "firecrawl-mcp", FIRECRAWL_API_KEY="fc-dummy"),
    npm("context7", "@upstash/context7-mcp", "4.1.1", "context7-mcp"),
    pypi("git", "mcp-server-git", "2026.10.19", "mcp_server_git", "-r", "{workdir}"),
    pypi("fetch", "mcp-server-fetch", "2026.10.24", "mcp_server_fetch"),
    pypi("time", "mcp-server-time", "2026.10.19", "mcp_server_time"),
    pypi("arxiv", "arxiv-mcp-server", "0.8.2", "arxiv_mcp_server"),
    pypi("atlassian", "mcp-atlassian", "0.23.1", "mcp-atlassian",
         TOOLSETS="all", JIRA_URL="https://example.atlassian.net", JIRA_USERNAME="x@example.com",
         JIRA_API_TOKEN="dummy", CONFLUENCE_URL="https://example.atlassian.net/wiki",
         CONFLUENCE_USERNAME="x@example.com", CONFLUENCE_API_TOKEN="dummy"),
]


def install() -> None:
    NPM.mkdir(parents=True, exist_ok=True)
    if not (NPM / "package.json").exists():
        (NPM / "package.json").write_text('{"name": "sidecar-tool-catalog", "private": true}\n')
    npm_specs = [f"{s.package}@{s.version}" for s in SERVERS if s.registry == "npm"]
    subprocess.run(["npm", "install", "--prefix", str(NPM), "--no-audit", "--no-fund",
                    "--loglevel=error", "--ignore-scripts", *npm_specs], check=True)
    for venv in sorted({s.venv for s in SERVERS if s.registry == "pypi"}):
        path = DEPS / venv
        if not (path / "bin" / "python").exists():
            subprocess.run([sys.executable, "-m", "venv", str(path)], check=True)
        specs = [f"{s.package}=={s.version}" for s in SERVERS
                 if s.registry == "pypi" and s.venv == venv]
        subprocess.run([str(path / "bin" / "pip"), "install", "-q", *specs], check=True)


async def list_tools(server: Server, workdir: str) -> list[dict[str, Any]]:
    env = {"PATH": os.environ["PATH"], "HOME": workdir, **server.env}
    command = [part.replace("{workdir}", workdir) for part in server.command]
    if server.key == "git":
        await asyncio.to_thread(subprocess.run, ["git", "init", "-q", workdir], check=True)
    params = StdioServerParameters(command=command[0], args=command[1:], env=env, cwd=workdir)
    async with Client(params, mode="legacy", cache=None, read_timeout_seconds=60) as client:
        tools: list[dict[str, Any]] = []
        cursor = None
        while True:
            page = await client.list_tools(cursor=cursor)
            tools += [t.model_dump(mode="json", by_alias=True, exclude_none=True)
                      for t in page.tools]
            cursor = page.next_cursor
            if not cursor:
                return tools


async def dump() -> None:
    catalog: list[dict[str, Any]] = []
    for server in SERVERS:
        with tempfile.TemporaryDirectory() as workdir:
            try:
                tools = await list_tools(server, workdir)
            except Exception as exc:  # reported and left out
                cause: BaseException = exc
                while isinstance(cause, BaseExceptionGroup) and cause.exceptions:
                    cause = cause.exceptions[0]
                print(f"{server.key}: failed ({type(cause).__name__}: {cause})",
                      file=sys.stderr)
                continue
        print(f"{server.key}: {len(tools)} tools ({server.package} {server.version})")
        catalog += [{"server": server.key, "package": server.package,
                     "version": server.version, "registry": server.registry,
                     "tool": tool} for tool in tools]
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps({"tools": catalog}, indent=1, ensure_ascii=False) + "\n")
    print(f"{len(catalog)} tools from {len({t['server'] for t in catalog})} servers -> {OUT}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--install", action="store_true", help="install the servers first")
    args = parser.parse_args()
    if args.install:
        install()
    asyncio.run(dump())


if __name__ == "__main__":
    main()
