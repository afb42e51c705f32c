#!/usr/bin/env python3
"""Check that PyTorch's own memory viewer reads `cudatrace export --format memory-viz`.

    python3 tools/gpu/check_memory_viz.py TRACE_DIR_OR_PICKLE [-o OUTDIR] [--no-torch-ok]

Given a trace directory, exports it first (`cudatrace export DIR --format memory-viz --at end`).
Then, without torch: the pickle's protocol is <= 4 and its device traces lead exactly to its
segments. With torch (any machine with PyTorch; the GPU machine has it): torch.cuda._memory_viz
renders trace_plot (the Active Memory Timeline), trace_plot(plot_segments=True) and
segment_plot (Allocator State History) into OUTDIR/*.html, each non-empty and carrying the
snapshot, and its text views (segsum, trace) run over it. Prints one line per check; exits
non-zero on the first failure. --no-torch-ok: without torch, stop after the torch-free checks
with status 0 (what the test suite runs here).
"""

from __future__ import annotations

import argparse
import os
import pickle
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def export(trace_dir: Path, out: Path) -> Path:
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "cudatrace",
            "export",
            str(trace_dir),
            "--format",
            "memory-viz",
            "--at",
            "end",
            "-o",
            str(out),
        ],
        env=env,
        capture_output=True,
        text=True,
    )
    if r.returncode != 0:
        sys.exit(f"export failed:\n{r.stdout}{r.stderr}")
    print(r.stderr.strip())
    return out


def check_plain(data: bytes) -> dict:
    if not (data[:1] == b"\x80" and data[1] <= 4):
        sys.exit("FAIL: not a pickle of protocol <= 4 (the viewer needs 4 at most)")
    snap = pickle.loads(data)
    for dev, entries in enumerate(snap["device_traces"]):
        segs: dict[int, int] = {}
        blocks: dict[int, int] = {}
        for e in entries:
            a = e["action"]
            if a == "segment_alloc":
                segs[e["addr"]] = e["size"]
            elif a == "alloc":
                blocks[e["addr"]] = e["size"]
            elif a == "free_completed":
                blocks.pop(e["addr"])
            elif a == "segment_free":
                segs.pop(e["addr"])
        final = {s["address"]: s["total_size"] for s in snap["segments"] if s["device"] == dev}
        if not (segs == blocks == final):
            sys.exit("FAIL: device %d: the trace does not lead to the snapshot's segments" % dev)
    n = sum(len(t) for t in snap["device_traces"])
    live = sum(s["total_size"] for s in snap["segments"])
    print(
        "snapshot ok: protocol %d, %d devices, %d trace entries, %d segments (%d bytes live)"
        % (data[1], len(snap["device_traces"]), n, len(snap["segments"]), live)
    )
    return snap


def check_torch(snap: dict, outdir: Path) -> None:
    from torch.cuda import _memory_viz as mv

    outdir.mkdir(parents=True, exist_ok=True)
    plots = [
        ("trace_plot", lambda: mv.trace_plot(snap)),
        ("trace_plot_segments", lambda: mv.trace_plot(snap, plot_segments=True)),
        ("segment_plot", lambda: mv.segment_plot(snap)),
    ]
    for name, fn in plots:
        html = fn()
        if not html or "snapshot.pickle" not in html or len(html) < 200:
            sys.exit("FAIL: %s produced no usable HTML (%d chars)" % (name, len(html or "")))
        (outdir / (name + ".html")).write_text(html)
        print("%s ok: %d chars -> %s" % (name, len(html), outdir / (name + ".html")))
    for name in ("segsum", "trace"):
        fn = getattr(mv, name, None)
        if fn is None:
            print(f"{name}: not in this torch version, skipped")
            continue
        text = fn(snap)
        if not text:
            sys.exit(f"FAIL: {name} printed nothing")
        print("%s ok: %d lines" % (name, text.count("\n") + 1))
    import torch

    print(f"torch {torch.__version__}: torch.cuda._memory_viz renders the export")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    ap.add_argument("path", type=Path, help="a trace directory or an exported .pickle")
    ap.add_argument("-o", "--outdir", type=Path, default=None, help="where the HTML goes")
    ap.add_argument(
        "--no-torch-ok",
        action="store_true",
        help="without torch, stop after the torch-free checks (status 0)",
    )
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="cudatrace-memviz-"))
    pk = args.path
    if pk.is_dir():
        pk = export(pk, work / "snapshot.pickle")
    snap = check_plain(pk.read_bytes())
    try:
        import torch  # noqa: F401
    except ImportError:
        if args.no_torch_ok:
            print("torch is not installed: torch.cuda._memory_viz not checked")
            return 0
        sys.exit("FAIL: torch is not installed (run this where PyTorch is)")
    check_torch(snap, args.outdir or work)
    return 0


if __name__ == "__main__":
    sys.exit(main())
