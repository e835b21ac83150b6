"""Secret references in manifest strings: `${env:NAME}`, `${file:PATH}`, `${keyring:SERVICE/NAME}`.

- `${env:NAME}`: the environment variable NAME.
- `${file:PATH}`: the content of a file (Docker and Kubernetes mount secrets as files), with
  trailing line breaks removed. A relative PATH is relative to the manifest's directory; `~`
  expands.
- `${keyring:SERVICE/NAME}`: the password the OS keyring (the `keyring` package) holds for
  SERVICE and user NAME. Without the package, or on a machine with no keyring backend (a
  headless server), the reference fails with a clear error that names the alternatives.

A reference that cannot be resolved raises `SecretReferenceError` naming the JSON path and the
reference, never a secret value.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path

_REF = re.compile(r"\$\{(env|file|keyring):([^}]*)\}")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
MAX_FILE_SECRET_BYTES = 1024 * 1024


class SecretReferenceError(Exception):
    """A `${...}` reference that cannot be resolved."""

    def __init__(self, path: str, message: str, hint: str = "") -> None:
        super().__init__(message)
        self.path = path
        self.message = message
        self.hint = hint


def resolve_references(
    text: str, path: str, environ: Mapping[str, str], base_dir: Path | None = None
) -> str:
    """`text` with every reference replaced by its value."""

    def sub(match: re.Match[str]) -> str:
        kind, ref = match.group(1), match.group(2)
        if kind == "env":
            return _env(ref, path, environ)
        if kind == "file":
            return _file(ref, path, base_dir)
        return _keyring(ref, path)

    return _REF.sub(sub, text)


def _env(name: str, path: str, environ: Mapping[str, str]) -> str:
    if not _ENV_NAME.fullmatch(name):
        raise SecretReferenceError(path, f"${{env:{name}}} is not a valid variable name")
    if name not in environ:
        raise SecretReferenceError(
            path, f"environment variable {name} is not set",
            hint=f"export {name} before starting the sidecar",
        )
    return environ[name]


def _file(ref: str, path: str, base_dir: Path | None) -> str:
    if not ref:
        raise SecretReferenceError(path, "${file:} names no file")
    target = Path(ref).expanduser()
    if not target.is_absolute() and base_dir is not None:
        target = base_dir / target
    try:
        with target.open("rb") as f:
            data = f.read(MAX_FILE_SECRET_BYTES + 1)
    except OSError as exc:
        raise SecretReferenceError(
            path, f"cannot read secret file {str(target)!r}: {exc.strerror or exc}",
            hint="mount the secret there or change the ${file:...} path",
        ) from None
    if len(data) > MAX_FILE_SECRET_BYTES:
        raise SecretReferenceError(path, f"secret file {str(target)!r} is larger than 1 MiB")
    try:
        return data.decode("utf-8").rstrip("\r\n")
    except UnicodeDecodeError:
        raise SecretReferenceError(path, f"secret file {str(target)!r} is not UTF-8") from None


def _keyring(ref: str, path: str) -> str:
    service, _, name = ref.rpartition("/")
    if not service or not name:
        raise SecretReferenceError(
            path, f"${{keyring:{ref}}} must be written ${{keyring:SERVICE/NAME}}"
        )
    alternatives = "use ${env:NAME} or ${file:PATH} instead"
    try:
        import keyring
        from keyring.errors import KeyringError
    except ImportError:
        raise SecretReferenceError(
            path, "${keyring:...} needs the `keyring` package, which is not installed",
            hint=f"pip install keyring, or {alternatives}",
        ) from None
    try:
        value: str | None = keyring.get_password(service, name)
    except KeyringError as exc:
        raise SecretReferenceError(
            path, f"no OS keyring is available here ({type(exc).__name__}: {exc})",
            hint=f"a headless machine has no keyring backend: {alternatives}",
        ) from None
    if value is None:
        raise SecretReferenceError(
            path, f"the keyring has no secret for service {service!r}, name {name!r}",
            hint=f"store it with `keyring set {service} {name}`",
        )
    return value
