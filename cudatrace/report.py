"""`cudatrace report`: who held the device memory, when, and what the device saw meanwhile.

Every report command (report, diff, the summary of `cudatrace run`) stands on one base, as
memray's reporters do: `Analysis` loads a trace directory (or one .ctrace file), replays it into
the model, and groups allocations into sites through `sites.group`. The report itself is first
built as a plain dict — exactly the JSON of `--json` (schema cudatrace.report/1, described in
docs/report-json.md) — and the text is rendered from that dict, so the two never disagree.
"""
from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

import click

from . import __version__
from .model import ADDR, AUX, AUX2, NONE64, Alloc, Groups, Model, build
from .observed import Observed
from .sites import GROUPINGS, SFrame, Site, Stacks, group, make_symbolizer
from .trace import C, TraceDir, TraceError, read_dir, read_trace

try:
    from .budget import format_bytes
except Exception:                                   # pragma: no cover - budget.py lands apart
    def format_bytes(n: int) -> str:
        n = int(n)
        if n < 0:
            return "-" + format_bytes(-n)
        if n < 1024:
            return "%d B" % n
        v, units = n / 1024.0, ("KiB", "MiB", "GiB", "TiB", "PiB")
        i = 0
        while v >= 1024.0 and i < len(units) - 1:
            v /= 1024.0
            i += 1
        return ("%.2f %s" if v < 10 else "%.1f %s") % (v, units[i])

SCHEMA = "cudatrace.report/1"
CONTEXT_SITES = 5          # sites whose call stacks are listed
CONTEXT_FRAMES = 6         # frames listed per stack

CU_ERRORS = {
    0: "CUDA_SUCCESS", 1: "CUDA_ERROR_INVALID_VALUE", 2: "CUDA_ERROR_OUT_OF_MEMORY",
    3: "CUDA_ERROR_NOT_INITIALIZED", 4: "CUDA_ERROR_DEINITIALIZED", 5: "CUDA_ERROR_PROFILER_DISABLED",
    34: "CUDA_ERROR_STUB_LIBRARY", 46: "CUDA_ERROR_DEVICES_UNAVAILABLE", 100: "CUDA_ERROR_NO_DEVICE",
    101: "CUDA_ERROR_INVALID_DEVICE", 102: "CUDA_ERROR_DEVICE_NOT_LICENSED",
    200: "CUDA_ERROR_INVALID_IMAGE", 201: "CUDA_ERROR_INVALID_CONTEXT",
    205: "CUDA_ERROR_MAP_FAILED", 206: "CUDA_ERROR_UNMAP_FAILED", 208: "CUDA_ERROR_ALREADY_MAPPED",
    214: "CUDA_ERROR_ECC_UNCORRECTABLE", 216: "CUDA_ERROR_CONTEXT_ALREADY_IN_USE",
    304: "CUDA_ERROR_OPERATING_SYSTEM", 400: "CUDA_ERROR_INVALID_HANDLE",
    401: "CUDA_ERROR_ILLEGAL_STATE", 500: "CUDA_ERROR_NOT_FOUND", 600: "CUDA_ERROR_NOT_READY",
    700: "CUDA_ERROR_ILLEGAL_ADDRESS", 702: "CUDA_ERROR_LAUNCH_TIMEOUT",
    709: "CUDA_ERROR_CONTEXT_IS_DESTROYED", 712: "CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED",
    719: "CUDA_ERROR_LAUNCH_FAILED", 800: "CUDA_ERROR_NOT_PERMITTED", 801: "CUDA_ERROR_NOT_SUPPORTED",
    802: "CUDA_ERROR_SYSTEM_NOT_READY", 803: "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH",
    804: "CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE", 900: "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED",
    999: "CUDA_ERROR_UNKNOWN",
}


def cu_error(code: int) -> str:
    return CU_ERRORS.get(code, "CUresult %d" % code)


class ReportError(Exception):
    """A trace that cannot be reported on: exit status 2, with a message naming the file."""
    status = 2


# ---- the shared base ----------------------------------------------------------------------

def load(path) -> TraceDir:
    """Read a trace directory or one .ctrace file, or raise ReportError naming what is wrong."""
    p = Path(path)
    if not p.exists():
        raise ReportError("cudatrace: %s: no such trace directory or file" % p)
    try:
        if p.is_file():
            t = read_trace(p)
            return TraceDir(p.parent, [t], _sibling_run(p), [])
        td = read_dir(p)
    except TraceError as e:
        raise ReportError("cudatrace: %s" % e)
    except OSError as e:
        raise ReportError("cudatrace: %s: %s" % (getattr(e, "filename", None) or p, e.strerror or e))
    if not td.traces:
        raise ReportError("cudatrace: %s: no readable trace file:\n  %s" % (p, "\n  ".join(td.errors)))
    return td


def _sibling_run(file: Path) -> dict:
    """run.json beside a single .ctrace file, if it is there."""
    rp = file.parent / "run.json"
    if rp.is_file():
        try:
            return json.loads(rp.read_text())
        except ValueError:
            return {}
    return {}


class Analysis:
    """Trace directory -> model -> stacks; what every report command starts from."""

    def __init__(self, path, symbolize: bool = True, show_cuda_frames: bool = False,
                 progress: bool = False, td: TraceDir | None = None, symbolizer=None,
                 view: str = "hybrid"):
        self.path = Path(path)
        self.td = td if td is not None else load(path)
        self.traces = self.td.traces
        self.model: Model = build(self.td)
        if symbolizer is None and symbolize:
            symbolizer = make_symbolizer(progress=progress)
        self.symbolizer = symbolizer
        self.stacks = Stacks(self.traces, symbolizer, fold=not show_cuda_frames, view=view)
        self.observed = Observed(self.td)
        self.start_ns = self._start()

    def _start(self) -> int:
        """Time zero of "seconds since start": the launcher's start when run.json has it (the
        samples share it), else the first trace's start."""
        starts = [t.start_monotonic_ns for t in self.traces if t.start_monotonic_ns]
        first = min(starts) if starts else self.model.t0
        r = self.td.run.get("start_monotonic_ns")
        if isinstance(r, int) and 0 < r <= (first or r):
            return r
        return first or self.model.t0

    def seconds(self, ts: int | None) -> float | None:
        if ts is None:
            return None
        return round((ts - self.start_ns) / 1e9, 6)

    def sites(self, allocs, by: str = "site", depth: int = 1) -> list[Site]:
        return group(self.model, allocs, self.stacks, by, depth, context=max(CONTEXT_FRAMES, depth))

    def moment(self, spec: str = "peak", device: int | None = None) -> dict:
        """What --at names: {"spec", "kind", "ts_ns", "seq", "device"}."""
        m = self.model
        s = (spec or "peak").strip().lower()
        if s == "peak":
            if device is None:
                return {"spec": "peak", "kind": "peak", "ts_ns": m.peak_ts if m.found else None,
                        "seq": m.peak_seq if m.found else None, "device": None}
            b, ts = m.device_peaks.get(device, (0, None))
            return {"spec": "peak", "kind": "peak", "ts_ns": ts, "seq": m.device_peak_seq.get(device),
                    "device": device}
        if s == "end":
            return {"spec": "end", "kind": "end", "ts_ns": m.t_end if m.n_events else None,
                    "seq": NONE64 - 1, "device": device}
        secs = parse_time(spec)
        return {"spec": spec, "kind": "time", "ts_ns": self.start_ns + int(round(secs * 1e9)),
                "seq": None, "device": device}

    def live(self, moment: dict) -> Groups:
        """What is live at the moment, grouped (sites.group takes it as is)."""
        m, dev = self.model, moment["device"]
        if moment["kind"] == "peak":
            return m.groups_at_peak(dev)
        if moment["kind"] == "end":
            return m.groups_at_end(dev)
        return m.groups_at(moment["ts_ns"], dev)

    def budget_limits(self) -> dict[int, int]:
        """device -> limit in bytes, as the shim wrote it into the traces."""
        out: dict[int, int] = {}
        for t in self.traces:
            for k, v in t.info.items():
                if k.startswith("budget."):
                    try:
                        out[int(k[7:])] = int(v)
                    except ValueError:
                        pass
        return out


_TIME_RE = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*(s|ms|us|m|min)?\s*$")


def parse_time(text: str) -> float:
    """'2.5s', '2.5', '1500ms', '1m' -> seconds."""
    m = _TIME_RE.match(text or "")
    if not m:
        raise ValueError("%r is not peak, end or a time (2.5s, 2.5, 1500ms)" % text)
    v = float(m.group(1))
    unit = m.group(2) or "s"
    return v * {"s": 1.0, "ms": 1e-3, "us": 1e-6, "m": 60.0, "min": 60.0}[unit]


# ---- the report as data --------------------------------------------------------------------

def _frames(frames: list[SFrame]) -> list[dict]:
    return [f.as_json() for f in frames]


def site_json(a: Analysis, s: Site, total: int, rank: int) -> dict:
    return {"rank": rank, "label": s.label(), "key": s.key_text(), "bytes": s.bytes,
            "count": s.count, "share": round(s.bytes / total, 6) if total else 0.0,
            "api": s.api_list(), "api_counts": dict(s.apis), "sizes": s.size_summary(),
            "pids": sorted(s.pids), "devices": sorted(s.devices),
            "first_time": a.seconds(s.first_ts), "last_time": a.seconds(s.last_ts),
            "frames": _frames(s.frames), "context": _frames(s.context)}


def _versions(a: Analysis) -> dict:
    drv = sorted({t.info.get("driver_version") for t in a.traces if t.info.get("driver_version")})
    shim = sorted({t.info.get("shim_version") or t.shim_version for t in a.traces} - {""})
    depth = sorted({t.stack_depth for t in a.traces})
    return {"driver": [int(d) if d.isdigit() else d for d in drv], "shim": shim, "stack_depth": depth,
            "nvml_driver": (a.td.run.get("sampler") or {}).get("driver")}


def driver_text(v) -> str:
    if isinstance(v, int) and v >= 1000:
        return "CUDA %d.%d (%d)" % (v // 1000, (v % 1000) // 10, v)
    return str(v)


def build_report(a: Analysis, at: str = "peak", by: str = "site", depth: int = 1, top: int = 10,
                 device: int | None = None) -> dict:
    """The report as a dict: the --json output (docs/report-json.md)."""
    m = a.model
    if device is not None and device not in m.device_peaks:
        seen = ", ".join(str(d) for d in sorted(m.device_peaks)) or "none"
        raise ReportError("cudatrace: no device memory was traced on device %d (devices with "
                          "allocations: %s)" % (device, seen))
    mom = a.moment(at, device)
    live = a.live(mom)
    total = live.bytes
    sites = a.sites(live, by, depth)
    end_live = m.groups_at_end(device)
    end_sites = a.sites(end_live, "site", depth)
    warnings: list[str] = []

    # processes
    moment_by_trace = live.by_trace()
    processes = []
    truncated = []
    for i, t in enumerate(a.traces):
        p = m.procs[i] if i < len(m.procs) else {}
        reason = None
        if not t.complete:
            reason = "no clean exit record: the process was killed, crashed, exec'd without " \
                     "closing or is still running"
            truncated.append({"file": t.path.name, "pid": t.pid, "reason": reason,
                              "events": t.n_events})
        processes.append({
            "pid": t.pid, "ppid": t.ppid, "exe": t.exe, "argv": t.argv, "file": t.path.name,
            "exec_index": t.exec_index, "status": t.status,
            "exit_code": t.end.exit_code if t.end else None,
            "dropped_events": t.end.dropped if t.end else None, "gaps": t.gaps,
            "events": t.n_events, "allocs": p.get("allocs", 0), "frees": p.get("frees", 0),
            "failed": p.get("failed", 0), "denied": p.get("denied", 0),
            "peak_bytes": p.get("peak_bytes", 0),
            "peak_time": a.seconds(p.get("peak_ts")) if p.get("allocs") else None,
            "at_bytes": moment_by_trace.get(i, 0), "end_bytes": p.get("end_bytes", 0),
            "first_time": a.seconds(p.get("first_ts")) if p.get("events") else None,
            "last_time": a.seconds(p.get("last_ts")) if p.get("events") else None})
        if t.end and t.end.dropped:
            warnings.append("%s: %d events were lost (the trace file could not grow)"
                            % (t.path.name, t.end.dropped))
        if t.gaps:
            warnings.append("%s: %d unpublished record(s) skipped (a writer died mid-record)"
                            % (t.path.name, t.gaps))

    # devices
    limits = a.budget_limits()
    moment_by_dev = live.by_device()
    devices = []
    for dev, (pb, pts) in sorted(m.device_peaks.items()):
        if device is not None and dev != device:
            continue
        devices.append({"device": dev, "peak_bytes": pb, "peak_time": a.seconds(pts), "peak_ts_ns": pts,
                        "end_bytes": m.device_end.get(dev, 0), "allocs": m.device_allocs.get(dev, 0),
                        "at_bytes": moment_by_dev.get(dev, 0), "budget": limits.get(dev)})

    # failures and denials
    failed_allocs = [x for x in m.failed if device is None or x.device == device]
    failed = []
    for rank, s in enumerate(a.sites(failed_allocs, "site", depth), 1):
        d = site_json(a, s, 0, rank)
        d.pop("share")
        d["errors"] = [{"code": c, "name": cu_error(c), "count": n} for c, n in s.results.most_common()]
        failed.append(d)
    denied_allocs = [x for x in m.denied if device is None or x.device == device]
    denied = []
    for rank, s in enumerate(a.sites(denied_allocs, "site", depth), 1):
        d = site_json(a, s, 0, rank)
        d.pop("share")
        mine = [x for x in denied_allocs if _same_site(a, x, s, depth)]
        last = max(mine, key=lambda x: x.ts) if mine else None
        d["limit"] = last.event[AUX] if last else None
        d["in_use"] = last.event[AUX2] if last else None
        denied.append(d)

    # memory queries
    mq = _memory_queries(a, device)

    # observed
    obs = a.observed.compare(
        mom["ts_ns"] if mom["kind"] == "peak" and mom["ts_ns"] is not None else
        (m.peak_ts if m.found else m.t0),
        lambda times: m.bytes_at(times, device), a.start_ns, device)
    obs["traced_peak_bytes"] = m.device_peaks.get(device, (0, 0))[0] if device is not None else m.peak_bytes

    # notes on coverage
    c = m.counts
    if c.get("unmatched_frees"):
        warnings.append("%d free(s) matched no traced allocation (memory allocated before tracing "
                        "began, or through a path not hooked)" % c["unmatched_frees"])
    if c.get("reused"):
        warnings.append("%d allocation(s) returned an address still live in the trace (its free "
                        "was not seen): the older one is counted as freed then" % c["reused"])
    if c.get("unsorted_traces"):
        warnings.append("%d trace file(s) had events out of time order (threads publishing out "
                        "of order); they were replayed sorted by time" % c["unsorted_traces"])
    if any(t.stack_depth == 0 for t in a.traces):
        warnings.append("stacks were off (--stack-depth 0) in %d trace file(s): no call sites there"
                        % sum(1 for t in a.traces if t.stack_depth == 0))
    if a.symbolizer is None:
        warnings.append("no symbolizer: frames are shown as module+offset")
    else:
        w = getattr(a.symbolizer, "warnings", None)
        for line in (w() if callable(w) else [])[:10]:
            warnings.append("symbols: %s" % line)
    for e in a.stacks.errors[:5]:
        warnings.append("symbolizing %s" % e)
    if mom["kind"] == "time" and m.n_events and mom["ts_ns"] > m.t_end:
        warnings.append("--at %s is after the last event (%.3f s): what is shown was live at the end"
                        % (mom["spec"], a.seconds(m.t_end)))
    if truncated and mom["kind"] == "end":
        warnings.append("truncated traces end where the process stopped writing: what is live "
                        "at their end may have been freed later, unseen")

    budget = None
    if limits or a.td.run.get("budget") or a.td.run.get("group"):
        on = sorted({t.info.get("on_exceed") for t in a.traces if t.info.get("on_exceed")})
        budget = {"limits": {str(d): v for d, v in sorted(limits.items())},
                  "on_exceed": on[0] if len(on) == 1 else (on or [a.td.run.get("on_exceed")])[0],
                  "group": a.td.run.get("group"), "aborted": bool(a.td.run.get("budget_aborted")),
                  "spec": a.td.run.get("budget")}

    argv = a.td.run.get("argv") or (a.traces[0].argv if a.traces else [])
    moment_json = {"spec": mom["spec"], "kind": mom["kind"], "time": a.seconds(mom["ts_ns"]),
                   "ts_ns": mom["ts_ns"], "device": device}
    trunc_idx = {i for i, t in enumerate(a.traces) if not t.complete}
    never = {"bytes": end_live.bytes, "count": end_live.count,
             "in_truncated_bytes": end_live.only(traces=trunc_idx).bytes,
             "sites": [site_json(a, s, end_live.bytes, i) for i, s in enumerate(end_sites[:top], 1)],
             "more_sites": max(0, len(end_sites) - top)}
    host_end = m.host_end
    return {
        "schema": SCHEMA,
        "cudatrace_version": __version__,
        "path": str(a.path),
        "command": list(argv),
        "start_ns": a.start_ns,
        "start_time": a.td.run.get("start_time"),
        "duration": a.seconds(m.t_end) if m.n_events else 0.0,
        "exit_status": a.td.run.get("exit_status"),
        "versions": _versions(a),
        "at": moment_json,
        "by": by,
        "depth": depth,
        "device": device,
        "peak_bytes": m.peak_bytes if device is None else m.device_peaks[device][0],
        "peak_time": (a.seconds(m.peak_ts) if m.found else None) if device is None
        else a.seconds(m.device_peaks[device][1]),
        "peak_ts_ns": (m.peak_ts if m.found else None) if device is None else m.device_peaks[device][1],
        "end_bytes": m.end_bytes if device is None else m.device_end.get(device, 0),
        "total_live_bytes": total,
        "total_live_count": live.count,
        "sites": [site_json(a, s, total, i) for i, s in enumerate(sites[:top], 1)],
        "more_sites": max(0, len(sites) - top),
        "never_freed": never,
        "failed": failed,
        "denied": denied,
        "processes": processes,
        "devices": devices,
        "host_pinned": {"peak_bytes": m.host_peak, "peak_time": a.seconds(m.host_peak_ts)
                        if m.host_peak else None, "end_bytes": host_end,
                        "allocs": c.get("host_allocs", 0)},
        "memory_queries": mq,
        "observed": obs,
        "budget": budget,
        "counts": dict(c),
        "truncated_files": truncated,
        "python": python_summary(a),
        "unreadable_files": list(a.td.errors),
        "warnings": warnings,
    }


def python_summary(a: Analysis) -> dict | None:
    """Python in the traced processes: versions, status, and device allocations with Python frames
    and without (by reason). None when no process ran Python."""
    from . import pyframes
    procs = [t for t in a.traces if "python.status" in t.info]
    if not procs:
        return None
    with_frames = 0
    without: dict[str, int] = {}
    for (ti, leaf), (count, _nbytes) in a.model.stack_totals().items():
        t = a.traces[ti]
        if "python.status" not in t.info:
            continue
        link = t.py_link(leaf)
        if link and link[0] == pyframes.LINK_FRAMES:
            with_frames += count
        else:
            why = pyframes.WHY.get(link[1], "reason %d" % link[1]) if link else \
                "no stack recorded (stacks off or the stack table full)"
            without[why] = without.get(why, 0) + count
    return {"view": a.stacks.view,
            "processes": [{"pid": t.pid, "version": t.info.get("python.version"),
                           "status": t.info.get("python.status")} for t in procs],
            "allocs_with_frames": with_frames, "allocs_without_frames": without}


def _same_site(a: Analysis, x: Alloc, s: Site, depth: int) -> bool:
    fr = a.stacks.frames(x.trace, x.stack)[:depth] if x.stack else []
    return tuple(f.key() for f in fr) == s.key


def _memory_queries(a: Analysis, device: int | None) -> dict:
    K = C()
    virt = K["CT_EF_VIRTUALIZED"]
    qs = [q for q in a.model.meminfo if device is None or q.device == device]
    by_api: dict[str, int] = {}
    nvirt = 0
    for q in qs:
        t = a.traces[q.trace]
        name = t.api_name(q.api)
        if q.rt_api:
            name += " (%s)" % t.api_name(q.rt_api)
        by_api[name] = by_api.get(name, 0) + 1
        if q.flags & virt:
            nvirt += 1
    last = None
    ok = [q for q in qs if q.result == 0]
    if ok:
        q = ok[-1]
        t = a.traces[q.trace]
        last = {"api": t.api_name(q.api), "time": a.seconds(q.ts), "pid": t.pid, "device": q.device,
                "free": q.event[ADDR], "total": q.size, "device_free": q.event[AUX],
                "device_total": q.event[AUX2], "virtualized": bool(q.flags & virt)}
    return {"count": len(qs), "failed": len(qs) - len(ok), "by_api": by_api, "virtualized": nvirt,
            "last": last}


# ---- text ----------------------------------------------------------------------------------

def _b(n) -> str:
    return format_bytes(n) if n is not None else "-"


def _s(t) -> str:
    return "%.3f s" % t if t is not None else "-"


def _n(n: int, what: str) -> str:
    return "{:,} {}{}".format(n, what, "" if n == 1 else "s")


def _pct(x: float) -> str:
    return "%5.1f%%" % (100.0 * x)


def _frame_label(d: dict, with_module: bool = True) -> str:
    f = SFrame(d["module"], d["function"], d["file"], d["line"], d["address"], d.get("offset", 0),
               d.get("inlined", False))
    lab = f.long_label() if with_module else f.label()
    return lab + ("  (inlined)" if f.inlined else "")


def _limits_text(limits: dict) -> str:
    """'12.0 GiB on each of devices 0-15', '8.00 GiB on device 0, 4.00 GiB on device 1'"""
    by: dict[int, list[int]] = {}
    for d, v in limits.items():
        by.setdefault(v, []).append(int(d))
    parts = []
    if len(by) == 1 and len(limits) >= 16:      # a bare size: the ledger holds it for every index
        return "%s on every device" % _b(next(iter(by)))
    for v, devs in sorted(by.items(), key=lambda kv: min(kv[1])):
        devs.sort()
        if len(devs) == 1:
            parts.append("%s on device %d" % (_b(v), devs[0]))
        elif devs == list(range(devs[0], devs[-1] + 1)):
            parts.append("%s on each of devices %d-%d" % (_b(v), devs[0], devs[-1]))
        else:
            parts.append("%s on each of devices %s" % (_b(v), ",".join(map(str, devs))))
    return ", ".join(parts)


def _trim_context(frames: list[dict]) -> list[dict]:
    """Frames up to main (what lies beyond it is the C runtime starting the program)."""
    for i, f in enumerate(frames):
        if f.get("function") == "main":
            return frames[:i + 1]
    return frames


def _is_cuda(d: dict) -> bool:
    from .sites import folded
    return folded(SFrame(d["module"], d["function"], d["file"], d["line"], d["address"],
                         d.get("offset", 0), d.get("inlined", False)))


def _table(rows: list[list[str]], right: set[int], indent: str = "  ") -> list[str]:
    if not rows:
        return []
    w = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    out = []
    for r in rows:
        cells = [c.rjust(w[i]) if i in right else c.ljust(w[i]) for i, c in enumerate(r)]
        out.append((indent + "  ".join(cells)).rstrip())
    return out


def render_text(r: dict, top_context: int = CONTEXT_SITES) -> str:
    L: list[str] = []
    w = L.append
    w("cudatrace report: %s" % r["path"])
    if r["command"]:
        w("  command     %s" % " ".join(r["command"]))
    procs = r["processes"]
    w("  processes   %d traced%s" % (len(procs), ", %d truncated" % len(r["truncated_files"])
                                     if r["truncated_files"] else ""))
    for p in procs:
        st = p["status"]
        if p["status"] == "complete":
            st += ", exit %s" % p["exit_code"] if p["exit_code"] not in (None, -1) else \
                " (exit status not recorded)"
        else:
            st += " (no clean exit record: killed, crashed or still running)"
        w("    pid %-7d ppid %-7d %-24s %s  [%s]" % (p["pid"], p["ppid"], os.path.basename(p["exe"]) or "?",
                                                      st, p["file"]))
    v = r["versions"]
    parts = ["%s frames per event" % "/".join(str(d) for d in v["stack_depth"])]
    if v["driver"]:
        parts.append("driver %s" % ", ".join(driver_text(d) for d in v["driver"]))
    if v.get("nvml_driver"):
        parts.append("NVML driver %s" % v["nvml_driver"])
    if v["shim"]:
        parts.append("shim %s" % ", ".join(v["shim"]))
    w("  trace       %s" % "; ".join(parts))
    b = r["budget"]
    if b:
        lim = _limits_text(b["limits"]) or "spec %s" % b.get("spec")
        w("  budget      %s (over budget: %s%s%s)" % (lim, b.get("on_exceed") or "?",
                                                    "; group %s" % b["group"] if b.get("group") else "",
                                                    "; the run was aborted" if b.get("aborted") else ""))
    else:
        w("  budget      none")
    c = r["counts"]
    w("  events      {:,} over {}; {:,} device allocations, {:,} frees, {:,} failed, {:,} denied".format(
        c.get("events", 0), _s(r["duration"]), c.get("allocs", 0), c.get("frees", 0),
        c.get("failed", 0), c.get("denied", 0)))
    _render_python(r.get("python"), w)
    w("")

    # peak
    dev_note = " on device %d" % r["device"] if r["device"] is not None else ""
    if r["peak_time"] is None:
        w("No device memory was allocated through the hooked driver API%s." % dev_note)
    else:
        w("Peak%s: %s of device memory live at %s" % (dev_note, _b(r["peak_bytes"]), _s(r["peak_time"])))
        if len(r["devices"]) > 1 or r["device"] is None:
            for d in r["devices"]:
                w("  device %-3s peak %10s at %-12s at exit %10s  %s%s"
                  % (d["device"] if d["device"] >= 0 else "?", _b(d["peak_bytes"]), _s(d["peak_time"]),
                     _b(d["end_bytes"]), _n(d["allocs"], "allocation"),
                     "  budget %s" % _b(d["budget"]) if d.get("budget") else ""))
        w("  live at exit: %s; pinned host memory peak %s" % (_b(r["end_bytes"]),
                                                            _b(r["host_pinned"]["peak_bytes"])))
    w("")

    # traced versus observed
    _render_observed(r, w)
    w("")

    # sites
    at = r["at"]
    when = {"peak": "at the peak (%s)" % _s(at["time"]), "end": "at the end (%s)" % _s(at["time"]),
            "time": "at %s" % _s(at["time"])}[at["kind"]]
    by = {"site": "call site", "api": "API", "library": "library", "process": "process"}[r["by"]]
    w("Device memory live %s by %s: %s in %s" % (when, by, _b(r["total_live_bytes"]),
                                                _n(r["total_live_count"], "allocation")))
    if not r["sites"]:
        w("  (nothing live)")
    rows = [["bytes", "share", "count", "min / median / max", by]]
    for s in r["sites"]:
        z = s["sizes"]
        rows.append([_b(s["bytes"]), _pct(s["share"]), "{:,}".format(s["count"]),
                     "%s / %s / %s" % (_b(z.get("min")), _b(z.get("median")), _b(z.get("max"))),
                     "#%d %s" % (s["rank"], s["label"])])
    if r["sites"]:
        for i, line in enumerate(_table(rows, {0, 1, 2})):
            L.append(line)
            if i:
                s = r["sites"][i - 1]
                extra = ", ".join(s["api"][:3]) + (" ..." if len(s["api"]) > 3 else "")
                more = []
                if len(procs) > 1:
                    more.append("pid %s" % ",".join(str(p) for p in s["pids"]))
                if len(r["devices"]) > 1 or (s["devices"] and s["devices"] != [0]):
                    more.append("device %s" % ",".join(str(d) for d in s["devices"]))
                w("        via %s%s" % (extra, ("; " + "; ".join(more)) if more else ""))
    if r["more_sites"]:
        w("  ... and %d more (--top)" % r["more_sites"])
    w("")

    # call stacks
    ctx = [s for s in r["sites"][:top_context] if s["context"]]
    if ctx and r["by"] in ("site", "library"):
        folded = not any(_is_cuda(f) for s in ctx for f in s["context"])
        w("Call stacks of the top sites (innermost first%s):"
          % ("; CUDA's own frames folded" if folded else ""))
        for s in ctx:
            w("  #%d  %s in %s" % (s["rank"], _b(s["bytes"]), _n(s["count"], "allocation")))
            ctxf = _trim_context(s["context"])
            for k, f in enumerate(ctxf[:CONTEXT_FRAMES]):
                w("      %s %s" % ("at  " if k == 0 else "from", _frame_label(f)))
            if len(ctxf) > CONTEXT_FRAMES:
                w("      ...")
        w("")

    # never freed
    nf = r["never_freed"]
    if nf["count"]:
        trunc = (" (%s of it in truncated traces: live when their writing stopped)"
                 % _b(nf["in_truncated_bytes"])) if nf.get("in_truncated_bytes") else ""
        w("Never freed by exit: %s in %s%s" % (_b(nf["bytes"]), _n(nf["count"], "allocation"), trunc))
        rows = [["bytes", "count", "site"]]
        for s in nf["sites"]:
            rows.append([_b(s["bytes"]), "{:,}".format(s["count"]), "#%d %s" % (s["rank"], s["label"])])
        L.extend(_table(rows, {0, 1}))
        if nf["more_sites"]:
            w("  ... and %d more sites" % nf["more_sites"])
    else:
        w("Never freed by exit: nothing (every traced allocation was freed)")
    w("")

    # failures
    if r["failed"]:
        w("Failed allocations: %d" % sum(f["count"] for f in r["failed"]))
        for f in r["failed"]:
            errs = ", ".join("%s x%d" % (e["name"], e["count"]) for e in f["errors"])
            z = f["sizes"]
            w("  %d x %s requested (%s .. %s), first at %s: %s" % (
                f["count"], _b(f["bytes"]), _b(z.get("min")), _b(z.get("max")), _s(f["first_time"]), errs))
            w("      at %s via %s" % (f["label"], ", ".join(f["api"])))
        w("")
    if r["denied"]:
        w("Budget denials: %d" % sum(d["count"] for d in r["denied"]))
        for d in r["denied"]:
            w("  %d x %s requested, first at %s (last: in use %s of a %s budget)" % (
                d["count"], _b(d["bytes"]), _s(d["first_time"]), _b(d["in_use"]), _b(d["limit"])))
            w("      at %s via %s" % (d["label"], ", ".join(d["api"])))
        w("")

    # processes
    if len(procs) > 1 or any(p["status"] != "complete" for p in procs):
        w("Processes:")
        rows = [["pid", "ppid", "exe", "allocs", "peak", "at %s" % at["kind"], "at exit", "failed",
                 "denied", "status"]]
        for p in procs:
            rows.append([str(p["pid"]), str(p["ppid"]), os.path.basename(p["exe"]) or "?",
                         str(p["allocs"]), _b(p["peak_bytes"]), _b(p["at_bytes"]), _b(p["end_bytes"]),
                         str(p["failed"]), str(p["denied"]), p["status"]])
        L.extend(_table(rows, {0, 1, 3, 4, 5, 6, 7, 8}))
        w("")

    # memory queries
    mq = r["memory_queries"]
    if mq["count"]:
        w("Memory queries seen: %d (%s)" % (mq["count"], ", ".join("%s x%d" % kv for kv in mq["by_api"].items())))
        last = mq["last"]
        if last:
            s = "  last: %s at %s told free %s of %s" % (last["api"], _s(last["time"]), _b(last["free"]),
                                                          _b(last["total"]))
            if last["virtualized"]:
                s += " (virtualized by the budget; the device said free %s of %s)" % (
                    _b(last["device_free"]), _b(last["device_total"]))
            w(s)
        if mq["virtualized"]:
            w("  %d of them answered with the budget instead of the device's figures" % mq["virtualized"])
        else:
            w("  none was virtualized: callers saw the device's own figures")
    else:
        w("Memory queries seen: none (no cuMemGetInfo / NVML memory query was traced)")
    w("")

    if r["truncated_files"]:
        w("Truncated trace files:")
        for t in r["truncated_files"]:
            w("  %s (pid %d, %d events): %s" % (t["file"], t["pid"], t["events"], t["reason"]))
        w("")
    if r["unreadable_files"]:
        w("Unreadable files:")
        for e in r["unreadable_files"]:
            w("  %s" % e)
        w("")
    if r["warnings"]:
        w("Notes:")
        for x in r["warnings"]:
            w("  - %s" % x)
    while L and not L[-1]:
        L.pop()
    return "\n".join(L) + "\n"


def _render_python(py: dict | None, w) -> None:
    if not py:
        return
    vers = sorted({"%s (%s)" % (p["version"], p["status"]) for p in py["processes"]})
    w("  python      CPython %s; %s view" % (", ".join(vers), py["view"]))
    w("              {:,} device allocations with Python frames".format(py["allocs_with_frames"]))
    for why, n in sorted(py["allocs_without_frames"].items(), key=lambda x: -x[1]):
        w("              {:,} without: {}".format(n, why))


def _render_observed(r: dict, w) -> None:
    o = r["observed"]
    traced_peak = o.get("traced_peak_bytes", r["peak_bytes"])
    if not o["samples"]:
        w("Traced versus observed: not measured (%s)" % (o["nvml_why"] or "no samples"))
        return
    iv = o.get("interval_ms")
    n = "%d sample%s%s" % (o["samples"], "" if o["samples"] == 1 else "s",
                           " every ~%d ms" % round(iv) if iv else "")
    near, mx, base = o["near_peak"], o["max"] or {}, o["baseline"] or {}
    source = ("NVML" if o["per_process"] else "NVML device totals only") if o["nvml"] else \
        "no NVML: %s" % o["nvml_why"]
    if not o["overlap"]:
        w("Traced versus observed (%s; %s):" % (source, n))
        w("  no sample fell while traced memory was live (the run's allocations came and went "
          "between samples): nothing to compare. Traced peak %s." % _b(traced_peak))
        return
    note = ("  (%s)" % near["note"]) if near.get("note") else None
    if o["nvml"] and o["per_process"]:
        w("Traced versus observed (NVML, %s):" % n)
        if note:
            w(note)
        rows = [["", "traced live", "NVML: process tree", "untraced"]]
        rows.append(["nearest sample to the peak (%+.0f ms)" % near["offset_ms"], _b(near["traced_bytes"]),
                     _b(near["tree_device_bytes"]), _b(near["untraced_bytes"])])
        if mx.get("tree_device_bytes") is not None:
            rows.append(["NVML's highest (at %s)" % _s(mx["tree_device_time"]), _b(mx["traced_bytes_then"]),
                         _b(mx["tree_device_bytes"]), _b(mx["untraced_bytes"])])
        for line in _table(rows, {1, 2, 3}, "    "):
            w(line)
        w("  traced peak %s. untraced = what NVML counts for the tree that no hook saw: CUDA "
          "contexts, module images, allocator paths not hooked; at most %s (at %s)."
          % (_b(traced_peak), _b(mx.get("untraced_max_bytes")), _s(mx.get("untraced_max_time"))))
        if any(x is not None and x < 0 for x in (near["untraced_bytes"], mx.get("untraced_bytes"))):
            w("  negative: the trace holds more than NVML showed for the tree (managed memory not "
              "resident yet, NVML's per-process figures lagging or missing a process).")
        if near["device_used"] is not None:
            w("  device used by everyone: %s of %s near the peak; highest %s" % (
                _b(near["device_used"]), _b(near["device_total"]), _b(mx.get("device_used"))))
    elif o["nvml"]:
        w("Traced versus observed (NVML device totals only, %s):" % n)
        if note:
            w(note)
        w("  no per-process figures: %s" % o["per_process_why"])
        w("  traced live %s at the sample nearest the peak (%+.0f ms); device used by everyone %s of "
          "%s there, %s more than at the first sample (other processes count too); highest %s"
          % (_b(near["traced_bytes"]), near["offset_ms"], _b(near["device_used"]),
             _b(near["device_total"]), _b(near["device_used_rise"]), _b(mx.get("device_used"))))
    else:
        w("Traced versus observed: no NVML (%s); what the host shows instead (%s):"
          % (o["nvml_why"], n))
        if note:
            w(note)
        w("  traced live %s at the sample nearest the peak (%+.0f ms); traced peak %s"
          % (_b(near["traced_bytes"]), near["offset_ms"], _b(traced_peak)))
        if near["mem_available"] is not None:
            w("  MemAvailable %s there, %s at the first sample: a drop of %s (largest drop %s)"
              % (_b(near["mem_available"]), _b(base.get("mem_available")), _b(near["mem_available_drop"]),
                 _b(mx.get("mem_available_drop"))))
        if near["tree_rss"] is not None:
            w("  process tree RSS %s there; highest %s" % (_b(near["tree_rss"]), _b(mx.get("tree_rss"))))
        w("  on a unified-memory device (Jetson) device allocations come out of this RAM")


# ---- the command ---------------------------------------------------------------------------

def run_report(path, top=10, by="site", at="peak", device=None, depth=1, show_cuda_frames=False,
               as_json=False, svg=None, out=None, symbolizer=None, view="hybrid") -> int:
    """The body of `cudatrace report` (also callable from Python). Returns the exit status."""
    out = out or sys.stdout
    try:
        if at not in ("peak", "end"):
            parse_time(at)
        a = Analysis(path, show_cuda_frames=show_cuda_frames, symbolizer=symbolizer,
                     progress=not as_json and _tty(), view=view)
        r = build_report(a, at=at, by=by, depth=depth, top=top, device=device)
    except ReportError as e:
        click.echo(str(e), err=True)
        return e.status
    except ValueError as e:
        click.echo("cudatrace: --at %s" % e, err=True)
        return 2
    if svg:
        from .plot import write_svg
        try:
            write_svg(a, svg, device=device, report=r)
        except OSError as e:
            click.echo("cudatrace: cannot write %s: %s" % (svg, e.strerror or e), err=True)
            return 2
    if as_json:
        out.write(json.dumps(r, indent=2, sort_keys=False) + "\n")
    else:
        out.write(render_text(r))
        if svg:
            out.write("timeline written to %s\n" % svg)
    return 0


def _tty() -> bool:
    try:
        return sys.stderr.isatty()
    except Exception:
        return False


@click.command("report", context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("path", type=click.Path(path_type=Path))
@click.option("--top", default=10, show_default=True, type=click.IntRange(1, None),
              help="Sites listed.")
@click.option("--by", type=click.Choice(GROUPINGS), default="site", show_default=True,
              help="Group allocations by call site, API, library or process.")
@click.option("--at", "at", default="peak", show_default=True, metavar="peak|end|TIME",
              help="The moment: the peak, the end, or TIME seconds since the start (2.5s, 2.5).")
@click.option("--device", type=int, default=None, metavar="N",
              help="Only device N (its own peak with --at peak).")
@click.option("--depth", default=1, show_default=True, type=click.IntRange(1, 64),
              help="Frames that make a site (a deeper site splits a shared helper by caller).")
@click.option("--show-cuda-frames", is_flag=True,
              help="Keep the CUDA libraries' own frames (folded by default).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON (schema cudatrace.report/1).")
@click.option("--svg", type=click.Path(dir_okay=False, path_type=Path), default=None, metavar="FILE",
              help="Also write a timeline picture (SVG) to FILE.")
@click.option("--python-only", "view", flag_value="python",
              help="Python programs: sites and stacks from Python frames alone.")
@click.option("--native-only", "view", flag_value="native",
              help="Python programs: native frames alone (the eval loop not replaced).")
def report_command(path, top, by, at, device, depth, show_cuda_frames, as_json, svg, view):
    """Who held the device memory at the peak (or another moment), by call site.

    PATH is a trace directory written by `cudatrace run`, or one .ctrace file of it.
    """
    sys.exit(run_report(path, top=top, by=by, at=at, device=device, depth=depth,
                        show_cuda_frames=show_cuda_frames, as_json=as_json, svg=svg,
                        view=view or "hybrid"))
