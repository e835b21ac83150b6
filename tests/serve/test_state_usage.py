"""`/v1/health` and `/metrics` report the state directory by part and the pruning counts."""

from __future__ import annotations

import time

import pytest

from tests.serve.test_api import ctx, snapshot

pytestmark = pytest.mark.anyio

PARTS = {"outcomes", "outcomes_wal", "managed_objects", "managed_index", "permissions", "tokens",
         "other"}


async def test_health_and_metrics_report_state_sizes_and_pruning(served):
    sid = await snapshot(served)
    for call_id, name in (("c1", "echo"), ("c2", "big")):
        res = await served.client.post(f"/v1/snapshots/{sid}/calls", json={
            "name": name, "input": {"text": "x"}, "context": ctx(call_id)})
        assert res.status_code == 200 and res.json()["status"] == "completed"
    outcomes = served.location.seam.outcomes
    assert outcomes is not None
    assert await outcomes.prune(time.time() + 1) == 2

    state = (await served.client.get("/v1/health")).json()["state"]
    assert set(state["bytes"]) == PARTS
    assert state["total_bytes"] == sum(state["bytes"].values())
    assert state["bytes"]["outcomes"] > 0 and state["bytes"]["managed_index"] > 0
    store = (await served.location.seam.store.stats())
    assert state["bytes"]["managed_objects"] == store.bytes > 0  # `big` retained its text
    assert state["retention_seconds"] == served.location.retention_seconds
    upkeep = state["upkeep"]
    assert (upkeep["outcomes_stored"], upkeep["outcomes_expired"],
            upkeep["outcomes_pruned"]) == (0, 2, 2)
    assert upkeep["managed_evicted_expired"] == upkeep["managed_evicted_quota"] == 0

    metrics = (await served.client.get("/metrics")).text
    assert f'sidecar_state_bytes{{part="managed_objects"}} {float(store.bytes)}' in metrics
    for part in PARTS:
        assert f'sidecar_state_bytes{{part="{part}"}} ' in metrics
    assert "sidecar_outcomes_pruned_total 2.0" in metrics
    assert "sidecar_outcomes_expired 2.0" in metrics
    assert "sidecar_outcomes_stored 0.0" in metrics
    assert 'sidecar_store_evicted_total{reason="expired"} 0.0' in metrics
    assert 'sidecar_store_evicted_total{reason="quota"} 0.0' in metrics
    assert "sidecar_wal_truncations_total " in metrics


async def test_a_pruned_call_id_posted_again_answers_expired(served):
    sid = await snapshot(served)
    call = {"name": "echo", "input": {"text": "once"}, "context": ctx("p1")}
    first = await served.client.post(f"/v1/snapshots/{sid}/calls", json=call)
    assert first.json()["status"] == "completed"
    assert served.location.seam.outcomes is not None
    await served.location.seam.outcomes.prune(time.time() + 1)
    again = await served.client.post(f"/v1/snapshots/{sid}/calls", json=call)
    body = again.json()
    assert again.status_code == 200 and body["status"] == "error" and body["replayed"]
    assert body["error"]["kind"] == "expired"
    assert "pruned after the retention period" in body["error"]["message"]
