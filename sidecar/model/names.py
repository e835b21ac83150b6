"""Effective (model-facing) tool names; imports nothing of ours.

Exports `effective_name` (the whole rule is in its docstring), `plain_names`, `sanitize`,
`has_namespace_prefix`, `is_valid_name`, `MAX_NAME_LENGTH` and `RESERVED_NAMES`. Providers
accept `[A-Za-z0-9_-]{1,64}`; every effective name is one of those.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Container, Iterable

MAX_NAME_LENGTH = 64
RESERVED_NAMES = frozenset({"managed_read", "execute", "search_tools", "describe_tools"})
"""Effective names of the sidecar's built-ins: no other registration may take them (the
registry leaves such a tool out and reports it; MCP bridges skip it per server)."""
_HASH_LENGTH = 8
_VALID = re.compile(r"[A-Za-z0-9_-]{1,64}")
_INVALID_CHAR = re.compile(r"[^A-Za-z0-9_-]")
_MEANINGFUL = re.compile(r"[A-Za-z0-9]")
_FIRST = re.compile(r"[A-Za-z_]")


def is_valid_name(name: str) -> bool:
    return _VALID.fullmatch(name) is not None


def sanitize(part: str) -> str:
    return _INVALID_CHAR.sub("_", part)


def _hash8(namespace: str, key: str) -> str:
    digest = hashlib.sha256(f"{namespace}\x00{key}".encode("utf-8", "surrogatepass"))
    return digest.hexdigest()[:_HASH_LENGTH]


def has_namespace_prefix(key: str, namespace: str | None) -> bool:
    """Whether `key` already starts with `<namespace>_` or `<namespace>-` (sanitized)."""
    if not namespace:
        return False
    prefix, sanitized = sanitize(namespace), sanitize(key)
    return len(sanitized) > len(prefix) + 1 and sanitized.startswith(
        (f"{prefix}_", f"{prefix}-"))


def plain_names(keys: Iterable[tuple[str, str | None]]) -> frozenset[str]:
    """The names that (key, namespace) pairs without the namespace prefix get: a prefixed key
    whose shortened name is one of them keeps the doubled form (rule 2)."""
    return frozenset(effective_name(key, namespace) for key, namespace in keys
                     if key and not has_namespace_prefix(key, namespace))


def effective_name(
    key: str, namespace: str | None = None, *, plain: Container[str] = ()
) -> str:
    """The model-facing name for `key` in `namespace`:

    1. each of namespace and key sanitized: every character outside `[A-Za-z0-9_-]` becomes
       `_` (so `git.status` -> `git_status`, `fs/read` -> `fs_read`);
    2. joined as `<namespace>_<key>` (the key alone when the namespace is empty or absent),
       except that a key that already starts with `<namespace>_` or `<namespace>-` is not
       prefixed again (server `git` + tool `git_status` -> `git_status`, not
       `git_git_status`) unless that name is one of `plain`: the names other keys of the same
       registration get by the ordinary rule (`git` + `status` -> `git_status`), which keep
       it, and the prefixed key gets the doubled form (see `plain_names`);
    3. when the result has no letter or digit (e.g. a key written only in non-Latin script) it
       gets the stable suffix `_<hash8>`, so distinct keys stay distinct;
    4. when it starts with a digit or `-` it gets a leading `_` (Gemini requires a letter or
       `_` first; every provider accepts that);
    5. when it is longer than 64 characters it is cut to 55 and gets `_<hash8>`.

    `hash8` is the first 8 hex digits of SHA-256 over the *authored* namespace and key, so the
    result is deterministic across processes and machines, and two long names that share
    their first 55 characters still differ. A valid name that starts with a letter or `_` and
    has no namespace is unchanged. An empty key raises `ValueError`.
    """
    if not key:
        raise ValueError("a tool name cannot be empty")
    namespace = namespace or ""
    if not namespace and _VALID.fullmatch(key) and _FIRST.match(key):
        return key
    if has_namespace_prefix(key, namespace):
        shortened = effective_name(key)
        if shortened not in plain:
            return shortened
    name = sanitize(key) if not namespace else f"{sanitize(namespace)}_{sanitize(key)}"
    if not _MEANINGFUL.search(name):
        name = f"{name}_{_hash8(namespace, key)}"
    if not _FIRST.match(name):
        name = "_" + name
    if len(name) > MAX_NAME_LENGTH:
        name = f"{name[: MAX_NAME_LENGTH - _HASH_LENGTH - 1]}_{_hash8(namespace, key)}"
    return name
