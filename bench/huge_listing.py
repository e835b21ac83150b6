"""How long `/v1/health` waits while an upstream sends a huge `tools/list` (issue 26 item 3).

Starts `sidecar serve` with one stdio server (`tests/hardening/servers/huge_list_server.py`)
whose `tools/list` answer is MB megabytes of JSON structure, polls `/v1/health` on one
keep-alive connection from the start until the server is ready, and then as long again with
the daemon idle (the baseline). Prints the latency percentiles of both and their ratio.

    .venv/bin/python bench/huge_listing.py [--mb 50]

Before the listing was parsed off the loop (2026-12-04, commit f2de488), 50 MB held the loop
in pieces of 4.4 s and 2.2 s (`json.loads` on the loop, then the SDK's result check).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

SERVER = Path(__file__).parent.parent / "tests" / "hardening" / "servers" / "huge_list_server.py"


def _start(state: Path, manifests: Path) -> tuple[subprocess.Popen[str], str]:
    env = {**os.environ, "SIDECAR_STATE_DIR": str(state), "SIDECAR_MANIFESTS": str(manifests)}
    env.pop("SIDECAR_TOKEN", None)
    proc = subprocess.Popen([sys.executable, "-m", "sidecar.cli", "serve", "--port", "0"],
                            env=env, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True)
    assert proc.stderr is not None
    for line in proc.stderr:
        if "listening on" in line:
            return proc, line.split("listening on ")[1].strip()
    raise SystemExit(f"serve exited early ({proc.wait()})")


def _poll(client: httpx.Client, until_ready: bool, count: int = 0) -> list[float]:
    latencies: list[float] = []
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        began = time.perf_counter()
        report = client.get("/v1/health").json()
        latencies.append(time.perf_counter() - began)
        state = report["servers"].get("huge", {}).get("state")
        if until_ready and state not in (None, "starting"):
            if state != "ready":
                raise SystemExit(f"the server did not start: {report['servers']['huge']}")
            return latencies
        if not until_ready and len(latencies) >= count:
            return latencies
        time.sleep(0.01)
    raise SystemExit("no result within 600 s")


def _row(name: str, latencies: list[float]) -> str:
    ordered = sorted(latencies)
    p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
    return (f"| {name} | {len(ordered)} | {1000 * statistics.median(ordered):.1f} | "
            f"{1000 * p99:.1f} | {1000 * ordered[-1]:.1f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=float, default=50.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        (root / "manifests").mkdir()
        (root / "manifests" / "huge.json").write_text(json.dumps({"mcpServers": {"huge": {
            "command": sys.executable, "args": [str(SERVER)],
            "env": {"HUGE_LIST_MB": str(args.mb)}, "timeouts": {"startup": 600}}}}))
        proc, url = _start(root / "state", root / "manifests")
        try:
            token = (root / "state" / "token").read_text().strip()
            with httpx.Client(base_url=url, timeout=600,
                              headers={"authorization": f"Bearer {token}"}) as client:
                began = time.monotonic()
                during = _poll(client, until_ready=True)
                took = time.monotonic() - began
                idle = _poll(client, until_ready=False, count=len(during))
        finally:
            proc.terminate()
            proc.wait(timeout=60)
    print(f"`tools/list` of {args.mb:g} MB: the server was ready after {took:.1f} s\n")
    print("| health | answers | p50 ms | p99 ms | max ms |\n|---|---|---|---|---|")
    print(_row("while the listing arrives", during))
    print(_row("idle (baseline)", idle))
    print(f"\nmax while listing / p50 idle: {max(during) / statistics.median(idle):.1f}x")


if __name__ == "__main__":
    main()
