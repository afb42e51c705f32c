"""pprof: a gzipped profile.proto, as `go tool pprof` and pprof-compatible services read it.

Four sample types, as Go's own heap profiles have them:
    alloc_objects / alloc_space   every device allocation of the run (count, bytes)
    inuse_objects / inuse_space   what was live at the moment (count, bytes): the default
One sample per stack (process and leaf), its locations leaf first: the frames `report`
attributes (CUDA's own folded), inlined calls as extra lines of one location. Each location
sits in the mapping of the ELF file it was in, with the build-id the trace recorded, so a tool
holding the binaries can symbolize again. Frames the symbolizer could not name are functions
named as report names them (module+offset). With several processes, each stack starts with a
frame naming its process, and every sample carries pid and exe labels.

The messages are built with the protobuf library, from cudatrace's profile.proto
(cudatrace/protodesc.py says why at run time rather than generated code).
"""

from __future__ import annotations

import gzip
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ... import __version__
from ...analyze.sites.group import NO_STACK
from ...protodesc import message_classes

if TYPE_CHECKING:
    from ...analyze.sites.stacks import SFrame
    from .view import View

PROTO = Path(__file__).with_name("profile.proto")
_classes: dict[str, Any] = {}  # message classes are built at run time: untyped


def classes() -> dict[str, Any]:
    """{"Profile": class, "Sample": class, ...} of pprof's format."""
    if not _classes:
        _classes.update(message_classes(PROTO, "cudatrace/pprof/profile.proto"))
    return _classes


class _Strings:
    def __init__(self, table: Any) -> None:  # a Profile's string_table
        self.table = table
        self.index: dict[str, int] = {}
        self("")

    def __call__(self, s: str | None) -> int:
        s = s or ""
        i = self.index.get(s)
        if i is None:
            i = self.index[s] = len(self.table)
            self.table.append(s)
        return i


def build(view: View) -> Any:
    """The Profile message of the view."""
    Profile = classes()["Profile"]
    b = _Builder(Profile(), view)
    b.header()
    live = view.live_stacks()
    run = view.run_stacks()
    keys = sorted(set(live) | set(run))
    view.prepare(keys)
    for ti, leaf in keys:
        lc, lb = live.get((ti, leaf), (0, 0))
        ac, ab = run.get((ti, leaf), (0, 0))
        if lb or ab or lc or ac:
            b.sample(ti, leaf, [ac, ab, lc, lb])
    return b.p


class _Builder:
    """A Profile being filled: its string table, and its functions, mappings and locations,
    each added once."""

    def __init__(self, p: Any, view: View) -> None:  # p: a Profile message
        self.p, self.view = p, view
        self.S = _Strings(p.string_table)
        self.mappings: dict[tuple[int, int], object] = {}
        # (trace, address), or ("synthetic", name) -> location id
        self.locations: dict[tuple[int, int] | tuple[str, str], int] = {}
        self.functions: dict[tuple[str, str, str], int] = {}

    def header(self) -> None:
        """Sample types, period, time, duration, comments."""
        p, S, view = self.p, self.S, self.view
        a, m = view.a, view.model
        for typ, unit in (
            ("alloc_objects", "count"),
            ("alloc_space", "bytes"),
            ("inuse_objects", "count"),
            ("inuse_space", "bytes"),
        ):
            p.sample_type.add(type=S(typ), unit=S(unit))
        p.default_sample_type = S("inuse_space")
        p.period_type.type = S("space")
        p.period_type.unit = S("bytes")
        p.period = 1
        start_time = a.td.run.get("start_time")
        if isinstance(start_time, (int, float)) and start_time > 0:
            p.time_nanos = int(start_time * 1e9)
        elif a.traces:
            p.time_nanos = min(t.start_realtime_ns for t in a.traces)
        if m.n_events:
            p.duration_nanos = max(0, m.t_end - a.start_ns)
        p.comment.append(S(f"cudatrace {__version__}: device memory of {view.command()}"))
        p.comment.append(
            S(
                f"inuse_space/inuse_objects: live {view.moment_text()}; alloc_space/alloc_objects: every "
                "allocation of the run"
            )
        )

    def function(self, name: str, system_name: str, filename: str | None) -> int:
        k = (name, system_name, filename or "")
        fid = self.functions.get(k)
        if fid is None:
            fid = self.functions[k] = len(self.functions) + 1
            S = self.S
            self.p.function.add(
                id=fid, name=S(name), system_name=S(system_name), filename=S(filename)
            )
        return fid

    def mapping(self, ti: int, address: int) -> Any:
        t = self.view.traces[ti]
        mod = t.module_for(address)
        if mod is None:
            return None
        k = (ti, t.modules.index(mod))
        mp = self.mappings.get(k)
        if mp is None:
            mp = self.p.mapping.add(
                id=len(self.mappings) + 1,
                memory_start=mod.start,
                memory_limit=mod.end,
                file_offset=max(0, mod.start - mod.base),
                filename=self.S(mod.path),
                build_id=self.S(mod.build_id.hex() if mod.build_id else ""),
            )
            self.mappings[k] = mp
        return mp

    def synthetic(self, name: str) -> int:
        k = ("synthetic", name)
        lid = self.locations.get(k)
        if lid is None:
            lid = self.locations[k] = len(self.locations) + 1
            self.p.location.add(id=lid).line.add(function_id=self.function(name, name, None))
        return lid

    def location(self, ti: int, group: list[SFrame]) -> int:
        address = group[0].address
        k = (ti, address)
        lid = self.locations.get(k)
        if lid is None:
            lid = self.locations[k] = len(self.locations) + 1
            loc = self.p.location.add(id=lid, address=address)
            mp = self.mapping(ti, address)
            if mp is not None:
                loc.mapping_id = mp.id
            for f in group:  # inlined callees first, the caller last
                name = f.function or f.label()
                loc.line.add(function_id=self.function(name, name, f.file), line=f.line or 0)
                if mp is not None and f.function:
                    mp.has_functions = True
                    mp.has_filenames = mp.has_filenames or bool(f.file)
                    mp.has_line_numbers = mp.has_line_numbers or bool(f.line)
                    mp.has_inline_frames = mp.has_inline_frames or f.inlined
        return lid

    def sample(self, ti: int, leaf: int, values: list[int]) -> None:
        """One stack's sample: its locations (one per address, inlined frames in it), the
        process as a root frame when there are several, pid and exe labels."""
        view, S = self.view, self.S
        s = self.p.sample.add(value=values)
        frames = view.frames(ti, leaf)
        if not frames:
            s.location_id.append(self.synthetic(NO_STACK))
        group: list[SFrame] = []
        for f in frames:  # innermost first: leaf first, as pprof wants
            if group and f.address != group[0].address:
                s.location_id.append(self.location(ti, group))
                group = []
            group.append(f)
        if group:
            s.location_id.append(self.location(ti, group))
        t = view.traces[ti]
        if view.multi_process:
            s.location_id.append(self.synthetic(view.process(ti)))
        s.label.add(key=S("pid"), num=t.pid)
        s.label.add(key=S("exe"), str=S(os.path.basename(t.exe) or "?"))


def write(view: View, path: Path) -> dict[str, int]:
    p = build(view)
    data = gzip.compress(p.SerializeToString(), mtime=0)
    Path(path).write_bytes(data)
    return {"samples": len(p.sample), "locations": len(p.location), "mappings": len(p.mapping)}
