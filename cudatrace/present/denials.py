"""Budget denials named as they happen: `cudatrace run` calls this (through the launcher's
watcher) soon after the ledger counts a denial. The shim's own line, written at the moment of
the denial, gives the raw path (it cannot know the program's allocator layers); this one reads
the DENY records from the trace, attributes them as every report does (docs/attribution.md)
and prints one line per call site:

    cudatrace: denied 16.0 MiB (cuMemAlloc_v2) at kv_layer_buffer (layers.c:68) via
    tensor_create > pool_obtain > device_take; budget 200.0 MiB, in use 196.0 MiB

It returns what it printed; the launcher keeps it in denials.jsonl in the trace directory
(record/denials.py), where `cudatrace status` finds the last one of a running member."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TextIO

from ..analyze.documents.analysis import Analysis
from ..analyze.replay.lives import AUX, AUX2, DEV
from ..analyze.sites.group import NO_STACK, api_label
from ..analyze.sites.names import on_terminal
from ..analyze.sites.stacks import make_symbolizer
from ..record_types import DeniedGroup
from ..symbols import Symbolizer
from ..units import format_bytes, printable
from .text import wrap_prose


class DenialPrinter:
    """Call with the trace directory; prints what was denied since the last call."""

    def __init__(self, stream: TextIO | None = None) -> None:
        self.stream = stream
        self.seen: set[tuple[str, int, int]] = set()  # (trace file, time, size)
        self.symbolizer: Symbolizer | None = None
        self.symbolizer_tried = False  # none could be had: not asked again
        self.untraced_said = 0

    def __call__(self, out_dir: Path, ledger_denials: int | None = None) -> list[DeniedGroup]:
        """ledger_denials: at the end of a run, the denials its own ledger counted; those no
        trace holds (a process could not record) are said in one line."""
        stream = self.stream or sys.stderr
        if not self.symbolizer_tried:
            self.symbolizer, self.symbolizer_tried = make_symbolizer(), True
        a = Analysis(out_dir, symbolizer=self.symbolizer)
        new = []
        for x in a.model.denied:
            t = a.traces[x.trace]
            k = (t.path.name, x.ts, x.size)
            if k not in self.seen:
                self.seen.add(k)
                new.append(x)
        groups: dict[str, DeniedGroup] = {}
        for x in new:
            via, rest = a.stacks.split(x.trace, x.stack) if x.stack else ([], [])
            label = rest[0].label() if rest else NO_STACK
            g = groups.get(label)
            if g is None:
                g = groups[label] = {
                    "label": label,
                    "via": [f.name() for f in via],
                    "api": api_label(a.model, x),
                    "count": 0,
                    "bytes": 0,
                    "pid": a.traces[x.trace].pid,
                }
            g["count"] += 1
            g["bytes"] += x.size
            g["limit"], g["in_use"] = x.event[AUX], x.event[AUX2]
            g["device"] = int(x.event[DEV])
            g["time"] = a.seconds(x.ts)
        contexts = _denial_contexts(a)
        lines = []
        for g in groups.values():
            chain = (" via {}".format(" > ".join(reversed(g["via"])))) if g["via"] else ""
            what = (
                format_bytes(g["bytes"])
                if g["count"] == 1
                else "%d x, %s in all" % (g["count"], format_bytes(g["bytes"]))
            )
            lines.append(
                "cudatrace: denied {} ({}) at {}{}; budget {}, in use {}{}\n".format(
                    what,
                    g["api"],
                    g["label"],
                    chain,
                    format_bytes(g["limit"]),
                    format_bytes(g["in_use"]),
                    in_use_parts(g["in_use"], g["limit"], contexts.get(g["device"], 0)),
                )
            )
        traced = max(len(a.model.denied), a.model.counts.get("denied", 0))
        counted = ledger_denials or 0  # None: not the end of a run, nothing counted
        untraced = counted - traced
        if untraced > self.untraced_said:
            lines.append(
                "cudatrace: denied %d allocation(s) in a process that could not record its "
                "trace: the budget ledger counted %d denial(s), the traces hold %d\n"
                % (untraced - self.untraced_said, counted, traced)
            )
            self.untraced_said = untraced
        if lines:  # a symbol's bytes are data: escaped before they reach the terminal
            text = "".join(printable(x[:-1]) + "\n" for x in lines)
            stream.write(wrap_prose(text, terminal=on_terminal(stream)))
            stream.flush()
        return list(groups.values())


def _denial_contexts(a: Analysis) -> dict[int, int]:
    """device -> the CUDA contexts the ledger held at the latest denial, as the shim's own line
    said them (its "deny_contexts.<dev>": every member's, other runs' of a group too); the
    run's own processes' contexts where no denial recorded it."""
    out = a.budget_contexts()
    latest: dict[int, tuple[int, int]] = {}
    for t in a.traces:
        for k, v in t.info.items():
            if k.startswith("deny_contexts.") and k[14:].isdigit() and v.isdigit():
                d = int(k[14:])
                if (t.start_monotonic_ns, int(v)) > latest.get(d, (-1, 0)):
                    latest[d] = (t.start_monotonic_ns, int(v))
    out.update({d: v for d, (_, v) in latest.items()})
    return out


def in_use_parts(in_use: int, limit: int, context: int) -> str:
    """What a denial's in-use figure is made of, when the budget counted CUDA contexts; and
    when the contexts alone fill the budget, that every allocation will be denied."""
    if not context:
        return ""
    ctx = min(context, in_use) if in_use else context
    allocs, ctxs = format_bytes(max(0, in_use - ctx)), format_bytes(ctx)
    text = f" (allocations {allocs}, CUDA contexts {ctxs})"
    if context >= limit:
        text += (
            f"; the budget is below the CUDA context it counts ({format_bytes(context)}): every "
            "allocation will be denied; give a budget above the context plus what the program "
            "allocates"
        )
    return text
