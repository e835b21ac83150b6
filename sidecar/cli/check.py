"""`sidecar check FILE... [--live] [--json] [--allow-unknown] | --schema`: validate manifests.

Every problem of every entry is reported, and the programs stdio servers and command tools
run are looked up on PATH (`missing_programs`). Without `--live` nothing starts and nothing
is asked. With `--live` the globs of the files'
permission rules, profiles (`include`, `exclude`), overrides and rate limits are also matched
against the tools of the running daemon (`--url`, else the state directory's; none is started):
each that matches none is a warning, and warnings fail the check like errors
(`bridges.manifest.globs`).

Exit 0: clean; 1: errors, unknown keys (unless `--allow-unknown`) or, with `--live`, globs
that match no tool; 2: usage; 3: `--live` and no daemon answers.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import sys
from pathlib import Path

from bridges.manifest.globs import ToolNames, unmatched_globs
from bridges.manifest.loading import ManifestProblem, ManifestSet, load_manifests
from bridges.manifest.schema import manifest_json_schema
from bridges.manifest_tools import manifest_tool_validator
from bridges.manifest_tools.config import CommandToolConfig
from sidecar.cli.output import EXIT_OK, EXIT_TOOL_ERROR, EXIT_UNREACHABLE, EXIT_USAGE


class NoDaemon(Exception):
    """`--live` found no running daemon to match against."""


def run(args: argparse.Namespace, state: Path) -> int:
    if args.schema:
        print(json.dumps(manifest_json_schema(), indent=2, sort_keys=True))
        return EXIT_OK
    if not args.files:
        print("sidecar check: name at least one manifest file or directory", file=sys.stderr)
        return EXIT_USAGE
    loaded = load_manifests(args.files, tool_validator=manifest_tool_validator(Path.cwd()))
    loaded.problems.extend(missing_programs(loaded))
    if args.live:
        from sidecar.cli.targets import Refused, Unreachable

        try:
            names = asyncio.run(_live_names(args, state))
        except (NoDaemon, Unreachable, Refused) as exc:
            print(f"sidecar check --live: {exc}", file=sys.stderr)
            return EXIT_UNREACHABLE
        loaded.problems.extend(unmatched_globs(loaded, names))
    return _report(args, loaded)


def missing_programs(loaded: ManifestSet) -> list[ManifestProblem]:
    """The programs the manifests' stdio servers and command tools run that this machine
    does not have (not on PATH, or no executable file at that path): they would fail to
    start, or fail every call."""
    found: list[ManifestProblem] = []
    for key, sourced in loaded.servers.items():
        config = sourced.value
        if config.command and not config.disabled:
            path = (config.env or {}).get("PATH") or os.environ.get("PATH")
            if not _runnable(config.command, path):
                found.append(_missing(sourced.file, f"$.mcpServers.{key}.command",
                                      config.command, "the server cannot start"))
    for key, sourced in loaded.tools.items():
        config = sourced.value
        if not isinstance(config, CommandToolConfig) or not config.argv:
            continue
        if "{" not in config.argv[0] and not _runnable(config.argv[0], os.environ.get("PATH")):
            found.append(_missing(sourced.file, f"$.tools.{key}.argv[0]", config.argv[0],
                                  "every call of the tool fails"))
    return found


def _runnable(program: str, path: str | None) -> bool:
    if os.sep in program or (os.altsep and os.altsep in program):
        if not os.path.isabs(os.path.expanduser(program)):
            return True  # relative to where it runs, which this check does not know
        return os.access(os.path.expanduser(program), os.X_OK)
    return shutil.which(program, path=path) is not None


def _missing(file: str, path: str, program: str, effect: str) -> ManifestProblem:
    return ManifestProblem(file, path, f"command {program!r} does not exist here: {effect}",
                           hint="install it, or name it by its full path (a client that "
                           "starts the daemon may have a shorter PATH than this shell)")


def _report(args: argparse.Namespace, loaded: ManifestSet) -> int:
    unknown = [p for p in loaded.problems if p.unknown_key and p.severity != "error"]
    warnings = [p for p in loaded.problems if p.severity == "warning"]
    if args.json:
        print(json.dumps({
            "files": loaded.files,
            "servers": sorted(loaded.servers),
            "tools": sorted(loaded.tools),
            "problems": [
                {"file": p.file, "path": p.path, "message": p.message, "hint": p.hint,
                 "severity": p.severity, "unknown_key": p.unknown_key}
                for p in loaded.problems
            ],
        }, indent=2))
    else:
        for problem in loaded.problems:
            print(f"{problem.severity}: {problem}")
        print(f"{len(loaded.files)} file(s), {len(loaded.servers)} server(s), "
              f"{len(loaded.tools)} tool(s), {len(loaded.errors)} error(s), "
              + (f"{len(warnings)} glob(s) matching no tool, " if args.live else "")
              + f"{len(unknown)} unknown key(s)"
              + (" (allowed)" if unknown and args.allow_unknown else ""))
        if unknown and not args.allow_unknown:
            print("unknown keys fail the check: fix them, or pass --allow-unknown (keys other "
                  "MCP clients use are kept as they are)")
    if loaded.errors or warnings or (unknown and not args.allow_unknown):
        return EXIT_TOOL_ERROR
    return EXIT_OK


async def _live_names(args: argparse.Namespace, state: Path) -> ToolNames:
    """Every tool name of the running daemon (after its servers' first attempts)."""
    from sidecar.cli.targets import RemoteBackend, servers_started
    from sidecar.serve.local_door import HTTP_SOCKET, read_info, socket_path

    url = args.url or os.environ.get("SIDECAR_URL")
    if url:
        backend = RemoteBackend(url, str(state))
    else:
        info = read_info(state)
        if info is None:
            raise NoDaemon(f"no daemon runs on {state} (start `sidecar serve`, or pass --url); "
                           "without --live the check needs none")
        backend = RemoteBackend("http://localhost", str(state),
                                uds=socket_path(state, HTTP_SOCKET))
    async with backend:
        await servers_started(backend)
        listed = await backend.request("GET", "/v1/tools", params={"profile": "*"})
    return ToolNames(frozenset(str(t["name"]) for t in listed["tools"]))
