"""`cudatrace export`: every format read back by the tool or library that defines it.

Two traces: the KV-pool program (examples/kv-pool) run on the simulated driver, symbolized
by the real symbolizer (its ELF has build-ids), and tracegen's two-process, two-device
scenario (a failure and a budget denial) over a small compiled ELF. Every export's total at
the moment equals `report --json`'s total_live_bytes at that moment.

pprof is read by `go tool pprof` (Debian's golang-go; .ci/run installs it): a missing `go`
fails these tests unless CUDATRACE_NO_GO=1 says this machine has none on purpose.
"""

from __future__ import annotations

import gzip
import json
import os
import pickle
import shutil
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

from support import tracegen
from support.cli import checkout_env, cudatrace
from support.kvpool import LAYERS, WEIGHTS, WORKSPACE, GiB, kvpool, thor_env  # noqa: F401
from support.paths import REPO  # noqa: E402

FORMATS = ("folded", "pprof", "speedscope", "memory-viz", "perfetto")
KV = "allocate_layer_kv"


def cli(env, *args, timeout=300):
    return cudatrace(env, *args, timeout=timeout, cwd=str(REPO))


def _ok(r):
    return f"exit {r.returncode}\nstdout:\n{r.stdout}\nstderr:\n{r.stderr}"


class Run:
    def __init__(self, path: Path, env: dict, base: Path):
        self.path, self.env, self.base = path, env, base
        self._reports: dict = {}
        self.n = 0

    def report(self, at="peak", device=None) -> dict:
        k = (at, device)
        if k not in self._reports:
            extra = ("--device", device) if device is not None else ()
            r = cli(self.env, "report", self.path, "--json", "--at", at, "--top", "100", *extra)
            assert r.returncode == 0, _ok(r)
            self._reports[k] = json.loads(r.stdout)
        return self._reports[k]

    def export(self, fmt, *opts) -> Path:
        self.n += 1
        out = self.base / ("export%d.%s" % (self.n, fmt))
        r = cli(self.env, "export", self.path, "--format", fmt, "-o", out, *opts)
        assert r.returncode == 0, _ok(r)
        assert out.is_file() and f"wrote {out}" in r.stderr, _ok(r)
        return out


@pytest.fixture(scope="module")
def kv(sim, kvpool, tmp_path_factory):  # noqa: F811
    base = tmp_path_factory.mktemp("export-kv")
    env = thor_env(sim, base)
    out = base / "trace"
    r = cli(env, "run", "-o", out, "--", kvpool, "--kv-cache-memory", "1GiB")
    assert r.returncode == 0, _ok(r)
    return Run(out, env, base)


@pytest.fixture(scope="module")
def scen(tmp_path_factory):
    base = tmp_path_factory.mktemp("export-scen")
    elf = tracegen.build_fixture_elf(base / "elf")
    figures = tracegen.write_scenario(base / "trace", elf=elf)
    env = checkout_env({k: v for k, v in os.environ.items() if not k.startswith("CUDASIM_")})
    env["CUDATRACE_CACHE"] = str(base / "symcache")
    run = Run(base / "trace", env, base)
    run.figures = figures
    return run


# ---- readers -------------------------------------------------------------------------------


def read_folded(path: Path) -> list[tuple[list[str], int]]:
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        stack, _, n = line.rpartition(" ")
        assert stack and n.isdigit(), line
        out.append((stack.split(";"), int(n)))
    return out


def read_pprof(path: Path):
    from cudatrace.present.export.pprof import classes

    data = path.read_bytes()
    assert data[:2] == b"\x1f\x8b", "pprof files are gzip-compressed"
    return classes()["Profile"].FromString(gzip.decompress(data))


def pprof_values(p) -> dict[str, int]:
    names = [p.string_table[st.type] for st in p.sample_type]
    tot = dict.fromkeys(names, 0)
    for s in p.sample:
        for n, v in zip(names, s.value):
            tot[n] += v
    return tot


def read_perfetto(path: Path):
    from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb

    return pb.Trace.FromString(path.read_bytes())


def perfetto_tracks(trace):
    tracks, events = {}, []
    for p in trace.packet:
        if p.HasField("track_descriptor"):
            d = p.track_descriptor
            tracks[d.uuid] = d
        elif p.HasField("track_event"):
            events.append((p.timestamp, p.track_event))
    return tracks, events


def counter_at(events, uuid: int, ts: int) -> int:
    v = 0
    for t, e in events:
        if e.track_uuid == uuid and e.type == 4 and t <= ts:
            v = e.counter_value
    return v


def export_total(fmt: str, path: Path, moment_ns: int) -> int:
    """The bytes live at the moment, as the exported file says."""
    if fmt == "folded":
        return sum(n for _, n in read_folded(path))
    if fmt == "pprof":
        return pprof_values(read_pprof(path))["inuse_space"]
    if fmt == "speedscope":
        return sum(json.loads(path.read_text())["profiles"][0]["weights"])
    if fmt == "memory-viz":
        snap = pickle.loads(path.read_bytes())
        return sum(
            b["size"]
            for s in snap["segments"]
            for b in s["blocks"]
            if b["state"] == "active_allocated"
        )
    if fmt == "perfetto":
        tracks, events = perfetto_tracks(read_perfetto(path))
        return sum(
            counter_at(events, u, moment_ns)
            for u, d in tracks.items()
            if d.HasField("counter") and not d.parent_uuid
        )
    raise AssertionError(fmt)


# ---- the numbers agree ---------------------------------------------------------------------


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("at", ["peak", "end", "1.25s"])
def test_total_at_the_moment_equals_report(scen, fmt, at):
    rep = scen.report(at)
    out = scen.export(fmt, "--at", at)
    assert export_total(fmt, out, rep["at"]["ts_ns"]) == rep["total_live_bytes"]


@pytest.mark.parametrize("fmt", FORMATS)
def test_kvpool_total_at_peak_equals_report(kv, fmt):
    rep = kv.report()
    assert rep["total_live_bytes"] == WEIGHTS + WORKSPACE + LAYERS * GiB
    out = kv.export(fmt)
    assert export_total(fmt, out, rep["at"]["ts_ns"]) == rep["total_live_bytes"]


def test_device_option_limits_every_format(scen):
    rep = scen.report("peak", device=1)
    assert rep["total_live_bytes"] == GiB
    for fmt in FORMATS:
        out = scen.export(fmt, "--device", "1")
        assert export_total(fmt, out, rep["at"]["ts_ns"]) == GiB, fmt


# ---- folded --------------------------------------------------------------------------------


def test_folded_kv_stack_root_to_leaf(kv):
    rows = read_folded(kv.export("folded"))
    kvrows = [(st, n) for st, n in rows if st[-1].startswith(KV)]
    assert len(kvrows) == 1, rows
    st, n = kvrows[0]
    assert n == LAYERS * GiB
    names = [s.split(" (")[0] for s in st]
    assert names[-3:] == ["main", "allocate_kv_cache", KV], st
    assert rows[0] == kvrows[0]  # largest first
    assert not any(
        "libcuda" in s or s.startswith("cu") for s, _ in [(x, 0) for st, _ in rows for x in st]
    )


def test_folded_process_roots_when_several(scen):
    rows = read_folded(scen.export("folded"))
    assert {st[0] for st, _ in rows} == {"pid 1000 (python3)", "pid 1001 (python3)"}
    by_leaf = defaultdict(int)
    for st, n in rows:
        by_leaf[st[-1].split(" (")[0]] += n
    assert by_leaf == {"load_weights": 4 * GiB, "alloc_activations": 2 * GiB, "make_workspace": GiB}


def test_folded_escapes_separators():
    from cudatrace.present.export.folded import escape

    for bad in ("a;b", "x\ny", "tab\there", "cr\rlf", "op<;>\n;"):
        e = escape(bad)
        assert ";" not in e and "\n" not in e and "\r" not in e and "\t" not in e, repr(e)
    assert escape("a;b") == "a\uff1bb"
    assert escape("std::vector<int>::push_back") == "std::vector<int>::push_back"


# ---- pprof ---------------------------------------------------------------------------------


def _go() -> str:
    go = shutil.which("go")
    if go is None:
        pytest.fail(
            "`go` is not installed: pprof files are read back by `go tool pprof` "
            "(apt-get install golang-go, as .ci/run does)"
        )
    return go


def go_pprof(*args) -> str:
    env = dict(
        os.environ,
        HOME=os.environ.get("HOME", "/tmp"),
        GOFLAGS="-mod=mod",
        GOTOOLCHAIN="local",
        PPROF_TMPDIR=os.environ.get("TMPDIR", "/tmp"),
    )
    r = subprocess.run(
        [_go(), "tool", "pprof", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=180,
        env=env,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout


def test_pprof_go_tool_shows_the_kv_site(kv):
    out = kv.export("pprof")
    text = go_pprof("-top", "-symbolize=none", "-unit=B", out)
    line = next((l for l in text.splitlines() if l.rstrip().endswith(KV)), None)
    assert line is not None, text
    flat = line.split()[0]
    assert flat == "%dB" % (LAYERS * GiB), line
    assert "Type: inuse_space" in text
    total = WEIGHTS + WORKSPACE + LAYERS * GiB
    assert "%dB total" % total in text, text
    # the whole run: the same here (kvpool allocates each buffer once)
    text = go_pprof("-top", "-symbolize=none", "-sample_index=alloc_objects", out)
    line = next(l for l in text.splitlines() if l.rstrip().endswith(KV))
    assert line.split()[0] == str(LAYERS), line


def test_pprof_read_back_with_protobuf(kv):
    p = read_pprof(kv.export("pprof"))
    S = p.string_table
    assert S[0] == ""
    assert [(S[t.type], S[t.unit]) for t in p.sample_type] == [
        ("alloc_objects", "count"),
        ("alloc_space", "bytes"),
        ("inuse_objects", "count"),
        ("inuse_space", "bytes"),
    ]
    assert S[p.default_sample_type] == "inuse_space"
    tot = pprof_values(p)
    assert tot["inuse_space"] == WEIGHTS + WORKSPACE + LAYERS * GiB
    assert tot["inuse_objects"] == LAYERS + 2
    from cudatrace.analyze.read.trace import read_dir
    from cudatrace.analyze.replay.model import build

    every = build(read_dir(kv.path)).lifetimes()  # the whole run, scratch included
    assert tot["alloc_space"] == sum(x.size for x in every) > tot["inuse_space"]
    assert tot["alloc_objects"] == len(every)
    # ids: locations, functions and mappings referenced exist
    locs = {l.id: l for l in p.location}
    funcs = {f.id: f for f in p.function}
    maps = {m.id: m for m in p.mapping}
    for s in p.sample:
        for lid in s.location_id:
            assert lid in locs
    for l in p.location:
        assert l.mapping_id == 0 or l.mapping_id in maps
        for ln in l.line:
            assert ln.function_id in funcs
    # the KV sample: its leaf names the function, file and line; its mapping has kvpool's
    # build-id as the trace recorded it
    kvs = [
        s
        for s in p.sample
        if any(S[funcs[ln.function_id].name] == KV for ln in locs[s.location_id[0]].line)
    ]
    assert len(kvs) == 1
    s = kvs[0]
    assert list(s.value) == [LAYERS, LAYERS * GiB, LAYERS, LAYERS * GiB]
    leaf = locs[s.location_id[0]]
    f = funcs[leaf.line[-1].function_id]
    assert S[f.filename].endswith("kvpool.c") and leaf.line[-1].line > 0
    callers = [S[funcs[locs[i].line[-1].function_id].name] for i in s.location_id]
    assert callers[:3] == [KV, "allocate_kv_cache", "main"], callers
    mp = maps[leaf.mapping_id]
    assert S[mp.filename].endswith("kvpool") and mp.has_functions
    t = read_dir(kv.path).traces[0]
    mod = next(m for m in t.modules if m.path == S[mp.filename])
    assert mod.build_id and S[mp.build_id] == mod.build_id.hex()
    assert mp.memory_start <= leaf.address < mp.memory_limit
    assert {S[lb.key] for lb in s.label} == {"pid", "exe"}


def test_pprof_descriptors_match_protoc(tmp_path):
    """The message classes cudatrace builds from profile.proto at run time are the ones protoc
    builds from the same file."""
    from google.protobuf import descriptor_pb2
    from grpc_tools import protoc

    from cudatrace.present.export import pprof
    from cudatrace.protodesc import parse

    out = tmp_path / "set.pb"
    rc = protoc.main(
        [
            "protoc",
            f"-I{pprof.PROTO.parent}",
            f"--descriptor_set_out={out}",
            pprof.PROTO.name,
        ]
    )
    assert rc == 0
    theirs = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes()).file[0]
    mine = parse(pprof.PROTO.read_text(), pprof.PROTO.name)

    def shape(fdp):
        return {
            m.name: [(f.name, f.number, f.label, f.type, f.type_name) for f in m.field]
            for m in fdp.message_type
        }

    assert theirs.package == mine.package == "perftools.profiles"
    assert shape(mine) == shape(theirs)
    assert "Profile" in shape(mine) and len(shape(mine)) == 8


def test_protodesc_refuses_what_it_cannot_read():
    from cudatrace.protodesc import ProtoError, parse

    with pytest.raises(ProtoError):
        parse('syntax = "proto3"; message A { oneof x { int64 a = 1; } }')
    with pytest.raises(ProtoError):
        parse('syntax = "proto3"; message A { map<double, int64> m = 1; }')
    with pytest.raises(ProtoError):
        parse('syntax = "proto3"; service S { rpc M (stream A) returns (A) {} }')
    with pytest.raises(ProtoError):
        parse('syntax = "proto2"; message A { optional int64 x = 1; }')
    with pytest.raises(ProtoError):
        parse('syntax = "proto3"; enum E { A = 0; }')


# ---- speedscope ----------------------------------------------------------------------------

# The constraints of speedscope's file format schema (file-format-schema.json) that a sampled
# profile must meet, written out here: what speedscope checks before it draws a file.
SPEEDSCOPE_SCHEMA = {
    "type": "object",
    "required": ["$schema", "profiles", "shared"],
    "properties": {
        "$schema": {
            "type": "string",
            "enum": ["https://www.speedscope.app/file-format-schema.json"],
        },
        "name": {"type": "string"},
        "exporter": {"type": "string"},
        "activeProfileIndex": {"type": "number"},
        "shared": {
            "type": "object",
            "required": ["frames"],
            "properties": {
                "frames": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "required": ["name"],
                        "properties": {
                            "name": {"type": "string"},
                            "file": {"type": "string"},
                            "line": {"type": "number"},
                            "col": {"type": "number"},
                        },
                    },
                }
            },
        },
        "profiles": {
            "type": "array",
            "items": {
                "type": "object",
                "required": [
                    "type",
                    "name",
                    "unit",
                    "startValue",
                    "endValue",
                    "samples",
                    "weights",
                ],
                "properties": {
                    "type": {"type": "string", "enum": ["sampled"]},
                    "name": {"type": "string"},
                    "unit": {
                        "enum": [
                            "bytes",
                            "microseconds",
                            "milliseconds",
                            "nanoseconds",
                            "none",
                            "seconds",
                        ]
                    },
                    "startValue": {"type": "number"},
                    "endValue": {"type": "number"},
                    "samples": {
                        "type": "array",
                        "items": {"type": "array", "items": {"type": "number"}},
                    },
                    "weights": {"type": "array", "items": {"type": "number"}},
                },
            },
        },
    },
}


def test_speedscope_against_its_schema(kv):
    import jsonschema

    doc = json.loads(kv.export("speedscope").read_text())
    jsonschema.validate(doc, SPEEDSCOPE_SCHEMA)
    prof = doc["profiles"][0]
    assert prof["unit"] == "bytes"
    assert len(prof["samples"]) == len(prof["weights"])
    frames = doc["shared"]["frames"]
    for st in prof["samples"]:
        assert st and all(isinstance(i, int) and 0 <= i < len(frames) for i in st)
    assert prof["endValue"] - prof["startValue"] == sum(prof["weights"])
    k = next(i for i, st in enumerate(prof["samples"]) if frames[st[-1]]["name"].startswith(KV))
    assert prof["weights"][k] == LAYERS * GiB
    leaf = frames[prof["samples"][k][-1]]
    assert leaf["file"].endswith("kvpool.c") and leaf["line"] > 0
    names = [frames[i]["name"].split(" (")[0] for i in prof["samples"][k]]
    assert names[-3:] == ["main", "allocate_kv_cache", KV], names  # root first


def test_speedscope_schema_catches_a_broken_file(kv):
    """The schema test can fail: a profile without weights is refused."""
    import jsonschema

    doc = json.loads(kv.export("speedscope").read_text())
    del doc["profiles"][0]["weights"]
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(doc, SPEEDSCOPE_SCHEMA)


# ---- memory-viz ----------------------------------------------------------------------------


def replay_device_trace(entries):
    """What PyTorch's viewer rebuilds from a device trace: live blocks and segments."""
    blocks, segs, ooms = {}, {}, []
    for e in entries:
        a = e["action"]
        if a == "segment_alloc":
            assert e["addr"] not in segs, e
            segs[e["addr"]] = e["size"]
        elif a == "alloc":
            assert e["addr"] in segs and e["addr"] not in blocks, e
            blocks[e["addr"]] = e["size"]
        elif a == "free_requested":
            assert e["addr"] in blocks, e
        elif a == "free_completed":
            assert blocks.pop(e["addr"]) == e["size"], e
        elif a == "segment_free":
            assert segs.pop(e["addr"]) == e["size"] and e["addr"] not in blocks, e
        elif a == "oom":
            ooms.append(e)
        else:
            raise AssertionError(f"unknown action {a!r}")
    return blocks, segs, ooms


@pytest.mark.parametrize("at", ["peak", "end"])
def test_memory_viz_unpickles_and_adds_up(scen, at):
    out = scen.export("memory-viz", "--at", at)
    data = out.read_bytes()
    assert data[0] == 0x80 and data[1] <= 4, "pickle protocol %d" % data[1]
    snap = pickle.loads(data)
    assert set(snap) >= {"segments", "device_traces"}
    rep = scen.report(at)
    per_dev = {d["device"]: d["at_bytes"] for d in rep["devices"]}
    for s in snap["segments"]:
        assert {
            "device",
            "address",
            "total_size",
            "allocated_size",
            "active_size",
            "stream",
            "segment_type",
            "blocks",
        } <= set(s)
        assert sum(b["size"] for b in s["blocks"]) == s["total_size"] == s["allocated_size"]
        for b in s["blocks"]:
            assert {"size", "state", "address", "frames"} <= set(b)
            assert b["state"] == "active_allocated"
            for f in b["frames"]:
                assert set(f) >= {"filename", "line", "name"}
    for dev, entries in enumerate(snap["device_traces"]):
        blocks, segs, ooms = replay_device_trace(entries)
        mine = {s["address"]: s["total_size"] for s in snap["segments"] if s["device"] == dev}
        assert segs == mine == blocks, dev  # the trace leads to the snapshot's state
        assert sum(mine.values()) == per_dev.get(dev, 0), dev
        times = [e["time_us"] for e in entries]
        assert times == sorted(times)
    ooms = [e for t in snap["device_traces"] for e in t if e["action"] == "oom"]
    assert len(ooms) == (1 if at == "end" else 0)  # the denial comes after the peak
    if ooms:
        assert ooms[0]["size"] == 2 * GiB and ooms[0]["frames"][0]["name"] == "grow_cache"


# The pickle opcodes the viewer's own unpickler (pytorch.org/memory_viz, MemoryViz.js) decodes:
# a snapshot using any other cannot be opened there.
VIEWER_OPCODES = {
    "PROTO",
    "FRAME",
    "STOP",
    "MARK",
    "MEMOIZE",
    "BINPUT",
    "LONG_BINPUT",
    "BINGET",
    "LONG_BINGET",
    "EMPTY_DICT",
    "DICT",
    "SETITEM",
    "SETITEMS",
    "EMPTY_LIST",
    "LIST",
    "APPEND",
    "APPENDS",
    "EMPTY_TUPLE",
    "TUPLE",
    "TUPLE1",
    "TUPLE2",
    "TUPLE3",
    "NONE",
    "NEWTRUE",
    "NEWFALSE",
    "BININT",
    "BININT1",
    "BININT2",
    "LONG1",
    "BINFLOAT",
    "SHORT_BINUNICODE",
    "BINUNICODE",
}


@pytest.mark.parametrize("which", ["kv", "scen"])
def test_memory_viz_uses_only_what_the_viewer_decodes(which, request):
    import pickletools

    run = request.getfixturevalue(which)
    data = run.export("memory-viz", "--at", "end").read_bytes()
    used = {op.name for op, _arg, _pos in pickletools.genops(data)}
    assert used <= VIEWER_OPCODES, used - VIEWER_OPCODES

    def ints(x):
        if isinstance(x, dict):
            for v in x.values():
                yield from ints(v)
        elif isinstance(x, (list, tuple)):
            for v in x:
                yield from ints(v)
        elif isinstance(x, int) and not isinstance(x, bool):
            yield x

    # the viewer turns integers into JavaScript numbers: exact only below 2**53
    assert all(abs(i) < 2**53 for i in ints(pickle.loads(data)))


def test_memory_viz_kv_frames(kv):
    snap = pickle.loads(kv.export("memory-viz", "--at", "end").read_bytes())
    assert snap["segments"] == []  # kvpool frees everything
    allocs = [e for e in snap["device_traces"][0] if e["action"] == "alloc"]
    kvs = [e for e in allocs if e["frames"][0]["name"] == KV]
    assert len(kvs) == LAYERS and all(e["size"] == GiB for e in kvs)
    assert kvs[0]["frames"][0]["filename"].endswith("kvpool.c")
    frees = [e for e in snap["device_traces"][0] if e["action"] == "free_completed"]
    assert len(frees) == len(allocs)


def test_memory_viz_moves_processes_apart_when_addresses_collide(tmp_path):
    """Two processes holding the same address on one device: the viewer keys blocks by
    address, so the second one's addresses move up (and the snapshot says by how much)."""
    d = tmp_path / "t"
    d.mkdir()
    for pid in (2000, 2001):
        w = tracegen.TraceWriter(d / ("%d.0.ctrace" % pid), pid=pid, ppid=1)
        w.module("/usr/bin/app", 0x400000, 0x800000, base=0)
        leaf = w.stack([0x401008, 0x402008])
        w.alloc(tracegen.BASE_TS + (pid - 1999) * tracegen.MS, 1 << 20, 0x7F0000000000, stack=leaf)
        w.close(end_ts=tracegen.BASE_TS + 10 * tracegen.MS)
    tracegen.write_run(d)
    env = dict(
        os.environ,
        PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""),
        CUDATRACE_CACHE=str(tmp_path / "cache"),
    )
    out = tmp_path / "s.pickle"
    r = cli(env, "export", d, "--format", "memory-viz", "-o", out, "--at", "end")
    assert r.returncode == 0, _ok(r)
    snap = pickle.loads(out.read_bytes())
    addrs = sorted(s["address"] for s in snap["segments"])
    assert addrs == [0x7F0000000000, 0x7F0000000000 + (1 << 48)]
    assert replay_device_trace(snap["device_traces"][0])[1] == {a: 1 << 20 for a in addrs}
    assert list(snap["cudatrace"]["address_shift"].values()) == [1 << 48]


# ---- perfetto ------------------------------------------------------------------------------


def test_perfetto_tracks_counters_and_events(scen):
    rep = scen.report("peak")
    trace = read_perfetto(scen.export("perfetto"))
    tracks, events = perfetto_tracks(trace)
    assert trace.packet[0].sequence_flags & 1  # incremental state cleared
    stamps = [t for t, _ in events]
    assert stamps == sorted(stamps)
    for _, e in events:
        assert e.track_uuid in tracks
    # device counters at the peak: report's per-device bytes at the moment
    dev = {d.name: u for u, d in tracks.items() if d.HasField("counter") and not d.parent_uuid}
    assert set(dev) == {"device 0: live bytes", "device 1: live bytes"}
    at = rep["at"]["ts_ns"]
    for d in rep["devices"]:
        assert counter_at(events, dev["device %d: live bytes" % d["device"]], at) == d["at_bytes"]
    # per process: a process track, its counters sum to the process's bytes at the moment
    procs = {d.process.pid: u for u, d in tracks.items() if d.HasField("process")}
    assert set(procs) == {1000, 1001}
    for p in rep["processes"]:
        mine = [
            u
            for u, d in tracks.items()
            if d.parent_uuid == procs[p["pid"]] and d.HasField("counter")
        ]
        assert sum(counter_at(events, u, at) for u in mine) == p["at_bytes"], p["pid"]
    # slices: balanced per track, every allocation >= 7 MiB of the run (4 + 8 + 2 = 14)
    begins = [e for _, e in events if e.type == 1]
    ends = defaultdict(int)
    for _, e in events:
        ends[e.track_uuid] += {1: 1, 2: -1}.get(e.type, 0)
    assert len(begins) == 14 and not any(ends.values())
    names = defaultdict(int)
    for e in begins:
        names[e.name.split(" (")[0]] += 1
    assert names == {"load_weights": 4, "alloc_activations": 8, "make_workspace": 2}
    # instants: the denial, the failure and the moment
    inst = [e.name for _, e in events if e.type == 3]
    assert any(n.startswith("denied 2.00 GiB at grow_cache") for n in inst), inst
    assert any(n.startswith("failed 16.0 GiB: CUDA_ERROR_OUT_OF_MEMORY") for n in inst), inst
    assert any(n.startswith("moment: at the peak") for n in inst), inst


def test_perfetto_kv_slices(kv):
    trace = read_perfetto(kv.export("perfetto"))
    tracks, events = perfetto_tracks(trace)
    kvs = [e for _, e in events if e.type == 1 and e.name.startswith(KV)]
    assert len(kvs) == LAYERS
    args = {a.name: a for a in kvs[0].debug_annotations}
    assert args["size"].int_value == GiB and "allocate_kv_cache" in args["stack"].string_value


# ---- the command ---------------------------------------------------------------------------


def test_missing_extra_names_it(scen, monkeypatch, capsys, tmp_path):
    from cudatrace.commands.export import run_export
    from cudatrace.errors import CudatraceError
    from cudatrace.present import export as ex

    monkeypatch.setattr(ex, "_importable", lambda name: False)
    out = tmp_path / "x.pb.gz"
    with pytest.raises(CudatraceError) as e:
        run_export(scen.path, "pprof", out)
    assert e.value.status == 2
    err = str(e.value)
    assert "pip install 'cudatrace[export]'" in err and "google.protobuf" in err
    assert not out.exists()


def test_bad_input_clear_errors_and_no_partial_file(scen, tmp_path):
    env = scen.env
    out = tmp_path / "x.folded"
    r = cli(env, "export", scen.path, "--format", "folded", "-o", out, "--at", "soon")
    assert r.returncode == 2 and "--at" in r.stderr and not out.exists(), _ok(r)
    r = cli(env, "export", scen.path, "--format", "folded", "-o", out, "--device", "7")
    assert r.returncode == 2 and "device 7" in r.stderr and not out.exists(), _ok(r)
    r = cli(env, "export", tmp_path / "nothing", "--format", "folded", "-o", out)
    assert r.returncode == 2 and "no such trace" in r.stderr and not out.exists(), _ok(r)
    r = cli(env, "export", scen.path, "--format", "svg", "-o", out)
    assert r.returncode == 2 and "svg" in r.stderr, _ok(r)
    r = cli(env, "export", scen.path, "--format", "folded", "-o", tmp_path / "no" / "dir" / "f")
    assert r.returncode == 2 and "cannot write" in r.stderr, _ok(r)
    assert not list(tmp_path.glob("**/.*.tmp"))


def test_gpu_memory_viz_check_script_runs_its_own_checks_without_torch(scen, tmp_path):
    """tools/gpu/check_memory_viz.py (run by hand on a machine with torch) refuses clearly
    where torch is missing, after its torch-free checks of the file pass."""
    out = scen.export("memory-viz", "--at", "end")
    r = subprocess.run(
        [
            sys.executable,
            str(REPO / "tools" / "gpu" / "check_memory_viz.py"),
            str(out),
            "--no-torch-ok",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, _ok(r)
    assert "snapshot ok" in r.stdout


def test_help_names_every_format(scen):
    from cudatrace.present.export import FORMATS as names

    r = cli(scen.env, "export", "--help")
    assert r.returncode == 0, _ok(r)
    text = " ".join(r.stdout.split())
    for name in names:
        assert name in text, name


@pytest.mark.parametrize("fmt", FORMATS)
def test_empty_and_stackless_traces(fmt, tmp_path):
    """A run that allocated nothing, and one traced with --stack-depth 0: every format writes a
    file its reader takes, with the right total, the stackless bytes under report's note."""
    env = dict(
        os.environ,
        PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""),
        CUDATRACE_CACHE=str(tmp_path / "cache"),
    )
    empty, bare = tmp_path / "empty", tmp_path / "bare"
    empty.mkdir()
    bare.mkdir()
    w = tracegen.TraceWriter(empty / "1.0.ctrace", pid=1)
    w.meminfo(tracegen.BASE_TS + 1000, 1, 2)
    w.close(end_ts=tracegen.BASE_TS + 5000)
    w = tracegen.TraceWriter(bare / "1.0.ctrace", pid=1, stack_depth=0)
    w.alloc(tracegen.BASE_TS + 1000, 4096, 0x1000)
    w.alloc(tracegen.BASE_TS + 2000, 8 << 20, 0x100000)
    w.close(end_ts=tracegen.BASE_TS + 5000)
    for d, total in ((empty, 0), (bare, 4096 + (8 << 20))):
        tracegen.write_run(d)
        out = tmp_path / (d.name + "." + fmt)
        r = cli(env, "export", d, "--format", fmt, "-o", out, "--at", "end")
        assert r.returncode == 0, _ok(r)
        # (Perfetto's counter read just before the exit at +5000 takes its memory with it)
        assert export_total(fmt, out, tracegen.BASE_TS + 4000) == total, d.name
    if fmt == "folded":
        assert read_folded(tmp_path / "bare.folded")[0][0] == [
            "(no stack recorded: stacks off, --stack-depth 0)"
        ]


@pytest.mark.parametrize("which", ["kv", "scen"])
def test_leaves_are_reports_sites(which, request):
    """The same attribution as report: grouped by their innermost frame, the folded stacks and
    the pprof samples give report's sites with report's bytes."""
    run = request.getfixturevalue(which)
    rep = run.report()
    sites = defaultdict(int)
    for s in rep["sites"]:
        sites[s["label"].split(" (")[0]] += s["bytes"]
    folded = defaultdict(int)
    for st, n in read_folded(run.export("folded")):
        folded[st[-1].split(" (")[0]] += n
    assert folded == sites
    p = read_pprof(run.export("pprof"))
    S, funcs = p.string_table, {f.id: f for f in p.function}
    locs = {loc.id: loc for loc in p.location}
    by_leaf = defaultdict(int)
    for s in p.sample:
        if s.value[3]:
            leaf = locs[s.location_id[0]].line[0]
            by_leaf[S[funcs[leaf.function_id].name].split(" (")[0]] += s.value[3]
    assert by_leaf == sites
