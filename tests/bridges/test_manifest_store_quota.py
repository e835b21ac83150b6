"""`[auth.quotas]` `store_bytes`: parsed per user (a user's own value, else the table's), put
into a real managed store's per-owner limits for `user:NAME` owners as each manifest load
does, and every bad value named by its JSON path."""

from __future__ import annotations

from pathlib import Path

import pytest

from bridges.manifest.loading import load_manifests
from managed_store import ManagedStore
from sidecar.daemon.stores import apply_store_quotas

pytestmark = pytest.mark.anyio

GOOD = """
[auth.quotas]
store_bytes = 1000
calls_per_minute = 10
[auth.quotas.users.bob]
store_bytes = 300
[auth.quotas.users.eve]
calls_per_minute = 5
"""

BAD = """
[auth.quotas]
store_bytes = "50MB"
[auth.quotas.users.bob]
store_bytes = 0
[auth.quotas.users.eve]
store_bytes = 1.5
"""


async def test_each_user_gets_their_limit_and_a_reload_replaces_them(tmp_path: Path) -> None:
    (tmp_path / "m.toml").write_text(GOOD)
    loaded = load_manifests([tmp_path])
    assert loaded.problems == []
    async with await ManagedStore.open(tmp_path / "store") as store:
        apply_store_quotas(store, loaded.auth)
        limits = store.owner_limits
        assert [limits.limit_of(o) for o in ("user:bob", "user:eve", "user:x", "session:s",
                                             "token:t")] == [300, 1000, 1000, None, None]
        (tmp_path / "m.toml").write_text("[auth.quotas]\ncalls_per_minute = 10\n")
        apply_store_quotas(store, load_manifests([tmp_path]).auth)
        assert limits.limit_of("user:bob") is None  # the per-owner share again
        apply_store_quotas(store, None)
        assert await store.owner_usage() == {}


def test_bad_values_are_named_by_their_path(tmp_path: Path) -> None:
    (tmp_path / "m.toml").write_text(BAD)
    found = sorted((p.path, p.message) for p in load_manifests([tmp_path]).errors)
    assert found == [
        ("$.auth.quotas.store_bytes", "store_bytes is a number of bytes, such as 52428800 "
                                      "for 50 MiB (not a string: '50MB')"),
        ("$.auth.quotas.users.bob.store_bytes", "Input should be greater than 0"),
        ("$.auth.quotas.users.eve.store_bytes",
         "Input should be a valid integer, got a number with a fractional part"),
    ]
