#!/usr/bin/env python3
"""What a sidecar's sparse zero tail costs a reader (issue 44: `report` took 4.4 s a GiB of holes).

    python3 tools/bench_sparse_tail.py [--gib 16] [--rounds 5]

Writes one sealed trace (tests/support/tracegen.py's raw blocks of repeated pairs, sealed by the
launcher's own Sealer: a sidecar of several entries), then reads it with `read_trace` as it is
and with the sidecar's size run on by --gib GiB of holes (os.truncate: never written), rounds
alternated, in this one process. Prints the median read time of each and the added time per GiB
of holes (CPU time of this process: what the reading costs, whatever else runs on the machine).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))


def _trace(d: Path, pairs: int) -> Path:
    from cudatrace.analyze.read.trace import C
    from cudatrace.record.seal import Sealer
    from support.tracegen import BASE_TS, TraceWriter

    K = C()
    p = d / "1.0.ctrace"
    w = TraceWriter(p, pid=1)  # pid 1, another start time: a process that is gone

    def events():
        ts = BASE_TS
        for i in range(pairs):
            ts += 1000
            a = 0x7F0000000000 + (i % 64 << 21)
            yield 0, (ts, 1 << 20, a, 0, 0, 1000, 0, 0, 3, 5, 0, K["CT_OP_ALLOC"], 4, 1, 0, 0)
            yield 0, (ts + 500, 0, a, 0, 0, 1000, 0, 0, 4, 7, 0, K["CT_OP_FREE"], 0, 1, 0, 0)

    w.block_events(events(), raw=True)
    w.close(clean=False)
    Sealer(d).pass_once(final=True)
    return p


def _read_cpu(p: Path) -> float:
    from cudatrace.analyze.read.trace import read_trace

    t0 = time.process_time()
    t = read_trace(p)
    assert not t.lost_chunks and t.n_events
    return time.process_time() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gib", type=int, default=16, help="GiB of holes after the sidecar (16)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--pairs", type=int, default=400_000)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="ct-sparse-") as w:
        plain = Path(w) / "plain"
        plain.mkdir()
        p = _trace(plain, args.pairs)
        holed = Path(w) / "holed"
        shutil.copytree(plain, holed)
        side = holed / (p.name + ".z")
        os.truncate(side, side.stat().st_size + (args.gib << 30))
        a, b = [], []
        for _ in range(args.rounds):
            a.append(_read_cpu(plain / p.name))
            b.append(_read_cpu(holed / p.name))
    ma, mb = statistics.median(a), statistics.median(b)
    print(
        f"read_trace, sidecar as written:          {ma * 1e3:8.1f} ms CPU (median of {args.rounds})"
    )
    print(f"read_trace, sidecar + {args.gib} GiB of holes: {mb * 1e3:8.1f} ms CPU")
    print(f"added per GiB of holes:                  {(mb - ma) / args.gib * 1e3:8.2f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
