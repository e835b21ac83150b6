"""What a launcher needs to start in a sandbox, prepared outside it without running the
package (docs/sandbox.md, "Launchers"). Imports nothing of ours; exports `launcher_of`,
`Prepared`, `PreparationFailed`, `PREPARED`, `PREPARE_TIMEOUT`, `pending`, `prepare`.

    npx  SPEC ...      npm exec --yes --ignore-scripts --package=SPEC -- /usr/bin/true
                       into a per-entry npm cache, bound writable at /run/sidecar/cache/npm
                       (`npm_config_cache`); offline inside
    uvx  SPEC ...      uvx --no-build --from SPEC /usr/bin/true (also `uv tool run`, `uv run`:
                       the same options, the command replaced) into a per-entry uv cache,
                       bound writable at /run/sidecar/cache/uv (`UV_CACHE_DIR`), with the
                       interpreter uv chose (`UV_PYTHON`); offline
    node, python       nothing: the program and its interpreter are bound (`plan`)

The launcher is argv[0]'s base name. A preparation runs once per entry and package set (a
stamp next to the cache says which); a changed set, or a stamp the entry removed, starts
from an empty cache, so the daemon's npm or uv never reads what a sandbox wrote.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import anyio

PREPARE_TIMEOUT = 600.0
"""Seconds one preparation (a download) may take, outside the entry's timeouts.startup."""
IN_SANDBOX_CACHES = "/run/sidecar/cache"
"""Where a prepared cache appears inside: on the sandbox's own root, so that no `read` path
(a home, say) can cover it."""
TRUE = "/usr/bin/true" if os.path.exists("/usr/bin/true") else "/bin/true"
"""What the preparation runs in place of the package: an absolute path, never a package bin."""
INTERPRETERS = re.compile(r"node|nodejs|python(\d+(\.\d+)?)?")
_NPX_DROPPED = {"-y", "--yes", "--offline", "--prefer-offline", "--prefer-online", "-q",
                "--quiet", "--no"}
_UV_VALUES = {
    "--from", "--with", "--with-editable", "--with-requirements", "-p", "--python", "--index",
    "--default-index", "-i", "--index-url", "--extra-index-url", "-f", "--find-links", "-c",
    "--constraints", "--overrides", "--build-constraints", "--env-file", "--directory",
    "--project", "--extra", "--group", "--only-group", "--no-group", "--package",
    "--index-strategy", "--keyring-provider", "--resolution", "--prerelease",
    "--exclude-newer", "--config-setting",
    "-C", "--link-mode", "--python-platform", "--cache-dir", "--config-file", "--color",
    "--allow-insecure-host", "--refresh-package", "--reinstall-package", "--upgrade-package",
    "-P", "--torch-backend",
}
_UV_DROPPED = {"--offline", "-q", "--quiet", "-v", "--verbose", "--isolated", "-n",
               "--no-cache", "--cache-dir"}
"""Options the preparation leaves out: it downloads, and the cache is the entry's own."""


class PreparationFailed(OSError):
    """The launcher's preparation failed; `str()` is one line saying what and why."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.strerror = reason

    def __str__(self) -> str:
        return str(self.args[0])


@dataclass(frozen=True, slots=True)
class Prepared:
    """What a prepared launcher adds to its sandbox."""

    binds: tuple[tuple[str, str], ...] = ()
    """(host directory, path inside) bound writable: the entry's own cache."""
    programs: tuple[str, ...] = ()
    """More programs to bind with their prefix, like the program itself (uv's interpreter)."""
    env: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class _Plan:
    kind: str
    """"npm" or "uv": the cache it fills."""
    argv: tuple[str, ...]
    """The preparation's command line (the cache's location is set in its environment)."""
    what: str
    python: tuple[str, ...] = ()
    """For uv: the `uv python find` request."""


def launcher_of(argv: Sequence[str]) -> str | None:
    """"npx", "uvx" ("uv tool run" too), "uv run", "node" or "python" (any pythonX.Y), or
    None: the launchers the sandbox knows, by argv[0]'s base name."""
    base = Path(argv[0]).name if argv else ""
    rest = list(argv[1:])
    if base in ("npx", "uvx"):
        return base
    if base == "uv":
        if rest[:2] == ["tool", "run"] or rest[:1] == ["x"]:
            return "uvx"
        if rest[:1] == ["run"]:
            return "uv run"
        return None
    if INTERPRETERS.fullmatch(base):
        return "node" if base.startswith("node") else "python"
    return None


class PreparedCaches:
    """Where prepared caches live: `<state>/sandbox/` once the daemon says (`use`), else
    `$XDG_CACHE_HOME/sidecar/sandbox` (`~/.cache/...`)."""

    def __init__(self) -> None:
        self._root: Path | None = None
        self._locks: dict[Path, anyio.Lock] = {}

    def use(self, root: str | os.PathLike[str]) -> None:
        self._root = Path(root)

    def root(self) -> Path:
        if self._root is not None:
            return self._root
        cache = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
        return Path(cache) / "sidecar" / "sandbox"

    def entry_dir(self, name: str) -> Path:
        slug = re.sub(r"[^A-Za-z0-9_.-]+", "_", name).lstrip(".")[:64] or "entry"
        return self.root() / f"{slug}-{hashlib.sha256(name.encode()).hexdigest()[:8]}"

    def lock(self, where: Path) -> anyio.Lock:
        return self._locks.setdefault(where, anyio.Lock())

    def sweep(self, keep: Iterable[str]) -> list[Path]:
        """Delete the prepared caches of entries not in `keep` (entry names: server keys and
        `tool:NAME`); the removed directories. Only under a root the daemon gave (`use`: its
        state directory, which no other daemon shares), never the user's own cache; blocking
        (a thread). An entry added again later is prepared again, which fetches its package."""
        if self._root is None:
            return []
        kept = {self.entry_dir(name) for name in keep}
        removed: list[Path] = []
        try:
            children = list(self._root.iterdir())
        except FileNotFoundError:
            return []
        for child in children:
            lock = self._locks.get(child)
            if child in kept or not _PREPARED_DIR.fullmatch(child.name) or child.is_symlink() \
                    or not child.is_dir() or (lock is not None and lock.locked()):
                continue
            shutil.rmtree(child, ignore_errors=True)
            self._locks.pop(child, None)
            removed.append(child)
        return removed


_PREPARED_DIR = re.compile(r"[A-Za-z0-9_.-]{1,64}-[0-9a-f]{8}")
"""The name of an entry's directory (`PreparedCaches.entry_dir`)."""
PREPARED = PreparedCaches()


def _plan(argv: Sequence[str], environ: Mapping[str, str],
          cwd: str | os.PathLike[str] | None) -> _Plan | None:
    kind = launcher_of(argv)
    if kind not in ("npx", "uvx", "uv run"):
        return None
    path = environ.get("PATH", os.defpath)
    program = argv[0]
    if "/" in program:  # as the sandbox finds it (`plan._find`)
        program = os.path.abspath(os.path.join(cwd or ".", program))
    else:
        program = shutil.which(program, path=path) or program
    if kind == "npx":
        return _npx_plan([program, *argv[1:]], path)
    return _uv_plan([program, *argv[1:]], kind)


def _npx_plan(argv: Sequence[str], path: str) -> _Plan:
    packages: list[str] = []
    config: list[str] = []
    args = list(argv[1:])
    while args:
        token = args.pop(0)
        if token == "--":
            break
        name = token.split("=", 1)[0]
        if name in ("-p", "--package"):
            packages.append(token.split("=", 1)[1] if "=" in token else args.pop(0) if args
                            else "")
        elif name in ("-c", "--call"):
            if "=" not in token and args:
                args.pop(0)
        elif token.startswith("-"):
            if "=" in token and name not in (*_NPX_DROPPED, "--cache"):
                config.append(token)  # npm configuration (`--registry=...`)
        else:
            if not packages:
                packages.append(token)
            break
    if not packages and args:
        packages.append(args[0])
    npm = Path(argv[0]).with_name("npm")
    program = str(npm) if npm.exists() else shutil.which("npm", path=path) or "npm"
    return _Plan("npm", (
        program, "exec", "--yes", "--ignore-scripts", "--no-audit", "--no-fund",
        "--loglevel=error", "--update-notifier=false", *config,
        *(f"--package={p}" for p in packages), "--", TRUE), f"npm: {' '.join(packages)}")


def _uv_plan(argv: Sequence[str], kind: str) -> _Plan:
    base = Path(argv[0]).name
    rest = list(argv[1:])
    if base == "uv":
        rest = rest[2:] if rest[:2] == ["tool", "run"] else rest[1:]
    options: list[str] = []
    python: list[str] = []
    spec = None
    while rest:
        token = rest.pop(0)
        if token == "--":
            break
        name = token.split("=", 1)[0]
        if name in _UV_DROPPED:
            if name == "--cache-dir" and "=" not in token and rest:
                rest.pop(0)
            continue
        if name in _UV_VALUES:
            value = token.split("=", 1)[1] if "=" in token else rest.pop(0) if rest else ""
            if name in ("-p", "--python"):
                python = [value]
            options += [name, value]
            continue
        if token.startswith("-"):
            options.append(token)
            continue
        spec = token
        break
    program = str(Path(argv[0]).with_name("uv")) if base == "uvx" else argv[0]
    if kind == "uv run":
        return _Plan("uv", (program, "run", "--no-build", *options, TRUE),
                     "uv: uv run (its environment)", tuple(python))
    froms = [options[i + 1] for i, o in enumerate(options[:-1]) if o == "--from"]
    if not froms and spec is not None:
        options += ["--from", _uv_requirement(spec)]
    what = " ".join(froms or [_uv_requirement(spec or "")])
    return _Plan("uv", (program, "tool", "run", "--no-build", *options, TRUE),
                 f"uv: {what}", tuple(python))


def _uv_requirement(spec: str) -> str:
    """uvx's `name@version` as a requirement (`name==version`)."""
    name, at, version = spec.partition("@")
    if not at or "://" in spec or not re.fullmatch(r"[A-Za-z0-9_.\[\],-]+", name):
        return spec
    return name if version == "latest" else f"{name}=={version}"


def pending(argv: Sequence[str], *, name: str, cwd: str | os.PathLike[str] | None) -> (
        str | None):
    """What preparing this entry will fetch, when it is not prepared yet (None: nothing to do)."""
    plan = _plan(argv, os.environ, cwd)
    if plan is None or _stamp_matches(PREPARED.entry_dir(name), plan):
        return None
    return plan.what


async def prepare(
    argv: Sequence[str], *, name: str, cwd: str | os.PathLike[str] | None,
    environ: Mapping[str, str],
) -> Prepared:
    """Prepare the launcher of `argv` for the entry `name` (at once when done before) and say
    what its sandbox gets. Raises PreparationFailed."""
    plan = _plan(argv, environ, cwd)
    if plan is None:
        return Prepared()
    where = PREPARED.entry_dir(name)
    cache = where / plan.kind
    inside = f"{IN_SANDBOX_CACHES}/{plan.kind}"
    async with PREPARED.lock(where):
        if not await anyio.to_thread.run_sync(_stamp_matches, where, plan):
            await _run_preparation(plan, where, cache, cwd or where, environ)
        stamp = await anyio.to_thread.run_sync(_stamp, where)
    if plan.kind == "npm":
        return Prepared(binds=((str(cache), inside),), env={
            "npm_config_cache": inside, "npm_config_offline": "true",
            "npm_config_update_notifier": "false", "npm_config_audit": "false",
            "npm_config_fund": "false"})
    interpreter = str(stamp.get("python") or "")
    env = {"UV_CACHE_DIR": inside, "UV_OFFLINE": "1", "UV_PYTHON_DOWNLOADS": "never"}
    if interpreter and not plan.python:
        env["UV_PYTHON"] = interpreter
    return Prepared(binds=((str(cache), inside),),
                    programs=(interpreter,) if interpreter else (), env=env)


def _stamp(where: Path) -> dict[str, object]:
    try:
        stamp = json.loads((where / "prepared.json").read_text())
    except (OSError, ValueError):
        return {}
    return stamp if isinstance(stamp, dict) else {}


def _stamp_matches(where: Path, plan: _Plan) -> bool:
    return _stamp(where).get("argv") == list(plan.argv) and (where / plan.kind).is_dir()


async def _run_preparation(
    plan: _Plan, where: Path, cache: Path, cwd: str | os.PathLike[str],
    environ: Mapping[str, str],
) -> None:
    await anyio.to_thread.run_sync(_fresh, where, cache)
    env = dict(environ)
    env["npm_config_cache" if plan.kind == "npm" else "UV_CACHE_DIR"] = str(cache)
    stamp: dict[str, object] = {"argv": list(plan.argv)}
    with anyio.move_on_after(PREPARE_TIMEOUT) as scope:
        if plan.kind == "uv":
            found = await _run([plan.argv[0], "python", "find", *plan.python], env, cwd, plan)
            stamp["python"] = found.strip().splitlines()[-1] if found.strip() else ""
            if not plan.python and stamp["python"]:
                env["UV_PYTHON"] = str(stamp["python"])
        await _run(list(plan.argv), env, cwd, plan)
    if scope.cancelled_caught:
        raise PreparationFailed(f"sandbox: preparing {plan.what} took more than "
                                f"{PREPARE_TIMEOUT:g} s")
    await anyio.to_thread.run_sync((where / "prepared.json").write_text, json.dumps(stamp))


def _fresh(where: Path, cache: Path) -> None:
    shutil.rmtree(where, ignore_errors=True)
    cache.mkdir(parents=True, mode=0o700)


async def _run(argv: list[str], env: dict[str, str], cwd: str | os.PathLike[str],
               plan: _Plan) -> str:
    try:
        done = await anyio.run_process(argv, env=env, cwd=cwd, check=False,
                                       stdin=subprocess.DEVNULL)
    except OSError as exc:
        raise PreparationFailed(f"sandbox: preparing {plan.what}: cannot run "
                                f"{argv[0]!r}: {exc.strerror or exc}") from None
    if done.returncode != 0:
        lines = [line.strip() for line in done.stderr.decode(errors="replace").splitlines()
                 if line.strip()]
        detail = " / ".join(lines[-3:])[:400] or f"exit status {done.returncode}"
        raise PreparationFailed(f"sandbox: preparing {plan.what} failed: {detail}")
    return done.stdout.decode(errors="replace")
