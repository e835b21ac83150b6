"""`Metrics` keeps each label set's children at hand: the counts are those `labels()` gives,
and past `MAX_LABELSETS` (tool, server) pairs new pairs still count under `other`."""

from __future__ import annotations

from sidecar.model.content import TextContent
from sidecar.model.outcome import Outcome
from sidecar.serve import metrics as metrics_module
from sidecar.serve.metrics import Metrics
from sidecar.stores.call_history import CallRecord


def record(tool: str, server: str | None = "up", replayed: bool = False) -> CallRecord:
    return CallRecord("c", tool, server, None, "s", "a", "m", "completed", None, 1.0, 2.0, 10,
                      None, 3, (), replayed)


def test_counts_by_label_set_and_the_overflow(monkeypatch) -> None:
    monkeypatch.setattr(metrics_module, "MAX_LABELSETS", 2)
    m = Metrics()
    done = Outcome(call_id="c", tool="echo", status="completed", content=(TextContent("hé"),))
    for _ in range(3):
        m.observe(done, 0.002)
        m.observe_record(record("echo"))
    m.observe_record(record("echo", replayed=True))  # a replay is not counted again
    for tool in ("t1", "t2", "t3", "t2", "t3"):
        m.observe_record(record(tool, None))
    value = m.registry.get_sample_value
    assert value("sidecar_calls_total", {"tool": "echo", "status": "completed",
                                         "error_kind": ""}) == 3
    assert value("sidecar_text_bytes_total", {"kind": "bounded"}) == 9
    assert value("sidecar_call_seconds_count", {"tool": "echo"}) == 3
    duration = "sidecar_call_duration_seconds_count"
    assert value(duration, {"tool": "echo", "server": "up"}) == 3
    assert value(duration, {"tool": "t1", "server": ""}) == 1
    assert value(duration, {"tool": "t2", "server": ""}) is None
    assert value(duration, {"tool": "other", "server": "other"}) == 4
    assert value("sidecar_call_input_bytes_sum", {"tool": "other", "server": "other"}) == 40
