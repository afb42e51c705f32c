"""`cudatrace status` as text: the budgets in force, from the ledgers' snapshots
(record/ledger_status.py status_json gathers them; --json prints that data as is)."""

from __future__ import annotations

from ..record_types import (
    LedgerDevice,
    LedgerMember,
    LedgerSnapshot,
    Status,
    Unfenced,
    WatchDevice,
    WatchReport,
)
from ..units import format_bytes
from .text import ranges, wrap_prose

BREACH_HEADS = {
    "outside_ledger": "OUTSIDE THE LEDGER",
    "unfenced": "UNFENCED ON A FENCED GPU",
    "group_over_budget": "GROUP OVER BUDGET BY NVML",
}


def _fmt_limit(n: int) -> str:
    return format_bytes(n) if n else "none"


def render_ledger(s: LedgerSnapshot) -> str:
    """The text of one ledger snapshot."""
    parts = s.get("parts") or []
    where = f"  ledger {s['path']}"
    if len(parts) > 1:  # a group of several users' parts (a shared directory)
        where = "  ledger parts: " + ", ".join(f"{p['path']} (uid {p['uid']})" for p in parts)
    lines = [_ledger_head(s), where]
    busy = [
        r
        for r in s["devices"]
        if any(r[k] for k in ("in_use", "dead_held", "peak", "denials", "over"))
    ]
    idle: dict[int, list[int]] = {}
    for r in s["devices"]:
        if r not in busy:
            idle.setdefault(r["limit"], []).append(r["device"])
    if not s["devices"]:
        lines.append("  no limits and no memory counted yet")
    if busy:
        lines += _device_rows(s, busy)
    for limit, devs in sorted(idle.items()):
        which, each = ("device", "") if len(devs) == 1 else ("devices", " each")
        lines.append(f"  {which} {ranges(devs)}: limit {_fmt_limit(limit)}{each}, nothing in use")
    for m in s["members"]:
        lines += _member_lines(m, uid=len(parts) > 1)
    return "\n".join(lines)


def _ledger_head(s: LedgerSnapshot) -> str:
    alive = [m for m in s["members"] if m["state"] != "dead"]
    dead = [m for m in s["members"] if m["state"] == "dead"]
    head = "%s: over budget: %s%s; %d process%s" % (
        s["name"],
        s["on_exceed"],
        ", pinned host memory counted" if s["count_host"] else "",
        len(alive),
        "" if len(alive) == 1 else "es",
    )
    if dead:
        head += " (+%d exited, not reclaimed yet)" % len(dead)
    if s["created"]:
        head += f"; since {s['created'].replace('T', ' ')}"
    return head


def _device_rows(s: LedgerSnapshot, busy: list[LedgerDevice]) -> list[str]:
    """The table of the devices in use: limit, use, peak, denials (contexts, over)."""
    warn = any(r["over"] for r in busy) or s["on_exceed"] == "warn"
    ctx = any(r.get("contexts") for r in busy)
    hdr = "  %-6s %12s %12s %12s %7s %8s" % (
        "device",
        "limit",
        "in use",
        "peak",
        "used",
        "denials",
    )
    if ctx:
        hdr += " %12s %12s" % ("allocations", "contexts")
    if warn:
        hdr += " %8s" % "over"
    lines = [hdr]
    for r in busy:
        pct = "%6.1f%%" % (100.0 * r["in_use"] / r["limit"]) if r["limit"] else "      -"
        row = "  %-6d %12s %12s %12s %7s %8d" % (
            r["device"],
            _fmt_limit(r["limit"]),
            format_bytes(r["in_use"]),
            format_bytes(r["peak"]),
            pct,
            r["denials"],
        )
        if ctx:
            row += " %12s %12s" % (format_bytes(r["allocations"]), format_bytes(r["contexts"]))
        if warn:
            row += " %8d" % r["over"]
        if r["dead_held"]:
            row += f"  (+{format_bytes(r['dead_held'])} held by exited processes)"
        lines.append(row)
    return lines


def _member_lines(m: LedgerMember, uid: bool = False) -> list[str]:
    """One member process: what it holds per device, and its last denial (uid: its user's)."""
    parts = []
    for d, r in sorted(m["devices"].items()):
        t = "device {}: {} (peak {}".format(d, format_bytes(r["held"]), format_bytes(r["peak"]))
        if r.get("context"):
            t = "device {}: {} = {} allocations + {} CUDA context (peak {}".format(
                d,
                format_bytes(r["held"]),
                format_bytes(r["allocations"]),
                format_bytes(r["context"]),
                format_bytes(r["peak"]),
            )
        if r["denials"]:
            t += ", %d denied" % r["denials"]
        if r["over"]:
            t += ", %d over" % r["over"]
        parts.append(t + ")")
    state = {"alive": "", "dead": " [exited]", "unknown": " [state unknown]"}[m["state"]]
    if m.get("other_pidns"):
        state += " [other pid namespace]"
    if uid and "uid" in m:
        state += " [uid %d]" % m["uid"]
    if m.get("share"):
        state += " [share {}: {} on each device]".format(
            m["share"], format_bytes(m["share_limit"]) if m.get("share_limit") else "no limit"
        )
    lines = ["  pid %-8d%s %s" % (m["pid"], state, "; ".join(parts) if parts else "nothing held")]
    last = m.get("last_denial")
    if last:
        via = (" via {}".format(" > ".join(reversed(last["via"])))) if last.get("via") else ""
        lines.append(
            "    last denied: {} at {}{}".format(format_bytes(last["bytes"]), last["label"], via)
        )
    return lines


def render_unfenced(u: Unfenced | None, budgets: bool = True) -> str:
    """The processes using a GPU that no ledger fences (record/fence.py unfenced), or "". That
    NVML cannot say is said only where budgets are in force."""
    if not u:
        return ""
    if not u["known"]:
        if not budgets:
            return ""
        return f"unfenced processes: unknown ({u['why']})"
    if not u["processes"]:
        return ""
    rows = [
        "  pid %-8d gpu %-3d %12s  %s" % (p["pid"], p["gpu"], _nvml_bytes(p["bytes"]), p["command"])
        for p in u["processes"]
    ]
    head = "UNFENCED: %d process%s on the GPUs that no budget ledger here counts" % (
        len(rows),
        "" if len(rows) == 1 else "es",
    )
    return "\n".join([head, *rows])


def _nvml_bytes(n: int | None) -> str:
    return "N/A" if n is None else format_bytes(n)


def _blind(d: WatchDevice) -> str:
    """A GPU where NVML gives no per-process figure: why, and what the platform offers."""
    head = f"gpu {d['gpu']}" + (f" ({d['uuid']})" if d["uuid"] else "")
    line = f"{head}: {d['why']}: the watch cannot tell what each process holds"
    if d["used"] is None:
        return line + ", nor what the device holds"
    where = "the device" if d["source"] == "nvml" else "the host's memory, which it shares"
    rest = max(0, d["used"] - d["ledgers"])
    return (
        f"{line}; {where}: {format_bytes(d['used'])} in use, the ledgers count "
        f"{format_bytes(d['ledgers'])}, {format_bytes(rest)} is in no ledger"
    )


def render_watch(w: WatchReport | None) -> str:
    """The watch's breaches (record/watch.py) and the GPUs it cannot see per process, or ""
    where there is nothing to say."""
    if not w or not w["known"]:
        return ""  # render_unfenced says why NVML cannot be read
    lines = [f"{BREACH_HEADS[f['kind']]}: {f['message']}" for f in w["findings"]]
    lines += [_blind(d) for d in w["devices"] if not d["per_process"]]
    return "\n".join(lines)


def render_status(st: Status) -> str:
    """What `cudatrace status [GROUP]` prints, from record.ledger_status.status_json's data (with
    record.fence's "unfenced")."""
    out = []
    unfenced = render_unfenced(st.get("unfenced"), bool(st["ledgers"]))
    w = st.get("watch")
    if not st["ledgers"] and not st["errors"] and not unfenced and not (w and w["findings"]):
        where = f"no ledgers in {st['dir']}" if "dir" in st else "no ledger on this node"
        return f"no budgets in force ({where})"
    for s in st["ledgers"]:
        out.append(render_ledger(s))
    for e in st["errors"]:
        out.append(f"{e['path']}: unusable: {e['error']}")
    if unfenced:
        out.append(unfenced)
    watch = render_watch(w)
    if watch:
        out.append(watch)
    return wrap_prose("\n\n".join(out))
