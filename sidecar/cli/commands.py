"""The `sidecar` command line: `main` parses the arguments (`sidecar.cli.parser`) and runs one
subcommand. The commands and their options are in docs/cli.md, the exit statuses in
`sidecar.cli.output` (re-exported here). The CLI sits on top: it may import the core, the
backends, `sidecar.formats`, `sidecar.serve`, `sidecar.daemon` and the bridges.

One daemon owns a state directory (`sidecar.serve.local_door`). `stdio`, `tools`, `call`,
`managed` and `health` attach to it through the Unix sockets in the state directory, and start
it on demand when none runs (it exits after `--idle-exit` seconds without clients); `--url` or
`$SIDECAR_URL` names a daemon over HTTP instead (token from `$SIDECAR_TOKEN` or
`<state>/token`), `--embedded` runs the command in this process, and `stdio --standalone`
serves its client from this process alone. Manifests: `--manifests`, else `$SIDECAR_MANIFESTS`
(even empty), else the bundled `manifests/` directory of this checkout; a client that names
manifests other than the running daemon's is refused.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import secrets
import signal
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sidecar.cli import asks as cli_asks
from sidecar.cli import calls as cli_calls
from sidecar.cli import tokens as cli_tokens
from sidecar.cli import upstreams as cli_upstreams
from sidecar.cli.database import database_url, door_exit, use_store
from sidecar.cli.output import (  # the exit statuses are part of the CLI's contract
    EXIT_ADDRESS_IN_USE as EXIT_ADDRESS_IN_USE,
)
from sidecar.cli.output import EXIT_BROKEN_PIPE as EXIT_BROKEN_PIPE
from sidecar.cli.output import EXIT_DATABASE as EXIT_DATABASE
from sidecar.cli.output import EXIT_INTERRUPTED as EXIT_INTERRUPTED
from sidecar.cli.output import EXIT_LOCATION_FAILED as EXIT_LOCATION_FAILED
from sidecar.cli.output import EXIT_OK as EXIT_OK
from sidecar.cli.output import EXIT_STATE_IN_USE as EXIT_STATE_IN_USE
from sidecar.cli.output import EXIT_TOOL_ERROR as EXIT_TOOL_ERROR
from sidecar.cli.output import EXIT_UNREACHABLE as EXIT_UNREACHABLE
from sidecar.cli.output import EXIT_USAGE as EXIT_USAGE
from sidecar.cli.output import (
    Style,
    print_health,
    print_outcome,
    print_tool_tokens,
    print_tools,
)
from sidecar.cli.parser import build_parser
from sidecar.serve.local_door import OwnerLock
from sidecar.serve.serve_policy import UnsafeConfiguration
from sidecar.stores.state_dir import UnsafeStateDir, prepare_state_dir

if TYPE_CHECKING:
    from sidecar.cli.targets import Backend, RemoteBackend

# The daemon (`sidecar.daemon.daemon`, with the `mcp` SDK: most of a start) is imported by the
# commands that need it, after `serve` and `stdio` have spawned their stdio servers
# (`_import_daemon`): those start on another core while the imports run.



HELP_DESCRIPTION = "The `sidecar` command line."
"""What `sidecar --help` says above the commands (not this module's docstring: that names
modules, which a user does not need)."""
BUNDLED_MANIFESTS = Path(__file__).resolve().parents[2] / "manifests"
"""The `manifests/` directory of the checkout the package is installed from (editable)."""


def _explicit_manifests(args: argparse.Namespace) -> list[str] | None:
    """The manifests the command names (`--manifests`, `--no-manifests`, or
    `$SIDECAR_MANIFESTS` when set, even empty), else None."""
    if getattr(args, "no_manifests", False):
        return []
    if getattr(args, "manifests", None):
        return list(args.manifests)
    env = os.environ.get("SIDECAR_MANIFESTS")
    if env is not None:
        return [p for p in env.split(os.pathsep) if p]
    return None


def _wanted_manifests(args: argparse.Namespace) -> list[str] | None:
    """The manifests a running daemon must serve for this command to use it: the named ones,
    as absolute paths; None (any daemon) when the command names none (no flag, and
    `$SIDECAR_MANIFESTS` unset or empty)."""
    from sidecar.serve.local_door import resolve_manifests

    if not getattr(args, "no_manifests", False) and not getattr(args, "manifests", None) \
            and not os.environ.get("SIDECAR_MANIFESTS"):
        return None
    return resolve_manifests(_explicit_manifests(args) or [])


def _manifests(args: argparse.Namespace) -> list[str]:
    """What a daemon started by this command loads: the named manifests, else the bundled
    directory (when this checkout has one)."""
    explicit = _explicit_manifests(args)
    if explicit is not None:
        return explicit
    return [str(BUNDLED_MANIFESTS)] if BUNDLED_MANIFESTS.is_dir() else []


def _state_dir(args: argparse.Namespace) -> Path:
    if args.state_dir:
        return Path(args.state_dir)
    explicit = os.environ.get("SIDECAR_STATE_DIR")
    if explicit:
        return Path(explicit)
    xdg = os.environ.get("XDG_STATE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".local" / "state") / "mcp-sidecar"


def _prepare_state(state: Path) -> None:
    """Create the state directory 0700, or check it (`UnsafeStateDir`), before anything is
    written into it; a loosened mode that was tightened is said once."""
    from sidecar.stores.state_dir import prepare_state_dir

    warning = prepare_state_dir(state)
    if warning:
        print(f"sidecar: warning: {warning}", file=sys.stderr)


def _idle_exit(args: argparse.Namespace) -> float:
    from sidecar.serve.local_door import idle_exit_default

    value = getattr(args, "idle_exit", None)
    return float(value) if value is not None else idle_exit_default()


def _read_input(raw: str) -> str:
    """`--input`: JSON text, `@FILE` (the file's text) or `-` (stdin)."""
    if raw == "-":
        return sys.stdin.read()
    if raw.startswith("@"):
        return Path(raw[1:]).read_text(encoding="utf-8")
    return raw


async def stdio(
    *, state_dir: str | None, manifests: list[str], profile: str | None = None
) -> None:
    """`sidecar.daemon.daemon.stdio`, imported when called (after `_import_daemon`)."""
    from sidecar.daemon.daemon import stdio as run_stdio

    await run_stdio(state_dir=state_dir, manifests=manifests, profile=profile)


async def serve(
    *, state_dir: str | None, manifests: list[str], host: str, port: int | None, auth: bool,
    allowed_hosts: list[str], allow_weak_token: bool = False,
    allow_no_auth_on_network: bool = False, idle_exit: float | None = None,
    owner: OwnerLock | None = None,
) -> None:
    """`sidecar.daemon.daemon.serve`, imported when called (after `_import_daemon`)."""
    from sidecar.daemon.daemon import serve as run_serve

    await run_serve(state_dir=state_dir, manifests=manifests, host=host, port=port, auth=auth,
                    allowed_hosts=allowed_hosts, allow_weak_token=allow_weak_token,
                    allow_no_auth_on_network=allow_no_auth_on_network, idle_exit=idle_exit,
                    owner=owner)


def _import_daemon(args: argparse.Namespace) -> None:
    """For the daemon commands: spawn the manifests' stdio servers, then import the daemon
    while they start (`bridges.prestart`; the Location's pool adopts them)."""
    from bridges.prestart import prestart_servers

    prestart_servers(_manifests(args))
    import sidecar.daemon.daemon  # noqa: F401  (the imports the servers' start overlaps)


def _attach(args: argparse.Namespace) -> tuple[str, str]:
    """For the client commands: (kind, where) of the daemon to talk to: ("url", URL),
    ("socket", PATH) of the state's daemon (started on demand), or ("embedded", "")."""
    url = args.url or os.environ.get("SIDECAR_URL")
    if url:
        return "url", url
    if args.embedded:
        return "embedded", ""
    from sidecar.serve.local_door import HTTP_SOCKET, ensure_daemon

    state = _state_dir(args)
    _prepare_state(state)
    info, started = ensure_daemon(state, _wanted_manifests(args), _manifests(args),
                                  idle_exit=_idle_exit(args), database=database_url() or None)
    if started:
        print(f"sidecar: started the {info.describe()}; it exits after "
              f"{info.idle_exit or 0:g} s without clients", file=sys.stderr)
    elif sys.stderr.isatty() and not args.json:
        print(Style(sys.stderr)(f"sidecar: using the {info.describe()}", "2"), file=sys.stderr)
    return "socket", str(state / HTTP_SOCKET)


async def _client(args: argparse.Namespace, kind: str, where: str) -> int:
    from sidecar.cli.targets import EmbeddedBackend, RemoteBackend, servers_started

    state = str(_state_dir(args))
    remote = None
    if kind == "url":
        remote = RemoteBackend(where, state)
    elif kind == "socket":
        remote = RemoteBackend("http://localhost", state, uds=where)
    if args.command in ("asks", "calls") or args.command in cli_upstreams.COMMANDS:
        return await _daemon_side(args, Path(state), remote)  # embedded: no Location opened
    backend: Backend
    if remote is not None:
        backend = remote
    else:
        from sidecar.cli.database import BriefDatabaseFailures
        from sidecar.daemon.daemon import Location, retention_from_env

        BriefDatabaseFailures.install()

        retention = retention_from_env()
        backend = EmbeddedBackend(
            state, _manifests(args),
            lambda root, **options: Location.open(root, retention_seconds=retention, **options),
        )
    async with backend:
        if args.command == "tools" and args.approve:
            return await _approve(backend, args)
        if args.command == "health":
            return print_health(await backend.health(), args.json)
        await servers_started(backend)
        if args.command == "tools":
            profile = "*" if args.all else args.profile
            if args.tokens:
                return print_tool_tokens(await backend.tool_tokens(profile), profile, args)
            return print_tools(await backend.tools(args.format, profile), args)
        if args.command == "call":
            name, raw_input = args.name, args.input
        else:
            name = "managed_read"
            payload: dict[str, Any] = {"ref": args.ref, "offset": args.offset, "limit": args.limit}
            if args.pattern is not None:
                payload["pattern"] = args.pattern
            if args.start is not None:
                payload["start"] = args.start
            if args.length is not None:
                payload["length"] = args.length
            raw_input = json.dumps(payload)
        call_id = getattr(args, "call_id", None) or "cli_" + secrets.token_hex(8)
        context = {"session_id": getattr(args, "session", "cli"), "agent": "cli",
                   "message_id": call_id, "call_id": call_id}
        progress = getattr(args, "progress", False) or (sys.stderr.isatty() and not args.json)
        outcome = await backend.call(name, raw_input, context, show_progress=progress,
                                     profile=getattr(args, "profile", None))
        return print_outcome(outcome, args.json)  # a held tool's error names the approval


async def _approve(backend: Backend, args: argparse.Namespace) -> int:
    from sidecar.cli.targets import RemoteBackend

    if len(args.approve) != 2 or args.approve[0] != "approve":
        print("sidecar: usage: sidecar tools approve NAME", file=sys.stderr)
        return EXIT_USAGE
    if not isinstance(backend, RemoteBackend):
        print("sidecar: approving a definition needs the running daemon (it holds the "
              "change); start `sidecar serve`, or pass --url", file=sys.stderr)
        return EXIT_UNREACHABLE
    change = await backend.approve(args.approve[1])
    if args.json:
        print(json.dumps(change))
    else:
        print(f"approved {change['tool']} ({change['key']}): its new definition is pinned")
    return EXIT_OK


def _configure_logging() -> None:
    """Daemon logs to stderr at INFO (`$SIDECAR_LOG_LEVEL` overrides). HTTP client libraries
    stay at WARNING: their INFO lines carry full request URLs, which may hold secrets."""
    level = os.environ.get("SIDECAR_LOG_LEVEL", "INFO").upper()
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s",
                        stream=sys.stderr)
    for noisy in ("httpx", "httpx2", "httpcore", "httpcore2"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def _run(coro: Any, *, daemon: bool = False) -> Any:
    """Run `coro` on uvloop where it builds; `daemon`: a long-lived process, whose import-time
    heap is frozen first (`freeze_startup_heap`)."""
    run: Callable[[Any], Any]
    try:
        import uvloop

        run = uvloop.run
    except ImportError:  # uvloop does not build on Windows
        run = asyncio.run
    if daemon:
        from sidecar.daemon.daemon import freeze_startup_heap

        freeze_startup_heap()
    return run(coro)


def _auth(args: argparse.Namespace) -> int:
    from sidecar.cli import auth as cli_auth
    from sidecar.daemon.stores import grant_store_of

    logging.basicConfig(level=os.environ.get("SIDECAR_LOG_LEVEL", "WARNING").upper(),
                        format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    for noisy in ("httpx", "httpx2", "httpcore", "httpcore2"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    return int(_run(cli_auth.run(args, _manifests(args), str(_state_dir(args)),
                                 grant_store_of)))


def main(argv: Sequence[str] | None = None) -> int:
    try:
        return _main(argv)
    except KeyboardInterrupt:  # Ctrl-C outside a call (a call says what became of it)
        print("sidecar: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # The reader of stdout left (`sidecar tools | head`): what it wanted it has, so end
        # quietly, as `cat` and `grep` do (exit 141, what a shell reports for SIGPIPE). Point
        # stdout at /dev/null so that the interpreter's last flush cannot fail again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return EXIT_BROKEN_PIPE


def _main(argv: Sequence[str] | None) -> int:
    args = build_parser(HELP_DESCRIPTION).parse_args(argv)
    try:
        return _dispatch(args)
    except Exception as exc:  # e.g. `tools --embedded` on a fleet database that failed
        from sidecar.cli.database import command_of, database_line

        line = database_line(exc, command_of(args))
        if line is None:
            raise
        print(line, file=sys.stderr)
        return EXIT_DATABASE


def _dispatch(args: argparse.Namespace) -> int:
    if os.environ.get("SIDECAR_RETENTION", "").strip():
        from sidecar.model.retention import retention_from_env

        retention_from_env()  # a bad value: one line, exit 2, before any daemon starts
    store_error = use_store(args)
    if store_error is not None:
        print(f"sidecar: {store_error}", file=sys.stderr)
        return EXIT_USAGE
    if args.command == "check":
        from sidecar.cli import check as cli_check

        return cli_check.run(args, _state_dir(args))
    if args.command == "auth":
        return _auth(args)
    if args.command == "token":
        from sidecar.daemon.stores import open_token_store  # not the daemon: ~1 s less

        return int(_run(cli_tokens.run(args, _state_dir(args), open_token_store,
                                       _explicit_manifests(args))))
    if args.command == "stop":
        return _stop(args)
    if args.command == "client-config":
        from sidecar.cli.client_config import run as client_config

        return client_config(args, _manifests(args), _state_dir(args))
    if args.command in ("search", "add", "remove"):
        from sidecar.cli.install import run as registry_command

        return registry_command(args, _manifests(args), _state_dir(args))
    if args.command == "stdio" and not args.standalone:
        from sidecar.serve.local_door import DoorError, attach_stdio

        try:
            _prepare_state(_state_dir(args))
            return attach_stdio(_state_dir(args), _wanted_manifests(args), _manifests(args),
                                idle_exit=_idle_exit(args), profile=args.profile,
                                database=database_url() or None)
        except (DoorError, UnsafeStateDir) as exc:
            print(f"sidecar: {exc}", file=sys.stderr)
            return door_exit(exc)
    if args.command in ("stdio", "serve", "daemon"):
        # SIGTERM before the daemon's loop handles it (`sidecar.daemon.start_signals`): unwind, and
        # stop the servers spawned ahead (`bridges.prestart`) instead of orphaning them.
        signal.signal(signal.SIGTERM, _exit_on_sigterm)
        try:
            return _run_daemon(args)
        finally:
            from bridges.prestart import PRESTARTED

            PRESTARTED.discard()
    from sidecar.cli.targets import Interrupted, Refused, Unreachable
    from sidecar.serve.local_door import DoorError

    if args.command == "call":
        try:
            args.input = _read_input(args.input)
        except (OSError, UnicodeDecodeError) as exc:
            print(f"sidecar: --input: {exc}", file=sys.stderr)
            return EXIT_USAGE
    try:
        kind, where = _attach(args)
        try:
            return int(_run(_client(args, kind, where)))
        except Unreachable as exc:
            if kind != "socket" or not exc.refused:
                raise
            # the daemon went away just then (its --idle-exit): find or start one again
            kind, where = _attach(args)
            return int(_run(_client(args, kind, where)))
    except Interrupted as exc:
        print(exc.line(), file=sys.stderr)
        return 128 + exc.signum
    except DoorError as exc:
        print(f"sidecar: {exc}", file=sys.stderr)
        return door_exit(exc)
    except Unreachable as exc:
        print(f"sidecar: {exc}", file=sys.stderr)
        return EXIT_UNREACHABLE
    except (Refused, UnsafeStateDir) as exc:
        print(f"sidecar: {exc}", file=sys.stderr)  # a daemon's 503 names its database
        return EXIT_DATABASE if getattr(exc, "database_down", False) else EXIT_USAGE
    except json.JSONDecodeError as exc:
        print(f"sidecar: --input is not valid JSON: {exc}", file=sys.stderr)
        return EXIT_USAGE


async def _daemon_side(args: argparse.Namespace, state: Path,
                       remote: RemoteBackend | None) -> int:
    """The commands about a daemon's own state, through `remote`; `--embedded` (None): asks
    wait in a running daemon and the servers run in one (both say so), the history is read
    from its file, and no Location is opened (nor its modules imported: ~1.5 s of a start)."""
    if remote is None:
        from sidecar.cli.database import BriefDatabaseFailures

        BriefDatabaseFailures.install()  # as for every embedded command
    if args.command == "calls":
        from sidecar.daemon.stores import open_call_history

        return await cli_calls.run(args, state, remote, open_call_history)
    run = cli_asks.run if args.command == "asks" else cli_upstreams.run
    if remote is None:
        return await run(args, None)
    async with remote:
        return await run(args, remote)


def _exit_on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(EXIT_OK)


def _stop(args: argparse.Namespace) -> int:
    from sidecar.serve.local_door import DoorError, stop_daemon

    state = _state_dir(args)
    try:
        info = stop_daemon(state)
    except DoorError as exc:
        print(f"sidecar: {exc}", file=sys.stderr)
        return EXIT_TOOL_ERROR
    print(f"sidecar: stopped the {info.describe()}" if info is not None
          else f"sidecar: no daemon runs on {state}", file=sys.stderr)
    return EXIT_OK


def _run_daemon(args: argparse.Namespace) -> int:
    """`stdio --standalone`, `serve` and `daemon`: the daemon in this process."""
    _configure_logging()  # stderr only (for stdio: stdout carries MCP messages)
    if args.command == "stdio":
        _import_daemon(args)
        from sidecar.registry.profiles import UnknownProfile

        try:
            return _daemon_exit(args, lambda: _run(
                stdio(state_dir=args.state_dir, manifests=_manifests(args),
                      profile=args.profile), daemon=True))
        except (UnknownProfile, UnsafeStateDir) as exc:
            print(f"sidecar: {exc}", file=sys.stderr)
            return EXIT_USAGE
    from sidecar.serve.local_door import OwnerLock, already_owned

    serving = args.command == "serve"
    state = _state_dir(args)
    taken = _address_taken(args.host, args.port) if serving else None
    if taken is not None:  # before anything is created (state directory, token, lock)
        print(f"sidecar: {taken}", file=sys.stderr)
        return EXIT_ADDRESS_IN_USE
    # the lock first: a daemon that is not going to own the state starts no server; but
    # nothing is written into a state directory that is not private (`sidecar.stores.state_dir`)
    try:
        loosened = prepare_state_dir(state)
    except UnsafeStateDir as exc:
        print(f"sidecar: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if loosened is not None:
        print(f"sidecar: warning: {loosened}", file=sys.stderr)
    owner = OwnerLock.acquire(state)
    if owner is None:
        print(f"sidecar: {already_owned(state)}", file=sys.stderr)
        # a daemon started on demand that lost the race to another: that one serves
        return EXIT_STATE_IN_USE if serving else EXIT_OK
    _import_daemon(args)
    try:
        return _daemon_exit(args, lambda: _run(
            serve(state_dir=str(state), manifests=_manifests(args),
                  host=args.host if serving else "127.0.0.1",
                  port=args.port if serving else None, auth=not args.no_auth,
                  allowed_hosts=args.allowed_host if serving else [],
                  allow_weak_token=serving and args.allow_weak_token,
                  allow_no_auth_on_network=serving and args.allow_no_auth_on_network,
                  idle_exit=None if serving else args.idle_exit, owner=owner),
            daemon=True))
    except (UnsafeConfiguration, UnsafeStateDir) as exc:
        print(f"sidecar: {exc}", file=sys.stderr)
        return EXIT_USAGE


def _address_taken(host: str, port: int) -> str | None:
    """Why `serve` cannot listen on host:port, when something listens there already (the
    daemon binds it again later: this only spares a state directory for nothing)."""
    import errno
    import socket

    if not port:
        return None
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        socket.create_server((host, port), family=family).close()
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            return (f"{host}:{port} is already in use (by another sidecar serve, or another "
                    "program); choose another --port")
    return None


def _daemon_exit(args: argparse.Namespace, run: Callable[[], Any]) -> int:
    """Run a daemon command; the failures a user causes by starting it twice are one line.
    Traces are exported while it runs when the `OTEL_*` variables ask for them."""
    from managed_store import StoreInUse
    from sidecar.daemon.daemon import AddressInUse, LocationFailed
    from sidecar.model import tracing

    tracing.configure_from_env()
    try:
        run()
    except StoreInUse:
        print(f"sidecar: another sidecar daemon is running on {_state_dir(args)} (one daemon "
              "per state directory; stop it, or use another --state-dir)", file=sys.stderr)
        return EXIT_STATE_IN_USE
    except AddressInUse as exc:
        print(f"sidecar: {exc.strerror}", file=sys.stderr)
        return EXIT_ADDRESS_IN_USE
    except LocationFailed as exc:  # its traceback is logged (`serve`); this line comes last
        print(f"sidecar: {exc}", file=sys.stderr)
        return EXIT_LOCATION_FAILED
    except Exception as exc:  # its own words, else lost while starting (`cli_database`)
        from sidecar.cli.database import command_of, database_line, database_url, scrubbed
        from sidecar.stores.errors import database_error_in

        database = database_error_in(exc)
        line = database_line(exc, command_of(args), outcome="could not start") or (
            scrubbed(f"sidecar: {database}", database_url()) if database is not None else None)
        if line is None:
            raise
        print(line, file=sys.stderr)
        return EXIT_DATABASE
    finally:
        tracing.shutdown()
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
