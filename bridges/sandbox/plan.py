"""What one sandboxed process needs, looked up on this machine: the program and its
interpreter, the system directories, the listed paths resolved, the masks. Imports
`bridges.manifest.sandbox` and its siblings; exports `plan_sandbox`, `SYSTEM_DIRS`,
`ETC_FILES`.

The program is found on PATH and followed through its symlinks and `#!` line; each place
the chain passes outside the system directories is bound read-only with its prefix (a
`bin/` directory's parent: a virtualenv, a pyenv version, a Node install). `npx` and `uvx`
(`uv`) get the cache their preparation filled (`bridges.sandbox.launchers`), `npm` the
user's npm cache (`~/.npm`) read-only. Nothing else of the user's home is visible.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterable, Mapping
from pathlib import Path

from bridges.manifest.sandbox import SandboxConfig, split_host_port
from bridges.sandbox.argv import Limits, SandboxPlan
from bridges.sandbox.launchers import Prepared
from bridges.sandbox.protected import PROTECTED

SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
ETC_FILES = (
    "ld.so.cache", "ld.so.conf", "ld.so.conf.d", "alternatives", "ssl", "ca-certificates",
    "ca-certificates.conf", "pki", "crypto-policies", "passwd", "group", "nsswitch.conf",
    "hosts", "host.conf", "gai.conf", "localtime", "timezone", "mime.types", "os-release",
    "protocols", "services", "npmrc",
)
"""/etc entries a sandbox sees (read-only); no secrets (`shadow`), no daemon configuration."""
NET_ETC_FILES = ("resolv.conf",)
"""Only with `network = "host"`: the others cannot resolve names themselves."""
CACHES = {"npm": ("~/.npm",)}
"""User caches bound read-only for a launcher that is not prepared (`launchers`)."""
SANDBOX_PATH = "/usr/local/bin:/usr/bin:/bin"


def plan_sandbox(
    config: SandboxConfig,
    argv: Iterable[str],
    *,
    cwd: str | os.PathLike[str] | None,
    env: Mapping[str, str],
    environ: Mapping[str, str],
    bwrap: str,
    prlimit: str,
    egress_socket: str | None = None,
    forwarder: tuple[str, ...] = (),
    owner: object = None,
    prepared: Prepared | None = None,
) -> SandboxPlan:
    """The plan of one run: `env` is what the entry sets itself (its `env` table), `environ`
    the daemon's environment, of which only `config.env`'s names pass (and PATH); `owner`
the key of this entry's own working directory in `PROTECTED`; `prepared` what its
    launcher's preparation gives it. FileNotFoundError when the program is not found."""
    args = list(argv)
    path = environ.get("PATH", SANDBOX_PATH)
    program = _find(args[0], path, cwd)
    home = str(Path("~").expanduser())
    prepared = prepared or Prepared()
    read = _prefixes(_chain(program))
    for extra in prepared.programs:
        read += _prefixes(_chain(extra))
    for cache in CACHES.get(Path(args[0]).name, ()):
        read.append(_real(cache))
    read += [_real(p) for p in config.read]
    write = [_real(p) for p in config.write]
    chdir = home
    if cwd is not None:
        chdir = _real(cwd)
        if not any(_under(chdir, w) for w in write):
            read.append(chdir)
    inside = {"PATH": path, "HOME": home, "TMPDIR": "/tmp", **prepared.env}
    inside |= {name: environ[name] for name in config.env if name in environ}
    inside |= dict(env)
    net = config.network
    forwarder_binds: list[str] = []
    if egress_socket is not None:
        forwarder = (os.path.realpath(forwarder[0]), *forwarder[1:])
        forwarder_binds = [p for p in _prefixes(_chain(forwarder[0])) if p not in read]
    bound = [*read, *write, *forwarder_binds]
    return SandboxPlan(
        bwrap=bwrap, argv=(program, *args[1:]), home=home, chdir=chdir, env=inside,
        limits=Limits(config.memory_mb, config.cpu_seconds, config.pids), prlimit=prlimit,
        system=_system(share_net=net == "host"), symlinks=_symlinks(),
        read=tuple(_unique(p for p in read if not _system_path(p))),
        write=tuple(_unique(write)), binds=tuple(prepared.binds),
        masks=PROTECTED.masks(bound, own=[*config.read, *config.write, chdir], owner=owner),
        share_net=net == "host", egress_socket=egress_socket, forwarder=forwarder,
        forwarder_binds=tuple(_unique(p for p in forwarder_binds if not _system_path(p))),
    )


def allowed_destinations(config: SandboxConfig) -> frozenset[tuple[str, int]]:
    """The (host, port) pairs of an allow-list `network` (empty for "none" and "host")."""
    if isinstance(config.network, str):
        return frozenset()
    pairs = (split_host_port(item) for item in config.network)
    return frozenset(p for p in pairs if p is not None)


def _find(name: str, path: str, cwd: str | os.PathLike[str] | None) -> str:
    if "/" in name:
        found = Path(cwd or ".", name) if not os.path.isabs(name) else Path(name)
        if not found.exists():
            raise FileNotFoundError(2, "No such file or directory", name)
        return str(found.absolute())
    which = shutil.which(name, path=path)
    if which is None:
        raise FileNotFoundError(2, "No such file or directory (not on PATH)", name)
    return str(Path(which).absolute())


def _chain(program: str, depth: int = 0) -> list[str]:
    """`program`, every symlink on the way to the file it names, that file, and the same for
    the interpreter of its `#!` line (and a virtualenv's base interpreter)."""
    chain = [program]
    current = Path(program)
    for _ in range(16):
        if not current.is_symlink():
            break
        current = current.parent / os.readlink(current)
        chain.append(str(current))
    real = os.path.realpath(program)
    chain.append(real)
    cfg = Path(program).parent.parent / "pyvenv.cfg"
    if cfg.is_file():
        for line in cfg.read_text(errors="replace").splitlines():
            key, _, value = line.partition("=")
            if key.strip() == "home":
                chain.append(str(Path(value.strip()) / "python"))
    if depth < 2:
        interpreter = _shebang(real)
        if interpreter is not None:
            chain += _chain(interpreter, depth + 1)
    return chain


def _shebang(path: str) -> str | None:
    try:
        with open(path, "rb") as f:
            head = f.read(256)
    except OSError:
        return None
    if not head.startswith(b"#!"):
        return None
    words = head[2:].split(b"\n", 1)[0].decode(errors="replace").split()
    if not words:
        return None
    if Path(words[0]).name == "env" and len(words) > 1:
        name = next((w for w in words[1:] if not w.startswith("-")), None)
        return shutil.which(name) if name else None
    return words[0]


def _prefixes(chain: Iterable[str]) -> list[str]:
    found = []
    for item in chain:
        parent = Path(os.path.normpath(item)).parent
        prefix = parent.parent if parent.name == "bin" else parent
        if str(prefix) != "/":
            found.append(os.path.realpath(prefix))
    return found


def _system(*, share_net: bool) -> tuple[str, ...]:
    dirs = [d for d in SYSTEM_DIRS if os.path.isdir(d) and not os.path.islink(d)]
    names = (*ETC_FILES, *(NET_ETC_FILES if share_net else ()))
    etc = [f"/etc/{name}" for name in names if os.path.exists(f"/etc/{name}")]
    return (*dirs, *etc)


def _symlinks() -> dict[str, str]:
    return {d: os.readlink(d) for d in SYSTEM_DIRS if os.path.islink(d)}


def _real(path: str | os.PathLike[str]) -> str:
    return os.path.realpath(os.path.expanduser(path))


def _under(path: str, parent: str) -> bool:
    return path == parent or path.startswith(parent.rstrip("/") + "/")


def _system_path(path: str) -> bool:
    return any(_under(path, d) for d in SYSTEM_DIRS)


def _unique(paths: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(paths))
