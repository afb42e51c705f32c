"""The phrases the text report and the HTML page share: how a process's trace ended, a budget's
limits, the driver's version, a failure's requests, a frame's label and the layers it was
folded through (from the report's frames, as analyze/sites/stacks.py's SFrame says them)."""

from __future__ import annotations

from collections.abc import Mapping

from ...analyze.documents.report_types import (
    Report,
    ReportDenied,
    ReportFailed,
    ReportFrame,
    ReportProcess,
    ReportSite,
    ReportVersions,
)
from ...analyze.sites.stacks import SFrame, folded
from ..text import secs_text, size_text


def driver_text(v: object) -> str:
    if isinstance(v, int) and v >= 1000:
        return "CUDA %d.%d (%d)" % (v // 1000, (v % 1000) // 10, v)
    return str(v)


def versions_text(v: ReportVersions) -> str:
    """How the run was recorded: frames per event, the driver's, NVML's and the shim's
    versions."""
    parts = ["{} frames per event".format("/".join(str(d) for d in v["stack_depth"]))]
    if v["driver"]:
        parts.append("driver {}".format(", ".join(driver_text(d) for d in v["driver"])))
    if v.get("nvml_driver"):
        parts.append("NVML driver {}".format(v["nvml_driver"]))
    if v["shim"]:
        parts.append("shim {}".format(", ".join(v["shim"])))
    return "; ".join(parts)


def sframe(d: ReportFrame) -> SFrame:
    return SFrame(
        d["module"],
        d["function"],
        d["file"],
        d["line"],
        d["address"],
        d.get("offset", 0),
        d.get("inlined", False),
    )


def frame_label(d: ReportFrame, with_module: bool = True, full: bool = False) -> str:
    f = sframe(d)
    lab = f.long_label(full) if with_module else f.label(full)
    return lab + ("  (inlined)" if f.inlined else "")


def via_text(site: ReportSite | ReportFailed | ReportDenied, full: bool = False) -> str:
    """The folded layers, outermost first, then the API: `tensor_new > backend > cuMemAlloc_v2`."""
    chain = [sframe(f).name(full) for f in reversed(site.get("via") or [])]
    return " > ".join(chain)


def status_text(p: ReportProcess, r: Report) -> str:
    """How a process's trace ended, in words that never contradict each other (the text report
    and the HTML page say it alike)."""
    st, code = p["status"], p["exit_code"]
    if st == "exec":
        return "replaced by exec (complete up to it)"
    if st == "complete":
        if code not in (None, -1):
            return f"complete, exit {code}"
        pids = {q["pid"] for q in r["processes"]}
        if (
            p["ppid"] not in pids
            and p.get("exec_index", 0) == 0
            and r.get("exit_status") is not None
        ):
            return "complete, exit {} (as the launcher saw it)".format(r["exit_status"])
        return "complete (its exit status was not seen: no hooked call came after main began)"
    if p.get("stopped"):
        if code is not None:
            return "trace stopped ({}); the process exited with status {}".format(
                p["stopped"], code
            )
        return "trace stopped ({}); no exit record".format(p["stopped"])
    sig = p.get("signal")
    if sig:
        name = _signal_name(sig)
        when = (
            " at {}".format(secs_text(p["ended_time"])) if p.get("ended_time") is not None else ""
        )
        return f"killed by signal {sig}{name}{when}, as the launcher saw it (no exit record)"
    if p.get("ended_time") is not None:
        return "killed or crashed (no exit record); ended at {} as the launcher saw it".format(
            secs_text(p["ended_time"])
        )
    return "truncated (no clean exit record: killed, crashed or still running)"


def _signal_name(sig: int) -> str:
    """' (SIGKILL)', or nothing for a number Python does not name."""
    import signal

    try:
        return f" ({signal.Signals(sig).name})"
    except ValueError:
        return ""


def limits_text(limits: Mapping[str, int]) -> str:
    """'12.0 GiB on each of devices 0-15', '8.00 GiB on device 0, 4.00 GiB on device 1'"""
    by: dict[int, list[int]] = {}
    for d, v in limits.items():
        by.setdefault(v, []).append(int(d))
    parts = []
    if len(by) == 1 and len(limits) >= 16:  # a bare size: the ledger holds it for every index
        return f"{size_text(next(iter(by)))} on every device"
    for v, devs in sorted(by.items(), key=lambda kv: min(kv[1])):
        devs.sort()
        if len(devs) == 1:
            parts.append("%s on device %d" % (size_text(v), devs[0]))
        elif devs == list(range(devs[0], devs[-1] + 1)):
            parts.append("%s on each of devices %d-%d" % (size_text(v), devs[0], devs[-1]))
        else:
            parts.append("{} on each of devices {}".format(size_text(v), ",".join(map(str, devs))))
    return ", ".join(parts)


def requests_text(f: ReportFailed | ReportDenied) -> str:
    """'2 x 40.00 MiB requested', or '3 requested (1.00 MiB .. 4.00 MiB, 6.00 MiB in all)':
    bytes is the site's total, never one request's size."""
    z = f.get("sizes") or {}
    if f["count"] == 1 or (z and z.get("min") == z.get("max")):
        each = z.get("min") if z else f["bytes"] // max(1, f["count"])
        return "%d x %s requested" % (f["count"], size_text(each))
    return "%d requested (%s .. %s, %s in all)" % (
        f["count"],
        size_text(z.get("min")),
        size_text(z.get("max")),
        size_text(f["bytes"]),
    )


def trim_context(frames: list[ReportFrame]) -> list[ReportFrame]:
    """Frames up to main (what lies beyond it is the C runtime starting the program)."""
    for i, f in enumerate(frames):
        if f.get("function") == "main":
            return frames[: i + 1]
    return frames


def is_cuda(d: ReportFrame) -> bool:
    return folded(sframe(d))
