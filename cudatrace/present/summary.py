"""The summary `cudatrace run` prints when the command ends: a few lines of the report, built on
the same base (analyze.analysis.Analysis), so its numbers are the report's."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from ..analyze.documents.analysis import Analysis
from ..analyze.documents.ranks import outliers, split_devices, tables
from ..analyze.documents.report.notes import implausible, unrecorded
from ..analyze.read.runfacts import driver_used, no_driver_sentence
from ..analyze.read.tags import tagged
from ..analyze.replay.lives import AUX2
from ..analyze.sites.names import fit, on_terminal
from ..units import format_bytes, printable, shell_quote
from .text import end_label, no_sample_while_live, term_width, wrap_prose

if TYPE_CHECKING:
    from ..analyze.documents.analysis import Analysis


def print_summary(
    out_dir: Path,
    status: int,
    stream: TextIO,
    top: int = 5,
    driver: Callable[[], str | None] | None = None,
) -> None:
    """driver: where libcuda.so.1 is on this machine (record/cudadrv.driver_library), asked
    only when no process of the run used the CUDA driver."""
    a = Analysis(out_dir)
    td, m = a.td, a.model

    wrap = on_terminal(stream)

    def w(text: str) -> None:  # a trace's names reach the terminal escaped; prose is wrapped
        stream.write(wrap_prose("\n".join(printable(x) for x in text.split("\n")), terminal=wrap))

    w("cudatrace: command exited with status %d; trace in %s\n" % (status, out_dir))
    _processes(a, w)
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
    missing = unrecorded(a)
    for x in missing:
        w(f"  {x}\n")
    if not m.found and not missing and driver is not None and not driver_used(td.traces):
        simulated = bool(td.run.get("simulated"))
        found = None if simulated else driver()
        argv = shell_quote(td.run.get("argv") or ["CMD"])
        w(
            f"  {no_driver_sentence(found, simulated, 'no process', f'cudatrace run --simulated -- {argv}')}\n"
        )
    elif not m.found:
        w(
            "  no device memory allocation was recorded (see above: not everything could be)\n"
            if missing
            else "  no device memory was allocated through the driver%s\n"
            % ("" if td.traces else " (no process used CUDA)")
        )
    else:
        _peak(a, w)
        _observed(a, w)
        _sites(a, w, top, on_terminal(stream))
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
        # what was "in use" when nothing traced was live: CUDA contexts, which the budget counts
        first = m.denied[0]
        in_use, traced = first.event[AUX2], m.live_bytes_at(first.ts)[0]
        if in_use > traced:
            w(
                "  at the first denial %s was in use, %s of it not traced in this run: CUDA "
                "contexts and module images (in a --group, other members' memory too), which "
                "the budget counts (docs/budgets.md)%s\n"
                % (
                    format_bytes(in_use),
                    format_bytes(in_use - traced),
                    "; the budget must hold them too" if not traced else "",
                )
            )
    w(f"  full report: cudatrace report {_rel(out_dir)}\n")


def _processes(a: Analysis, w: Callable[[str], None]) -> None:
    """How many processes were traced, which files could not be read or stopped early."""
    td, m = a.td, a.model
    active = [i for i, p in enumerate(m.procs) if p.get("events")]
    truncated = [t for t in td.traces if not t.complete]
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
    for t in td.traces:  # fencing asked for and impossible (docs/budgets.md): never silent
        verdict, _, why = (t.info.get("fence") or "").partition(": ")
        if verdict:
            w(
                "  pid %d: %s: fencing could not be set up: %s\n"
                % (t.pid, "CUDA refused" if verdict == "refused" else "ran UNFENCED", why)
            )
    for t in td.traces:
        if t.stopped_ns:
            w(
                "  pid %d: trace stopped at %.3f s (%s): events after it were lost, so memory "
                "freed later still counts as live\n"
                % (t.pid, a.seconds(t.stopped_ns) or 0.0, t.stopped_why)
            )


def _peak(a: Analysis, w: Callable[[str], None]) -> None:
    """The peak (per device when there are several) and what was never freed."""
    m = a.model
    split = split_devices(a)  # one ordinal, several GPUs: per physical device (ranks.md)
    w(
        "  peak of live device memory%s: %s at %.3f s"
        % (
            ", all devices together" if split else "",
            format_bytes(m.peak_bytes),
            a.seconds(m.peak_ts) or 0.0,
        )
    )
    if split:
        devs = sorted(tables(a)["dev_peaks"].items())
        w(
            " (per device: {}{})".format(
                ", ".join("%s:%s %s" % (h, d, format_bytes(b)) for (h, d), (b, _) in devs[:8]),
                ", and %d more" % (len(devs) - 8) if len(devs) > 8 else "",
            )
        )
    elif len(m.device_peaks) > 1:
        w(
            " ({})".format(
                ", ".join(
                    "device %d: %s" % (d, format_bytes(b))
                    for d, (b, _) in sorted(m.device_peaks.items())
                )
            )
        )
    w(f"; {end_label(sum(1 for p in m.procs if p.get('allocs')))}: {format_bytes(m.end_bytes)}\n")
    for x in implausible(a):
        w(f"  {x}\n")
    _ranks_line(a, w)


def _observed(a: Analysis, w: Callable[[str], None]) -> None:
    """What NVML saw of the process tree near the peak, beside the trace."""
    m = a.model
    obs = a.observed.compare(m.peak_ts, m.bytes_max, a.start_ns, ends=a.process_ends())
    near = obs.get("near_peak") or {}
    if obs["samples"] and not obs["overlap"]:
        every = (a.td.run.get("sampler") or {}).get("interval_ms") or obs.get("interval_ms")
        w(f"  observed: {no_sample_while_live(a.run_seconds(), every, m.peak_bytes)}\n")
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


def _sites(a: Analysis, w: Callable[[str], None], top: int, cut: bool) -> None:
    """The top call sites by bytes live at the peak."""
    m = a.model
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
        w(fit(line, width, cut) + "\n")  # cut on a terminal only


def _ranks_line(a: Analysis, w: Callable[[str], None]) -> None:
    """One line on the ranks (docs/ranks.md): how many, their peaks, the ones that stand out."""
    if not tagged(a.traces):
        return
    tb = tables(a)
    peaks = {g.label: tb["rank_peaks"].get(g.key, (0, None))[0] for g in tb["groups"]}
    if not peaks:
        return
    med, odd = outliers(peaks)
    w(
        "  ranks: %d, peaks %s .. %s%s\n"
        % (
            len(peaks),
            format_bytes(min(peaks.values())),
            format_bytes(max(peaks.values())),
            "".join(
                "; %s stands out (%s, median %s)"
                % (k, format_bytes(peaks[k]), format_bytes(int(med or 0)))
                for k in odd
            ),
        )
    )


def _rel(p: Path) -> str:
    try:
        r = os.path.relpath(p)
        return r if not r.startswith("..") else str(p)
    except ValueError:
        return str(p)
