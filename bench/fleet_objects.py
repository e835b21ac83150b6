"""Section 3 of `bench/fleet.py`: a 100 MB spool and `managed_read` first-byte latency with
the managed store on S3 (SeaweedFS, `SIDECAR_OBJECT_STORE`) against the local directory, all
opened by the composition root as a Location opens them, beside the raw `obstore` path and a
plain file write. The S3 engine runs in both write modes (`SIDECAR_OBJECT_STORE_WRITE`):
write-behind (the default: the commit returns once the object is staged locally and indexed;
also timed until a second store instance, another Location on the same bucket and database,
can read it, i.e. until the upload completed) and write-through."""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import functools
import os
import statistics
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import psutil
from fleet_common import MB, environment, process_cpu, table, verdict
from fleet_servers import PostgresServer, SeaweedS3

from sidecar import Location, ToolContext


def text_chunks(total: int, chunk: int = MB) -> list[bytes]:
    """`total` bytes of text in lines of 99 characters, random (SeaweedFS would compress a
    repeated text; a real tool output does not compress to nothing)."""
    chunks = []
    for _ in range(max(1, total // chunk)):
        raw = base64.b64encode(os.urandom(chunk * 3 // 4 * 99 // 100))[: chunk // 100 * 99]
        chunks.append(b"\n".join(raw[i:i + 99] for i in range(0, len(raw), 99)) + b"\n")
    return chunks


async def timed(make: Callable[[], Awaitable[Any]]) -> tuple[float, Any]:
    start = time.perf_counter()
    result = await make()
    return time.perf_counter() - start, result


async def spool_timed(spools: dict[str, list[float]], cpu: dict[str, list[tuple[float, float]]],
                      s3_pid: int, name: str, make: Callable[[], Awaitable[Any]]) -> Any:
    """Time one spool, with the CPU this process and the S3 server spent on it."""
    me = psutil.Process()
    mine, theirs = sum(me.cpu_times()[:2]), process_cpu(s3_pid)
    took, result = await timed(make)
    spools.setdefault(name, []).append(took)
    cpu.setdefault(name, []).append((sum(me.cpu_times()[:2]) - mine,
                                     process_cpu(s3_pid) - theirs))
    return result


LOCAL = "local directory (TextStore)"
BEHIND = "S3 write-behind ({engine}): commit returned"
READABLE = "S3 write-behind: readable on a second store (upload done)"
THROUGH = "S3 write-through ({engine})"


async def spool_behind(spools: dict[str, list[float]], cpu: dict[str, list[tuple[float, float]]],
                       s3_pid: int, names: tuple[str, str], store: Any, other: Any,
                       chunks: list[bytes]) -> Any:
    """A write-behind spool, timed twice: until its commit returned, and until `other` (a
    second store instance) reads its first byte, which waits for the upload."""
    me = psutil.Process()
    mine, theirs = sum(me.cpu_times()[:2]), process_cpu(s3_pid)
    start = time.perf_counter()
    ref = await spool_into(store, chunks, "bench")
    committed = time.perf_counter() - start
    at_commit = (sum(me.cpu_times()[:2]) - mine, process_cpu(s3_pid) - theirs)
    await other.read_bytes(ref.id, 0, 1)
    readable = time.perf_counter() - start
    for name, took, used in ((names[0], committed, at_commit),
                             (names[1], readable, (sum(me.cpu_times()[:2]) - mine,
                                                   process_cpu(s3_pid) - theirs))):
        spools.setdefault(name, []).append(took)
        cpu.setdefault(name, []).append(used)
    return ref


async def spool_into(store: Any, chunks: list[bytes], namespace: str) -> Any:
    async with store.open_spool(namespace=namespace) as spool:
        for chunk in chunks:
            await spool.write(chunk)
        return await spool.commit()


def write_file(path: Path, chunks: list[bytes]) -> None:
    with path.open("wb") as f:
        for chunk in chunks:
            f.write(chunk)
        f.flush()
        os.fsync(f.fileno())


async def managed_read(snapshot: Any, ref: str) -> Any:
    """The built-in `managed_read` tool through the seam: the first line of `ref`."""
    return await snapshot.execute("managed_read", {"ref": ref, "offset": 1, "limit": 1},
                                  ToolContext("bench", "bench", "m", uuid.uuid4().hex))


async def obstore_writer(store: Any, key: str, chunks: list[bytes], part_mib: int) -> None:
    """Streamed: a part is uploaded once `part_mib` MiB are buffered, up to 8 at a time."""
    import obstore

    writer = obstore.open_writer_async(store, key, buffer_size=part_mib * 1024 * 1024,
                                       max_concurrency=8)
    for chunk in chunks:
        await writer.write(chunk)
    await writer.close()


async def section_objects(opts: argparse.Namespace, pg: PostgresServer, s3: SeaweedS3) -> str:
    import obstore

    chunks = text_chunks(opts.mb * MB)
    size = sum(len(c) for c in chunks)
    raw_store = s3.object_store()
    spools: dict[str, list[float]] = {}
    cpu: dict[str, list[tuple[float, float]]] = {}  # (this process, SeaweedFS) per spool
    first: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="sidecar-fleet-") as tmp:
        async with contextlib.AsyncExitStack() as stack:
            local = await stack.enter_async_context(Location.open(
                tmp, state_dir=Path(tmp) / "local", durable=True, name="bench",
                entry_point_plugins=False, store_quota_bytes=20 * size))
            fleet_env = {**s3.env("bench"), "SIDECAR_DATABASE_URL": await pg.new_database()}
            remote = {}
            for mode in ("behind", "through"):
                with environment({**fleet_env, "SIDECAR_OBJECT_STORE_WRITE": mode}):
                    remote[mode] = await stack.enter_async_context(Location.open(
                        tmp, state_dir=Path(tmp) / mode, durable=True, name="bench",
                        entry_point_plugins=False, store_quota_bytes=20 * size))
            engine = type(remote["behind"].seam.store).__name__
            s3_engine = engine != type(local.seam.store).__name__
            behind, through = BEHIND.format(engine=engine), THROUGH.format(engine=engine)
            stores = {LOCAL: local}
            if s3_engine:
                stores[behind] = remote["behind"]
                stores[through] = remote["through"]
            refs: dict[str, Any] = {}
            spooled = functools.partial(spool_timed, spools, cpu, s3.process.pid)
            for r in range(opts.rounds):
                names = list(stores)
                for name in names[r % len(names):] + names[:r % len(names)]:
                    if name == behind:
                        refs[name] = await spool_behind(
                            spools, cpu, s3.process.pid, (behind, READABLE),
                            stores[name].seam.store, remote["through"].seam.store, chunks)
                        continue
                    refs[name] = await spooled(name, functools.partial(
                        spool_into, stores[name].seam.store, chunks, "bench"))
                await spooled("local file: write + fsync (floor)", functools.partial(
                    asyncio.to_thread, write_file, Path(tmp) / "plain", chunks))
                for part in (8, 32):
                    await spooled(f"S3 raw: obstore multipart writer, {part} MiB parts",
                                  functools.partial(obstore_writer, raw_store, f"raw/{r}-{part}",
                                                    chunks, part))
                await spooled("S3 raw: one PUT of the whole text (held in memory)",
                              functools.partial(obstore.put_async, raw_store, f"raw/{r}",
                                                b"".join(chunks), use_multipart=False))
            # first byte: the built-in `managed_read` through the seam (first line of the
            # text), the store's read_bytes at the start and in the middle, a ranged GET
            middle = f"{size // 2 // MB} MB"
            reads: dict[str, Callable[[], Awaitable[Any]]] = {}
            for name, location in stores.items():
                ref, store = refs[name].id, location.seam.store
                name = name.removesuffix(": commit returned")
                reads[f"{name}: managed_read, line 1"] = functools.partial(
                    managed_read, location.snapshot(), ref)
                reads[f"{name}: read_bytes 64 KiB at 0"] = functools.partial(
                    store.read_bytes, ref, 0, 65536)
                reads[f"{name}: read_bytes 64 KiB at {middle}"] = functools.partial(
                    store.read_bytes, ref, size // 2, 65536)
            key = f"raw/{opts.rounds - 1}"
            reads["S3 raw: ranged GET 64 KiB at 0"] = functools.partial(
                obstore.get_range_async, raw_store, key, start=0, end=65536)
            reads[f"S3 raw: ranged GET 64 KiB at {middle}"] = functools.partial(
                obstore.get_range_async, raw_store, key, start=size // 2, end=size // 2 + 65536)
            for _ in range(opts.reads):
                for name, read in reads.items():
                    took, result = await timed(read)
                    status = getattr(result, "status", "completed")
                    if status != "completed":
                        raise RuntimeError(f"{name}: {result.error}")
                    first.setdefault(name, []).append(took)
            await obstore.delete_async(raw_store, [f"raw/{r}{part}" for r in range(opts.rounds)
                                                   for part in ("", "-8", "-32")])
    local_name = LOCAL
    rows = []
    for name, times in spools.items():
        ratio = statistics.median(times) / statistics.median(spools[local_name])
        rows.append([name, f"{statistics.median(times):.2f}", f"{min(times):.2f}",
                     f"{size / MB / statistics.median(times):,.0f}", f"{ratio:.2f}x",
                     f"{statistics.median(c[0] for c in cpu[name]):.2f}",
                     f"{statistics.median(c[1] for c in cpu[name]):.2f}"])
    streamed = [n for n in spools if n.startswith("S3 raw: obstore multipart")]
    s3_row = next((n for n in spools if n.startswith("S3 write-behind (")),
                  min(streamed, key=lambda n: statistics.median(spools[n])))
    ratio_of = {name: statistics.median(times) / statistics.median(spools[local_name])
                for name, times in spools.items()}
    s3_ratio = statistics.median(spools[s3_row]) / statistics.median(spools[local_name])
    # the server's work for the whole upload (a write-behind commit returns before it ends)
    server_cpu = statistics.median(c[1] for c in cpu.get(READABLE, cpu[s3_row]))
    local_time = statistics.median(spools[local_name])
    read_rows = [[name, f"{times[0] * 1e3:.2f}", f"{statistics.median(times) * 1e3:.2f}",
                  f"{max(times) * 1e3:.2f}"] for name, times in first.items()]
    engine_note = (f"The S3 rows are the managed-store engine the composition root chose "
                   f"({engine}), once per write mode; the write-behind spool is timed until its "
                   "commit returned and, in the same run, until a second store instance (the "
                   "write-through Location: another pool, no staging) could read its first "
                   "byte, which waits for the upload (it polls the index every 250 ms at most)."
                   if s3_engine else
                   "The S3-backed managed store is not in this tree yet: with "
                   "`SIDECAR_OBJECT_STORE` set the composition root still opened the local "
                   f"store ({engine}), so the S3 rows are the raw `obstore` path (what the "
                   "engine will build on), not yet the engine.")
    return "\n".join([
        f"### 3. Managed objects: a {size / MB:.0f} MB spool and first-byte latency, S3 "
        f"(SeaweedFS) vs the local directory ({opts.rounds} interleaved rounds)",
        "",
        "Spool: the text streamed in 1 MB chunks (`open_spool` → `write` → `commit`, the "
        "`TextStore` protocol) into the store a Location opened, its order alternating per "
        "round. Text: random base64 lines of 99 characters. SeaweedFS `weed mini` runs on "
        "this machine and writes to the same disk. " + engine_note,
        "",
        table(["spool", "median s", "best s", "MB/s", "vs local directory",
               "cpu s (this process)", "cpu s (SeaweedFS)"], rows),
        "",
        f"First byte ({opts.reads} reads each, taking turns; the first read is the cold one):",
        "",
        table(["read", "first ms", "median ms", "max ms"], read_rows),
        "",
        "Baseline: the local directory's spool in the same rounds. Target: a 100 MB spool to "
        "S3 within 2x.",
        "",
        f"- {s3_row}: {s3_ratio:.2f}x the local directory's spool: "
        f"{verdict(s3_ratio <= 2.0)} (target <= 2x)"
        + ("" if s3_engine else " (raw path; the engine is not measured yet)") + "."
        + (f" Readable on a second store (upload done): {ratio_of[READABLE]:.2f}x; "
           f"write-through: {ratio_of[through]:.2f}x." if s3_engine else "") + " The S3 "
        f"server alone spent {server_cpu:.2f} CPU-s on the upload, "
        f"{server_cpu / local_time:.1f}x the local spool's {local_time:.2f} s"
        + (": on these shared cores the object store's own work decides how soon an upload "
           "ends; a remote S3 puts that work on other machines." if server_cpu > 2 * local_time
           else "."),
    ])
