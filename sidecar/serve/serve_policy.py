"""What `sidecar serve` refuses to start with, and what it warns about: `--no-auth` off
loopback (`check_no_auth`), a weak bearer token (`check_token`, strength by `token_bits`) and
a token file others may reach (`check_token_file`); each refusal is `UnsafeConfiguration`
naming the flag that accepts it.

Imports nothing of ours. Exports `UnsafeConfiguration`, `check_no_auth`, `check_token`,
`check_token_file`, `token_bits`, `is_loopback`, `weak_tokens_allowed`, `MIN_TOKEN_BITS`,
`MIN_DISTINCT_CHARACTERS` and `ALLOW_WEAK_TOKEN_ENV`.
"""

from __future__ import annotations

import ipaddress
import math
import os
import stat
import string
from pathlib import Path

MIN_TOKEN_BITS = 256
MIN_DISTINCT_CHARACTERS = 8
ALLOW_WEAK_TOKEN_ENV = "SIDECAR_ALLOW_WEAK_TOKEN"

_HEX = frozenset(string.hexdigits)
_BASE64 = frozenset(string.ascii_letters + string.digits + "+/=-_")


class UnsafeConfiguration(Exception):
    """`sidecar serve` would start in a configuration it refuses; the message says which and
    the flag that accepts it."""


def is_loopback(host: str) -> bool:
    """Whether `host` (a bind address) only accepts connections from this machine: `localhost`
    or a loopback IP literal. Any other name may resolve to anything: not loopback."""
    name = host.strip("[]").lower()
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def check_no_auth(host: str, *, allow_on_network: bool) -> str:
    """The warning to print for `--no-auth` on `host` (printed whenever `--no-auth` is used,
    on any address); `UnsafeConfiguration` when `host` is not loopback and
    `allow_on_network` (`--allow-no-auth-on-network`) is false. With `--no-auth` the
    Host/Origin check is the only barrier, and any client that is not a browser passes it by
    sending `Host: localhost`."""
    if is_loopback(host):
        return (f"warning: --no-auth: every process on this machine can call tools through "
                f"http on {host} (only the Host/Origin check stands in front of them)")
    if not allow_on_network:
        raise UnsafeConfiguration(
            f"refusing --no-auth on {host}, which is not a loopback address: anyone who can "
            f"reach it could call every tool (a non-browser client passes the Host check by "
            f"sending 'Host: localhost'); bind 127.0.0.1, drop --no-auth, or add "
            f"--allow-no-auth-on-network if something else guards the network"
        )
    return (f"warning: --no-auth on {host}, which is not a loopback address "
            f"(--allow-no-auth-on-network): anyone who can reach it can call every tool")


def token_bits(token: str) -> float:
    """The estimated entropy of `token` in bits: length x bits per character of the
    smallest usual alphabet that holds the token (hex 4, base64/base64url 6, anything else
    6.5). `MIN_TOKEN_BITS` (256: 32 random bytes) are needed, and a token of fewer than
    `MIN_DISTINCT_CHARACTERS` distinct characters is weak whatever its length. The token the
    daemon creates (`secrets.token_urlsafe(32)`, 43 characters) passes; so do `openssl rand
    -hex 32` and `openssl rand -base64 32`. A uuid4 (122 bits) does not."""
    chars = set(token)
    if chars <= _HEX:
        per_char = 4.0
    elif chars <= _BASE64:
        per_char = 6.0
    else:
        per_char = math.log2(95)
    return len(token) * per_char


def check_token(token: str, source: str, *, allow_weak: bool) -> None:
    """`UnsafeConfiguration` when `token` (from `source`, e.g. "SIDECAR_TOKEN", or a short
    `<state>/token` written by hand) is weak (`token_bits`) and weak tokens are not allowed
    (`--allow-weak-token` or `SIDECAR_ALLOW_WEAK_TOKEN=1`). Checked when the daemon listens
    on TCP (`sidecar serve`); `sidecar daemon` serves only 0600 sockets in the private state
    directory and accepts a weak token. The token itself is never part of the message."""
    bits = token_bits(token)
    if allow_weak or (bits >= MIN_TOKEN_BITS and len(set(token)) >= MIN_DISTINCT_CHARACTERS):
        return
    raise UnsafeConfiguration(
        f"refusing the bearer token from {source}: about {bits:.0f} bits of entropy "
        f"({len(token)} characters), {MIN_TOKEN_BITS} needed; use a random one (unset it and "
        f"the daemon makes one, or `openssl rand -hex 32`), or pass --allow-weak-token "
        f"(or {ALLOW_WEAK_TOKEN_ENV}=1)"
    )


def weak_tokens_allowed(flag: bool) -> bool:
    return flag or os.environ.get(ALLOW_WEAK_TOKEN_ENV, "") not in ("", "0")


def check_token_file(path: Path, info: os.stat_result) -> None:
    """`UnsafeConfiguration` unless `info` (the `lstat` or `fstat` of the token file at
    `path`) is a regular file of this user that no one else may read or write; checked
    before the token is read. The daemon creates it 0600; `chmod 600` fixes a loose one."""
    if stat.S_ISLNK(info.st_mode) or not stat.S_ISREG(info.st_mode):
        raise UnsafeConfiguration(
            f"refusing the token file {path}: it is not a regular file (a symlink?); "
            f"remove it and the daemon makes a new one, or set SIDECAR_TOKEN")
    if info.st_uid != os.geteuid():
        raise UnsafeConfiguration(
            f"refusing the token file {path}: it belongs to uid {info.st_uid}, not to this "
            f"user; remove it and the daemon makes a new one")
    mode = stat.S_IMODE(info.st_mode)
    if mode & (stat.S_IRGRP | stat.S_IROTH | stat.S_IWGRP | stat.S_IWOTH):
        raise UnsafeConfiguration(
            f"refusing the token file {path}: other users may read or write it (mode "
            f"{mode:04o}), so they may have the token; run: chmod 600 {path}, and replace "
            f"the token if others could have read it")
