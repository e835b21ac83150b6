"""Where the S3 engine keeps its objects: `s3://bucket/prefix` plus the usual AWS variables.

    settings = S3Settings.from_url("s3://bucket/sidecar", os.environ)

`AWS_ENDPOINT_URL` (or `AWS_ENDPOINT_URL_S3`) names an S3-compatible server (SeaweedFS,
MinIO, ...); an `http://` endpoint allows plain HTTP. `AWS_ACCESS_KEY_ID`,
`AWS_SECRET_ACCESS_KEY` and `AWS_SESSION_TOKEN` are the credentials; without them the object
store client looks for credentials as the AWS SDKs do (web identity, instance metadata).
`AWS_REGION` (or `AWS_DEFAULT_REGION`) defaults to `us-east-1`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

if TYPE_CHECKING:
    from obstore.store import S3Config, S3Store

DEFAULT_REGION = "us-east-1"
_BAD_SEGMENTS = {"", ".", ".."}
# S3's rules, loosened to the characters S3-compatible servers accept too (`_`, capitals).
_BUCKET = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{1,61}[A-Za-z0-9]", re.ASCII)


@dataclass(frozen=True, slots=True)
class S3Settings:
    """An S3 location and how to reach it. The secret never appears in `repr`."""

    bucket: str
    prefix: str = ""
    """Object keys start with `prefix/` (no leading or trailing slash; may be empty)."""
    endpoint: str | None = None
    access_key_id: str | None = None
    secret_access_key: str | None = field(default=None, repr=False)
    session_token: str | None = field(default=None, repr=False)
    region: str = DEFAULT_REGION
    request_timeout: float = 60.0
    max_retries: int = 3

    @classmethod
    def from_url(cls, url: str, environ: Mapping[str, str]) -> S3Settings:
        """Parse `s3://bucket/prefix` and read the AWS variables from `environ`. Raises
        `ValueError` naming what is wrong."""
        parts = urlsplit(url.strip())
        if "@" in parts.netloc:  # never echoed: it may hold a key
            raise ValueError("the object store URL must not carry credentials: give them in "
                             "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY")
        if parts.scheme != "s3" or not parts.netloc:
            raise ValueError(
                f"object store {url!r} is not of the form s3://bucket/prefix")
        if parts.query or parts.fragment:
            raise ValueError(f"object store {url!r}: no query or fragment is allowed")
        if not _BUCKET.fullmatch(parts.netloc):
            raise ValueError(f"object store {url!r}: {parts.netloc!r} is not a bucket name "
                             "(3-63 of a-z, 0-9, '.', '-')")
        prefix = parts.path.strip("/")
        if prefix and any(segment in _BAD_SEGMENTS or not segment.isprintable()
                          for segment in prefix.split("/")):
            raise ValueError(f"object store {url!r}: the prefix has an empty, '.' or '..' "
                             "part, or unprintable characters")
        endpoint = (environ.get("AWS_ENDPOINT_URL_S3") or environ.get("AWS_ENDPOINT_URL")
                    or None)
        if endpoint is not None and urlsplit(endpoint).scheme not in ("http", "https"):
            raise ValueError(f"AWS_ENDPOINT_URL {endpoint!r} is not an http(s) URL")
        return cls(
            bucket=parts.netloc, prefix=prefix, endpoint=endpoint,
            access_key_id=environ.get("AWS_ACCESS_KEY_ID") or None,
            secret_access_key=environ.get("AWS_SECRET_ACCESS_KEY") or None,
            session_token=environ.get("AWS_SESSION_TOKEN") or None,
            region=environ.get("AWS_REGION") or environ.get("AWS_DEFAULT_REGION")
            or DEFAULT_REGION,
        )

    @property
    def location(self) -> str:
        """`bucket/prefix`: names this store's objects in the index."""
        return f"{self.bucket}/{self.prefix}" if self.prefix else self.bucket

    def key(self, ref_id: str) -> str:
        """The object key of a (validated) ref id."""
        return f"{self.prefix}/{ref_id}" if self.prefix else ref_id

    def open_client(self) -> S3Store:
        """An obstore client for the bucket (no network traffic until first used)."""
        from obstore.store import S3Store

        allow_http = bool(self.endpoint and self.endpoint.startswith("http://"))
        timeout = timedelta(seconds=self.request_timeout)
        config: S3Config = {"region": self.region}
        if self.endpoint is not None:
            config["endpoint"] = self.endpoint
        if self.access_key_id is not None and self.secret_access_key is not None:
            config["access_key_id"] = self.access_key_id
            config["secret_access_key"] = self.secret_access_key
            if self.session_token is not None:
                config["session_token"] = self.session_token
        return S3Store(
            self.bucket, config=config,
            client_options={"allow_http": allow_http, "timeout": timeout,
                            "connect_timeout": timedelta(seconds=10)},
            retry_config={"max_retries": self.max_retries, "retry_timeout": timeout,
                          "backoff": {"init_backoff": timedelta(milliseconds=100),
                                      "max_backoff": timedelta(seconds=5), "base": 2}},
        )


_SIZE_UNITS = {"": 1, "k": 1024, "m": 1024**2, "g": 1024**3, "t": 1024**4}
_TIME_UNITS = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0}


@dataclass(frozen=True, slots=True)
class WriteSettings:
    """How a replica writes objects (see `s3.staging`), from its environment:

    `SIDECAR_OBJECT_STORE_WRITE`          `behind` (default): a commit returns once the object
                                          is complete in a local staging file and indexed; the
                                          upload ends in the background. `through`: a commit
                                          returns once the object is in the bucket.
    `SIDECAR_OBJECT_STORE_STAGING_BYTES`  committed bytes a replica may hold not yet uploaded
                                          (default 1G); past it a commit waits for its upload.
    `SIDECAR_OBJECT_STORE_READ_WAIT`      how long a read waits for another replica's upload
                                          (default 120 s; `90`, `90s`, `2m`).
    `SIDECAR_OBJECT_STORE_CLOSE_WAIT`     how long shutting down waits for uploads to end
                                          (default 20 s: within Kubernetes' default 30 s
                                          grace period); the rest resume at the next start
                                          on the same state directory.
    """

    behind: bool = True
    staging_bytes: int = 1024**3
    read_wait: float = 120.0
    close_wait: float = 20.0

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> WriteSettings:
        """Raises `ValueError` naming the variable and its value when one is wrong."""
        mode = environ.get("SIDECAR_OBJECT_STORE_WRITE", "").strip().lower() or "behind"
        if mode not in ("behind", "through"):
            raise ValueError(f"SIDECAR_OBJECT_STORE_WRITE must be 'behind' or 'through', got "
                             f"{environ['SIDECAR_OBJECT_STORE_WRITE']!r}")
        default = cls()
        return cls(
            behind=mode == "behind",
            staging_bytes=_size(environ, "SIDECAR_OBJECT_STORE_STAGING_BYTES",
                                default.staging_bytes),
            read_wait=_seconds(environ, "SIDECAR_OBJECT_STORE_READ_WAIT", default.read_wait),
            close_wait=_seconds(environ, "SIDECAR_OBJECT_STORE_CLOSE_WAIT", default.close_wait),
        )


def _size(environ: Mapping[str, str], name: str, default: int) -> int:
    raw = environ.get(name, "").strip()
    if not raw:
        return default
    text = raw.lower().removesuffix("ib").removesuffix("b")
    unit = text[-1:] if text[-1:] in _SIZE_UNITS else ""
    try:
        value = int(float(text[: len(text) - len(unit)]) * _SIZE_UNITS[unit])
    except ValueError:
        value = -1
    if value < 0:
        raise ValueError(f"{name} must be a size such as 1G or 512M, got {raw!r}")
    return value


def _seconds(environ: Mapping[str, str], name: str, default: float) -> float:
    raw = environ.get(name, "").strip()
    if not raw:
        return default
    text = raw.lower()
    unit = text[-1:] if text[-1:] in _TIME_UNITS else ""
    try:
        value = float(text[: len(text) - len(unit)]) * _TIME_UNITS[unit]
    except ValueError:
        value = -1.0
    if not 0 <= value < float("inf"):
        raise ValueError(f"{name} must be a duration such as 120, 90s or 2m, got {raw!r}")
    return value
