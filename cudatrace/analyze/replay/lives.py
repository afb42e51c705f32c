"""What a replay yields: each allocation's life (Alloc: the event, its trace, when it ended and
how), the lives live at a moment grouped by site (Groups), the event's fields by index and
the kinds of memory counted as device memory."""

from __future__ import annotations

from collections import Counter
from collections.abc import Container, Iterable
from typing import Any

from ..read.trace import C, event_fields

_F = {name: i for i, name in enumerate(event_fields())}


TS, SIZE, ADDR, AUX, AUX2, TID, DEV, RES, STACK, API, RT, OP, KIND, SPACE, FLAGS = (
    _F[n]
    for n in (
        "ts_ns",
        "size",
        "addr",
        "aux",
        "aux2",
        "tid",
        "device",
        "result",
        "stack",
        "api",
        "rt_api",
        "op",
        "kind",
        "space",
        "flags",
    )
)


NFIELDS = len(_F)


NONE64 = (1 << 64) - 1


NEVER_FREED = "never_freed"  # a `by_ts` value of the backends' queries: never freed


KIND_NAMES = {
    "CT_KIND_DEVICE": "device",
    "CT_KIND_PITCH": "pitch",
    "CT_KIND_MANAGED": "managed",
    "CT_KIND_ASYNC": "async",
    "CT_KIND_HOST": "host",
    "CT_KIND_VMM": "vmm",
    "CT_KIND_ARRAY": "array",
    "CT_KIND_GRAPH": "graph",
    "CT_KIND_IMPORT": "import",
    "CT_KIND_NONE": "none",
}


def kind_name(k: int) -> str:
    for n, v in C().items():
        if n.startswith("CT_KIND_") and v == k:
            return KIND_NAMES.get(n, n)
    return "kind%d" % k


def device_kinds() -> set[int]:
    K = C()
    return {
        K[n]
        for n in (
            "CT_KIND_DEVICE",
            "CT_KIND_PITCH",
            "CT_KIND_MANAGED",
            "CT_KIND_ASYNC",
            "CT_KIND_VMM",
            "CT_KIND_ARRAY",
            "CT_KIND_GRAPH",
        )
    }


def kinds_mask(kinds: Iterable[int]) -> int:
    """A set of kinds (CT_KIND_*) as the replay's bit mask (kinds past 63 share the last bit)."""
    m = 0
    for k in kinds:
        m |= 1 << min(k, 63)
    return m


def host_kinds() -> set[int]:
    return {C()["CT_KIND_HOST"]}


# Alloc.how: why a life ended (END_EXITED: its process ended holding it)
END_LIVE, END_FREE, END_REUSED, END_UNMAPPED, END_EXITED = 0, 1, 2, 3, 4


class _Field:
    """One field of an Alloc's event (an integer), read by name: `a.api` is `a.event[API]`."""

    __slots__ = ("index",)

    def __init__(self, index: int) -> None:
        self.index = index

    def __get__(self, obj: Alloc, owner: type[Alloc] | None = None) -> int:
        v: int = obj.event[self.index]
        return v


class Alloc:
    """One event of the replay (an allocation, a failure, a denial, a memory query) and, for a
    device allocation, when it ended (end_ts None: still live when its trace ended)."""

    __slots__ = ("trace", "event", "size", "ts", "device", "index", "seq", "end_ts", "how")

    def __init__(
        self,
        trace: int,
        event: tuple[Any, ...],
        size: int,
        ts: int,
        device: int,
        index: int = -1,
        seq: int = -1,
        end_ts: int | None = None,
        how: int = 0,
    ):
        self.trace = trace
        self.event = event
        self.size = size
        self.ts = ts
        self.device = device
        self.index = index
        self.seq = seq
        self.end_ts = end_ts
        self.how = how

    # the event's fields a reader asks an allocation for, by name
    api = _Field(API)
    rt_api = _Field(RT)
    stack = _Field(STACK)
    result = _Field(RES)
    kind = _Field(KIND)
    flags = _Field(FLAGS)

    def __repr__(self) -> str:
        return "Alloc(trace=%d, size=%d, ts=%d, device=%d, addr=0x%x)" % (
            self.trace,
            self.size,
            self.ts,
            self.device,
            self.event[ADDR],
        )


class Groups:
    """Allocations live at a moment, grouped by (trace, stack, api, rt_api, device): what site
    grouping needs without one Python object per allocation. rows: tuples (trace, stack, api,
    rt_api, device, count, bytes, first_ts, last_ts, sizes) where sizes is a sorted sequence
    (a list, or a memoryview on the C replay's array)."""

    __slots__ = ("rows", "bytes", "count", "keep")

    def __init__(self, rows: list[tuple[Any, ...]], keep: object = None) -> None:
        self.rows = rows
        self.bytes = sum(r[6] for r in rows)
        self.count = sum(r[5] for r in rows)
        self.keep = keep  # what the memoryviews look into

    @classmethod
    def of(cls, allocs: Iterable[Alloc], results: bool = False) -> Groups:
        """results: add an 11th column, a Counter of non-zero CUresults (failed allocations)."""
        g: dict[tuple[Any, ...], list[Any]] = {}
        for a in allocs:
            e = a.event
            k = (a.trace, e[STACK], e[API], e[RT], e[DEV])
            x = g.get(k)
            if x is None:
                x = g[k] = [0, 0, a.ts, a.ts, [], Counter()]
            x[0] += 1
            x[1] += a.size
            if a.ts < x[2]:
                x[2] = a.ts
            if a.ts > x[3]:
                x[3] = a.ts
            x[4].append(a.size)
            if results and e[RES]:
                x[5][e[RES]] += 1
        order = sorted(g.items(), key=lambda kv: kv[0][:4] + (kv[0][4] & 0xFFFFFFFF,))  # as C sorts
        extra = (lambda x: (x[5],)) if results else (lambda x: ())
        return cls([k + (x[0], x[1], x[2], x[3], sorted(x[4])) + extra(x) for k, x in order])

    def plain(self) -> list[tuple[Any, ...]]:
        """rows with the sizes as lists (to compare, to print)."""
        return [r[:9] + (list(r[9]),) for r in self.rows]

    def by_trace(self) -> dict[int, int]:
        out: dict[int, int] = {}
        for r in self.rows:
            out[r[0]] = out.get(r[0], 0) + r[6]
        return out

    def by_device(self) -> dict[int, int]:
        out: dict[int, int] = {}
        for r in self.rows:
            out[r[4]] = out.get(r[4], 0) + r[6]
        return out

    def only(self, traces: Container[int] | None = None, device: int | None = None) -> Groups:
        return Groups(
            [
                r
                for r in self.rows
                if (traces is None or r[0] in traces) and (device is None or r[4] == device)
            ],
            self.keep,
        )

    def __len__(self) -> int:
        result: int = self.count
        return result


def peak(lives: Iterable[Alloc], until: int | None = None) -> tuple[int, int | None]:
    """(the most bytes live at once, when: None if nothing was) over allocation lifetimes; at
    one time frees count before allocations, so a peak is never higher than the replay's.
    until: frees after it are not counted (the lives are seen up to that time)."""
    steps = []
    for a in lives:
        steps.append((a.ts, 1, a.size))
        if a.end_ts is not None and (until is None or a.end_ts <= until):
            steps.append((a.end_ts, 0, -a.size))
    steps.sort()
    cur, best, when = 0, 0, None
    for ts, _, d in steps:
        cur += d
        if cur > best:
            best, when = cur, ts
    return best, when
