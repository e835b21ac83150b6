"""The `TextStore` on S3-compatible object storage with its index in PostgreSQL, for fleets
(several replicas sharing managed texts). Needs the `fleet` extra (`obstore`, `asyncpg`);
importing `managed_store` alone never imports this package.

    from managed_store.s3 import S3Settings, S3TextStore

    settings = S3Settings.from_url("s3://bucket/prefix", os.environ)
    store = await S3TextStore.open(pool, settings, ttl_seconds=..., quota_bytes=...,
                                   staging_dir=state_dir / "managed-s3")  # write-behind
"""

from managed_store.s3.index import LOCK_MANAGED_CLEANUP, LOCK_MANAGED_QUOTA
from managed_store.s3.settings import S3Settings, WriteSettings
from managed_store.s3.store import S3TextStore

__all__ = ["LOCK_MANAGED_CLEANUP", "LOCK_MANAGED_QUOTA", "S3Settings", "S3TextStore",
           "WriteSettings"]
