"""The one line a command prints when the fleet database fails under it (exit 6,
`EXIT_DATABASE`): unreachable when the command starts, or lost, refused or silent (no answer
within `SIDECAR_DATABASE_TIMEOUT`) while it runs.

    sidecar auth: the fleet database 10.0.0.5:5432/sidecar is unavailable: `sidecar auth
    status` did not finish (connection was closed in the middle of operation)

The database is named `host:port/name` (`sidecar.serve.local_door.database_of`), never by its URL:
the user and the password of `--store` / `$SIDECAR_DATABASE_URL` are never printed, even when
a server's message quotes them. A `DatabaseError` of its own making (a schema newer than this
sidecar knows, a bad `SIDECAR_DATABASE_TIMEOUT`, an unusable `SIDECAR_OBJECT_STORE`) is printed
in its own words. Anything else is a defect and keeps its traceback.
"""

from __future__ import annotations

import argparse
import logging
import os
import re
from urllib.parse import unquote, urlsplit

from sidecar.cli.output import EXIT_DATABASE, EXIT_USAGE
from sidecar.serve.local_door import database_of
from sidecar.stores.errors import (
    DatabaseError,
    SchemaTooNew,
    database_failure,
    driver_failure,
    exception_chain,
)

__all__ = ["STORE_SCHEMES", "BriefDatabaseFailures", "command_of", "database_line",
           "database_url", "door_exit", "scrubbed", "use_store"]

STORE_SCHEMES = ("postgres://", "postgresql://")


def database_url() -> str:
    """The fleet database the command uses (`--store` is in the environment by now)."""
    return os.environ.get("SIDECAR_DATABASE_URL", "").strip()


def use_store(args: argparse.Namespace) -> str | None:
    """`--store URL` wins over `$SIDECAR_DATABASE_URL`: it is put there, so that the stores,
    `sidecar token` and a daemon this command starts on demand all use it. The problem with
    the URL, or None."""
    if not hasattr(args, "store"):
        return None  # a command that opens no store (`check`, `stop`, ...)
    flag = args.store
    if flag is not None:
        os.environ["SIDECAR_DATABASE_URL"] = flag.strip()
    url = database_url()
    if url and not url.startswith(STORE_SCHEMES):
        where = "--store" if flag is not None else "$SIDECAR_DATABASE_URL"
        return (f"{where}: the fleet database is a postgres:// or postgresql:// URL, not "
                f"{url.split(':', 1)[0]!r}")
    return None


def door_exit(exc: Exception) -> int:
    """A daemon started on demand that could not use the fleet database: that status;
    otherwise a usage error."""
    return EXIT_DATABASE if getattr(exc, "daemon_exit", None) == EXIT_DATABASE else EXIT_USAGE


def database_line(exc: BaseException, command: str, *, prefix: str = "sidecar",
                  outcome: str = "did not finish") -> str | None:
    """`prefix: ...` for `exc` when the fleet database failed under `command` (e.g.
    "sidecar auth status", which then `outcome`), else None (a defect: let it raise)."""
    url = database_url()
    failure = _failure_in(exc, url)
    if failure is None:
        return None
    said = next((e for e in exception_chain(failure) if isinstance(e, DatabaseError)), None)
    if said is not None and (isinstance(said, SchemaTooNew) or not _outage(failure)):
        text = str(said)  # its own words: a schema or a setting, not an outage
    else:
        label = f"the fleet database {database_of(url)}" if url else "the fleet database"
        text = f"{label} is unavailable: `{command}` {outcome} ({_cause(failure)})"
    return f"{prefix}: {scrubbed(text, url)}"


def command_of(args: argparse.Namespace) -> str:
    """`sidecar auth status`, `sidecar tools --embedded`, ...: the command, for messages."""
    words = ["sidecar", args.command]
    words += [getattr(args, sub) for sub in ("auth_command", "token_command", "managed_command")
              if getattr(args, sub, None)]
    if getattr(args, "embedded", False):
        words.append("--embedded")
    return " ".join(words)


def _failure_in(exc: BaseException, url: str) -> BaseException | None:
    """The database failure `exc` is or was raised from; in an exception group, the first of
    its leaves when every leaf is one (a defect beside it keeps the traceback)."""
    if isinstance(exc, BaseExceptionGroup):
        found = [_failure_in(leaf, url) for leaf in exc.exceptions]
        return found[0] if found and all(f is not None for f in found) else None
    if not url:  # the driver is the fleet extra: without a database only our own errors count
        return next((e for e in exception_chain(exc) if isinstance(e, DatabaseError)), None)
    import sidecar.backends.postgres.pool  # noqa: F401  (registers its driver's failures)

    return database_failure(exc)


def _outage(failure: BaseException) -> bool:
    """Whether the database itself failed (the driver's error, or a refused, reset or timed
    out connection inside it) rather than a setting (`SIDECAR_GRANT_KEY`,
    `SIDECAR_OBJECT_STORE`, ...) the sidecar reports as a `DatabaseError` in its own words."""
    return driver_failure(failure)


def _cause(failure: BaseException) -> str:
    chain = list(exception_chain(failure))
    if any(isinstance(c, TimeoutError) for c in chain):
        return "no answer within the database timeout, SIDECAR_DATABASE_TIMEOUT"
    for c in reversed(chain):  # the root's words: a wrapper repeats them
        words = " ".join(str(c).split())
        if words:
            return words
    return type(chain[-1]).__name__


def scrubbed(text: str, url: str) -> str:
    """`text` on one line, without the URL's user or password."""
    text = " ".join(text.split())
    if not url:
        return text
    parts = urlsplit(url)
    if parts.password:
        for form in {parts.password, unquote(parts.password)}:
            text = text.replace(form, "***")
    if parts.username:  # a whole word: a short user name may be part of other words
        for form in {parts.username, unquote(parts.username)}:
            text = re.sub(rf"(?<![\w.-]){re.escape(form)}(?![\w.-])", "***", text)
    return text


class BriefDatabaseFailures(logging.Filter):
    """For a command that runs a Location in its own process (`--embedded`): a log record of
    a fleet database failure (the stores retrying, the pool reconnecting) is one line,
    its cause instead of its traceback, so the command's stderr ends with its one line
    (`database_line`) without tracebacks; every other record is left as it is."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if exc is not None and _failure_in(exc, database_url()) is not None:
            record.msg = scrubbed(f"{record.getMessage()} ({_cause(exc)})", database_url())
            record.args = None
            record.exc_info = record.exc_text = None
        return True

    @classmethod
    def install(cls) -> None:
        """On a stderr handler of the root logger (WARNING, or `$SIDECAR_LOG_LEVEL`)."""
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
        handler.addFilter(cls())
        root = logging.getLogger()
        root.addHandler(handler)
        root.setLevel(os.environ.get("SIDECAR_LOG_LEVEL", "WARNING").upper())
