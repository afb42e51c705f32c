"""A Perfetto trace (protobuf TracePackets), for ui.perfetto.dev and trace_processor.

Built with the `perfetto` package's trace builder and its protos (pip install
'cudatrace[export]'). The whole run is on it; the moment chosen with --at is marked:

    "device N: live bytes"                 a counter per device (every process together)
    process "pid P (exe)"                  a track group per process, holding
      "device N: live bytes"               its own counter per device
      "allocations >= SIZE"                one slice per allocation at least SIZE big, from
                                           its allocation to its free (or the end of the trace:
                                           never freed), named by report's site label, with
                                           size, address, device, API and stack as arguments;
                                           overlapping lifetimes go on further lanes
      "budget denials", "failed allocations"  instant events, with what was asked and why
    "cudatrace"                            an instant event at the moment (peak, end, or time)

Counter values are exact: every allocation and free of the run (the traced bytes, the same
replay as `report`), one point per timestamp. Timestamps are the trace's monotonic clock in ns.
SIZE is 1 MiB or a thousandth of the peak, whichever is larger; at most MAX_SLICES slices (the
largest allocations) are drawn, and the trace says when some were left out.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ... import __version__
from ...analyze.documents.cu_errors import cu_error
from ...analyze.replay.lives import ADDR, AUX, AUX2, RES, Alloc
from ...analyze.sites.group import NO_STACK, api_label
from ...units import format_bytes

if TYPE_CHECKING:
    from .view import View

MiB = 1 << 20
MAX_SLICES = 20000
SEQ = 1


def threshold(view: View) -> int:
    return max(MiB, view.model.peak_bytes // 1000)


# what a debug annotation of an event holds: (name, value)
Args = Sequence[tuple[str, object]]


class _Out:
    def __init__(self) -> None:
        from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb
        from perfetto.trace_builder.proto_builder import TraceProtoBuilder

        self.pb = pb
        self.builder = TraceProtoBuilder()
        self.next_uuid = 1
        self.first = True
        self.pending: list[tuple[int, int, Callable[..., None], tuple[Any, ...]]] = []

    def packet(self, ts: int | None = None) -> Any:  # a TracePacket
        p = self.builder.add_packet()
        p.trusted_packet_sequence_id = SEQ
        if self.first:
            p.sequence_flags = self.pb.TracePacket.SEQ_INCREMENTAL_STATE_CLEARED
            self.first = False
        else:
            p.sequence_flags = self.pb.TracePacket.SEQ_NEEDS_INCREMENTAL_STATE
        if ts is not None:
            p.timestamp = max(0, int(ts))
        return p

    def track(
        self,
        name: str,
        parent: int | None = None,
        counter: bool = False,
        pid: int | None = None,
        process_name: str | None = None,
    ) -> int:
        uuid = self.next_uuid
        self.next_uuid += 1
        d = self.packet().track_descriptor
        d.uuid = uuid
        if parent is not None:
            d.parent_uuid = parent
        if pid is not None:
            d.process.pid = pid
            d.process.process_name = process_name or name
        else:
            d.name = name
        if counter:
            d.counter.unit = self.pb.CounterDescriptor.UNIT_SIZE_BYTES
        return uuid

    def counter(self, track: int, ts: int, value: int) -> None:
        self.pending.append((ts, len(self.pending), self._counter, (track, ts, value)))

    def event(
        self, track: int, ts: int, kind: str, name: str | None = None, args: Args = ()
    ) -> None:
        self.pending.append((ts, len(self.pending), self._event, (track, ts, kind, name, args)))

    def flush(self) -> None:
        """The events after every track descriptor, in time order (ties: as given)."""
        for _ts, _i, fn, a in sorted(self.pending, key=lambda e: e[:2]):
            fn(*a)
        self.pending = []

    def _counter(self, track: int, ts: int, value: int) -> None:
        e = self.packet(ts).track_event
        e.type = self.pb.TrackEvent.TYPE_COUNTER
        e.track_uuid = track
        e.counter_value = int(value)

    def _event(self, track: int, ts: int, kind: str, name: str | None, args: Args) -> None:
        e = self.packet(ts).track_event
        e.type = {
            "begin": self.pb.TrackEvent.TYPE_SLICE_BEGIN,
            "end": self.pb.TrackEvent.TYPE_SLICE_END,
            "instant": self.pb.TrackEvent.TYPE_INSTANT,
        }[kind]
        e.track_uuid = track
        if name is not None:
            e.name = name
        for k, v in args:
            a = e.debug_annotations.add()
            a.name = k
            if isinstance(v, bool):
                a.bool_value = v
            elif isinstance(v, int):
                a.int_value = v
            else:
                a.string_value = str(v)


def build(view: View) -> Any:
    """The Trace message (perfetto's protos)."""
    out = _Out()
    m = view.model
    lives = [x for x in m.lifetimes() if view.device is None or x.device == view.device]

    # counters: deltas per device and per (process, device), one point per timestamp
    dev_delta: dict[int | tuple[str, str], dict[int, int]] = defaultdict(lambda: defaultdict(int))
    proc_delta: dict[tuple[int, int], dict[int, int]] = defaultdict(lambda: defaultdict(int))
    for x in lives:
        for ts, d in ((x.ts, x.size), (x.end_ts, -x.size)):
            if ts is None:
                continue
            dev_delta[view.device_key(x)][ts] += d
            proc_delta[(x.trace, x.device)][ts] += d
    for dev in sorted(dev_delta, key=str):
        _counter(
            out,
            out.track(f"device {view.device_name(dev)}: live bytes", counter=True),
            dev_delta[dev],
            m.t_end,
        )

    # per process: counters, large allocations, denials, failures
    limit = threshold(view)
    big = sorted((x for x in lives if x.size >= limit), key=lambda x: -x.size)
    left_out = max(0, len(big) - MAX_SLICES)
    big = big[:MAX_SLICES]
    denied = [x for x in m.denied if view.device is None or x.device == view.device]
    failed = [x for x in m.failed if view.device is None or x.device == view.device]
    view.prepare({(x.trace, x.stack) for x in big + denied + failed})
    procs = sorted({x.trace for x in lives} | {x.trace for x in denied + failed})
    for ti in procs:
        t = view.traces[ti]
        ptrack = out.track(view.process(ti), pid=t.pid, process_name=view.process(ti))
        for (pti, dev), deltas in sorted(proc_delta.items()):
            if pti == ti:
                track = out.track(f"device {_dev(dev)}: live bytes", parent=ptrack, counter=True)
                _counter(out, track, deltas, m.t_end)
        mine = sorted((x for x in big if x.trace == ti), key=lambda x: (x.ts, x.seq))
        _slices(out, view, ptrack, mine, limit)
        _instants(out, view, ptrack, [x for x in denied if x.trace == ti], "budget denials")
        _instants(out, view, ptrack, [x for x in failed if x.trace == ti], "failed allocations")

    info = out.track("cudatrace")
    note = [
        ("command", view.command()),
        ("cudatrace", __version__),
        ("live bytes", view.total),
        ("allocations >=", limit),
    ]
    if left_out:
        note.append(("allocations not drawn", left_out))
    out.event(info, view.moment_ts, "instant", f"moment: {view.moment_text()}", note)
    out.flush()
    return out.builder.trace


def _counter(out: _Out, track: int, deltas: Mapping[int, int], t_end: int) -> None:
    """A counter track from its deltas, carried to the trace's end."""
    cur = 0
    for ts in sorted(deltas):
        cur += deltas[ts]
        out.counter(track, ts, cur)
    if t_end and (not deltas or max(deltas) < t_end):
        out.counter(track, t_end, cur)


def _slices(out: _Out, view: View, ptrack: int, mine: list[Alloc], limit: int) -> None:
    """A process's large allocations as slices, on as many lanes as overlap."""
    m, t_end = view.model, view.model.t_end
    lanes: list[int] = []  # end time of each lane's last slice
    lane_tracks: list[int] = []
    for x in mine:
        end = x.end_ts if x.end_ts is not None else t_end
        k = next((i for i, e in enumerate(lanes) if e <= x.ts), None)
        if k is None:
            k = len(lanes)
            lanes.append(0)
            lane_tracks.append(
                out.track(
                    "allocations >= {}{}".format(
                        format_bytes(limit), "" if k == 0 else " (%d)" % (k + 1)
                    ),
                    parent=ptrack,
                )
            )
        lanes[k] = end
        args = [
            ("size", x.size),
            ("address", f"0x{x.event[ADDR]:x}"),
            ("device", x.device),
            ("api", api_label(m, x)),
            ("stack", _stack(view, x)),
        ]
        if x.end_ts is None:
            args.append(("never freed", True))
        out.event(
            lane_tracks[k],
            x.ts,
            "begin",
            f"{_site(view, x)} {format_bytes(x.size)}",
            args,
        )
        out.event(lane_tracks[k], max(end, x.ts), "end")


def _instants(out: _Out, view: View, ptrack: int, xs: list[Alloc], what: str) -> None:
    """A process's budget denials or failed allocations as instant events on their track."""
    if not xs:
        return
    m = view.model
    tr = out.track(what, parent=ptrack)
    for x in sorted(xs, key=lambda x: x.ts):
        if what == "budget denials":
            name = f"denied {format_bytes(x.size)}"
            args = [("size", x.size), ("budget", x.event[AUX]), ("in use", x.event[AUX2])]
        else:
            name = f"failed {format_bytes(x.size)}: {cu_error(x.event[RES])}"
            args = [("size", x.size), ("result", cu_error(x.event[RES]))]
        args += [("device", x.device), ("api", api_label(m, x)), ("stack", _stack(view, x))]
        out.event(tr, x.ts, "instant", f"{name} at {_site(view, x)}", args)


def _dev(d: int) -> str:
    return str(d) if d >= 0 else "?"


def _site(view: View, x: Alloc) -> str:
    fr = view.frames(x.trace, x.stack)
    return fr[0].label() if fr else NO_STACK


def _stack(view: View, x: Alloc) -> str:
    fr = view.frames(x.trace, x.stack)
    return "\n".join(f.long_label() for f in fr) if fr else NO_STACK


def write(view: View, path: Path) -> dict[str, int]:
    trace = build(view)
    Path(path).write_bytes(trace.SerializeToString())
    return {"packets": len(trace.packet)}
