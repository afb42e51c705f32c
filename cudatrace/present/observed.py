"""Traced versus observed, as text: what NVML (or the host's figures) showed beside the trace,
near the peak and at its highest. The report's section, and the HTML page's facts."""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

from ..analyze.documents.report_types import (
    Report,
    ReportMax,
    ReportNear,
    ReportObserved,
    ReportObservedBaseline,
)
from .text import no_sample_while_live, secs_text, size_text, table


class _Seen(NamedTuple):
    """What each kind of figures' text reads: the section, where it goes, how many samples,
    the note of the sample near the peak, it, the highest, the baseline, the traced peak."""

    o: ReportObserved
    w: Callable[[str], object]
    n: str
    note: str | None
    near: ReportNear
    mx: ReportMax | None
    base: ReportObservedBaseline | None
    traced_peak: int


def render_observed(r: Report, w: Callable[[str], object]) -> None:
    o = r["observed"]
    traced_peak = o.get("traced_peak_bytes", r["peak_bytes"])
    if not o["samples"]:
        w("Traced versus observed: not measured (%s)" % (o["nvml_why"] or "no samples"))
        return
    iv = o.get("interval_ms")
    n = "%d sample%s%s" % (
        o["samples"],
        "" if o["samples"] == 1 else "s",
        " every ~%d ms" % round(iv) if iv else "",
    )
    near, mx, base = o["near_peak"], o["max"], o["baseline"]
    source = (
        ("NVML" if o["per_process"] else "NVML device totals only")
        if o["nvml"]
        else "the host's figures"
    )
    if not o["overlap"] or near is None:
        w(f"Traced versus observed ({source}; {n}):")
        if not o["nvml"]:
            w("  no device figures: {}".format(o["nvml_why"]))
        why = no_sample_while_live(r.get("run_seconds", r["duration"]), iv, traced_peak)
        w(f"  {why}: nothing to compare. Traced peak {size_text(traced_peak)}.")
        if base and base.get("device_total"):
            w(
                "  device used by everyone before the run: {} of {}".format(
                    size_text(base.get("device_used")), size_text(base["device_total"])
                )
            )
        return
    note = ("  ({})".format(near["note"])) if near.get("note") else None
    args = _Seen(o, w, n, note, near, mx, base, traced_peak)
    if o["nvml"] and o["per_process"]:
        _observed_per_process(args)
    elif o["nvml"]:
        _observed_device_totals(args)
    else:
        _observed_host(args)


def _observed_per_process(seen: _Seen) -> None:
    """NVML per process: the tree's device memory beside the trace; the untraced rest."""
    o, w, n, note, near, mx, base, traced_peak = seen
    w(f"Traced versus observed (NVML, {n}):")
    if note:
        w(note)
    rows = [["", "traced live", "NVML: process tree", "untraced"]]
    rows.append(
        [
            "nearest sample to the peak ({:+.0f} ms)".format(near["offset_ms"]),
            size_text(near["traced_bytes"]),
            size_text(near["tree_device_bytes"]),
            size_text(near["untraced_bytes"]),
        ]
    )
    if mx and mx["tree_device_bytes"] is not None:
        rows.append(
            [
                "NVML's highest (at {})".format(secs_text(mx["tree_device_time"])),
                size_text(mx["traced_bytes_then"]),
                size_text(mx["tree_device_bytes"]),
                size_text(mx["untraced_bytes"]),
            ]
        )
    for line in table(rows, {1, 2, 3}, "    "):
        w(line)
    w(
        "  traced peak {}. untraced = what NVML counts for the tree that no hook saw: CUDA "
        "contexts, module images, allocator paths not hooked; at most {} (at {}).".format(
            size_text(traced_peak),
            size_text(mx["untraced_max_bytes"] if mx else None),
            secs_text(mx["untraced_max_time"] if mx else None),
        )
    )
    if any(
        x is not None and x < 0
        for x in (near["untraced_bytes"], (mx["untraced_bytes"] if mx else None))
    ):
        w(
            "  negative: the trace holds more than NVML showed for the tree (managed memory not "
            "resident yet, NVML's per-process figures lagging or missing a process)."
        )
    if near["device_used"] is not None:
        w(
            "  device used by everyone: {} of {} near the peak; highest {}".format(
                size_text(near["device_used"]),
                size_text(near["device_total"]),
                size_text(mx["device_used"] if mx else None),
            )
        )


def _observed_device_totals(seen: _Seen) -> None:
    """NVML without per-process figures: the device's total use, other processes included."""
    o, w, n, note, near, mx, base, traced_peak = seen
    w(f"Traced versus observed (NVML device totals only, {n}):")
    if note:
        w(note)
    w("  no per-process figures: {}".format(o["per_process_why"]))
    w(
        "  traced live {} at the sample nearest the peak ({:+.0f} ms); device used by everyone {} of "
        "{} there, {} more than at the first sample (other processes count too); highest {}".format(
            size_text(near["traced_bytes"]),
            near["offset_ms"],
            size_text(near["device_used"]),
            size_text(near["device_total"]),
            size_text(near["device_used_rise"]),
            size_text(mx["device_used"] if mx else None),
        )
    )


def _observed_host(seen: _Seen) -> None:
    """No NVML: what the host shows (MemAvailable, MemFree, RSS, PSS)."""
    o, w, n, note, near, mx, base, traced_peak = seen
    w(f"Traced versus observed (the host's figures, {n}):")
    w("  no device figures: {}".format(o["nvml_why"]))
    if note:
        w(note)
    w(
        "  traced live {} at the sample nearest the peak ({:+.0f} ms); traced peak {}".format(
            size_text(near["traced_bytes"]), near["offset_ms"], size_text(traced_peak)
        )
    )
    if near["mem_available"] is not None:
        w(
            "  MemAvailable {} there, {} at the first sample: a drop of {} (largest drop {})".format(
                size_text(near["mem_available"]),
                size_text(base.get("mem_available") if base else None),
                size_text(near["mem_available_drop"]),
                size_text(mx["mem_available_drop"] if mx else None),
            )
        )
    if near.get("mem_free") is not None:
        w(
            "  MemFree {} there (a drop of {}): what cuMemGetInfo calls free on a unified-memory "
            "device".format(size_text(near["mem_free"]), size_text(near.get("mem_free_drop")))
        )
    if near["tree_rss"] is not None:
        w(
            "  process tree RSS {} there; highest {}".format(
                size_text(near["tree_rss"]), size_text(mx["tree_rss"] if mx else None)
            )
        )
    if near.get("tree_pss") is not None:
        w(
            "  process tree PSS {} there; highest {}".format(
                size_text(near["tree_pss"]), size_text(mx["tree_pss"] if mx else None)
            )
        )
    w("  on a unified-memory device (Jetson) device allocations come out of this RAM")


# ---- the command ---------------------------------------------------------------------------
