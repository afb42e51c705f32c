"""The sentences of a sweep's JSON (cudatrace.sweep/1): sizes in readable units, each law on
one line, the --expect sentence, how a run ended. sweep/fits.py writes them into the document;
present/sweep.py and the command's progress lines use the same phrases, so the text and the
JSON never disagree."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

KiB, MiB, GiB, TiB = 1 << 10, 1 << 20, 1 << 30, 1 << 40
UNITS = (("TiB", TiB), ("GiB", GiB), ("MiB", MiB), ("KiB", KiB))


def readable(v: float) -> str:
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


def ratio_text(x: float) -> str:
    return (f"{x:.3g}").rstrip(".")


def _knob_unit(knob: Mapping[str, Any]) -> tuple[str, int]:
    """For a knob in bytes: the unit its values are written in (MiB for 256MiB..1GiB)."""
    pos = [v for v in knob["numbers"] if v > 0]
    low = min(pos) if pos else 1
    for name, size in UNITS:
        if low >= size:
            return name, size
    return "B", 1


def per_text(knob: Mapping[str, Any]) -> str:
    """'per MiB of --kv-cache-memory', 'per block', 'per 1 of --layer-mib'."""
    label = knob["flag"] or (knob["placeholder"] if knob["placeholder"] != "{}" else "the value")
    if knob["unit"] == "bytes":
        return f"per {_knob_unit(knob)[0]} of {label}"
    if knob.get("noun"):
        return "per {}".format(knob["noun"])
    return f"per 1 of {label}"


def slope_text(slope: float, knob: Mapping[str, Any], ratio: bool = True) -> str:
    """'28.0 MiB per MiB of --kv-cache-memory (28x)', '1.75 MiB per block'."""
    if knob["unit"] == "bytes":
        _, size = _knob_unit(knob)
        return "{} {}{}".format(
            readable(slope * size),
            per_text(knob),
            f" ({ratio_text(slope)}x)" if ratio else "",
        )
    return f"{readable(slope)} {per_text(knob)}"


def _intercept(v: float) -> str:
    return (f"- {readable(-v)}") if v < 0 else (f"+ {readable(v)}")


def _points(points: Sequence[Sequence[float]], knob: Mapping[str, Any] | None) -> str:
    def val(x: float) -> str:
        if knob is not None and knob["unit"] == "bytes":
            return size_spec(int(x)) if x else "0"
        return f"{x:g}"

    return ", ".join(f"{val(x)}: {readable(y)}" for x, y in points)


def law_text(d: dict[str, Any], knob: Mapping[str, Any]) -> str:
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


def _term_text(coef: float, knobs: Sequence[Mapping[str, Any]]) -> str:
    labels = [k["flag"] or k["placeholder"] for k in knobs]
    if not knobs:
        return readable(coef)
    if any(k["unit"] == "bytes" for k in knobs):
        return "{} x {}".format(ratio_text(coef), " x ".join(labels))
    return "{} x {}".format(readable(coef), " x ".join(labels))


def grid_law_text(d: dict[str, Any], knobs: Sequence[Mapping[str, Any]]) -> str:
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
    label: str, slope: float, expect: float, knob: Mapping[str, Any], where: str | None = None
) -> str:
    """'allocate_layer_kv grows 28x the flag (28.0 MiB per MiB of --kv-cache-memory): sized per
    layer, or once for each of 28 things?' (where: the other knobs' values, on a grid)"""
    who = "the peak" if label == "peak" else label
    got = slope_text(slope, knob, ratio=False) + (f" at {where}" if where else "")
    if expect <= 0:
        return f"{who} grows ({got}) though --expect says {ratio_text(expect)}"
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
    return f"{who} grows {ratio_text(ratio)}x {what} ({got}): {hint}"


def ended_text(e: Mapping[str, Any]) -> str:
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
