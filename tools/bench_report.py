#!/usr/bin/env python3
"""Benchmark: read + replay + report a synthetic trace of many events (default 10 million).

    python3 tools/bench_report.py                   # 10M events over 4 processes, 2 devices
    python3 tools/bench_report.py --events 1000000 --procs 1 --backend python   # the oracle

The trace directory is generated once with tests/support/tracegen.py (the same layouts and the
same encoder as the shim: by default format version 3's event blocks, 2 threads per process,
about 7 bytes per event; --format events: the old 72-byte records), in a child process, and
cached under /tmp/cudatrace-bench-report/<events>-<procs>-<format>.../. Then, timed: read_dir,
model.build (the C replay; --backend python: the tests' Python oracle), the report (grouping by
site with symbolization, text, JSON and the SVG timeline). The target (issue 25): <= 5 s and
<= 500 MB peak RSS for 10M events on this 2-core machine; the last lines print both figures
next to their targets.

The workload is what a malloc-heavy program looks like: per process 200 call sites, an
allocation pool that grows to ~20k live blocks and shrinks again in waves, frees in a scrambled
order, addresses reused, a few failed allocations, denials and memory queries, and a leak of one
block in 50 that is never freed.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from cudatrace.analyze.read.trace import C  # noqa: E402
from support import tracegen as tg  # noqa: E402

TARGET_S, TARGET_MB = 5.0, 500.0
CACHE = Path(os.environ.get("CUDATRACE_BENCH_DIR", "/tmp/cudatrace-bench-report"))


def generate(
    d: Path,
    events: int,
    procs: int,
    seed: int = 12345,
    workload: str = "mixed",
    fmt: str = "blocks",
    threads: int = 2,
) -> None:
    """Write `events` events split over `procs` trace files, plus run.json and samples.
    workload "leak": nothing is ever freed (the worst case for what is live at the end).
    fmt "blocks": what the shim writes (format version 3: each thread's compact events in
    blocks of its own, so a file of several threads is not in time order); "events": the
    72-byte EVENT records of format version 1. threads: threads per process (blocks only)."""
    K = C()
    d.mkdir(parents=True, exist_ok=True)
    per = events // procs
    t_start = tg.BASE_TS
    duration = 60 * tg.SEC
    for p in range(procs):
        pid = 2000 + p
        w = tg.TraceWriter(
            d / ("%d.0.ctrace" % pid),
            pid=pid,
            ppid=1999 if p == 0 else 2000,
            exe="/usr/bin/python3",
            argv=["python3", "bench.py", str(p)],
            start_ns=t_start,
        )
        fr = tg.Frames(None)
        fr.write_modules(w)
        stacks = [
            w.stack(fr.stack("site_%03d" % s, "layer_%d" % (s % 7), "main")) for s in range(200)
        ]
        api_alloc, api_free = w.api_id("cuMemAlloc_v2"), w.api_id("cuMemFree_v2")
        rt_alloc, rt_free = w.api_id("cudaMalloc"), w.api_id("cudaFree")
        api_info, rt_info = w.api_id("cuMemGetInfo_v2"), w.api_id("cudaMemGetInfo")
        OP_A, OP_F, OP_M, OP_D = (
            K["CT_OP_ALLOC"],
            K["CT_OP_FREE"],
            K["CT_OP_MEMINFO"],
            K["CT_OP_DENY"],
        )
        KD, SP = K["CT_KIND_DEVICE"], K["CT_SPACE_DEVPTR"]
        flags = K["CT_EF_RUNTIME_KNOWN"]
        dev = p % 2
        step = duration // per
        nth = threads if fmt == "blocks" else 1

        def gen():
            x = seed + p
            live: list[tuple[int, int]] = []  # (addr, stack)
            free_addrs: list[int] = []
            next_addr = 0x7F0000000000 + (p << 36)
            ts = t_start + p * 1000
            n = 0
            while n < per:
                x = (x * 6364136223846793005 + 1442695040888963407) & 0xFFFFFFFFFFFFFFFF
                r = x >> 33
                ts += step
                th = (r >> 24) % nth
                tid = 7 + th
                wave = (n // 400000) % 2 == 0  # grow, then shrink
                target = 20000 if wave else 2000
                if n % 5000 == 4999:
                    yield (
                        th,
                        (
                            ts,
                            80 << 30,
                            40 << 30,
                            40 << 30,
                            80 << 30,
                            tid,
                            dev,
                            0,
                            stacks[0],
                            api_info,
                            rt_info,
                            OP_M,
                            0,
                            0,
                            0,
                            0,
                        ),
                    )
                elif n % 250000 == 124999:
                    yield (
                        th,
                        (
                            ts,
                            64 << 30,
                            0,
                            0,
                            0,
                            tid,
                            dev,
                            2,
                            stacks[r % 200],
                            api_alloc,
                            rt_alloc,
                            OP_A,
                            KD,
                            SP,
                            flags,
                            0,
                        ),
                    )
                elif n % 500000 == 249999:
                    yield (
                        th,
                        (
                            ts,
                            8 << 30,
                            0,
                            16 << 30,
                            15 << 30,
                            tid,
                            dev,
                            2,
                            stacks[r % 200],
                            api_alloc,
                            rt_alloc,
                            OP_D,
                            KD,
                            SP,
                            flags,
                            0,
                        ),
                    )
                elif workload == "mixed" and live and (len(live) > target or (r & 3) == 0):
                    i = r % len(live)
                    addr, st = live[i]
                    live[i] = live[-1]
                    live.pop()
                    if st % 50 == 7 and (r & 1):  # this site leaks: never freed
                        continue
                    free_addrs.append(addr)
                    yield (
                        th,
                        (
                            ts,
                            0,
                            addr,
                            0,
                            0,
                            tid,
                            dev,
                            0,
                            stacks[st],
                            api_free,
                            rt_free,
                            OP_F,
                            0,
                            SP,
                            flags,
                            0,
                        ),
                    )
                else:
                    s = r % 200
                    size = (1 << (12 + (r >> 8) % 10)) + ((r >> 4) & 0xF00)
                    if free_addrs and (r & 4):
                        addr = free_addrs.pop()
                    else:
                        addr = next_addr
                        next_addr += 1 << 26
                    live.append((addr, s))
                    yield (
                        th,
                        (
                            ts,
                            size,
                            addr,
                            0,
                            0,
                            tid,
                            dev,
                            0,
                            stacks[s],
                            api_alloc,
                            rt_alloc,
                            OP_A,
                            KD,
                            SP,
                            flags,
                            0,
                        ),
                    )
                n += 1

        if fmt == "blocks":
            w.block_events(gen(), nthreads=nth)
        else:
            w.raw_events(e for _, e in gen())
        w.close(end_ts=t_start + duration + 1)
    samples = [
        tg.sample(
            t_start + k * 100 * tg.MS,
            tree={0: (k % 50) << 26, 1: (k % 40) << 26},
            used=[(k % 50) << 26, (k % 40) << 26],
            pids=[2000 + p for p in range(procs)],
        )
        for k in range(0, 600)
    ]
    tg.write_run(d, argv=["python3", "bench.py"], samples=samples, start_ns=t_start - tg.MS)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--events", type=int, default=10_000_000)
    ap.add_argument("--procs", type=int, default=4)
    ap.add_argument("--regen", action="store_true", help="regenerate the cached trace")
    ap.add_argument(
        "--workload",
        choices=("mixed", "leak"),
        default="mixed",
        help="mixed: allocation waves with frees (default); leak: nothing freed",
    )
    ap.add_argument(
        "--format",
        choices=("blocks", "events"),
        default="blocks",
        help="blocks: format version 3 event blocks, as the shim writes (default); events: "
        "the 72-byte EVENT records of version 1",
    )
    ap.add_argument("--threads", type=int, default=2, help="threads per process (blocks)")
    ap.add_argument("--backend", choices=("c", "python"), default=None)
    ap.add_argument("--no-symbols", action="store_true", help="skip the symbolizer")
    ap.add_argument("--json", action="store_true", help="print the figures as JSON")
    ap.add_argument("--generate-only", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()

    d = CACHE / (
        "%d-%d%s-%s%s"
        % (
            args.events,
            args.procs,
            "" if args.workload == "mixed" else "-" + args.workload,
            args.format,
            "-t%d" % args.threads if args.format == "blocks" else "",
        )
    )
    if args.generate_only:
        t = time.perf_counter()
        if d.exists():
            shutil.rmtree(d)
        generate(
            d,
            args.events,
            args.procs,
            workload=args.workload,
            fmt=args.format,
            threads=args.threads,
        )
        mb = sum(p.stat().st_size for p in d.iterdir()) / 1e6
        print(
            f"generated {d} in {time.perf_counter() - t:.1f} s ({mb:.0f} MB, "
            f"{mb * 1e6 / args.events:.1f} bytes per event)",
            file=sys.stderr,
        )
        return 0
    if args.regen and d.exists():
        shutil.rmtree(d)
    if not (d / "run.json").exists():  # in a child: its memory is not this process's peak
        argv = [a for a in sys.argv[1:] if a not in ("--regen", "--json")]
        subprocess.run([sys.executable, __file__, *argv, "--generate-only"], check=True)

    from cudatrace.analyze.documents.analysis import Analysis
    from cudatrace.analyze.documents.report import build_report
    from cudatrace.analyze.read.trace import read_dir
    from cudatrace.present.plot import render_svg
    from cudatrace.present.report import render_text

    fig = {
        "events": args.events,
        "procs": args.procs,
        "workload": args.workload,
        "format": args.format,
        "threads": args.threads if args.format == "blocks" else 1,
        "dir": str(d),
        "trace_mb": round(sum(p.stat().st_size for p in d.glob("*.ctrace")) / 1e6, 1),
    }
    c0 = time.process_time()
    t0 = time.perf_counter()
    td = read_dir(d)
    t1 = time.perf_counter()
    if args.backend == "python":  # the tests' Python oracle instead of the C replay
        from cudatrace.analyze.documents import analysis
        from support.replay_oracle import build_with

        analysis.build = lambda td_, *a, **k: build_with(td_, "python", *a, **k)
    a = Analysis(d, td=td, symbolize=not args.no_symbols)
    t2 = time.perf_counter()
    r = build_report(a, at="peak", by="site", depth=1, top=10)
    text = render_text(r)
    js = json.dumps(r)
    t3 = time.perf_counter()
    end = build_report(a, at="end", by="site", depth=3, top=10)
    t4 = time.perf_counter()
    svg = render_svg(a, report=r)
    t5 = time.perf_counter()
    c5 = time.process_time()
    m = a.model
    fig.update(
        {
            "events_replayed": m.n_events,
            "backend": m.backend.name,
            "read_s": round(t1 - t0, 3),
            "build_s": round(t2 - t1, 3),
            "report_peak_s": round(t3 - t2, 3),
            "report_end_depth3_s": round(t4 - t3, 3),
            "svg_s": round(t5 - t4, 3),
            "total_s": round(t5 - t0, 3),
            # CPU time of this process over the same span: what other jobs' load changes least
            "total_cpu_s": round(c5 - c0, 3),
            "read_build_report_s": round(t3 - t0, 3),
            "peak_bytes": m.peak_bytes,
            "live_at_peak": r["total_live_count"],
            "live_at_end": end["total_live_count"],
            "sites_at_peak": len(r["sites"]) + r["more_sites"],
            "text_bytes": len(text),
            "json_bytes": len(js),
            "svg_bytes": len(svg),
            "max_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0, 1),
        }
    )
    # the targets (issue 25): read + replay + report of 10M events in <= 5 s and <= 0.5 GB
    fig["target_total_s"] = TARGET_S
    fig["target_rss_mb"] = TARGET_MB
    fig["meets_targets"] = fig["total_s"] <= TARGET_S and fig["max_rss_mb"] <= TARGET_MB
    try:
        fig["load_avg_1m"] = round(os.getloadavg()[0], 2)
    except OSError:
        pass
    if args.json:
        print(json.dumps(fig, indent=2))
    else:
        for k, v in fig.items():
            print("%-22s %s" % (k, v))
    return 0


if __name__ == "__main__":
    sys.exit(main())
