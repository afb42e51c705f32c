"""The report's notes: what it cannot see, or sees with a caveat (traces that stopped, what the
budget ledger saw beyond them, figures no device could hold, --aggregate and damaged traces,
sealed chunks lost)."""

from __future__ import annotations

from typing import Any

from ....units import format_bytes
from ...read.trace import Trace
from ...replay.lives import AUX2
from ..analysis import Analysis

PLAUSIBLE_MAX = 1 << 50  # 1 PiB: no device holds more; a figure past it is a corrupt field


def beyond_traces(a: Analysis) -> dict[str, Any] | None:
    """What the budget ledger saw that the traces lack (a process could not record: its trace
    file could not be created or grow): {"denials": denials no trace holds, "peak_bytes": the
    ledger's peak (contexts included) when no allocation was traced, else 0}; None when the
    traces hold all the ledger saw (or no ledger ran)."""
    if not isinstance(a.td.run, dict) or a.td.run.get("group"):
        return None  # a group's ledger counts every member's runs, not this run's alone
    ledger = a.td.run.get("ledger_final")
    devs = ledger.get("devices") if isinstance(ledger, dict) else None
    if not isinstance(devs, list):
        return None
    devs = [d for d in devs if isinstance(d, dict)]
    denials = sum(int(d.get("denials") or 0) for d in devs)
    untraced = max(0, denials - a.model.counts.get("denied", 0))
    peak = 0 if a.model.found else max((int(d.get("peak") or 0) for d in devs), default=0)
    if not untraced and not peak:
        return None
    return {"denials": untraced, "peak_bytes": peak}


def unrecorded(a: Analysis) -> list[str]:
    """What the run did that its traces do not hold: processes whose trace stopped (a full disk,
    no descriptor left), and what the budget ledger saw beyond the traces (denials, a peak) when
    a process could not record at all."""
    out = []
    stopped = [t for t in a.traces if t.stopped_ns]
    if stopped:
        out.append(
            "%d process(es) could not record all their events (%s): the figures miss what they "
            "did after that" % (len(stopped), ", ".join(sorted({t.stopped_why for t in stopped})))
        )
    beyond = beyond_traces(a)
    if beyond and beyond["denials"]:
        out.append(
            "the budget ledger refused %d allocation(s), the traces hold %d: a process "
            "could not record (its trace file could not be created or grow)"
            % (beyond["denials"] + a.model.counts.get("denied", 0), a.model.counts.get("denied", 0))
        )
    if beyond and beyond["peak_bytes"]:
        out.append(
            "the budget ledger saw %s in use at its peak (contexts included) while no "
            "allocation was traced: a process could not record" % format_bytes(beyond["peak_bytes"])
        )
    return out


def implausible(a: Analysis) -> list[str]:
    """Warnings for peaks no device could hold: beyond the device's total (from the traced
    memory queries or the sampler's NVML figures), or beyond PLAUSIBLE_MAX when no total is
    known. A flipped bit in an event's size reads as a plausible-looking wrong number."""
    totals: dict[int, int] = {}
    for q in a.model.meminfo:
        real = q.event[AUX2]
        if q.device >= 0 and 0 < real < PLAUSIBLE_MAX:
            totals[q.device] = max(totals.get(q.device, 0), real)
    for smp in a.td.samples():
        for d in smp.get("devices") or []:
            t = d.get("total")
            if isinstance(t, int) and 0 < t < PLAUSIBLE_MAX and d.get("index") is not None:
                totals.setdefault(int(d["index"]), t)
    out = []
    biggest = max(totals.values(), default=None)
    for dev, (peak, _ts) in sorted(a.model.device_peaks.items()):
        total = totals.get(dev, biggest)
        bound = total if total else PLAUSIBLE_MAX
        if peak > bound:
            out.append(
                "implausible: the traced peak on device %d, %s, is more than %s (%s); an event's "
                "size may be corrupt, so these figures should not be trusted"
                % (
                    dev,
                    format_bytes(peak),
                    format_bytes(bound),
                    "the device's total" if total else "any device holds",
                )
            )
    return out


def coverage_notes(
    a: Analysis, mom: dict[str, Any], truncated: list[Any], sc: dict[str, Any], lost: list[Any]
) -> list[Any]:
    """What the report cannot see, or sees with a caveat: the notes under it."""
    m = a.model
    warnings: list[str] = []
    warnings.extend(unrecorded(a))
    warnings.extend(n for t in a.traces for n in t.notes)  # sealed chunks lost, sidecar damage
    c = m.counts
    if c.get("unmatched_frees"):
        warnings.append(
            "%d free(s) matched no traced allocation (memory allocated before tracing "
            "began, or through a path not hooked)" % c["unmatched_frees"]
        )
    if c.get("reused"):
        warnings.append(
            "%d allocation(s) returned an address still live in the trace (its free "
            "was not seen): the older one is counted as freed then" % c["reused"]
        )
    if c.get("unsorted_traces"):
        warnings.append(
            "%d trace file(s) had events out of time order (threads publishing out "
            "of order; a free is stamped before its driver call); they were replayed sorted "
            "by time" % c["unsorted_traces"]
        )
    if any(t.stack_depth == 0 for t in a.traces):
        warnings.append(
            "stacks were off (--stack-depth 0) in %d trace file(s): no call sites there"
            % sum(1 for t in a.traces if t.stack_depth == 0)
        )
    warn = stack_cache_note(sc)
    if warn:
        warnings.append(warn)
    if a.symbolizer is None:
        warnings.append("no symbolizer: frames are shown as module+offset")
    else:
        w = getattr(a.symbolizer, "warnings", None)
        for line in (w() if callable(w) else [])[:10]:
            warnings.append(f"symbols: {line}")
    for e in a.stacks.errors[:5]:
        warnings.append(f"symbolizing {e}")
    if mom["kind"] == "time" and m.n_events and mom["ts_ns"] > m.t_end:
        warnings.append(
            f"--at {mom['spec']} is after the last event ({a.seconds(m.t_end):.3f} s): what is "
            "shown was live at the end"
        )
    if getattr(a.td, "bad_samples", 0):
        warnings.append("%d malformed line(s) of samples*.jsonl were skipped" % a.td.bad_samples)
    warnings.extend(implausible(a))
    if lost:
        warnings.append(
            "%d process(es) lost events when their trace could not be written (see Events "
            "lost): memory they freed after that moment is still counted as live" % len(lost)
        )
    if truncated and mom["kind"] == "end":
        warnings.append(
            "truncated traces end where the process stopped writing: what is live "
            "at their end may have been freed later, unseen"
        )
    return warnings


def stack_cache_note(
    sc: dict[str, Any], min_events: int = 200, min_rate: float = 0.9
) -> str | None:
    full, hits = sc["stack_unwinds_full"], sc["stack_cache_hits"]
    if full + hits < min_events or hits >= min_rate * (full + hits):
        return None
    return (
        f"stacks: {full} of {full + hits} events took a full unwind (stack cache hit rate "
        f"{100.0 * hits / (full + hits):.0f}%): the call sites did not repeat, or their frames are "
        "ones the cache does not describe; each such event costs a libgcc unwind (docs/aarch64.md)"
    )


def lost_chunks_json(traces: list[Trace]) -> list[dict[str, Any]]:
    """The report's `lost_chunks`: per trace file, the sealed chunks neither the trace nor its
    sidecar holds (their events are missing from every figure)."""
    return [
        {
            "file": t.path.name,
            "pid": t.pid,
            "chunks": list(t.lost_chunks),
            "bytes": sum(min(t.chunk_size, t.size_bytes - c * t.chunk_size) for c in t.lost_chunks),
        }
        for t in traces
        if t.lost_chunks
    ]
