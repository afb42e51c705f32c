"""`cudatrace top` as text: a snapshot of the box (record_types.TopSnapshot, gathered by
record/top.py) drawn as lines, for the live screen (present/top_screen.py) and for `--once`
alike: the same function draws both, so a script reads what a person sees.

    render(snapshot, view, width, height) -> [line, ...]

`view` (View) is what the person chose: the sort of the processes, one device or all, one
group or all. With a width every line fits it (columns a narrow screen cannot hold are left
out, the last one cut: names keep their function and `(file:line)`, analyze/sites/names.py fit);
without one (a pipe, a file) nothing is cut. With a height (the screen) the processes give way
first, so that groups, sites and denials stay in view.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, TypeVar

from ..analyze.sites.names import fit
from ..record_types import (
    TopDenial,
    TopDevice,
    TopGroup,
    TopProcess,
    TopRun,
    TopSnapshot,
)
from ..units import format_bytes, printable, wrap_line
from .status import BREACH_HEADS

T = TypeVar("T")

# sort key -> (name shown, what it sorts by; the largest first unless reversed)
SORTS = {
    "memory": "NVML's memory",
    "counted": "the ledger's count",
    "pid": "pid",
    "command": "command",
}
KEYS = {"m": "memory", "l": "counted", "p": "pid", "n": "command"}
HELP = "keys: m l p n sort (memory, ledger, pid, name)  r reverse  d/D device  g/G group  q quit"
FENCE_WORDS = {"unfenced": "UNFENCED", "elsewhere": "(elsewhere)", "not_visible": "(not visible)"}


@dataclass(frozen=True)
class View:
    """What the screen shows: the processes' order, one device (NVML index) or all (None),
    one group (its name) or all (None)."""

    sort: str = "memory"
    reverse: bool = False
    device: int | None = None
    group: str | None = None

    def key(self, ch: str, snap: TopSnapshot | None) -> View:
        """The view after a key (anything unknown leaves it as it is)."""
        if ch in KEYS:
            new = KEYS[ch]
            return replace(self, sort=new, reverse=self.reverse if new == self.sort else False)
        if ch == "r":
            return replace(self, reverse=not self.reverse)
        if ch in ("d", "D") and snap is not None:
            gpus: list[int | None] = [None, *(d["gpu"] for d in snap["devices"])]
            return replace(self, device=_step(gpus, self.device, ch == "d"))
        if ch in ("g", "G") and snap is not None:
            names: list[str | None] = [None, *(g["name"] for g in snap["groups"])]
            return replace(self, group=_step(names, self.group, ch == "g"))
        return self


def _step(items: Sequence[T], now: T, forward: bool) -> T:
    i = items.index(now) if now in items else 0
    return items[(i + (1 if forward else -1)) % len(items)]


def render(
    snap: TopSnapshot | None, view: View, width: int | None = None, height: int | None = None
) -> list[str]:
    """The lines of the view (see the module's doc); a screen's last line is left to its keys."""
    if snap is None:
        return _clip(["cudatrace top: reading the devices, ledgers and traces ..."], width)
    head = _clip(_head(snap, view, width), width)
    procs = _clip(_processes(snap, view, width), width)
    rest = _groups(snap, view, width) + _sites(snap, view, width) + _denials(snap, view, width)
    rest = _clip(rest + _notes(snap), width)
    if height is not None:
        room = height - len(head) - len(rest)
        if len(procs) > max(room, 3):
            keep = max(room, 3) - 1
            procs = [*procs[:keep], f"  ... {len(procs) - keep} more lines (d: one device)"]
    lines = head + procs + rest
    return lines if height is None else lines[:height]


def _clip(lines: list[str], width: int | None) -> list[str]:
    """Each line within width: prose wrapped (units.wrap_line), a table's row cut."""
    if width is None:
        return lines
    out = []
    for line in lines:
        pieces = wrap_line(line, width) if len(line) > width else [line]
        out += [fit(x, width, terminal=True) if len(x) > width else x for x in pieces]
    return out


def _head(snap: TopSnapshot, view: View, width: int | None) -> list[str]:
    order = SORTS[view.sort] + (", reversed" if view.reverse else "")
    dev = "all" if view.device is None else str(view.device)
    grp = "all" if view.group is None else printable(view.group)
    when = time.strftime("%H:%M:%S", time.localtime(snap["time"]))
    first = f"cudatrace top  {printable(snap['host'])}  {when}"
    chose = f"sort: {order}   device: {dev}   group: {grp}"
    lines = [f"{first}   {chose}"]
    if width is not None and len(lines[0]) > width:
        lines = [first, chose]
    if not snap["nvml"]["known"]:
        lines.append(f"NVML: {snap['nvml']['why']}: no device figures")
    return lines


# ---- devices and their processes ---------------------------------------------------------------


def _device_line(d: TopDevice) -> str:
    name = printable(d["name"]) or "GPU"
    line = f"GPU {d['gpu']}: {name}"
    if d["used"] is not None and d["total"] is not None:
        where = "" if d["source"] == "nvml" else " (the host's memory, which it shares)"
        line += f"; {format_bytes(d['used'])} of {format_bytes(d['total'])} in use{where}"
    if d["ledgers"]:
        line += f"; the ledgers count {format_bytes(d['ledgers'])}"
    return line


def _selected(p: TopProcess, snap: TopSnapshot, view: View) -> bool:
    if view.group is None:
        return True
    if p["group"] == view.group:
        return True
    g = next((g for g in snap["groups"] if g["name"] == view.group), None)
    return g is not None and p["pid"] in g["unfenced"]


def _order(procs: list[TopProcess], view: View) -> list[TopProcess]:
    def key(p: TopProcess) -> tuple[Any, ...]:
        if view.sort == "pid":
            return (p["pid"],)
        if view.sort == "command":
            return (p["command"], p["pid"])
        n = p["bytes"] if view.sort == "memory" else p["counted"]
        return (-(n if n is not None else -1), p["pid"])

    out = sorted(procs, key=key)
    return out[::-1] if view.reverse else out


def _run_name(path: str) -> str:
    return printable(path.rstrip("/").rsplit("/", 1)[-1]) if path else ""


def _processes(snap: TopSnapshot, view: View, width: int | None) -> list[str]:
    lines: list[str] = []
    devices = [d for d in snap["devices"] if view.device in (None, d["gpu"])]
    if snap["nvml"]["known"] and not snap["devices"]:
        lines.append("no GPU: NVML lists no device")
    for d in devices:
        lines.append(_device_line(d))
        if not d["per_process"] and d["why"]:
            lines.append(f"  {d['why']}: figures per process N/A")
        procs = _order([p for p in d["processes"] if _selected(p, snap, view)], view)
        if not procs:
            lines.append("  no process holds memory here" + ("" if view.group is None else
                         f" of group {printable(view.group)}"))  # fmt: skip
            continue
        rows = [["PID", "NVML", "LEDGER", "GROUP", "RUN", "COMMAND"]]
        for p in procs:
            group = printable(p["group"]) or FENCE_WORDS.get(p["fence"], "")
            rows.append(
                [
                    str(p["pid"]),
                    _size(p["bytes"], "N/A"),
                    _size(p["counted"], "-"),
                    group,
                    _run_name(p["run"]) or "-",
                    printable(p["command"]),
                ]  # fmt: skip
            )
        lines += _table(rows, {1, 2}, width, drop=(4, 2))
    return lines


def _size(n: int | None, none: str) -> str:
    return none if n is None else format_bytes(n)


def _table(
    rows: list[list[str]], right: set[int], width: int | None, drop: tuple[int, ...] = ()
) -> list[str]:
    """Aligned rows, two spaces apart, indented by two; with a width, the columns in `drop`
    are left out (in that order) while the rows are wider, and the last column is cut."""
    cols = list(range(len(rows[0])))
    for c in drop:
        if width is None or _row_width(rows, cols) <= width:
            break
        cols.remove(c)
    if width is not None:  # the last column gets the room left (names keep their function)
        room = max(8, width - _row_width(rows, cols[:-1]) - 2)
        rows = [[*r[:-1], fit(r[-1], room, terminal=True)] for r in rows]
    w = {c: max(len(r[c]) for r in rows) for c in cols}
    out = []
    for r in rows:
        cells = [r[c].rjust(w[c]) if c in right else r[c].ljust(w[c]) for c in cols]
        out.append(("  " + "  ".join(cells)).rstrip())
    return out


def _row_width(rows: list[list[str]], cols: list[int]) -> int:
    return 2 + sum(max(len(r[c]) for r in rows) for c in cols) + 2 * max(0, len(cols) - 1)


# ---- groups, sites, denials -------------------------------------------------------------------


def _groups(snap: TopSnapshot, view: View, width: int | None) -> list[str]:
    groups = [g for g in snap["groups"] if view.group in (None, g["name"])]
    if view.device is not None:
        groups = [g for g in groups if any(d["gpu"] == view.device for d in g["devices"])]
    if not groups:
        return []
    rows = [["GROUP", "DEV", "GPU", "LIMIT", "IN USE", "USED", "PEAK", "DENIED", "MEMBERS",
             "UNFENCED"]]  # fmt: skip
    for g in groups:
        rows += _group_rows(g)
    lines = ["BUDGET GROUPS", *_table(rows, {3, 4, 5, 6, 7, 8, 9}, width, drop=(6, 2, 1))]
    for g in groups:
        if view.group is not None:
            lines += [f"  member pid {m['pid']} {printable(m['command'])}: "
                      f"{format_bytes(m['held'])}" + (f", {m['denials']} denied" if m["denials"] else "")
                      for m in g["members"]]  # fmt: skip
    return lines


def _group_rows(g: TopGroup) -> list[list[str]]:
    members, unfenced = str(len(g["members"])), str(len(g["unfenced"]))
    out = []
    for i, d in enumerate(g["devices"] or [None]):
        name = printable(g["name"]) if i == 0 else ""
        if d is None:
            out.append([name, "-", "-", "none", "0 B", "-", "-", "0", members, unfenced])
            continue
        used = f"{100.0 * d['in_use'] / d['limit']:.0f}%" if d["limit"] else "-"
        out.append(
            [
                name,
                str(d["device"]),
                "-" if d["gpu"] is None else str(d["gpu"]),
                format_bytes(d["limit"]) if d["limit"] else "none",
                format_bytes(d["in_use"]),
                used,
                format_bytes(d["peak"]),
                str(d["denials"]),
                members,
                unfenced,
            ]  # fmt: skip
        )
    return out


def _run_on(run: TopRun, snap: TopSnapshot, view: View) -> bool:
    if view.group is None:
        return True
    g = next((g for g in snap["groups"] if g["name"] == view.group), None)
    return g is not None and any(m["run"] == run["path"] for m in g["members"])


def _gpu_matches(gpu: str, snap: TopSnapshot, index: int) -> bool:
    uuid = next((d["uuid"] for d in snap["devices"] if d["gpu"] == index), None)
    return gpu == str(index) or (uuid is not None and gpu == uuid)


def _sites(snap: TopSnapshot, view: View, width: int | None) -> list[str]:
    lines: list[str] = []
    for run in snap["runs"]:
        if not _run_on(run, snap, view):
            continue
        for d in run["devices"]:
            if view.device is not None and not _gpu_matches(d["gpu"], snap, view.device):
                continue
            on = f"device {d['device']}" + (f" (gpu {printable(d['gpu'])})" if d["gpu"] else "")
            lines.append(f"  {_run_name(run['path'])} ({printable(run['command'])}), {on}: "
                         f"{format_bytes(d['live'])} live")  # fmt: skip
            rows = [[format_bytes(s["bytes"]), printable(s["label"])] for s in d["sites"]]
            lines += ["  " + x for x in _table(rows, {0}, None if width is None else width - 2)]
    return ["TOP SITES (runs being traced)", *lines] if lines else []


def _denials(snap: TopSnapshot, view: View, width: int | None) -> list[str]:
    rows = [x for x in snap["denials"] if view.group in (None, x["group"])]
    room = None if width is None else max(20, width - 12)  # a site's name on a line of its own
    return ["LATEST DENIALS", *(_denial_line(x, room) for x in rows)] if rows else []


def _denial_line(x: TopDenial, room: int | None) -> str:
    when = (
        time.strftime("%H:%M:%S", time.localtime(x["wall_time"])) if x["wall_time"] else "--:--:--"
    )
    who = f"pid {x['pid']}" + (f" ({printable(x['group'])})" if x["group"] else "")
    if x["label"] is None:
        return (f"  {when}  {who}: {x['count']} denied; no launcher kept the site (the preload "
                "library's line on its stderr names it)")  # fmt: skip
    size = format_bytes(x["bytes"]) if x["bytes"] is not None else "?"
    times = f" x{x['count']}" if x["count"] > 1 else ""
    label = printable(x["label"])
    if room is not None:
        label = fit(label, room, terminal=True)
    line = f"  {when}  {who}: {size}{times} {x['api']} at {label}"
    if x["limit"] is not None and x["in_use"] is not None:
        line += f"; in use {format_bytes(x['in_use'])} of {format_bytes(x['limit'])}"
    return line


def _notes(snap: TopSnapshot) -> list[str]:
    lines = [f"{BREACH_HEADS[f['kind']]}: {f['message']}" for f in snap["findings"]]
    return lines + [f"cannot read {printable(e)}" for e in snap["errors"]]
