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
