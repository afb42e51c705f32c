"""Aggregate traces (`cudatrace run --aggregate`): from the last snapshot to the events the replay
reads.

An aggregate trace holds no ALLOC/FREE events: its SNAPSLOT records hold snapshots (layouts in
native/include/trace_format.h, struct ct_snap_*), rewritten in turn, the newest complete one
the one to read. A snapshot gives, per key (site and size), the totals of the run and what was
live now, at the process's device peak and at the peak of each device (and of pinned host
memory). `apply_snapshots` turns it into a short synthetic event stream that the C replay
reads like any other: at each of those moments (in time order) everything of the previous
moment is freed and that moment's live set allocated, so the replay's peak, per-device peaks,
what is live at them and at the end, and the sites and stacks of all that are exact for the
process. What is lost is said by `notes`: no timeline between those moments, no per-event
history; several processes' peaks are each exact, their sum over time is not known (the
report gives the range it lies in).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .trace import C, Trace, layout

SYNTH_BASE = 0x5A5A00000000  # addresses of synthetic allocations (never compared with real ones)


@dataclass
class Snapshot:
    head: dict[str, Any]
    groups: list[dict[str, Any]]
    keys: list[dict[str, Any]]
    slots: int = 0  # SNAPSLOT records in the file
    valid: int = 0  # of them holding a complete snapshot
    moments: list[tuple[str, int]] = field(default_factory=list)  # (what, ts) synthesized


def _fnv(b: bytes) -> int:
    h = 0xCBF29CE484222325
    for x in b:
        h = ((h ^ x) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def read_snapshot(records: list[bytes]) -> Snapshot | None:
    """The newest complete snapshot among SNAPSLOT records (each whole, header included)."""
    K = C()
    hdr, _ = layout("struct ct_rec_hdr")
    hs, hn = layout("struct ct_snap_head")
    gs, gn = layout("struct ct_snap_group")
    ks, kn = layout("struct ct_snap_key")
    best, nslots, nvalid = None, 0, 0
    for data in records:
        _m, rtype, rsize = hdr.unpack_from(data, 0)
        if rtype != K["CT_REC_SNAPSLOT"] or rsize > len(data):
            continue
        nslots += 1
        body = hdr.size
        if rsize < hdr.size + hs.size:
            continue
        head = dict(zip(hn, hs.unpack_from(data, body)))
        n = head["body_bytes"]
        if not head["seq"] or hs.size + n > rsize - hdr.size:
            continue
        if n != gs.size * K["CT_SNAP_GROUPS"] + ks.size * head["nkeys"]:
            continue
        raw = bytes(data[body + hs.size : body + hs.size + n])
        if _fnv(raw) != head["checksum"]:
            continue  # being written when the process stopped: the other slot holds the last
        nvalid += 1
        if best is None or head["seq"] > best[0]["seq"]:
            best = (head, raw)
    if best is None:
        return Snapshot({}, [], [], nslots, 0) if nslots else None
    head, raw = best
    groups = [dict(zip(gn, g)) for g in gs.iter_unpack(raw[: gs.size * K["CT_SNAP_GROUPS"]])]
    keys = [dict(zip(kn, k)) for k in ks.iter_unpack(raw[gs.size * K["CT_SNAP_GROUPS"] :])]
    return Snapshot(head, groups, keys, nslots, nvalid)


def _allocs(k: dict[str, Any], count: int, nbytes: int) -> list[int]:
    """(size) of each of count allocations of key k holding nbytes together."""
    if not count:
        return []
    if not (k["flags"] & C()["CT_SNAP_KEY_MIXED"]) and k["size"] * count == nbytes:
        return [k["size"]] * count
    each = nbytes // count
    return [each] * (count - 1) + [nbytes - each * (count - 1)]


def synthesize(snap: Snapshot) -> list[tuple[Any, ...]]:
    """Events (tuples in event_fields() order) that replay into the snapshot's moments."""
    K = C()
    h = snap.head
    host_g = K["CT_SNAP_HOST_GROUP"]
    moments = []  # (ts, order, what, key index -> (count, bytes))
    if h["peak_bytes"] or any(k["peak_count"] for k in snap.keys):
        moments.append(
            (
                h["peak_ts"],
                1,
                "peak",
                {
                    i: (k["peak_count"], k["peak_bytes"])
                    for i, k in enumerate(snap.keys)
                    if k["group"] != host_g
                },
            )
        )
    for g, grp in enumerate(snap.groups):
        if not grp["allocs"]:
            continue
        if g != host_g and grp["peak_ts"] == h["peak_ts"] and moments:
            continue  # reached by the same event as the process's peak
        moments.append(
            (
                grp["peak_ts"],
                0,
                "device %d peak" % grp["device"] if g != host_g else "pinned host peak",
                {
                    i: (k["gpeak_count"], k["gpeak_bytes"])
                    for i, k in enumerate(snap.keys)
                    if k["group"] == g
                },
            )
        )
    end_ts = max(h["last_ts"], *(m[0] for m in moments)) if moments else h["last_ts"]
    moments.append(
        (end_ts, 2, "end", {i: (k["cur_count"], k["cur_bytes"]) for i, k in enumerate(snap.keys)})
    )
    moments.sort(key=lambda m: (m[0], m[1]))
    alloc, free = K["CT_OP_ALLOC"], K["CT_OP_FREE"]
    rt_known = K["CT_EF_RUNTIME_KNOWN"]
    out: list[tuple[Any, ...]] = []
    live: list[tuple[int, int, dict[str, Any]]] = []
    addr = SYNTH_BASE
    for ts, _order, what, state in moments:
        for size, a, k in live:
            out.append((ts, size, a, 0, 0, 0, k["device"], 0, 0, 0, 0, free, 0, k["space"], 0, 0))
        live = []
        for i, (count, nbytes) in sorted(state.items()):
            k = snap.keys[i]
            flags = rt_known if k["rt_api"] else 0
            for size in _allocs(k, count, nbytes):
                addr += 0x1000
                out.append(
                    (
                        ts,
                        size,
                        addr,
                        0,
                        0,
                        0,
                        k["device"],
                        0,
                        k["stack"],
                        k["api"],
                        k["rt_api"],
                        alloc,
                        k["kind"],
                        k["space"],
                        flags,
                        0,
                    )
                )
                live.append((size, addr, k))
        snap.moments.append((what, ts))
    return out


def apply_snapshots(t: Trace) -> None:
    """If t is an aggregate trace (not read yet), read its last snapshot into t.aggregate and
    give t the synthetic events (merged with the events it did write: failures, denials,
    memory queries)."""
    if not t.snap_slots or t.aggregate is not None:
        return
    snap = read_snapshot(t.snap_slots)
    if snap is None:
        return
    t.aggregate = snap
    if not snap.head:
        return
    synth = synthesize(snap)
    real = t.events
    merged = sorted(real + synth, key=lambda e: e[0])
    t.events = merged
