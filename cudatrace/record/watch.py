"""The watch: NVML's figures against the ledgers' (record/gpuview.py's view), for `cudatrace
node` at every pass and for `cudatrace status` and `metrics` on any host. It trusts NVML, not
the process: a slot of a ledger is written by its member, NVML's figures by the driver.

Three breaches (docs/budgets.md, "What the node's watch detects"):

- **outside_ledger**: a member holds more on a GPU by NVML than its ledger slot counts
  (allocations and the CUDA context counted), beyond its tolerance: memory it took around the
  preload library (libc's own `dlsym` reached by `dlvsym`, a table of driver entry points of its
  own, raw ioctls).
- **unfenced**: a process holds memory on a GPU that members of a ledger use (a fenced GPU) and
  is a member of no ledger: a container without a cudatrace device, a process without the
  library. One that maps the library joins its ledger at its first counted call, after making
  its context: it is not judged while it holds no more than the largest context counted on the
  GPU (plus NVML's granularity), nor in the JOIN_GRACE_S seconds after the watch first saw it
  (a first context where none is counted yet has no size to be held to).
- **group_over_budget**: a group's members on a GPU hold more by NVML, together, than its
  budget, beyond their tolerances.

The tolerance of a member is what the ledger cannot know by design (docs/budgets.md, "CUDA
contexts count"): NVML's 2 MiB granularity, and for a member whose CUDA context is counted what
that context may grow by after its last measurement; the two make the stated margin, 64 MiB a
member. A member with no context counted has no context that could have grown unseen: its
tolerance is the granularity alone, and a context NVML shows beyond it is memory outside the
ledger (true: its budget does not count it; the message says so). A member whose context the
node agent counts but has not counted yet (a container's, in its first passes) is not judged
alone until then (`pending`); its group is, but no process is stopped for it.

A breach stands only when it holds over `CONFIRM` readings `PAUSE` seconds apart (a ledger and
NVML are read one after the other: an allocation made and freed between the two reads is not a
breach). Where NVML gives no per-process figure, no breach is judged from figures: the device
says why (gpuview), never 0.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import NamedTuple

from ..nvml import DeviceReading, Nvml
from ..record_types import WatchFinding, WatchMember, WatchProcess, WatchReport
from ..units import format_bytes
from .gpuview import Source, view

MiB = 1 << 20
GRANULE = 2 * MiB  # NVML's per-process figures come in 2 MiB steps
MARGIN = 64 * MiB  # docs/budgets.md's stated margin a member: context growth + the granule
CONFIRM = 3  # readings a breach must hold over
JOIN_GRACE_S = 10.0  # a process that maps the library may take this long to join its ledger
PAUSE = 0.1  # seconds between them

KINDS = ("outside_ledger", "unfenced", "group_over_budget")
Key = tuple[str, int, int, str]  # (kind, gpu, pid, group)


def _key(f: WatchFinding) -> Key:
    return (f["kind"], f["gpu"], f["pid"], f["group"])


def _who(p: WatchProcess) -> str:
    return f"pid {p['pid']}" + (f" ({p['command']})" if p["command"] else "")


_CtxKey = tuple[str, int, int, int]  # (ledger, slot, pid, device) of a member's context


class Watch:
    """Judges views; remembers, per member and device, the smallest CUDA context it saw
    counted (a context absorbs memory taken around the library at its next measurement: the
    first figure tells which member grew)."""

    def __init__(self, margin: int = MARGIN):
        self.margin = margin
        self.first_ctx: dict[_CtxKey, int] = {}
        self.first_seen: dict[int, float] = {}  # pid -> when seen mapping the library, unjoined

    def tolerance(self, m: WatchMember) -> int:
        return self.margin if m["context"] > 0 else min(GRANULE, self.margin)

    def _ctx_key(self, p: WatchProcess) -> _CtxKey:
        m = p["member"]
        assert m is not None
        return (m["ledger"], m["slot"], p["pid"], m["device"])

    def remember(self, report: WatchReport) -> None:
        """Note the contexts counted now (once a pass, on its first reading)."""
        alive = set()
        for d in report["devices"]:
            for p in d["processes"]:
                if p["member"] is None or p["member"]["device"] < 0:
                    continue
                k = self._ctx_key(p)
                alive.add(k)
                ctx = p["member"]["context"]
                if ctx > 0:
                    self.first_ctx[k] = min(self.first_ctx.get(k, ctx), ctx)
        self.first_ctx = {k: v for k, v in self.first_ctx.items() if k in alive}
        now, joining = time.monotonic(), set()
        for d in report["devices"]:
            for p in d["processes"]:
                if p["member"] is None and p["shim"]:
                    joining.add(p["pid"])
                    self.first_seen.setdefault(p["pid"], now)
        self.first_seen = {k: v for k, v in self.first_seen.items() if k in joining}

    def joining(self, p: WatchProcess, context: int) -> bool:
        """A process that maps the library and may not have joined its ledger yet."""
        if not p["shim"]:
            return False
        if p["bytes"] is not None and p["bytes"] <= context + GRANULE:
            return True
        seen = self.first_seen.get(p["pid"])
        return seen is None or time.monotonic() - seen < JOIN_GRACE_S

    def judge(
        self, report: WatchReport, pending: Callable[[WatchProcess], bool] = lambda p: False
    ) -> list[WatchFinding]:
        out: list[WatchFinding] = []
        for d in report["devices"]:
            uuid = d["uuid"]
            for p in d["processes"]:
                f = self._process(p, d["fenced"], d["context"], pending(p))
                if f is not None:
                    out.append(dict(f, uuid=uuid))  # type: ignore[arg-type]
            if d["per_process"]:
                out += [dict(f, uuid=uuid) for f in self._groups(d["processes"], pending)]  # type: ignore[misc]
        return out

    def _process(
        self, p: WatchProcess, fenced: bool, context: int, pending: bool
    ) -> WatchFinding | None:
        m, used = p["member"], p["bytes"]
        if m is None:
            if p["fence"] != "unfenced" or not fenced:
                return None
            if self.joining(p, context):
                return None  # not joined yet: a context (its first counted call joins it)
            what = format_bytes(used) if used is not None else "memory (NVML gives no figure)"
            return self._finding(
                "unfenced", p, "", used, 0, 0,
                f"{_who(p)} holds {what} on GPU {p['gpu']}, which fenced processes use, and is "
                "a member of no ledger: it runs without a fence",
            )  # fmt: skip
        if used is None or m["device"] < 0 or pending:
            return None
        tol = self.tolerance(m)
        if used - m["held"] <= tol:
            return None
        ctx = (
            f"{format_bytes(m['context'])} CUDA context"
            if m["context"]
            else "no CUDA context counted"
        )
        return self._finding(
            "outside_ledger", p, m["group"], used, m["held"], tol,
            f"{_who(p)} holds {format_bytes(used)} on GPU {p['gpu']} by NVML, "
            f"{format_bytes(used - m['held'])} more than its ledger counts "
            f"({format_bytes(m['allocations'])} allocations + {ctx}; group {m['group']}): "
            "memory taken around the preload library",
        )  # fmt: skip

    @staticmethod
    def _finding(
        kind: str, p: WatchProcess, group: str, used: int | None, counted: int, tol: int, msg: str
    ) -> WatchFinding:
        return {
            "kind": kind,  # type: ignore[typeddict-item]
            "gpu": p["gpu"],
            "uuid": "",
            "pid": p["pid"],
            "group": group,
            "bytes": used,
            "counted": counted,
            "tolerance": tol,
            "excess": None if used is None else used - counted,
            "message": msg,
        }

    def _groups(
        self, procs: list[WatchProcess], pending: Callable[[WatchProcess], bool]
    ) -> list[WatchFinding]:
        groups: dict[tuple[str, int], list[WatchProcess]] = {}
        for p in procs:
            m = p["member"]
            if m is not None and m["device"] >= 0 and m["limit"] and p["bytes"] is not None:
                groups.setdefault((m["ledger"], m["device"]), []).append(p)
        out = []
        for _key, ps in sorted(groups.items()):
            members = [p["member"] for p in ps if p["member"] is not None]
            group, limit = members[0]["group"], members[0]["limit"]
            total = sum(p["bytes"] or 0 for p in ps)
            tol = sum(self.tolerance(m) for m in members)
            if total - limit <= tol:
                continue
            victim = self._victim(ps, pending)
            f = self._finding(
                "group_over_budget", ps[0], group, total, limit, tol,
                f"group {group} holds {format_bytes(total)} on GPU {ps[0]['gpu']} by NVML "
                f"({len(ps)} member{'s' if len(ps) > 1 else ''}), over its budget of "
                f"{format_bytes(limit)}",
            )  # fmt: skip
            f["pid"] = victim["pid"] if victim else 0
            out.append(f)
        return out

    def _victim(
        self, ps: list[WatchProcess], pending: Callable[[WatchProcess], bool]
    ) -> WatchProcess | None:
        """The member holding the most that the ledger did not see it allocate (NVML's figure
        less its allocations and the first context counted for it); none under --on-exceed
        warn (the group may pass its budget) or while a member's context is not counted yet."""
        if any(pending(p) for p in ps) or ps[0]["member"]["on_exceed"] == "warn":  # type: ignore[index]
            return None

        def unexplained(p: WatchProcess) -> int:
            m = p["member"]
            assert m is not None and p["bytes"] is not None
            first = self.first_ctx.get(self._ctx_key(p), m["context"])
            return p["bytes"] - m["allocations"] - first

        return max(ps, key=lambda p: (unexplained(p), p["bytes"] or 0))


def unknown(why: str) -> WatchReport:
    """The report where NVML cannot be read at all."""
    return {"known": False, "why": why, "devices": [], "findings": [], "placements": [],
            "not_visible": 0, "tolerance": 0}  # fmt: skip


class Where(NamedTuple):
    """Where the view looks: the /proc of the host's pid namespace, the GPU of an ordinal no
    member places (gpuview.view), the ledger files tried that are no source (unreadable)."""

    proc: str = "/proc"
    fallback: Callable[[int], int | None] = lambda d: None
    known: frozenset[tuple[str, int]] = frozenset()


def report(
    read_sources: Callable[[], Sequence[Source]],
    nvml: Nvml | None,
    watch: Watch | None = None,
    where: Where | None = None,
    pending: Callable[[WatchProcess], bool] = lambda p: False,
    confirm: int = CONFIRM,
    readings: Sequence[DeviceReading] | None = None,
) -> WatchReport:
    """NVML against the ledgers now, with the breaches that held over `confirm` readings
    (`readings`: NVML's first, where the caller has read it already)."""
    if nvml is None or not nvml.available:
        return unknown(nvml.why if nvml is not None else "no NVML")
    w = watch or Watch()
    proc, fallback, known = where or Where()
    rep = view(read_sources(), nvml.read() if readings is None else readings, proc, fallback, known)
    w.remember(rep)
    found = {_key(f): f for f in w.judge(rep, pending)}
    for _ in range(confirm - 1):
        if not found:
            break
        time.sleep(PAUSE)
        again = view(read_sources(), nvml.read(), proc, fallback, known)
        now = {_key(f): f for f in w.judge(again, pending)}
        found = {k: now[k] for k in found if k in now}
    rep["findings"] = sorted(found.values(), key=lambda f: (f["gpu"], f["kind"], f["pid"]))
    rep["tolerance"] = w.margin
    return rep
