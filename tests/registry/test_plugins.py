"""Plugins: dotted references, entry points, isolation of failures, deactivation."""

from __future__ import annotations

import sys
import textwrap

import pytest

from sidecar import Location

pytestmark = pytest.mark.anyio
P = "tests.registry.plugin_fixtures.sample"


async def test_plugins_activate_into_their_own_scopes_and_failures_are_isolated(tmp_path):
    refs = [f"{P}:activate", f"{P}:activate_then_fail", f"{P}:activate_async",
            f"{P}:NOT_CALLABLE", "no.such.module:activate"]
    async with Location.open(tmp_path, state_dir=tmp_path / "s", plugins=refs) as loc:
        names = loc.snapshot().names
        assert "sample_hello" in names and "async_hello" in names
        assert "partial" not in names  # a failing plugin leaves nothing behind
        status = loc.plugins.status
        assert status[f"{P}:activate"].state == "active"
        assert status[f"{P}:activate"].tools == ("sample_hello",)
        failed = status[f"{P}:activate_then_fail"]
        assert failed.state == "failed" and "plugin blew up" in failed.error
        assert status[f"{P}:NOT_CALLABLE"].state == "failed"
        assert status["no.such.module:activate"].state == "failed"
        loc.plugins.deactivate(f"{P}:activate")
        assert "sample_hello" not in loc.snapshot().names
        await loc.plugins.sync([f"{P}:activate"])  # async_hello is deactivated, hello is back
        names = loc.snapshot().names
        assert "sample_hello" in names and "async_hello" not in names


async def test_plugins_listed_in_a_manifest_load(tmp_path):
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "plugins.toml").write_text(f'plugins = ["{P}:activate"]\n')
    manifests = [tmp_path / "m"]
    async with Location.open(tmp_path, state_dir=tmp_path / "s", manifests=manifests) as loc:
        assert "sample_hello" in loc.snapshot().names


async def test_entry_point_plugins_are_discovered(tmp_path, monkeypatch):
    site = tmp_path / "site"
    dist = site / "fake_sidecar_plugin-1.0.dist-info"
    dist.mkdir(parents=True)
    metadata = "Metadata-Version: 2.1\nName: fake-sidecar-plugin\nVersion: 1.0\n"
    (dist / "METADATA").write_text(metadata)
    (dist / "entry_points.txt").write_text(textwrap.dedent(f"""
        [mcp_sidecar.plugins]
        sample = {P}:activate_async
    """))
    monkeypatch.syspath_prepend(str(site))
    assert str(site) in sys.path
    async with Location.open(tmp_path, state_dir=tmp_path / "s") as loc:
        assert "async_hello" in loc.snapshot().names
    async with Location.open(tmp_path, state_dir=tmp_path / "s", entry_point_plugins=False) as loc:
        assert "async_hello" not in loc.snapshot().names
