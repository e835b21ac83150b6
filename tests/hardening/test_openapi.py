"""Issue 26 item 14: the OpenAPI document describes the events /v1/events sends, and every
route, known or not, answers errors in the JSON error body."""

from __future__ import annotations

import json
import threading
from typing import Any

import jsonschema

from tests.hardening.conftest import Daemon


def _events(daemon: Daemon, count: int) -> list[dict[str, Any]]:
    """The first `count` events of /v1/events while a call runs, parsed as an SSE client
    (and schemathesis) parses them: one object per event with `event`, `data` and `id`."""
    events: list[dict[str, Any]] = []
    current: dict[str, Any] = {}
    with daemon.client() as client, client.stream("GET", "/v1/events") as stream:
        assert stream.headers["content-type"].startswith("text/event-stream")
        caller = threading.Thread(target=daemon.call, args=("text", {"line": "x", "count": 2},
                                                            "evented"))
        caller.start()
        for line in stream.iter_lines():
            if line == "":
                if current:
                    events.append(current)
                    current = {}
                if len(events) == count:
                    break
            elif not line.startswith(":"):
                field, _, value = line.partition(":")
                current[field] = value.removeprefix(" ")
    caller.join(timeout=60)
    return events


def test_sent_events_match_the_documented_event_schema(daemon: Daemon) -> None:
    with daemon.client() as client:
        document = client.get("/v1/openapi.json").json()
    media = document["paths"]["/v1/events"]["get"]["responses"]["200"]["content"]
    schema = media["text/event-stream"]["schema"]
    events = _events(daemon, 1)  # call.settled at least
    assert events
    for event in events:
        jsonschema.validate(event, schema)
        json.loads(event["data"])
    assert "call.settled" in schema["properties"]["event"]["enum"]
    daemon.health()


def test_unknown_routes_and_methods_answer_the_json_error_body(daemon: Daemon) -> None:
    with daemon.client() as client:
        missing = client.get("/v1/nothing-here")
        assert missing.status_code == 404
        assert missing.headers["content-type"] == "application/json"
        assert missing.json()["error"] == {"code": "not_found",
                                           "message": "no route GET /v1/nothing-here"}
        assert client.get("/").json()["error"]["code"] == "not_found"
        wrong = client.put("/v1/health")
        assert wrong.status_code == 405
        assert wrong.json()["error"]["code"] == "method_not_allowed"
        assert "GET" in wrong.headers["allow"]
    daemon.health()
