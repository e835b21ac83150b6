"""`sidecar logs SERVER [-f]`, `sidecar restart SERVER`, `sidecar resources [read URI]` and
`sidecar prompts [get NAME [--arg K=V]...]`: the upstream servers of the state directory's
daemon (or `--url`), through `/v1/servers/{name}/stderr`, `/v1/servers/{name}/restart`,
`/v1/resources` and `/v1/prompts` (`sidecar.serve.upstream_api`). They live in a running
daemon, so `--embedded` has none.

Imports nothing of ours at module level but `sidecar.cli.output`. Exports `add_parser`,
`run` and `COMMANDS`.
"""

from __future__ import annotations

import argparse
import base64
import json
import sys
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from sidecar.cli.output import EXIT_OK, EXIT_TOOL_ERROR, EXIT_USAGE

if TYPE_CHECKING:
    from sidecar.cli.targets import RemoteBackend

COMMANDS = ("logs", "restart", "resources", "prompts")


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser],
               client: argparse.ArgumentParser) -> None:
    logs = sub.add_parser("logs", parents=[client], help="what an MCP server wrote to stderr",
                          description="Print the last 64 KiB a stdio MCP server wrote to "
                          "stderr (secrets redacted); -f keeps following it.")
    logs.add_argument("server", help="the server's manifest key")
    logs.add_argument("-f", "--follow", action="store_true", help="keep printing new lines")
    restart = sub.add_parser("restart", parents=[client], help="restart an MCP server",
                             description="Restart one MCP server (its process or "
                             "connection) and print its state once it is back.")
    restart.add_argument("server", help="the server's manifest key")
    resources = sub.add_parser(
        "resources", parents=[client], help="the upstream servers' resources",
        description="List the resources (and URI templates) of the upstream servers, or "
        "read one: `sidecar resources read URI` (text is printed; binary content goes to "
        "--output FILE, or to stdout when it is not a terminal).")
    resources.add_argument("action", nargs="*", metavar="read URI",
                           help="read the resource with this URI")
    resources.add_argument("--profile", default=None, help="through this profile's filter")
    resources.add_argument("--output", "-o", default=None,
                           help="write a read resource's content to this file")
    prompts = sub.add_parser(
        "prompts", parents=[client], help="the upstream servers' prompts",
        description="List the prompts of the upstream servers with their arguments, or get "
        "one: `sidecar prompts get NAME --arg city=Paris`.")
    prompts.add_argument("action", nargs="*", metavar="get NAME", help="get this prompt")
    prompts.add_argument("--arg", action="append", default=[], metavar="NAME=VALUE",
                         help="an argument of the prompt (repeat for more)")
    prompts.add_argument("--profile", default=None, help="through this profile's filter")


async def run(args: argparse.Namespace, backend: RemoteBackend | None) -> int:
    """Exit 0 when shown, 1 when the daemon refused (unknown server, resource or prompt:
    the message says which), 2 for a usage error (or `--embedded`)."""
    if backend is None:
        print(f"sidecar {args.command}: the servers run in a daemon; --embedded has none",
              file=sys.stderr)
        return EXIT_USAGE
    from sidecar.cli.targets import Refused

    try:
        if args.command == "logs":
            return await _logs(args, backend)
        if args.command == "restart":
            return await _restart(args, backend)
        if args.command == "resources":
            return await _resources(args, backend)
        return await _prompts(args, backend)
    except Refused as exc:
        if exc.status in (404, 502, 504):
            print(f"sidecar {args.command}: {exc}", file=sys.stderr)
            return EXIT_TOOL_ERROR
        raise


def _server_path(server: str, tail: str) -> str:
    return f"/v1/servers/{quote(server, safe='')}/{tail}"


async def _logs(args: argparse.Namespace, backend: RemoteBackend) -> int:
    path = _server_path(args.server, "stderr")
    if not args.follow:
        body = await backend.request("GET", path)
        if args.json:
            print(json.dumps(body, indent=2))
        else:
            sys.stdout.write(body["text"])
        return EXIT_OK
    async for event, data in backend.events(path, params={"follow": "true"}):
        if event == "stderr":
            sys.stdout.write(data["text"])
            sys.stdout.flush()
        elif event == "gone":
            print(f"sidecar logs: {data['message']}", file=sys.stderr)
            return EXIT_TOOL_ERROR
    return EXIT_OK


async def _restart(args: argparse.Namespace, backend: RemoteBackend) -> int:
    body = await backend.request("POST", _server_path(args.server, "restart"))
    health = body["health"]
    if args.json:
        print(json.dumps(body, indent=2))
    else:
        error = f" ({health['last_error']})" if health.get("last_error") else ""
        print(f"{args.server}: {health['state']}, {health['tool_count']} tools, "
              f"{health['restarts']} restarts{error}")
    return EXIT_OK if health["state"] == "ready" else EXIT_TOOL_ERROR


def _profile(args: argparse.Namespace) -> dict[str, str]:
    return {"profile": args.profile} if args.profile else {}


async def _resources(args: argparse.Namespace, backend: RemoteBackend) -> int:
    if not args.action:
        listing = await backend.request("GET", "/v1/resources", params=_profile(args))
        if args.json:
            print(json.dumps(listing, indent=2))
            return EXIT_OK
        for r in listing["resources"]:
            mime = f"  {r['mime_type']}" if r.get("mime_type") else ""
            print(f"{r['server']}  {r['uri']}  {r.get('name', '')}{mime}")
        for t in listing["templates"]:
            print(f"{t['server']}  {t['uri_template']}  (template) {t.get('name', '')}")
        if not listing["resources"] and not listing["templates"]:
            print("no server offers resources", file=sys.stderr)
        return EXIT_OK
    if len(args.action) != 2 or args.action[0] != "read":
        print("sidecar resources: usage: sidecar resources [read URI]", file=sys.stderr)
        return EXIT_USAGE
    read = await backend.request("GET", "/v1/resources/read",
                                 params={"uri": args.action[1], **_profile(args)})
    if args.json:
        print(json.dumps(read, indent=2))
        return EXIT_OK
    return _write_contents(read["contents"], args.output)


def _write_contents(contents: list[dict[str, Any]], output: str | None) -> int:
    data = b"".join(c["text"].encode() if c.get("text") is not None
                    else base64.b64decode(c.get("blob", "")) for c in contents)
    binary = any(c.get("text") is None for c in contents)
    if output is not None:
        with open(output, "wb") as file:
            file.write(data)
        print(f"wrote {len(data):,} bytes to {output}", file=sys.stderr)
    elif binary and sys.stdout.isatty():
        kinds = ", ".join(sorted({str(c.get("mime_type") or "binary") for c in contents}))
        print(f"sidecar resources: {len(data):,} bytes of {kinds}: give --output FILE (or "
              "redirect stdout)", file=sys.stderr)
        return EXIT_USAGE
    else:
        sys.stdout.buffer.write(data)
        sys.stdout.flush()
    return EXIT_OK


async def _prompts(args: argparse.Namespace, backend: RemoteBackend) -> int:
    if not args.action:
        listing = await backend.request("GET", "/v1/prompts", params=_profile(args))
        if args.json:
            print(json.dumps(listing, indent=2))
            return EXIT_OK
        for p in listing["prompts"]:
            names = ", ".join(a["name"] + ("" if a.get("required") else "?")
                              for a in p.get("arguments") or [])
            print(f"{p['server']}  {p['name']}({names})  {p.get('description') or ''}")
        if not listing["prompts"]:
            print("no server offers prompts", file=sys.stderr)
        return EXIT_OK
    if len(args.action) != 2 or args.action[0] != "get":
        print("sidecar prompts: usage: sidecar prompts [get NAME [--arg K=V]...]",
              file=sys.stderr)
        return EXIT_USAGE
    arguments: dict[str, str] = {}
    for given in args.arg:
        name, sep, value = given.partition("=")
        if not sep or not name:
            print(f"sidecar prompts: --arg {given!r}: NAME=VALUE", file=sys.stderr)
            return EXIT_USAGE
        arguments[name] = value
    got = await backend.request("POST", "/v1/prompts/get", json={
        "name": args.action[1], "arguments": arguments, **_profile(args)})
    if args.json:
        print(json.dumps(got, indent=2))
        return EXIT_OK
    for message in got["messages"]:
        content = message.get("content") or {}
        shown = content.get("text") if content.get("type") == "text" else json.dumps(content)
        print(f"[{message.get('role')}]\n{shown}")
    return EXIT_OK
