"""`sidecar search QUERY`, `sidecar add NAME|server.json` and `sidecar remove NAME`: servers
from an MCP Registry (or a catalog file) installed as one manifest file each,
`<manifest directory>/NAME.toml`, which a running daemon loads live (users: docs/registry.md).
Secrets are files under `<state>/secrets/NAME/` (0600, in 0700 directories), referenced as
`${file:...}`. Imports `sidecar.cli.registry`, `sidecar.cli.server_json`, `sidecar.stores`;
exports `run` (`sidecar.cli.parser` builds the commands' arguments).
"""

from __future__ import annotations

import argparse
import getpass
import json
import re
import shutil
import sys
import tomllib
from pathlib import Path
from typing import Any

from sidecar.cli.output import EXIT_OK, EXIT_TOOL_ERROR, EXIT_UNREACHABLE, EXIT_USAGE
from sidecar.cli.registry import (
    Registry,
    RegistryError,
    load_server_json,
    open_registry,
)
from sidecar.cli.server_json import (
    INSTALLED_MARK,
    Input,
    Install,
    MissingInputs,
    UnsupportedServer,
    build_install,
    entry_key,
    manifest_text,
    summary,
)
from sidecar.stores.state_dir import UnsafeStateDir, prepare_state_dir, write_private_file

_KEY = re.compile(r"[A-Za-z0-9_-]{1,64}")


class UsageError(Exception):
    """A command that cannot go on as asked (one line, exit 2)."""


def run(args: argparse.Namespace, manifests: list[str], state: Path) -> int:
    try:
        if args.command == "search":
            return _search(args)
        if args.command == "add":
            return _add(args, manifests, state)
        return _remove(args, manifests, state)
    except RegistryError as exc:
        print(f"sidecar: {exc}", file=sys.stderr)
        return EXIT_UNREACHABLE if "cannot reach" in str(exc) else EXIT_TOOL_ERROR
    except (UsageError, UnsupportedServer, UnsafeStateDir) as exc:
        print(f"sidecar: {exc}", file=sys.stderr)
        return EXIT_USAGE


# --- search --------------------------------------------------------------------------------


def _search(args: argparse.Namespace) -> int:
    found = [summary(s) for s in open_registry(args.registry).search(args.query,
                                                                     max(args.limit, 1))]
    if args.json:
        print(json.dumps(found, indent=2))
        return EXIT_OK
    for item in found:
        secrets = "  needs secrets" if item["secrets"] else ""
        print(f"{item['name']}  {item['version']}  {', '.join(item['transports']) or '-'}"
              f"{secrets}")
        if item["description"]:
            print(f"    {' '.join(str(item['description']).split())}")
    print(f"{len(found)} server(s)" + ("; `sidecar add NAME` installs one" if found else ""),
          file=sys.stderr)
    return EXIT_OK


# --- add -----------------------------------------------------------------------------------


def _add(args: argparse.Namespace, manifests: list[str], state: Path) -> int:
    server, where = _server(args)
    key = args.key or entry_key(server["name"])
    if not _KEY.fullmatch(key):
        raise UsageError(f"--as {key!r}: a name of 1-64 letters, digits, '_' or '-'")
    directory = _manifest_dir(manifests)
    target = directory / f"{key}.toml"
    _check_free(key, target, manifests)
    given_secrets = _pairs(args.secret, "--secret", files=True)
    given_sets = _pairs(args.set, "--set", files=False)
    secret_dir = state / "secrets" / key

    def supply(need: Input) -> str | None:
        given = given_secrets if need.secret else given_sets
        if need.key in given:
            return given[need.key]
        if args.yes or not (need.secret or (need.required and need.default is None)):
            return None
        return _ask(need)

    try:
        install = build_install(server, key, secret_dir, supply)
    except MissingInputs as exc:
        flags = ", ".join(f"{'--secret' if i.secret else '--set'} {i.key}=..."
                          for i in exc.inputs)
        raise UsageError(f"{server['name']} needs {exc} (give {flags})") from None
    _check_used(install, given_secrets, "--secret")
    _check_used(install, given_sets, "--set")
    text = manifest_text(install, where, secret_dir if install.secrets else None)
    if args.json and args.yes:
        print(json.dumps({"file": str(target), "key": key, "entry": install.entry,
                          "secrets": sorted(str(secret_dir / n) for n in install.secrets)}))
    else:
        print(f"# {target}\n{text}", end="")
    if not args.yes and not _confirm(f"Write {target}?"):
        print("sidecar: nothing written", file=sys.stderr)
        return EXIT_TOOL_ERROR
    _write(install, text, target, state, secret_dir)
    stored = f" ({len(install.secrets)} secret(s) in {secret_dir})" if install.secrets else ""
    print(f"sidecar: wrote {target}{stored}; a running daemon starts {key} now "
          "(`sidecar health`, `sidecar tools`)", file=sys.stderr)
    return EXIT_OK


def _server(args: argparse.Namespace) -> tuple[dict[str, Any], str]:
    """The server.json to install and where it came from."""
    path = Path(args.server).expanduser()
    if args.server.endswith(".json") and path.is_file():
        server = load_server_json(path)
        if args.version and server.get("version") != args.version:
            raise UsageError(f"{path} is version {server.get('version')}, not {args.version}")
        return server, str(path)
    registry = open_registry(args.registry)
    name = args.server if "/" in args.server else _full_name(registry, args.server)
    return registry.get(name, args.version), registry.where


def _full_name(registry: Registry, short: str) -> str:
    """The one registry name whose last part is `short`."""
    found = sorted({str(s["name"]) for s in registry.search(short, 100)
                    if s["name"].rsplit("/", 1)[-1].lower() == short.lower()})
    if len(found) == 1:
        return found[0]
    if not found:
        raise RegistryError(f"the registry {registry.where} has no server named {short!r} "
                            f"(`sidecar search {short}` lists what it has)")
    raise UsageError(f"{short!r} names several servers: {', '.join(found)}; give the full name")


def _manifest_dir(manifests: list[str]) -> Path:
    """The first manifest directory in use (created when a named one does not exist yet)."""
    for entry in manifests:
        path = Path(entry).expanduser()
        if path.is_dir():
            return path
        if not path.exists() and path.suffix not in (".json", ".toml"):
            path.mkdir(parents=True)
            return path
    named = ", ".join(manifests) or "none (--no-manifests)"
    raise UsageError(f"sidecar add writes NAME.toml into a manifest directory; the manifests "
                     f"in use are {named}: pass --manifests DIR")


def _declared_servers(path: Path) -> set[str]:
    try:
        text = path.read_text(encoding="utf-8")
        data = tomllib.loads(text) if path.suffix == ".toml" else json.loads(text)
    except (OSError, ValueError):
        return set()
    if not isinstance(data, dict):
        return set()
    return {k for table in ("mcpServers", "servers")
            if isinstance(data.get(table), dict) for k in data[table]}


def _check_free(key: str, target: Path, manifests: list[str]) -> None:
    from bridges.manifest.loading import manifest_files

    if target.exists():
        raise UsageError(f"{target} exists already (`sidecar remove {key}` first, or "
                         "--as ANOTHER_NAME)")
    for path in manifest_files(manifests):
        if path.is_file() and key in _declared_servers(path):
            raise UsageError(f"{path} declares a server {key!r} already (--as ANOTHER_NAME)")


def _pairs(values: list[str], flag: str, *, files: bool) -> dict[str, str]:
    pairs: dict[str, str] = {}
    for raw in values:
        name, eq, value = raw.partition("=")
        if not eq or not name:
            raise UsageError(f"{flag} {raw!r}: write NAME=VALUE" + ("|@FILE" if files else ""))
        if files and value.startswith("@"):
            try:
                value = Path(value[1:]).expanduser().read_text(encoding="utf-8").rstrip("\r\n")
            except (OSError, UnicodeDecodeError) as exc:
                raise UsageError(f"{flag} {name}: cannot read {value[1:]}: {exc}") from None
        pairs[name] = value
    return pairs


def _check_used(install: Install, given: dict[str, str], flag: str) -> None:
    known = {i.key for i in install.inputs}
    unknown = sorted(set(given) - known)
    if unknown:
        inputs = ", ".join(sorted(known)) or "none"
        raise UsageError(f"{flag} {unknown[0]}: {install.server['name']} has no such input "
                         f"(its inputs: {inputs})")


def _ask(need: Input) -> str | None:
    """One input from the user: hidden on a terminal when it is a secret; a line of stdin
    otherwise (scripts)."""
    what = "secret" if need.secret else "value"
    hints = [h for h in (need.description,
                         f"one of {', '.join(need.choices)}" if need.choices else "",
                         "required" if need.required else "empty: none") if h]
    prompt = f"{need.key} ({what}; {'; '.join(hints)}): "
    if sys.stdin.isatty():
        answer = getpass.getpass(prompt, sys.stderr) if need.secret else input(prompt)
    else:
        print(prompt, end="", file=sys.stderr, flush=True)
        answer = sys.stdin.readline().rstrip("\r\n")
        print(file=sys.stderr)  # the answer is not echoed: end the prompt's line
    return answer or None


def _confirm(question: str) -> bool:
    print(f"{question} [y/N] ", end="", file=sys.stderr, flush=True)
    answer = sys.stdin.readline()
    if not sys.stdin.isatty():
        print(file=sys.stderr)
    return answer.strip().lower() in ("y", "yes")


def _write(install: Install, text: str, target: Path, state: Path, secret_dir: Path) -> None:
    """The secrets first (0600 files in 0700 directories), then the manifest, renamed into
    place whole: the daemon's reload sees it once, with its secrets there."""
    if install.secrets:
        warning = prepare_state_dir(state)
        if warning:
            print(f"sidecar: warning: {warning}", file=sys.stderr)
        for directory in (state / "secrets", secret_dir):
            directory.mkdir(mode=0o700, exist_ok=True)
            directory.chmod(0o700)
        for name, value in install.secrets.items():
            write_private_file(secret_dir / name, value + "\n")
    temp = target.with_name(f".{target.name}.tmp")
    temp.write_text(text, encoding="utf-8")
    temp.replace(target)


# --- remove --------------------------------------------------------------------------------


def _remove(args: argparse.Namespace, manifests: list[str], state: Path) -> int:
    key = args.key
    if not _KEY.fullmatch(key):
        raise UsageError(f"{key!r} is not an entry name")
    dirs = [Path(m).expanduser() for m in manifests if Path(m).expanduser().is_dir()]
    found = [d / f"{key}.toml" for d in dirs if (d / f"{key}.toml").is_file()]
    if not found:
        where = ", ".join(map(str, dirs)) or "no manifest directory"
        print(f"sidecar: no {key}.toml in {where} (`sidecar add` writes entries there)",
              file=sys.stderr)
        return EXIT_TOOL_ERROR
    target = found[0]
    with target.open(encoding="utf-8") as f:
        if not f.readline().startswith(INSTALLED_MARK):
            raise UsageError(f"{target} was not written by `sidecar add`; edit or delete it "
                             "yourself")
    target.unlink()
    secret_dir = state / "secrets" / key
    secrets = secret_dir.is_dir()
    if secrets:
        shutil.rmtree(secret_dir)
    print(f"sidecar: removed {target}" + (f" and its secrets ({secret_dir})" if secrets else "")
          + f"; a running daemon stops {key} now", file=sys.stderr)
    return EXIT_OK
