"""trace_gaps.py TRACE_OR_DIR... - the time between one thread's consecutive events, read from a
raw trace (format 4, unsealed: what the shim writes without the launcher), standard library only
(it runs on the GPU machine beside tools/gpu/contention.sh, which keeps its last round's traces).

An allocation's time is stamped after its driver call and a free's before, so one thread's gap
from an allocation to its next free is the shim's work after the first call and before the
second plus the program's own between them: on a loop of pairs, what the shim keeps a thread
away from the driver. Prints, per trace: the alloc->free and free->alloc gaps (quantiles, ns),
and how much of the run's span no thread recorded anything for more than 10 us (a process-wide
stall: page faults, a lock, a chunk being mapped)."""

from __future__ import annotations

import struct
import sys
from collections import defaultdict
from pathlib import Path

MAGIC, RAWBLOCK, HEADER = 51107, 19, 256
SHORT, FULL = 1, 2
EVENT = struct.Struct("<QQQQQIiiIHHBBBBI4x")  # struct ct_event (trace_format.h), 72 bytes
OP_ALLOC, OP_FREE = 1, 2


def events(data: bytes) -> dict[int, list[tuple[int, int]]]:
    """(time, op) of each thread's events, by the writer's thread number"""
    out: dict[int, list[tuple[int, int]]] = defaultdict(list)
    ctx: dict[int, tuple[int, dict[int, int]]] = {}
    pos = HEADER
    while pos + 8 <= len(data):
        magic, typ, size = struct.unpack_from("<HHI", data, pos)
        if magic != MAGIC or size < 8:
            pos += 8  # a hole (zeros) or a cut tail
            continue
        if typ == RAWBLOCK:
            used, thread, _seq, flags = struct.unpack_from("<IIII", data, pos + 8)
            ts, ops = ctx.get(thread, (0, {})) if not flags & 1 else (0, {})
            p, end = pos + 24, min(pos + 24 + used, len(data))
            while p + 8 <= end:
                w0 = struct.unpack_from("<Q", data, p)[0]
                kind = w0 >> 56 & 0xF
                if kind == SHORT and p + 24 <= end:
                    dt = struct.unpack_from("<Q", data, p + 8)[0] & 0xFFFFFFFF
                    ts, op = ts + dt, ops.get(w0 >> 48 & 0xFF, 0)
                    p += 24
                elif kind == FULL and p + 80 <= end:
                    e = EVENT.unpack_from(data, p + 8)
                    ts, op = e[0], e[11]
                    ops[e[9] % 32 if e[9] < 256 else -1] = op
                    p += 80
                else:
                    break
                out[thread].append((ts, op))
            ctx[thread] = (ts, ops)
        pos += size
    return out


def quantiles(v: list[int]) -> str:
    if not v:
        return "none"
    v = sorted(v)
    q = [v[min(len(v) - 1, int(f * len(v)))] for f in (0.1, 0.5, 0.9, 0.99)]
    return f"p10 {q[0]:,} p50 {q[1]:,} p90 {q[2]:,} p99 {q[3]:,} max {v[-1]:,} (n {len(v):,})"


def report(path: Path) -> None:
    by_thread = events(path.read_bytes())
    af, fa, every = [], [], []
    for evs in by_thread.values():
        evs.sort()
        every += [t for t, _ in evs]
        for (t0, o0), (t1, o1) in zip(evs, evs[1:]):
            if (o0, o1) == (OP_ALLOC, OP_FREE):
                af.append(t1 - t0)
            elif (o0, o1) == (OP_FREE, OP_ALLOC):
                fa.append(t1 - t0)
    every.sort()
    idle = [b - a for a, b in zip(every, every[1:]) if b - a > 10_000]
    span = every[-1] - every[0] if every else 0
    print(f"{path} ({len(by_thread)} threads, {len(every):,} events)")
    print(f"  alloc->free ns: {quantiles(af)}")
    print(f"  free->alloc ns: {quantiles(fa)}")
    print(
        f"  no event for > 10 us: {len(idle):,} times, {sum(idle) / 1e6:,.1f} ms of {span / 1e6:,.1f} ms"
    )


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__.split("\n\n")[0], file=sys.stderr)
        return 2
    for a in map(Path, argv):
        for f in sorted(a.glob("*.ctrace")) if a.is_dir() else [a]:
            report(f)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
