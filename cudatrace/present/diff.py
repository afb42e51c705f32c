"""`cudatrace diff A B`: what changed between two runs (or two builds) of a program.

Sites are matched by their symbolized frames (SFrame.key(): module basename, function, file
basename; module and offset when a frame could not be symbolized), never by address, so runs
with different load addresses compare, and so do builds when symbols are there. For each site:
bytes and counts live at each run's own peak and at the end, and whether the site allocated
anything at all in each run, which labels it new (never allocated in A), gone (never in B),
grown, shrunk or same (by bytes at the peak, then at the end). Largest absolute change first.
"""

from __future__ import annotations

from ..analyze.analysis import Analysis
from ..analyze.sites import Site, key_text, site_of
from ..units import format_bytes, printable
from .text import secs_text, size_text, table, term_width

SCHEMA = "cudatrace.diff/1"


def share_graph(a: Analysis, b: Analysis) -> None:
    """Recognize the allocator layers from the stacks of both runs together (names, not
    addresses: function identities compare across runs), so both sides fold alike."""
    if a.stacks.graph is not b.stacks.graph:
        b.stacks.graph = a.stacks.graph
    a.stacks.learn(a.allocation_stacks())
    b.stacks.learn(b.allocation_stacks())
    a.stacks.set_source(None)
    b.stacks.set_source(None)


def _side(a: Analysis) -> dict:
    m = a.model
    return {
        "path": str(a.path),
        "command": list(a.td.run.get("argv") or (a.traces[0].argv if a.traces else [])),
        "peak_bytes": m.peak_bytes,
        "peak_time": a.seconds(m.peak_ts) if m.found else None,
        "end_bytes": m.end_bytes,
        "allocs": m.counts.get("allocs", 0),
        "failed": m.counts.get("failed", 0),
        "denied": m.counts.get("denied", 0),
        "processes": len(a.traces),
        "truncated_files": [t.path.name for t in a.traces if not t.complete],
    }


def _pair(x: int, y: int) -> dict:
    return {"a": x, "b": y, "delta": y - x}


def diff(a: Analysis, b: Analysis, depth: int = 1, top: int | None = None) -> dict:
    """The comparison as a dict: the --json output (docs/report-json.md, cudatrace.diff/1)."""
    rows: dict[tuple, dict] = {}
    if a.stacks.graph is not b.stacks.graph:
        share_graph(a, b)

    def slot(key, frames, label, via=()):
        r = rows.get(key)
        if r is None:
            r = rows[key] = {
                "key": key,
                "frames": frames,
                "label": label,
                "via": list(via),
                "peak_bytes": [0, 0],
                "peak_count": [0, 0],
                "end_bytes": [0, 0],
                "end_count": [0, 0],
                "run_bytes": [0, 0],
                "run_count": [0, 0],
            }
        elif not r["frames"] and frames:
            r["frames"], r["label"] = frames, label
        return r

    for side, an in ((0, a), (1, b)):
        m = an.model
        for what, allocs in (("peak", m.groups_at_peak()), ("end", m.groups_at_end())):
            for s in an.sites(allocs, "site", depth):
                r = slot(s.key, s.frames, s.label(an.full_names), s.via)
                r[what + "_bytes"][side] += s.bytes
                r[what + "_count"][side] += s.count
        totals = m.stack_totals()
        an.stacks.prepare(list(totals))
        for (ti, leaf), (cnt, nbytes) in totals.items():
            key, fr = site_of(an.stacks, ti, leaf, depth)
            r = slot(key, fr, Site(key, fr).label(an.full_names), an.stacks.split(ti, leaf)[0])
            r["run_bytes"][side] += nbytes
            r["run_count"][side] += cnt

    sites = []
    for r in rows.values():
        pa, pb = r["peak_bytes"]
        ea, eb = r["end_bytes"]
        ra, rb = r["run_count"]
        if ra == 0 and rb > 0:
            status = "new"
        elif rb == 0 and ra > 0:
            status = "gone"
        elif pb != pa:
            status = "grown" if pb > pa else "shrunk"
        elif eb != ea:
            status = "grown" if eb > ea else "shrunk"
        else:
            status = "same"
        sites.append(
            {
                "status": status,
                "label": r["label"],
                "key": key_text(r["key"]),
                "frames": [f.as_json() for f in r["frames"]],
                "via": [f.as_json() for f in r["via"]],
                "peak": {
                    "a_bytes": pa,
                    "b_bytes": pb,
                    "delta_bytes": pb - pa,
                    "a_count": r["peak_count"][0],
                    "b_count": r["peak_count"][1],
                    "delta_count": r["peak_count"][1] - r["peak_count"][0],
                },
                "end": {
                    "a_bytes": ea,
                    "b_bytes": eb,
                    "delta_bytes": eb - ea,
                    "a_count": r["end_count"][0],
                    "b_count": r["end_count"][1],
                    "delta_count": r["end_count"][1] - r["end_count"][0],
                },
                "run": {
                    "a_bytes": r["run_bytes"][0],
                    "b_bytes": r["run_bytes"][1],
                    "a_count": ra,
                    "b_count": rb,
                    "delta_count": rb - ra,
                },
            }
        )
    sites.sort(
        key=lambda s: (
            -max(abs(s["peak"]["delta_bytes"]), abs(s["end"]["delta_bytes"])),
            -abs(s["peak"]["delta_count"]),
            -abs(s["end"]["delta_count"]),
            -abs(s["run"]["delta_count"]),
            s["label"],
        )
    )
    counts = {
        k: sum(1 for s in sites if s["status"] == k)
        for k in ("grown", "shrunk", "new", "gone", "same")
    }
    A, B = _side(a), _side(b)
    shown = sites if top is None else sites[:top]
    return {
        "schema": SCHEMA,
        "depth": depth,
        "a": A,
        "b": B,
        "totals": {
            "peak_bytes": _pair(A["peak_bytes"], B["peak_bytes"]),
            "end_bytes": _pair(A["end_bytes"], B["end_bytes"]),
            "allocs": _pair(A["allocs"], B["allocs"]),
            "failed": _pair(A["failed"], B["failed"]),
            "denied": _pair(A["denied"], B["denied"]),
        },
        "status_counts": counts,
        "sites": shown,
        "more_sites": len(sites) - len(shown),
    }


def _signed(n: int) -> str:
    if n == 0:
        return "0"
    return ("+" if n > 0 else "-") + format_bytes(abs(n))


def _pct(a: int, b: int) -> str:
    if a == 0:
        return "" if b == 0 else " (new)"
    return " (%+.1f%%)" % (100.0 * (b - a) / a)


def render_text(d: dict) -> str:
    L: list[str] = []
    w = L.append
    A, B, T = d["a"], d["b"], d["totals"]
    w("cudatrace diff")
    w("  A  {}  ({})".format(A["path"], " ".join(A["command"]) or "?"))
    w("  B  {}  ({})".format(B["path"], " ".join(B["command"]) or "?"))
    rows = [
        ["", "A", "B", "change"],
        [
            "peak",
            "{} at {}".format(size_text(A["peak_bytes"]), secs_text(A["peak_time"])),
            "{} at {}".format(size_text(B["peak_bytes"]), secs_text(B["peak_time"])),
            _signed(T["peak_bytes"]["delta"]) + _pct(A["peak_bytes"], B["peak_bytes"]),
        ],
        [
            "live at exit",
            size_text(A["end_bytes"]),
            size_text(B["end_bytes"]),
            _signed(T["end_bytes"]["delta"]) + _pct(A["end_bytes"], B["end_bytes"]),
        ],
        ["allocations", str(A["allocs"]), str(B["allocs"]), "%+d" % T["allocs"]["delta"]],
        ["failed", str(A["failed"]), str(B["failed"]), "%+d" % T["failed"]["delta"]],
        ["denied", str(A["denied"]), str(B["denied"]), "%+d" % T["denied"]["delta"]],
    ]
    L.extend(table(rows, {1, 2, 3}))
    for side, s in (("A", A), ("B", B)):
        if s["truncated_files"]:
            w("  {} has truncated trace files: {}".format(side, ", ".join(s["truncated_files"])))
    c = d["status_counts"]
    w("")
    w(
        "Sites by largest change (live at each run's own peak, and at exit): {}".format(
            ", ".join(
                "%d %s" % (c[k], k) for k in ("grown", "shrunk", "new", "gone", "same") if c[k]
            )
        )
    )
    rows = [["status", "peak A", "peak B", "change", "count", "exit A", "exit B", "change", "site"]]
    width = term_width()
    for s in d["sites"]:
        p, e = s["peak"], s["end"]
        rows.append(
            [
                s["status"],
                size_text(p["a_bytes"]),
                size_text(p["b_bytes"]),
                _signed(p["delta_bytes"]),
                "%+d" % p["delta_count"] if p["delta_count"] else "0",
                size_text(e["a_bytes"]),
                size_text(e["b_bytes"]),
                _signed(e["delta_bytes"]),
                s["label"],
            ]
        )
    if d["sites"]:
        L.extend(table(rows, {1, 2, 3, 4, 5, 6, 7}, width=width))
    else:
        w("  (no device allocation in either run)")
    if d["more_sites"]:
        w("  ... and %d more (--top)" % d["more_sites"])
    # whatever a trace held (argv, paths, names) reaches the terminal escaped
    return "\n".join(printable(x) for x in L) + "\n"
