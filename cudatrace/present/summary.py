"""The summary `cudatrace run` prints when the command ends: a few lines of the report, built on
the same base (analyze.analysis.Analysis), so its numbers are the report's."""

from __future__ import annotations

import os
from pathlib import Path

from ..analyze.analysis import Analysis, implausible
from ..analyze.names import fit, on_terminal
from ..units import format_bytes, printable
from .text import term_width


def print_summary(out_dir: Path, status: int, stream, top: int = 5) -> None:
    a = Analysis(out_dir)
    td, m = a.td, a.model

    def w(text: str) -> None:  # a trace's names reach the terminal escaped
        stream.write("\n".join(printable(x) for x in text.split("\n")))

    active = [i for i, p in enumerate(m.procs) if p.get("events")]
    truncated = [t for t in td.traces if not t.complete]
    w("cudatrace: command exited with status %d; trace in %s\n" % (status, out_dir))
    w(
        "  processes traced: %d (%d with CUDA memory activity)%s\n"
        % (
            len(td.traces),
            len(active),
            ", %d without a clean exit record" % len(truncated) if truncated else "",
        )
    )
    for e in td.errors:
        w(f"  unreadable: {e}\n")
    for t in td.traces:
        if t.stopped_ns:
            w(
                "  pid %d: trace stopped at %.3f s (%s): events after it were lost, so memory "
                "freed later still counts as live\n"
                % (t.pid, a.seconds(t.stopped_ns) or 0.0, t.stopped_why)
            )
    c = m.counts
    w(
        "  device allocations %d, frees %d, failed %d, denied by budget %d; pinned host allocations %d\n"
        % (
            c.get("allocs", 0),
            c.get("frees", 0),
            c.get("failed", 0),
            c.get("denied", 0),
            c.get("host_allocs", 0),
        )
    )
    if not m.found:
        w(
            "  no device memory was allocated through the driver%s\n"
            % ("" if td.traces else " (no process used CUDA)")
        )
    else:
        w(
            f"  peak of live device memory: {format_bytes(m.peak_bytes)} at {a.seconds(m.peak_ts):.3f} s"
        )
        if len(m.device_peaks) > 1:
            w(
                " ({})".format(
                    ", ".join(
                        "device %d: %s" % (d, format_bytes(b))
                        for d, (b, _) in sorted(m.device_peaks.items())
                    )
                )
            )
        w(f"; live at exit: {format_bytes(m.end_bytes)}\n")
        for x in implausible(a):
            w(f"  {x}\n")
        obs = a.observed.compare(m.peak_ts, m.bytes_at, a.start_ns)
        near = obs.get("near_peak") or {}
        if obs["samples"] and not obs["overlap"]:
            w("  observed: no sample fell while traced memory was live (samples every ~100 ms)\n")
        elif near.get("tree_device_bytes") is not None:
            w(
                "  observed by NVML for the process tree near the peak: {} (traced then {}; untraced "
                "{}: contexts, module images, unhooked paths)\n".format(
                    format_bytes(near["tree_device_bytes"]),
                    format_bytes(near["traced_bytes"]),
                    format_bytes(near["untraced_bytes"]),
                )
            )
        elif obs["samples"]:
            w(
                "  observed: no NVML per-process figures (%s); see the report for RSS and "
                "MemAvailable\n" % (obs["nvml_why"] or obs["per_process_why"])
            )
        sites = a.sites(m.groups_at_peak(), "site", 1)
        w("  top call sites by bytes live at the peak:\n")
        width = term_width()
        for s in sites[:top]:
            share = 100.0 * s.bytes / m.peak_bytes if m.peak_bytes else 0
            entry = (f" via {s.via[-1].name()}") if s.via else ""  # the outermost layer
            line = "    %10s %5.1f%% %6d x  %s%s  [%s]" % (
                format_bytes(s.bytes),
                share,
                s.count,
                s.label(),
                entry,
                ", ".join(s.api_list()),
            )
            w(fit(line, width, on_terminal(stream)) + "\n")  # cut on a terminal only
    if m.failed:
        f = m.failed[0]
        w(
            "  failed allocations: %d (first: %s of %s)\n"
            % (len(m.failed), td.traces[f.trace].api_name(f.api), format_bytes(f.size))
        )
    if m.denied:
        ds = a.sites(m.denied, "site", 1)
        w(
            "  denied by the budget: %d (%s)\n"
            % (len(m.denied), "; ".join("%d at %s" % (d.count, d.label()) for d in ds[:3]))
        )
    w(f"  full report: cudatrace report {_rel(out_dir)}\n")


def _rel(p: Path) -> str:
    try:
        r = os.path.relpath(p)
        return r if not r.startswith("..") else str(p)
    except ValueError:
        return str(p)
