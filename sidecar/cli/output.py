"""What CLI commands print, and the exit status they end with (part of the CLI's contract;
`sidecar.cli.commands` re-exports the statuses): an outcome, a tool list (or its tokens), a
health report, in colour on a terminal (`Style`, off with `NO_COLOR`) or as JSON with `--json`.

Exit statuses: 0 success; 1 the call ended in an error outcome (or `check` found errors, or
`health` is degraded); 2 usage error (or the daemon refused the request, or `serve` refused an
unsafe configuration: see `sidecar.serve.serve_policy`); 3 the configured daemon is
unreachable; 4 the state directory has a daemon already; 5 the port is in use; 6 the fleet
database (`--store`, `$SIDECAR_DATABASE_URL`) is unreachable or its schema is newer than this
sidecar knows, or a command working on it itself (`auth`, `token`, `--embedded`) lost it
midway: one line naming it (`sidecar.cli.database`); or the daemon answered 503 `unavailable`
(its fleet database is down; `health`: status "unavailable"); 7 a task of the running
Location failed; 130 and 143 a call interrupted by SIGINT or SIGTERM; 141 stdout closed early.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

EXIT_OK, EXIT_TOOL_ERROR, EXIT_USAGE, EXIT_UNREACHABLE = 0, 1, 2, 3
EXIT_STATE_IN_USE, EXIT_ADDRESS_IN_USE = 4, 5
EXIT_DATABASE = 6
"""The fleet database (`--store`, `SIDECAR_DATABASE_URL`) cannot be reached, or its schema is
newer than this sidecar knows."""
EXIT_LOCATION_FAILED = 7
"""`serve`/`daemon`: a task of the running Location failed; the daemon stopped serving and
ended (for a supervisor to start it again)."""
EXIT_INTERRUPTED = 130  # SIGINT (128 + 2); a call ended by SIGTERM exits 143
EXIT_BROKEN_PIPE = 141  # what a shell reports for a process killed by SIGPIPE (128 + 13)


class Style:
    def __init__(self, stream: Any) -> None:
        self.on = bool(getattr(stream, "isatty", lambda: False)()) and "NO_COLOR" not in os.environ

    def __call__(self, text: str, code: str) -> str:
        return f"\033[{code}m{text}\033[0m" if self.on else text


def print_outcome(outcome: dict[str, Any], as_json: bool) -> int:
    style = Style(sys.stdout)
    if as_json:
        print(json.dumps(outcome, ensure_ascii=False, indent=2))
    elif outcome["status"] == "completed":
        for item in outcome["content"]:
            if item["type"] == "text":
                print(item["text"], end="" if item["text"].endswith("\n") else "\n")
            else:
                shown = {k: v for k, v in item.items() if k not in ("data", "blob")}
                print(style(f"[{item['type']}: {json.dumps(shown)}]", "2"))
    else:
        error = outcome["error"]
        line = f"error ({error['kind']}): {error['message']}"
        print(Style(sys.stderr)(line, "31"), file=sys.stderr)
    return EXIT_OK if outcome["status"] == "completed" else EXIT_TOOL_ERROR


def print_tools(tools: list[dict[str, Any]], args: argparse.Namespace) -> int:
    if args.json or args.format:
        print(json.dumps(tools, indent=2, ensure_ascii=False))
        return EXIT_OK
    style = Style(sys.stdout)
    width = max((len(t["name"]) for t in tools), default=0)
    for tool in tools:
        summary = (tool.get("description") or "").strip().splitlines()
        print(f"{style(tool['name'].ljust(width), '1')}  {summary[0] if summary else ''}")
    return EXIT_OK


def print_tool_tokens(report: dict[str, Any], profile: str | None,
                      args: argparse.Namespace) -> int:
    """`sidecar tools --tokens`: each server's tools, costliest first, then the total."""
    if args.json:
        print(json.dumps(report, indent=2, ensure_ascii=False))
        return EXIT_OK
    style = Style(sys.stdout)
    tokens: dict[str, int] = report["tokens"]
    servers: dict[str, dict[str, Any]] = report["tokens_by_server"]
    whose = ("every tool" if profile == "*" else
             f"profile {profile}" if profile else "the default profile")
    print(f"Tokens of the definitions {whose} serves (name, description and input schema as "
          f"the model sees them; {report['token_encoding']}, tiktoken)")
    width = max((len(n) for n in tokens), default=0)
    for server, entry in servers.items():
        count = len(entry["tools"])
        print(style(f"\n{server}  {entry['tokens']:,} tokens, {count} "
                    f"tool{'s' if count != 1 else ''}", "1"))
        for name in sorted(entry["tools"], key=lambda n: (-tokens[n], n)):
            print(f"  {name.ljust(width)}  {tokens[name]:>7,}")
    print(style(f"\ntotal  {report['total_tokens']:,} tokens, {len(tokens)} tools", "1"))
    return EXIT_OK


def state_line(state: dict[str, Any]) -> str:
    """The state directory's size by part, then what pruning and eviction removed."""
    parts = ", ".join(f"{part} {size / 1e6:.1f} MB" for part, size in state["bytes"].items())
    up = state.get("upkeep", {})
    return (f"state: {state['total_bytes'] / 1e6:.1f} MB ({parts})\n"
            f"  since start: {up.get('outcomes_pruned', 0)} outcomes pruned "
            f"({up.get('outcomes_expired', 0)} expired call ids kept), "
            f"{up.get('managed_evicted_expired', 0)} managed objects expired, "
            f"{up.get('managed_evicted_quota', 0)} evicted over quota, "
            f"{up.get('wal_truncations', 0)} WAL truncations")


def staged_line(staged: dict[str, Any]) -> str:
    """A store writing behind: what this replica committed and has not uploaded yet."""
    line = (f"  staged here, not uploaded yet: {staged['objects']} objects, "
            f"{staged['bytes']:,} bytes")
    if staged["objects"]:
        line += f", oldest committed {staged['oldest_seconds']:g} s ago"
    if staged.get("retrying"):
        line += f"; {staged['retrying']} retrying after: {staged.get('last_error') or '?'}"
    return line


def print_health(report: dict[str, Any], as_json: bool) -> int:
    down = report["status"] == "unavailable"  # the fleet database does not answer
    failed = EXIT_DATABASE if down else EXIT_TOOL_ERROR
    if as_json:
        print(json.dumps(report, indent=2))
        return EXIT_OK if report["status"] == "ok" else failed
    style = Style(sys.stdout)
    daemon = report.get("daemon")
    if isinstance(daemon, dict):
        manifests = ", ".join(daemon.get("manifests") or ()) or "none"
        print(f"daemon: pid {daemon.get('pid')} ({daemon.get('started')}), state "
              f"{daemon.get('state_dir')}, manifests: {manifests}"
              + (f", {daemon['url']}" if daemon.get("url") else ""))
    colour = "32" if report["status"] == "ok" else "33"
    store = report.get("store")  # (none while the fleet database does not answer)
    print(f"status: {style(report['status'], colour)}  tools: {report['tools']}"
          + (f"  store: {store['objects']} objects, {store['bytes']:,} bytes" if store else ""))
    if down:
        print(f"database: {(report.get('database') or {}).get('error', 'unreachable')}")
    staged = (store or {}).get("staged")
    if staged:
        print(staged_line(staged))
    if report.get("state"):
        print(state_line(report["state"]))
    for name, server in sorted(report.get("servers", {}).items()):
        state = server.get("state", "?")
        mark = style(state, "32" if state == "ready" else "31")
        error = f"  ({server['last_error']})" if server.get("last_error") else ""
        print(f"  {name}: {mark}, {server.get('tool_count', 0)} tools{sandbox_note(server)}"
              f"{error}")
    for ref, plugin in sorted(report.get("plugins", {}).items()):
        print(f"  plugin {ref}: {plugin['state']}")
    reasons = degraded_reasons(report)
    if reasons:
        print("degraded because:")
        for reason in reasons:
            print(f"  - {reason}")
    return EXIT_OK if report["status"] == "ok" else failed


def sandbox_note(server: dict[str, Any]) -> str:
    """", sandboxed (network none)" for a server that runs in a sandbox, else ""."""
    sandbox = server.get("sandbox")
    if not isinstance(sandbox, dict):
        return ""
    network = sandbox.get("network")
    shown = ", ".join(network) if isinstance(network, list) else network
    return f", sandboxed (network {shown})"


def degraded_reasons(report: dict[str, Any]) -> list[str]:
    """Why `status` is "degraded", one plain sentence each."""
    reasons = []
    for name, server in sorted(report.get("servers", {}).items()):
        state = server.get("state")
        if state in ("ready", "disabled"):
            continue
        why = f": {server['last_error']}" if server.get("last_error") else ""
        reasons.append(f"server {name} is {state}{why}")
    reasons += [f"plugin {ref} failed: {plugin.get('error') or plugin.get('last_error') or ''}"
                .rstrip(": ") for ref, plugin in sorted(report.get("plugins", {}).items())
                if plugin.get("state") == "failed"]
    reasons += [f"manifest {p['file']}: {p['path']}: {p['message']}"
                for p in report.get("manifest_problems", []) if p.get("severity") == "error"]
    reasons += [f"manifest reload rejected: {p['file']}: {p['path']}: {p['message']}"
                for p in report.get("reload_problems", [])]
    reasons += [f"manifest {p['file']}: {p['path']}: {p['message']}"
                + (f" ({p['hint']})" if p.get("hint") else "")
                for p in report.get("unmatched_globs", [])]
    reasons += [f"tool {c['tool']} ({c['key']}) changed upstream and is held "
                f"({c['action'].replace('_', ' ')}): review it, then `sidecar tools approve "
                f"{c['tool']}`" for c in report.get("definition_changes", [])
                if c.get("policy") == "hold"]
    if report.get("status") == "degraded" and not reasons:  # a reason this CLI does not know
        reasons.append("the daemon did not say why (see `sidecar health --json`)")
    return reasons
