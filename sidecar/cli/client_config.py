"""`sidecar client-config CLIENT [--install]`: the MCP client configuration that starts
`sidecar stdio` with the absolute path of this `sidecar` executable, the manifests and the
state directory in use (users: docs/clients.md). Imports `sidecar.serve.local_door` only.

    client           file written by --install (the client's standard place)   format
    claude-desktop   ~/.config/Claude/claude_desktop_config.json (Linux),      mcpServers JSON
                     ~/Library/Application Support/Claude/... (macOS)
    claude-code      ./.mcp.json (project scope)                               mcpServers JSON
    cursor           ~/.cursor/mcp.json                                        mcpServers JSON
    vscode           ./.vscode/mcp.json                                        servers JSON
    codex            ~/.codex/config.toml                                      [mcp_servers.NAME]
    generic          (prints only)                                             mcpServers JSON

`--install` merges the one entry (`--name`, default "sidecar") into the file, keeping everything
else, prints the unified diff, then writes (atomically; `--dry-run` only prints the diff).
"""

from __future__ import annotations

import argparse
import difflib
import json
import os
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit

from sidecar.serve.local_door import database_mismatch, read_info

CLIENTS = ("claude-desktop", "claude-code", "cursor", "vscode", "codex", "generic")


def add_parser(sub: Any, parents: list[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser(
        "client-config", parents=parents,
        help="print (or --install) an MCP client's configuration for `sidecar stdio`",
        description="Print the entry that makes an MCP client start `sidecar stdio` (JSON, "
        "or TOML for codex; --json prints JSON for every client), or merge it into the "
        "client's config file with --install.")
    parser.add_argument("client", choices=CLIENTS, help="the MCP client to configure")
    parser.add_argument("--name", default="sidecar", help="the server's key (default sidecar)")
    parser.add_argument("--install", action="store_true",
                        help="merge it into the client's config file (shows the diff first)")
    parser.add_argument("--dry-run", action="store_true",
                        help="with --install: show the diff, write nothing")
    parser.add_argument("--config-file", default=None, metavar="FILE",
                        help="with --install: this file instead of the client's standard one")


def sidecar_command() -> list[str]:
    """The absolute command that runs this installation's `sidecar` (without a script, `-P`:
    the client starts it in a project's directory, where `-m` alone would import a `sidecar`
    package found there first)."""
    beside = Path(sys.executable).parent / "sidecar"
    if beside.is_file() and os.access(beside, os.X_OK):
        return [str(beside)]
    found = shutil.which("sidecar")
    if found:
        return [str(Path(found).resolve())]
    return [sys.executable, "-P", "-m", "sidecar.cli"]


def stdio_command(manifests: list[str], state: Path, store: str | None = None) -> list[str]:
    command = [*sidecar_command(), "stdio", "--state-dir", str(state.expanduser().resolve())]
    if not manifests:
        command.append("--no-manifests")
    for manifest in manifests:
        command += ["--manifests", str(Path(manifest).expanduser().resolve())]
    if store:
        command += ["--store", store]
    return command


def without_password(url: str) -> tuple[str, bool]:
    """`url` without a password (in its user part, or a `password` query parameter), and
    whether it had one. Everything else (user, hosts, port, database, options) is kept."""
    parts = urlsplit(url)
    userinfo, at, hosts = parts.netloc.rpartition("@")
    user, colon, _ = userinfo.partition(":")
    query = parse_qsl(parts.query, keep_blank_values=True)
    kept = [(k, v) for k, v in query if k != "password"]
    netloc = f"{user}@{hosts}" if at and user else hosts
    search = parts.query if len(kept) == len(query) else urlencode(kept)
    stripped = f"{parts.scheme}://{netloc}{parts.path}" + (f"?{search}" if search else "")
    return stripped, bool(colon) or len(kept) != len(query)


PASSWORD_NOTE = ("sidecar: the fleet database's password is not written into the client "
                 "config: `sidecar stdio` reads it from the password file of the user the "
                 "client runs as (~/.pgpass, or $PGPASSFILE; a line "
                 "host:port:database:user:password, mode 0600), or from $PGPASSWORD")


def standard_file(client: str) -> Path | None:
    home = Path.home()
    if client == "claude-desktop":
        if sys.platform == "darwin":
            return home / "Library" / "Application Support" / "Claude" / \
                "claude_desktop_config.json"
        if sys.platform == "win32":
            return Path(os.environ.get("APPDATA", home)) / "Claude" / "claude_desktop_config.json"
        return home / ".config" / "Claude" / "claude_desktop_config.json"
    return {
        "claude-code": Path.cwd() / ".mcp.json",
        "cursor": home / ".cursor" / "mcp.json",
        "vscode": Path.cwd() / ".vscode" / "mcp.json",
        "codex": home / ".codex" / "config.toml",
    }.get(client)


def _json_merge(key: str, section: str, entry: dict[str, Any]) -> Callable[[str], str]:
    def merge(old: str) -> str:
        document = json.loads(old) if old.strip() else {}
        if not isinstance(document, dict):
            raise ValueError("the file does not hold a JSON object")
        servers = document.setdefault(section, {})
        if not isinstance(servers, dict):
            raise ValueError(f"{section!r} in the file is not an object")
        servers[key] = entry
        return json.dumps(document, indent=2) + "\n"

    return merge


def _toml_section(key: str, command: list[str], env: dict[str, str] | None = None) -> str:
    section = (f"[mcp_servers.{key}]\ncommand = {json.dumps(command[0])}\n"
               f"args = {json.dumps(command[1:])}\n")
    if env:
        pairs = ", ".join(f"{name} = {json.dumps(value)}" for name, value in env.items())
        section += f"env = {{ {pairs} }}\n"
    return section


def _toml_merge(key: str, command: list[str],
                env: dict[str, str] | None = None) -> Callable[[str], str]:
    header = f"[mcp_servers.{key}]"

    def merge(old: str) -> str:
        lines = old.splitlines(keepends=True)
        kept: list[str] = []
        skipping = False
        for line in lines:
            stripped = line.strip()
            if stripped.startswith("["):
                skipping = stripped == header or stripped.startswith(f"[mcp_servers.{key}.")
            if not skipping:
                kept.append(line)
        text = "".join(kept)
        if text and not text.endswith("\n"):
            text += "\n"
        return text + ("\n" if text.strip() else "") + _toml_section(key, command, env)

    return merge


def snippet(client: str, key: str, command: list[str],
            env: dict[str, str] | None = None) -> tuple[str, Callable[[str], str]]:
    """(what to print, how to merge it into an existing file's text); `env`: variables the
    client sets for the command."""
    if client == "codex":
        return _toml_section(key, command, env), _toml_merge(key, command, env)
    entry: dict[str, Any] = {"command": command[0], "args": command[1:]}
    if env:
        entry["env"] = env
    section = "mcpServers"
    if client == "vscode":
        entry = {"type": "stdio", **entry}
        section = "servers"
    return (json.dumps({section: {key: entry}}, indent=2) + "\n",
            _json_merge(key, section, entry))


def run(args: argparse.Namespace, manifests: list[str], state: Path) -> int:
    """`sidecar client-config`; `manifests` and `state`: what the command line resolved
    (`--store` is in `$SIDECAR_DATABASE_URL` by now).

    With a fleet database the entry gets `--store` with that URL WITHOUT its password: a config
    file is no place for a secret. `sidecar stdio` (asyncpg, following libpq) then reads the
    password from the password file of the user the client runs as (`~/.pgpass`, or
    `$PGPASSFILE`, which is passed into the entry's `env` when set here), or from
    `$PGPASSWORD`. A running daemon of the state directory that keeps its records in another
    database than the one given is refused, as for the other client commands.
    """
    url = os.environ.get("SIDECAR_DATABASE_URL", "").strip()
    info = read_info(state)
    refusal = database_mismatch(info, url, "would configure clients for") if info else None
    if refusal is not None:
        print(f"sidecar: {refusal}", file=sys.stderr)
        return 2
    store, had_password = without_password(url) if url else (None, False)
    env = ({"PGPASSFILE": os.environ["PGPASSFILE"]}
           if store and os.environ.get("PGPASSFILE") else None)
    if had_password:
        print(PASSWORD_NOTE, file=sys.stderr)
    command = stdio_command(manifests, state, store)
    text, merge = snippet(args.client, args.name, command, env)
    if not args.install:
        if args.json and args.client == "codex":  # its file is TOML; the same entry as JSON
            entry: dict[str, Any] = {"command": command[0], "args": command[1:]}
            if env:
                entry["env"] = env
            text = json.dumps({"mcp_servers": {args.name: entry}}, indent=2) + "\n"
        print(text, end="")
        return 0
    target = Path(args.config_file) if args.config_file else standard_file(args.client)
    if target is None:
        print(f"sidecar: {args.client} has no standard config file; use --config-file FILE",
              file=sys.stderr)
        return 2
    try:
        old = target.read_text(encoding="utf-8") if target.exists() else ""
        new = merge(old)
    except (OSError, ValueError) as exc:
        print(f"sidecar: cannot update {target}: {exc}", file=sys.stderr)
        return 2
    diff = difflib.unified_diff(old.splitlines(keepends=True), new.splitlines(keepends=True),
                                fromfile=f"{target} (before)", tofile=f"{target} (after)")
    shown = "".join(diff)
    print(shown or f"{target} already holds this configuration\n", end="")
    if args.dry_run or not shown:
        return 0
    target.parent.mkdir(parents=True, exist_ok=True)
    temporary = target.with_name(f".{target.name}.sidecar-tmp")
    temporary.write_text(new, encoding="utf-8")
    if target.exists():
        os.chmod(temporary, target.stat().st_mode & 0o777)
    os.replace(temporary, target)
    print(f"sidecar: wrote {target}", file=sys.stderr)
    return 0
