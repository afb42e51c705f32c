"""The text of `cudatrace sweep`, rendered from the dict of --json (cudatrace.sweep/1), so the
two never disagree; and the phrases both carry (slopes in readable units, how a run ended, the
--expect sentence)."""

from __future__ import annotations

from ..analyze.names import fit, on_terminal

KiB, MiB, GiB, TiB = 1 << 10, 1 << 20, 1 << 30, 1 << 40
UNITS = (("TiB", TiB), ("GiB", GiB), ("MiB", MiB), ("KiB", KiB))


def readable(v) -> str:
    """Bytes, maybe fractional or negative: '0.5 B', '17 B', '1.75 MiB', '28.0 GiB'."""
    v = float(v)
    if v < 0:
        return "-" + readable(-v)
    if v < 1024:
        return ("%d B" % v) if v == int(v) else (f"{v:.3g} B")
    for name, size in UNITS:
        if v >= size:
            x = v / size
            s = (f"{x:.2f}") if x < 10 else (f"{x:.1f}")
            return f"{s} {name}"
    return "%d B" % v  # pragma: no cover


def size_spec(n: int) -> str:
    """A size as --budget takes it, short: '64GiB', '1.75GiB', '600MiB'."""
    for name, size in UNITS:
        x = n / size
        if x >= 1 and (x * 4) == int(x * 4) and "e" not in f"{x:g}":
            return f"{x:g}{name}"
    return "%dMiB" % -(-n // MiB) if n >= MiB else "%d" % n


def _ratio(x: float) -> str:
    return (f"{x:.3g}").rstrip(".")


def _knob_unit(knob: dict) -> tuple[str, int]:
    """For a knob in bytes: the unit its values are written in (MiB for 256MiB..1GiB)."""
    pos = [v for v in knob["numbers"] if v > 0]
    low = min(pos) if pos else 1
    for name, size in UNITS:
        if low >= size:
            return name, size
    return "B", 1


def per_text(knob: dict) -> str:
    """'per MiB of --kv-cache-memory', 'per block', 'per 1 of --layer-mib'."""
    label = knob["flag"] or (knob["placeholder"] if knob["placeholder"] != "{}" else "the value")
    if knob["unit"] == "bytes":
        return f"per {_knob_unit(knob)[0]} of {label}"
    if knob.get("noun"):
        return "per {}".format(knob["noun"])
    return f"per 1 of {label}"


def slope_text(slope: float, knob: dict, ratio: bool = True) -> str:
    """'28.0 MiB per MiB of --kv-cache-memory (28x)', '1.75 MiB per block'."""
    if knob["unit"] == "bytes":
        _, size = _knob_unit(knob)
        return "{} {}{}".format(
            readable(slope * size),
            per_text(knob),
            f" ({_ratio(slope)}x)" if ratio else "",
        )
    return f"{readable(slope)} {per_text(knob)}"


def _intercept(v: float) -> str:
    return (f"- {readable(-v)}") if v < 0 else (f"+ {readable(v)}")


def _points(points, knob: dict | None) -> str:
    def val(x):
        if knob is not None and knob["unit"] == "bytes":
            return size_spec(int(x)) if x else "0"
        return f"{x:g}"

    return ", ".join(f"{val(x)}: {readable(y)}" for x, y in points)


def law_text(d: dict, knob: dict) -> str:
    """One line for a series along one knob."""
    law, fit = d["law"], d["fit"]
    kind = law["kind"]
    n = len(law["points"])
    if kind == "none":
        return "no run finished well"
    if kind == "one_point":
        return "one value only ({}): no law".format(_points(law["points"], knob))
    if kind == "flat":
        ys = [y for _, y in law["points"]]
        if max(ys) == min(ys):
            return f"flat at {readable(ys[0])}"
        return f"flat at {readable(min(ys))} to {readable(max(ys))} (within 1%)"
    line = "{} {}".format(slope_text(fit["slope"], knob), _intercept(fit["intercept"]))
    if kind == "affine":
        if not law["tested"]:
            return line + "  (2 points: a line always fits two, untested)"
        return line + "  (%s, %d points)" % (law["detail"], n)
    return "NOT AFFINE: {}; points {}; least-squares line {}, r2 {:.3f}".format(
        law["detail"],
        _points(law["points"], knob),
        line,
        fit["r2"],
    )


def _term_text(coef: float, knobs: list[dict]) -> str:
    labels = [k["flag"] or k["placeholder"] for k in knobs]
    if not knobs:
        return readable(coef)
    if any(k["unit"] == "bytes" for k in knobs):
        return "{} x {}".format(_ratio(coef), " x ".join(labels))
    return "{} x {}".format(readable(coef), " x ".join(labels))


def grid_law_text(d: dict, knobs: list[dict]) -> str:
    fit, law = d["fit"], d["law"]
    if fit is None:
        return "no law: too few runs finished well to determine it"
    if law["kind"] == "flat":
        ys = [p[-1] for p in law["points"]]
        return (
            f"flat at {readable(ys[0])}"
            if max(ys) == min(ys)
            else f"flat at {readable(min(ys))} to {readable(max(ys))} (within 1%)"
        )
    by = {k["name"]: k for k in knobs}
    terms = [t for t in fit["terms"] if t["knobs"] and t["coefficient"] != 0]
    parts = [_term_text(t["coefficient"], [by[n] for n in t["knobs"]]) for t in terms]
    text = " + ".join(parts) if parts else "0"
    text += " " + _intercept(fit["intercept"])
    how = "exact" if fit["exact"] else "r2 {:.4f}".format(fit["r2"])
    if not law["tested"]:
        how += ", as many terms as runs: untested"
    return "%s  (%s law, %s, %d points)" % (text, fit["model"], how, fit["n"])


def expectation_sentence(
    label: str, slope: float, expect: float, knob: dict, where: str | None = None
) -> str:
    """'allocate_layer_kv grows 28x the flag (28.0 MiB per MiB of --kv-cache-memory): sized per
    layer, or once for each of 28 things?' (where: the other knobs' values, on a grid)"""
    who = "the peak" if label == "peak" else label
    got = slope_text(slope, knob, ratio=False) + (f" at {where}" if where else "")
    if expect <= 0:
        return f"{who} grows ({got}) though --expect says {_ratio(expect)}"
    ratio = slope / expect
    if knob["unit"] == "bytes" and expect == 1:
        what = "the flag" if knob["flag"] else "the value"
    else:
        what = f"the expected {slope_text(expect, knob, ratio=False)}"
    n = round(ratio)
    if n >= 2 and abs(ratio - n) <= 0.02 * n:
        hint = (
            ("sized once for each of %d things?" % n)
            if knob.get("noun") == "layer"
            else "sized per layer, or once for each of %d things?" % n
        )
    else:
        hint = "something more than the knob sizes it?"
    return f"{who} grows {_ratio(ratio)}x {what} ({got}): {hint}"


def ended_text(e: dict) -> str:
    how = e.get("how")
    sig = e.get("signal")
    if how == "exited":
        return "exited %d" % e["status"]
    if how == "signaled":
        return f"died of {sig}"
    if how == "stopped" and e.get("why") == "time":
        return "stopped after {:g}s ({})".format(e["seconds"], sig)
    if how == "stopped":
        return "stopped: URL answered at {:.1f}s, {} ({})".format(
            e["answered_after"],
            ("memory settled {:g}s".format(e["settle"]))
            if e.get("settled")
            else "memory never settled",
            sig,
        )
    if how == "killed":
        return "killed after {:.1f}s: SIGINT and SIGTERM did not stop it".format(e.get("after", 0))
    if how == "url_timeout":
        return "{} did not answer in {:g}s; stopped ({})".format(e["url"], e["seconds"], sig)
    if how == "failed_under_budget":
        return "failed under the budget (%d allocation%s denied; exit status %s)" % (
            e.get("denied", 0),
            "" if e.get("denied") == 1 else "s",
            e.get("status"),
        )
    if how == "no_trace":
        return "no trace (exit status {}): {}".format(e.get("status"), e.get("why"))
    if how == "not_started":
        # (a sweep.json of an older version: its messages carried the prefix)
        return "not started: {}".format(e.get("why", "").replace("cudatrace: ", "", 1))
    if how == "interrupted":
        return f"interrupted ({sig})"
    return str(how)


def _table(rows: list[list[str]], right: set[int]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    out = []
    for r in rows:
        cells = [c.rjust(widths[i]) if i in right else c.ljust(widths[i]) for i, c in enumerate(r)]
        out.append(("  " + "  ".join(cells)).rstrip())
    return out


def render(d: dict) -> str:
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
    return "\n".join(L) + "\n"


def _head(d: dict, L: list) -> None:
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
                st["url"], st["settle"]
            )
        )
    w("  traces in {}".format(d["directory"]))
    w("")


def _runs(d: dict, L: list) -> None:
    """One row per run: its value, how it ended, its peak, its trace; why a run was left out."""
    rows = [["value", "how it ended", "peak", "trace"]]
    for r in d["runs"]:
        peak = readable(r["peak_bytes"]) if r["peak_bytes"] is not None else "-"
        if not r["included"]:
            peak += " (left out)" if r["peak_bytes"] is not None else ""
        rows.append([r["text"], r["ended"]["text"], peak, _rel(r["directory"], d["directory"])])
    L.extend(_table(rows, {2}))
    for r in d["runs"]:
        if not r["included"] and r["ended"].get("message"):
            L.append("  {}: {}".format(r["text"], r["ended"]["message"]))
    L.append("")


def _laws(d: dict, L: list) -> int:
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


def _bytes_table(d: dict, L: list, width: int) -> None:
    """The bytes of each series at each included run, when there are 8 runs or fewer."""
    inc = [i for i, r in enumerate(d["runs"]) if r["included"]]
    if not inc or len(inc) > 8:
        return
    L.append("")
    L.append("Bytes live at each run's peak:")
    rows = [["", *[d["runs"][i]["text"] for i in inc]]]
    for s in [d["peak"]] + d["sites"]:
        rows.append([fit(s["label"], width), *[readable(s["bytes"][i]) for i in inc]])
    L.extend(_table(rows, set(range(1, len(inc) + 1))))


def _expectation(d: dict, L: list) -> None:
    """--expect: what grows faster than expected."""
    if d["expect"] is None:
        return
    w = L.append
    knobs = d["knobs"]
    w("")
    flagged = [s for s in [d["peak"]] + d["sites"] if s["contradicts_expectation"]]
    if len(knobs) > 1:
        what = ", ".join(
            "{} per unit of {}".format(
                readable(d["expect"][x["name"]]), x["flag"] or x["placeholder"]
            )
            for x in knobs
            if x["name"] in d["expect"]
        )
    else:
        what = slope_text(d["expect"], knobs[0], ratio=False)
    w("Against --expect {} ({}):".format(d.get("expect_text") or _ratio(d["expect"]), what))
    for s in flagged:
        w("  ! " + s["expectation"])
    if not flagged:
        w("  nothing grows more than 10% faster than expected")


def _pm(x) -> str:
    return "" if x is None else f" +- {readable(x)}"


def _prediction(d: dict, L: list) -> None:
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
