"""The summary `cudatrace run` prints when the command ends."""
from __future__ import annotations

import os
from pathlib import Path

from .budget import format_bytes
from .model import build
from .observed import Observed
from .sites import Stacks, group, make_symbolizer
from .trace import TraceError, read_dir


def print_summary(out_dir: Path, status: int, stream, top: int = 5) -> None:
    try:
        td = read_dir(out_dir)
    except TraceError as e:
        stream.write("cudatrace: command exited with status %d; no trace: %s\n"
                     "  (the preload library did not enter the command: was LD_PRELOAD removed, "
                     "or the binary static or setuid?)\n" % (status, e))
        return
    m = build(td)
    w = stream.write
    active = [t for t in td.traces if t.events]
    truncated = [t for t in td.traces if not t.complete]
    w("cudatrace: command exited with status %d; trace in %s\n" % (status, out_dir))
    w("  processes traced: %d (%d with CUDA memory activity)%s\n" % (
        len(td.traces), len(active),
        ", %d without a clean exit record" % len(truncated) if truncated else ""))
    for e in td.errors:
        w("  unreadable: %s\n" % e)
    c = m.counts
    w("  device allocations %d, frees %d, failed %d, denied by budget %d; pinned host allocations %d\n"
      % (c.get("allocs", 0), c.get("frees", 0), c.get("failed", 0), c.get("denied", 0),
         c.get("host_allocs", 0)))
    if m.peak_index < 0:
        w("  no device memory was allocated through the driver%s\n" % (
            "" if td.traces else " (no process used CUDA)"))
    else:
        t0 = min(t.start_monotonic_ns for t in td.traces)
        w("  peak of live device memory: %s at %.3f s" % (format_bytes(m.peak_bytes),
                                                         (m.peak_ts - t0) / 1e9))
        if len(m.device_peaks) > 1:
            w(" (%s)" % ", ".join("device %d: %s" % (d, format_bytes(b))
                                   for d, (b, _) in sorted(m.device_peaks.items())))
        w("; live at exit: %s\n" % format_bytes(m.end_bytes))
        obs = Observed(td)
        at = obs.at(m.peak_ts, m.peak_bytes)
        if at.get("observed_tree_device_bytes") is not None:
            w("  observed by NVML for the process tree near the peak: %s (untraced: %s: contexts, "
              "module images, unhooked paths)\n" % (format_bytes(at["observed_tree_device_bytes"]),
                                                   format_bytes(at["untraced_bytes"])))
        elif td.samples():
            w("  observed: no NVML (%s); see the report for RSS and MemAvailable\n" % obs.why_no_nvml())
        stacks = Stacks(td.traces, make_symbolizer())
        sites = group(m, m.live_at_peak, stacks, "site", 1)
        w("  top call sites by bytes live at the peak:\n")
        for s in sites[:top]:
            share = 100.0 * s.bytes / m.peak_bytes if m.peak_bytes else 0
            w("    %10s %5.1f%% %6d x  %s  [%s]\n" % (format_bytes(s.bytes), share, s.count,
                                                   s.label(), ", ".join(sorted(s.apis))))
    if m.failed:
        w("  failed allocations: %d (first: %s of %s)\n" % (
            len(m.failed), td.traces[m.failed[0].trace].api_name(m.failed[0].api),
            format_bytes(m.failed[0].size)))
    w("  full report: cudatrace report %s\n" % _rel(out_dir))


def _rel(p: Path) -> str:
    try:
        r = os.path.relpath(p)
        return r if not r.startswith("..") else str(p)
    except ValueError:
        return str(p)
