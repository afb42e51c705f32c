"""The text of `cudatrace sweep`, rendered from the dict of --json (cudatrace.sweep/1), so the
two never disagree (the phrases both carry: analyze/documents/sweep_sentences.py)."""

from __future__ import annotations

from ..analyze.documents.sweep_sentences import ratio_text, readable, slope_text
from ..analyze.documents.sweep_types import Sweep
from ..analyze.sites.names import fit, on_terminal
from .text import wrap_prose


def _table(rows: list[list[str]], right: set[int]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    out = []
    for r in rows:
        cells = [c.rjust(widths[i]) if i in right else c.ljust(widths[i]) for i, c in enumerate(r)]
        out.append(("  " + "  ".join(cells)).rstrip())
    return out


def render(d: Sweep) -> str:
    """The text of a sweep from its cudatrace.sweep/1 dict, section by section."""
    L: list[str] = []
    _head(d, L)
    _runs(d, L)
    width = _laws(d, L)
    _bytes_table(d, L, width)
    _expectation(d, L)
    _prediction(d, L)
    for n in d["notes"]:
        L.append("")
        L.append(f"note: {n}")
    return wrap_prose("\n".join(L)) + "\n"


def _head(d: Sweep, L: list[str]) -> None:
    """The command, its knobs, how each run was stopped, where the traces are."""
    w = L.append
    w("cudatrace sweep: {}".format(" ".join(d["command"])))
    for k in d["knobs"]:
        w(
            "  knob {}{}: {}".format(
                k["flag"] or k["placeholder"],
                " ({})".format(k["placeholder"]) if k["flag"] else "",
                ", ".join(k["values"]),
            )
        )
    st = d["stop"]
    if st["after"] is not None:
        w(
            "  each run stopped after {:g}s (SIGINT, then SIGTERM and SIGKILL {:g}s apart)".format(
                st["after"], st["grace"]
            )
        )
    elif st["url"] is not None:
        w(
            "  each run stopped once {} answers and traced memory stays the same for {:g}s".format(
                st["url"], st["settle"] or 0.0
            )
        )
    w("  traces in {}".format(d["directory"]))
    w("")


def _runs(d: Sweep, L: list[str]) -> None:
    """One row per run: its value, how it ended, its peak, its trace; why a run was left out."""
    rows = [["value", "how it ended", "peak", "trace"]]
    for r in d["runs"]:
        peak = readable(r["peak_bytes"]) if r["peak_bytes"] is not None else "-"
        if not r["included"]:
            peak += " (left out)" if r["peak_bytes"] is not None else ""
        rows.append([r["text"], r["ended"]["text"], peak, _rel(r["directory"], d["directory"])])
    L.extend(_table(rows, {2}))
    for r in d["runs"]:
        message = r["ended"].get("message")
        if not r["included"] and message:
            L.append("  {}: {}".format(r["text"], message))
    L.append("")


def _laws(d: Sweep, L: list[str]) -> int:
    """The law of the peak and of each site; returns the width of the label column."""
    w = L.append
    knobs = d["knobs"]
    series = [d["peak"]] + d["sites"]
    if len(knobs) > 1:
        w(
            "Laws of the bytes live at each run's peak (least squares in {}):".format(
                ", ".join(k["flag"] or k["placeholder"] for k in knobs)
            )
        )
    else:
        k = knobs[0]
        w(
            "Laws of the bytes live at each run's peak (least squares in %s):"
            % (k["flag"] or ("the value ({})".format(k["placeholder"])))
        )
    width = max(len(s["label"]) for s in series)
    if on_terminal():  # labels are cut (their middles first) on a terminal only
        width = min(48, width)
    for s in series:
        w(
            "  {}  {}{}".format(
                fit(s["label"], width).ljust(width),
                s["law"]["text"],
                "   <-- faster than expected" if s["contradicts_expectation"] else "",
            )
        )
    if d["more_sites"]:
        w("  ... and %d more sites (--top)" % d["more_sites"])
    return width


def _bytes_table(d: Sweep, L: list[str], width: int) -> None:
    """The bytes of each series at each included run, when there are 8 runs or fewer."""
    inc = [i for i, r in enumerate(d["runs"]) if r["included"]]
    if not inc or len(inc) > 8:
        return
    L.append("")
    L.append("Bytes live at each run's peak:")
    rows = [["", *[d["runs"][i]["text"] for i in inc]]]
    for s in [d["peak"]] + d["sites"]:
        cells = ["-" if s["bytes"][i] is None else readable(s["bytes"][i] or 0) for i in inc]
        rows.append([fit(s["label"], width), *cells])
    L.extend(_table(rows, set(range(1, len(inc) + 1))))


def _expectation(d: Sweep, L: list[str]) -> None:
    """--expect: what grows faster than expected."""
    expect = d["expect"]
    if expect is None:
        return
    w = L.append
    knobs = d["knobs"]
    w("")
    flagged = [s for s in [d["peak"], *d["sites"]] if s["contradicts_expectation"]]
    if isinstance(expect, dict):  # a grid's: per knob
        what = ", ".join(
            "{} per unit of {}".format(readable(expect[x["name"]]), x["flag"] or x["placeholder"])
            for x in knobs
            if x["name"] in expect
        )
        text = d.get("expect_text") or str(expect)
    else:
        what = slope_text(expect, knobs[0], ratio=False)
        text = d.get("expect_text") or ratio_text(expect)
    w(f"Against --expect {text} ({what}):")
    if d.get("expect_checked") is False:
        w(
            "  no verdict: fewer than two runs went into the laws, so there is no law to hold it against"
        )
        return
    for s in flagged:
        w("  ! " + (s["expectation"] or ""))
    if not flagged:
        w("  nothing grows more than 10% faster than expected")


def _pm(x: float | None) -> str:
    return "" if x is None else f" +- {readable(x)}"


def _prediction(d: Sweep, L: list[str]) -> None:
    """--predict: the peak and the top sites at a value, and a budget for it."""
    p = d.get("prediction")
    if p is None:
        return
    w = L.append
    knobs = d["knobs"]
    w("")
    grid = len(knobs) > 1
    at = p["at"] if grid or not knobs[0]["flag"] else "{} {}".format(knobs[0]["flag"], p["at"])
    w(
        "Predicted at {}{}:".format(
            at, " (extrapolated beyond the values run)" if p.get("extrapolated") else ""
        )
    )
    if p["peak"] is None:
        w("  no law to predict from")
        return
    rows = [["peak", readable(p["peak"]["bytes"]) + _pm(p["peak"]["stderr"]), p["peak"]["how"]]]
    for s in p["sites"]:
        rows.append([s["label"][:60], readable(s["bytes"]) + _pm(s["stderr"]), s["how"]])
    L.extend(_table(rows, set()))
    for n in p["notes"]:
        if not n.startswith("extrapolated"):
            w(f"  ({n})")
    b = p["budget"]
    if b is not None:
        w("  budget for a co-tenant box: --budget {}: {}".format(b["spec"], b["reason"]))


def _rel(path: str, base: str) -> str:
    import os

    try:
        r = os.path.relpath(path, base)
        return r if not r.startswith("..") else path
    except ValueError:
        return path
