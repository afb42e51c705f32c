"""`cudatrace report`: text content, the JSON schema, moments, groupings, errors, the SVG."""

from __future__ import annotations

import json
import os
import shutil
import xml.etree.ElementTree as ET

import pytest
from click.testing import CliRunner

from cudatrace.analyze.documents.analysis import Analysis
from cudatrace.analyze.documents.report import SCHEMA, build_report
from cudatrace.attribution import Attribution
from cudatrace.cli import main
from cudatrace.commands.options import Outputs
from cudatrace.commands.report import run_report
from cudatrace.errors import CudatraceError
from cudatrace.present.report import render_text
from cudatrace.units import parse_time
from support import tracegen as tg
from support.fixture_elf import elf, fake_sym  # noqa: F401  (fixtures)
from support.schemas import validate

GiB, MiB = tg.GiB, tg.MiB


@pytest.fixture(scope="module")
def scen(tmp_path_factory, elf):
    d = tmp_path_factory.mktemp("run") / "trace"
    facts = tg.write_scenario(d, elf=elf)
    return d, facts


@pytest.fixture(scope="module")
def scen_no_nvml(tmp_path_factory, elf):
    d = tmp_path_factory.mktemp("jetson") / "trace"
    tg.write_scenario(d, elf=elf, nvml=False, budget=None)
    return d


def report_json(path, sym, **kw) -> dict:
    a = Analysis(path, symbolizer=sym)
    r = build_report(a, **kw)
    return json.loads(json.dumps(r))  # exactly what --json prints


def report_json_nofold(path, sym, **kw) -> dict:
    a = Analysis(path, Attribution(fold=False), symbolizer=sym)
    return json.loads(json.dumps(build_report(a, **kw)))


def cli(*args, sym=None, monkeypatch=None):
    if sym is not None and monkeypatch is not None:
        monkeypatch.setattr(
            "cudatrace.analyze.documents.analysis.make_symbolizer", lambda progress=False: sym
        )
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


# ---- the JSON schema: what docs/report-json.md promises scripts ------------------------------
# The schema is the file the package ships (cudatrace/schemas/report-1.json).


def test_json_schema_and_values(scen, fake_sym):
    d, f = scen
    r = report_json(d, fake_sym)
    validate(r)
    assert r["observed"]["near_peak"] is not None and r["observed"]["max"] is not None
    assert r["schema"] == SCHEMA == "cudatrace.report/1"
    assert r["peak_bytes"] == f["peak_bytes"] == 7 * GiB
    assert r["peak_ts_ns"] == f["peak_ts"]
    assert r["peak_time"] == pytest.approx((f["peak_ts"] - f["start_ns"]) / 1e9)
    assert r["at"] == {
        "spec": "peak",
        "kind": "peak",
        "time": r["peak_time"],
        "ts_ns": f["peak_ts"],
        "device": None,
    }
    assert r["total_live_bytes"] == 7 * GiB and r["total_live_count"] == 14
    assert [s["label"].split(" ")[0] for s in r["sites"]] == [
        "load_weights",
        "alloc_activations",
        "make_workspace",
    ]
    top = r["sites"][0]
    assert (top["bytes"], top["count"], top["share"]) == (
        4 * GiB,
        4,
        pytest.approx(4 / 7, abs=1e-6),
    )
    assert top["sizes"] == {"min": GiB, "median": GiB, "max": GiB}
    assert top["api"] == ["cuMemAlloc_v2 (cudaMalloc)"]
    assert top["pids"] == [1000] and top["devices"] == [0]
    assert top["frames"][0]["function"] == "load_weights"
    assert [x["function"] for x in top["context"]] == ["load_weights", "setup", "main"]
    assert sum(s["share"] for s in r["sites"]) == pytest.approx(1.0)
    assert r["end_bytes"] == 4 * GiB
    assert r["never_freed"]["bytes"] == 4 * GiB and r["never_freed"]["count"] == 4
    assert r["never_freed"]["sites"][0]["label"].startswith("load_weights")
    assert r["truncated_files"] == [
        {
            "file": "1001.0.ctrace",
            "pid": 1001,
            "events": 4,
            "reason": r["truncated_files"][0]["reason"],
        }
    ]
    assert [p["status"] for p in r["processes"]] == ["complete", "truncated"]
    assert [(p["pid"], p["ppid"]) for p in r["processes"]] == [(1000, 999), (1001, 1000)]
    assert [(x["device"], x["peak_bytes"], x["end_bytes"]) for x in r["devices"]] == [
        (0, 6 * GiB, 4 * GiB),
        (1, GiB, 0),
    ]
    assert r["devices"][0]["budget"] == 6 * GiB
    (fail,) = r["failed"]
    assert fail["count"] == 1 and fail["bytes"] == 16 * GiB
    assert fail["errors"] == [{"code": 2, "name": "CUDA_ERROR_OUT_OF_MEMORY", "count": 1}]
    assert fail["label"].startswith("grow_cache")
    (deny,) = r["denied"]
    assert (deny["bytes"], deny["limit"], deny["in_use"]) == (2 * GiB, 6 * GiB, 6 * GiB)
    mq = r["memory_queries"]
    assert mq["count"] == 1 and mq["virtualized"] == 1
    assert mq["last"]["free"] == 6 * GiB and mq["last"]["device_total"] == 80 * GiB
    assert r["host_pinned"]["peak_bytes"] == 512 * MiB and r["host_pinned"]["end_bytes"] == 0
    o = r["observed"]
    assert o["nvml"] and o["per_process"] and o["samples"] == 34
    near = o["near_peak"]
    assert near["untraced_bytes"] == 600 * MiB  # two contexts of 300 MiB
    assert near["tree_device_bytes"] == near["traced_bytes"] + 600 * MiB
    assert o["max"]["tree_device_bytes"] == 7 * GiB + 600 * MiB
    assert o["max"]["untraced_bytes"] == 600 * MiB
    assert o["max"]["untraced_max_bytes"] == 600 * MiB and o["overlap"]
    assert r["budget"]["limits"] == {"0": 6 * GiB} and r["budget"]["on_exceed"] == "fail"


def test_text_report(scen, fake_sym):
    d, _ = scen
    text = render_text(report_json(d, fake_sym))
    for s in (
        "command     python3 train.py",
        "pid 1000",
        "ppid 999",
        "pid 1001",
        "truncated (no clean exit record",
        "64 frames per event",
        "driver CUDA 12.4 (12040)",
        "budget      6.00 GiB on device 0",
        "Peak: 7.00 GiB of device memory live at 1.750 s",
        "device 0   peak   6.00 GiB",
        "device 1   peak   1.00 GiB",
        "Traced versus observed (NVML",
        "untraced",
        "600.0 MiB",
        "Device memory live at the peak (1.750 s) by call site: 7.00 GiB in 14 allocations",
        "#1 load_weights",
        "57.1%",
        "1.00 GiB / 1.00 GiB / 1.00 GiB",
        "via cuMemAlloc_v2 (cudaMalloc)",
        "Call stacks of the top sites",
        "from setup",
        "from main",
        "Never freed by exit: 4.00 GiB in 4 allocations",
        "Failed allocations: 1",
        "CUDA_ERROR_OUT_OF_MEMORY",
        "Budget denials: 1",
        "in use 6.00 GiB of a 6.00 GiB budget",
        "Memory queries seen: 1",
        "virtualized by the budget",
        "free 79.0 GiB of 80.0 GiB",
        "Truncated trace files:",
        "1001.0.ctrace",
    ):
        assert s in text, s
    # the call-site list is ordered by bytes
    assert (
        text.index("#1 load_weights")
        < text.index("#2 alloc_activations")
        < text.index("#3 make_workspace")
    )


def test_cli_report_text_and_json(scen, fake_sym, monkeypatch):
    d, _ = scen
    res = cli("report", str(d), sym=fake_sym, monkeypatch=monkeypatch)
    assert res.exit_code == 0, res.output
    assert "Peak: 7.00 GiB" in res.output and "load_weights" in res.output
    res = cli("report", str(d), "--json", "--top", "2", sym=fake_sym, monkeypatch=monkeypatch)
    assert res.exit_code == 0
    r = json.loads(res.output)
    validate(r)
    assert len(r["sites"]) == 2 and r["more_sites"] == 1


def test_at_end(scen, fake_sym):
    d, f = scen
    r = report_json(d, fake_sym, at="end")
    assert r["at"]["kind"] == "end"
    assert r["total_live_bytes"] == 4 * GiB and r["total_live_count"] == 4
    assert [s["label"].split(" ")[0] for s in r["sites"]] == ["load_weights"]
    assert r["peak_bytes"] == 7 * GiB  # the peak is still reported


@pytest.mark.parametrize("spec", ["2.5s", "2.5", "2500ms"])
def test_at_time(scen, fake_sym, spec):
    d, f = scen
    r = report_json(d, fake_sym, at=spec)
    # 2.5 s after the launcher's start (t0 - 50 ms): 4 GiB weights, 3 of 8 activations, the
    # child's two workspaces
    assert r["at"]["kind"] == "time" and r["at"]["time"] == pytest.approx(2.5)
    assert r["at"]["ts_ns"] == f["start_ns"] + int(2.5e9)
    assert r["total_live_bytes"] == 4 * GiB + 3 * 256 * MiB + GiB
    by = {s["label"].split(" ")[0]: s["count"] for s in r["sites"]}
    assert by == {"load_weights": 4, "alloc_activations": 3, "make_workspace": 2}


def test_at_after_the_last_event(scen, fake_sym):
    d, _ = scen
    r = report_json(d, fake_sym, at="9s")
    # the parent exited at 3.2 s holding its 4 GiB of weights: gone with it (issue 21, item 3);
    # the launcher ran on to 10 s
    assert r["total_live_bytes"] == 0
    assert any("after the last event" in x for x in r["warnings"])


def test_at_after_the_run_is_refused(scen, fake_sym):
    # it said "0 B live" at 99 s of a 10 s run, as if that were a fact of the run
    d, _ = scen
    with pytest.raises(CudatraceError, match=r"--at 99s: the run lasted 10\.0\d\d s"):
        report_json(d, fake_sym, at="99s")


def test_at_before_anything(scen, fake_sym):
    d, _ = scen
    r = report_json(d, fake_sym, at="0")
    assert r["total_live_bytes"] == 0 and r["sites"] == []
    assert "(nothing live)" in render_text(r)


def test_at_bad_value(scen, fake_sym, monkeypatch):
    d, _ = scen
    res = cli("report", str(d), "--at", "soon", sym=fake_sym, monkeypatch=monkeypatch)
    assert res.exit_code == 2
    assert "soon" in res.output
    with pytest.raises(ValueError):
        parse_time("-1s")
    assert parse_time("1min") == 60.0
    # issue 11: "1m" is a MiB in sizes; as a time it is refused, not read as a minute
    with pytest.raises(ValueError, match="ambiguous"):
        parse_time("1m")


def test_by_api(scen, fake_sym):
    d, _ = scen
    r = report_json(d, fake_sym, by="api")
    assert [(s["label"], s["bytes"]) for s in r["sites"]] == [
        ("cuMemAlloc_v2 (cudaMalloc)", 7 * GiB)
    ]
    assert r["sites"][0]["pids"] == [1000, 1001] and r["sites"][0]["devices"] == [0, 1]
    assert "by API" in render_text(r)


def test_by_library(scen, fake_sym, elf):
    d, _ = scen
    r = report_json(d, fake_sym, by="library")
    assert [(s["label"], s["bytes"]) for s in r["sites"]] == [(os.path.basename(elf), 7 * GiB)]


def test_by_process(scen, fake_sym):
    d, _ = scen
    r = report_json(d, fake_sym, by="process")
    assert [(s["label"], s["bytes"]) for s in r["sites"]] == [
        ("pid 1000 (python3)", 6 * GiB),
        ("pid 1001 (python3)", GiB),
    ]


def test_cli_by_and_at(scen, fake_sym, monkeypatch):
    d, _ = scen
    for args in (
        ["--by", "api"],
        ["--by", "library"],
        ["--by", "process"],
        ["--at", "end"],
        ["--at", "1.2s"],
        ["--depth", "3"],
        ["--show-cuda-frames"],
        ["--device", "1"],
    ):
        res = cli("report", str(d), "--json", *args, sym=fake_sym, monkeypatch=monkeypatch)
        assert res.exit_code == 0, (args, res.output)
        validate(json.loads(res.output))


def test_device_filter(scen, fake_sym):
    d, f = scen
    r = report_json(d, fake_sym, device=1)
    assert r["device"] == 1
    assert r["peak_bytes"] == GiB and r["peak_ts_ns"] == f["device_peaks"][1][1]
    assert [s["label"].split(" ")[0] for s in r["sites"]] == ["make_workspace"]
    assert [x["device"] for x in r["devices"]] == [1]
    r0 = report_json(d, fake_sym, device=0)
    assert r0["peak_bytes"] == 6 * GiB and r0["total_live_bytes"] == 6 * GiB
    assert r0["failed"] and r0["denied"]


def test_device_without_allocations(scen, fake_sym, monkeypatch):
    d, _ = scen
    res = cli("report", str(d), "--device", "5", sym=fake_sym, monkeypatch=monkeypatch)
    assert res.exit_code == 2 and "device 5" in res.output


def test_depth_splits_sites_by_caller(tmp_path, fake_sym, elf):
    fr = tg.Frames(elf)
    w = tg.TraceWriter(tmp_path / "1.0.ctrace", pid=1)
    fr.write_modules(w)
    a = w.stack(fr.stack("alloc_activations", "forward", "main"))
    b = w.stack(fr.stack("alloc_activations", "train_step", "main"))
    w.alloc(tg.BASE_TS + 1, 100, 0x1, stack=a)
    w.alloc(tg.BASE_TS + 2, 300, 0x2, stack=b)
    w.close()
    # alloc_activations serves two callers: an allocator layer, folded into their sites
    r0 = report_json(tmp_path, fake_sym, depth=1)
    assert [
        (s["label"].split()[0], s["bytes"], [v["function"] for v in s["via"]]) for s in r0["sites"]
    ] == [("train_step", 300, ["alloc_activations"]), ("forward", 100, ["alloc_activations"])]
    assert r0["attribution"]["layers"] == ["alloc_activations"]
    # --no-fold: the raw innermost frame, which --depth splits by caller
    r1 = report_json_nofold(tmp_path, fake_sym, depth=1)
    assert [(s["bytes"], s["count"]) for s in r1["sites"]] == [(400, 2)]
    assert r1["sites"][0]["sizes"] == {"min": 100, "median": 100, "max": 300}  # lower median
    assert r1["sites"][0]["via"] == [] and r1["attribution"]["fold"] is False
    r2 = report_json_nofold(tmp_path, fake_sym, depth=2)
    assert [[x["function"] for x in s["frames"]] for s in r2["sites"]] == [
        ["alloc_activations", "train_step"],
        ["alloc_activations", "forward"],
    ]
    assert r2["sites"][0]["sizes"] == {"min": 300, "median": 300, "max": 300}


def test_cuda_frames_folded_unless_asked(scen, fake_sym):
    d, _ = scen
    a = Analysis(d, Attribution(show_cuda_frames=True), symbolizer=fake_sym)
    r = build_report(a)
    assert os.path.basename(r["sites"][0]["frames"][0]["module"]) == "libcudatrace.so"
    assert [os.path.basename(x["module"]) for x in r["sites"][0]["context"][:3]] == [
        "libcudatrace.so",
        "libcuda.so.1",
        "libcudart.so.12",
    ]


def test_no_nvml_shows_meminfo_and_rss(scen_no_nvml, fake_sym):
    r = report_json(scen_no_nvml, fake_sym)
    o = r["observed"]
    assert not o["nvml"] and "no NVIDIA driver here" in o["nvml_why"]
    near = o["near_peak"]
    assert near["tree_device_bytes"] is None and near["untraced_bytes"] is None
    assert near["mem_available_drop"] is not None and near["mem_available_drop"] > 0
    assert o["max"]["tree_rss"] is not None
    text = render_text(r)
    assert "Traced versus observed (the host's figures, 34 samples" in text, text
    assert "  no device figures: no NVIDIA driver here (libnvidia-ml.so.1 not found)" in text
    assert "MemAvailable" in text and "process tree RSS" in text
    assert r["budget"] is None and "budget      none" in text


def test_no_samples_at_all(tmp_path, fake_sym):
    w = tg.TraceWriter(tmp_path / "1.0.ctrace", pid=1)
    w.alloc(tg.BASE_TS + 1, 100, 0x1)
    w.close()
    r = report_json(tmp_path, fake_sym)
    assert r["observed"]["samples"] == 0 and r["observed"]["near_peak"] is None
    assert "Traced versus observed: not measured" in render_text(r)


def test_single_file_path(scen, fake_sym, monkeypatch):
    d, _ = scen
    res = cli("report", str(d / "1001.0.ctrace"), "--json", sym=fake_sym, monkeypatch=monkeypatch)
    assert res.exit_code == 0, res.output
    r = json.loads(res.output)
    assert [p["pid"] for p in r["processes"]] == [1001]
    assert r["peak_bytes"] == GiB
    assert r["truncated_files"][0]["file"] == "1001.0.ctrace"


def test_truncated_mid_record_is_reported(tmp_path, fake_sym, monkeypatch):
    w = tg.TraceWriter(tmp_path / "7.0.ctrace", pid=7)
    w.alloc(tg.BASE_TS + 1, 100, 0x1)
    w.alloc(tg.BASE_TS + 2, 200, 0x2)
    pos = w.pos
    w.close(clean=False, zero_tail=False)
    tg.cut(tmp_path / "7.0.ctrace", pos - 24)
    res = cli("report", str(tmp_path), sym=fake_sym, monkeypatch=monkeypatch)
    assert res.exit_code == 0
    assert "7.0.ctrace (pid 7, 1 events)" in res.output
    assert "truncated" in res.output
    assert "Peak: 100 B" in res.output


# ---- errors: exit status 2 and the file named ------------------------------------------------


def test_missing_path(tmp_path):
    res = cli("report", str(tmp_path / "nope"))
    assert res.exit_code == 2
    assert str(tmp_path / "nope") in res.output and "no such" in res.output


def test_corrupt_file(tmp_path):
    p = tmp_path / "1.0.ctrace"
    p.write_bytes(b"this is not a trace" * 20)
    res = cli("report", str(p))
    assert res.exit_code == 2 and str(p) in res.output and "not a cudatrace trace" in res.output


def test_empty_file(tmp_path):
    p = tmp_path / "1.0.ctrace"
    p.write_bytes(b"")
    res = cli("report", str(p))
    assert res.exit_code == 2 and str(p) in res.output and "empty" in res.output


def test_file_cut_inside_its_header(tmp_path):
    w = tg.TraceWriter(tmp_path / "1.0.ctrace", pid=1)
    w.close()
    tg.cut(tmp_path / "1.0.ctrace", 100)
    res = cli("report", str(tmp_path))
    assert res.exit_code == 2
    assert "1.0.ctrace" in res.output and "too short" in res.output


def test_directory_without_traces(tmp_path):
    res = cli("report", str(tmp_path))
    assert res.exit_code == 2 and "no trace files" in res.output


def test_one_bad_file_among_good_ones(scen, tmp_path, fake_sym, monkeypatch):
    d, _ = scen
    d2 = tmp_path / "t"
    shutil.copytree(d, d2)
    (d2 / "1002.0.ctrace").write_bytes(b"\0" * 300)
    res = cli("report", str(d2), sym=fake_sym, monkeypatch=monkeypatch)
    assert res.exit_code == 0
    assert "Unreadable files:" in res.output and "1002.0.ctrace" in res.output


def test_stacks_off(tmp_path, fake_sym):
    w = tg.TraceWriter(tmp_path / "1.0.ctrace", pid=1, stack_depth=0)
    w.alloc(tg.BASE_TS + 1, 100, 0x1)
    w.close()
    r = report_json(tmp_path, fake_sym)
    assert r["sites"][0]["label"].startswith("(no stack recorded")
    assert any("stack-depth 0" in x for x in r["warnings"])


def test_nothing_allocated(tmp_path, fake_sym):
    w = tg.TraceWriter(tmp_path / "1.0.ctrace", pid=1)
    w.meminfo(tg.BASE_TS + 1, free=1, total=2)
    w.close()
    r = report_json(tmp_path, fake_sym)
    validate(r)
    assert r["peak_time"] is None and r["peak_bytes"] == 0
    assert "No device memory was allocated" in render_text(r)


# ---- the picture ----------------------------------------------------------------------------


def test_svg(scen, fake_sym, monkeypatch, tmp_path):
    d, _ = scen
    out = tmp_path / "t.svg"
    res = cli("report", str(d), "--svg", str(out), sym=fake_sym, monkeypatch=monkeypatch)
    assert res.exit_code == 0, res.output
    assert "timeline written to" in res.output
    root = ET.parse(out).getroot()  # well-formed XML
    ns = "{http://www.w3.org/2000/svg}"
    assert root.tag == ns + "svg"
    texts = " ".join(t.text or "" for t in root.iter(ns + "text"))
    for s in (
        "peak 7.00 GiB at 1.750 s",
        "budget 6.00 GiB",
        "device memory (GiB)",
        "time since start (seconds)",
        "NVML: process tree",
        "NVML: device used",
        "traced live",
        "denied",
        "failed",
    ):
        assert s in texts, s
    assert len(list(root.iter(ns + "polyline"))) == 2  # NVML tree and device used
    svg = out.read_text()
    assert "<script" not in svg and "href" not in svg  # self-contained


def test_svg_without_nvml_and_for_one_device(scen_no_nvml, fake_sym, tmp_path):
    from cudatrace.present.plot import render_svg

    a = Analysis(scen_no_nvml, symbolizer=fake_sym)
    svg = render_svg(a)
    assert "MemAvailable drop since start" in svg and "process tree RSS" in svg
    assert "no NVML" in svg
    svg1 = render_svg(a, device=1)
    assert "(device 1)" in svg1 and "peak 1.00 GiB" in svg1
    ET.fromstring(svg1)


def test_svg_unwritable(scen, fake_sym, monkeypatch, tmp_path):
    d, _ = scen
    res = cli(
        "report",
        str(d),
        "--svg",
        str(tmp_path / "no" / "dir" / "x.svg"),
        sym=fake_sym,
        monkeypatch=monkeypatch,
    )
    assert res.exit_code == 2 and "x.svg" in res.output


# ---- the rest of the shared base ------------------------------------------------------------


def test_summary_uses_the_same_numbers(scen, fake_sym, monkeypatch):
    import io

    from cudatrace.present.summary import print_summary

    d, _ = scen
    monkeypatch.setattr(
        "cudatrace.analyze.documents.analysis.make_symbolizer", lambda progress=False: fake_sym
    )
    buf = io.StringIO()
    print_summary(d, 0, buf)
    s = buf.getvalue()
    assert "peak of live device memory: 7.00 GiB at 1.750 s" in s
    assert "untraced 600.0 MiB" in s
    assert "load_weights" in s
    assert "failed allocations: 1" in s and "denied by the budget: 1" in s


def test_commands_registered():
    assert {"report", "diff"} <= set(main.list_commands(None))
    assert main.get_command(None, "report").name == "report"


def test_run_report_raises_the_one_error(scen, fake_sym, tmp_path):
    import io

    d, _ = scen
    buf = io.StringIO()
    run_report(d, outputs=Outputs(as_json=True), out=buf, symbolizer=fake_sym)
    validate(json.loads(buf.getvalue()))
    with pytest.raises(CudatraceError) as e:
        run_report(tmp_path / "missing", out=buf)
    assert e.value.status == 2 and "missing" in str(e.value)
    assert not str(e.value).startswith("cudatrace:")


def test_real_symbolizer(scen, tmp_path, monkeypatch):
    """With cudatrace.symbols (DWARF): functions, files and lines from the fixture program."""
    from cudatrace.analyze.sites.stacks import make_symbolizer

    monkeypatch.setenv("CUDATRACE_CACHE", str(tmp_path / "cache"))
    sym = make_symbolizer()
    assert sym is not None, "the symbolizer (pyelftools) is a dependency"
    d, _ = scen
    r = report_json(d, sym)
    top = r["sites"][0]["frames"][0]
    assert top["function"] == "load_weights"
    assert top["file"] and top["file"].endswith("trainer.c") and top["line"] == 4


def test_median_over_several_parts():
    import random

    from cudatrace.analyze.sites.group import kth_smallest

    rnd = random.Random(7)
    for _ in range(200):
        parts = [
            sorted(rnd.randrange(0, 50) for _ in range(rnd.randrange(0, 9)))
            for _ in range(rnd.randrange(1, 5))
        ]
        parts = [p for p in parts if p]
        if not parts:
            continue
        flat = sorted(x for p in parts for x in p)
        k = rnd.randrange(len(flat))
        assert kth_smallest(parts, k, flat[0], flat[-1]) == flat[k]


def _small_run(d, samples):
    w = tg.TraceWriter(d / "1.0.ctrace", pid=1)
    w.alloc(tg.BASE_TS + 100 * tg.MS, GiB, 0x1)
    w.free(tg.BASE_TS + 300 * tg.MS, 0x1)
    w.close()
    tg.write_run(d, samples=samples, start_ns=tg.BASE_TS)


def test_nvml_device_totals_only(tmp_path, fake_sym):
    # NVML answers for the device, but lists nothing for the tree: no per-process figures, and
    # no claim that the tree used 0 bytes
    ts = [tg.BASE_TS + k * 100 * tg.MS for k in range(5)]
    _small_run(
        tmp_path,
        [
            tg.sample(t, tree={0: 0}, used=5 * GiB + (GiB if 1 <= k <= 2 else 0))
            for k, t in enumerate(ts)
        ],
    )
    r = report_json(tmp_path, fake_sym)
    o = r["observed"]
    assert (
        o["nvml"]
        and not o["per_process"]
        and "NVML listed no device memory" in o["per_process_why"]
    )
    assert o["near_peak"]["tree_device_bytes"] is None and o["near_peak"]["untraced_bytes"] is None
    assert o["near_peak"]["device_used_rise"] == GiB
    text = render_text(r)
    assert "NVML device totals only" in text and "untraced" not in text


def test_nvml_errors_read_as_no_nvml(tmp_path, fake_sym):
    ts = [tg.BASE_TS + k * 100 * tg.MS for k in range(5)]
    samples = [
        dict(
            tg.sample(t, mem_available=(60 - (1 if 1 <= k <= 2 else 0)) * GiB),
            devices=[{"index": 0, "error": 3}],
            tree_device_bytes={"0": 0},
        )
        for k, t in enumerate(ts)
    ]
    _small_run(tmp_path, samples)
    r = report_json(tmp_path, fake_sym)
    o = r["observed"]
    assert not o["nvml"]
    assert o["near_peak"]["mem_available_drop"] == GiB
    # plain words, no NVML error codes: what an integrated device answers, said as such
    text = render_text(r)
    assert (
        "no device figures: the device reports no memory use to NVML (integrated devices, "
        "as Jetson's, do not)" in text
    ), text
    assert "NVML error" not in text and "NOT_SUPPORTED" not in text


def test_no_sample_while_memory_was_live(tmp_path, fake_sym):
    _small_run(tmp_path, [tg.sample(tg.BASE_TS + 900 * tg.MS, tree={0: 300 * MiB}, used=GiB)])
    r = report_json(tmp_path, fake_sym)
    assert r["observed"]["overlap"] is False
    assert "no sample fell while traced memory was live" in render_text(r)


def test_nearest_sample_with_memory_live(tmp_path, fake_sym):
    # the peak is at 100 ms, the freeing at 300 ms; samples at 50 ms (nothing yet) and 250 ms
    _small_run(
        tmp_path,
        [
            tg.sample(tg.BASE_TS + 50 * tg.MS, tree={0: 300 * MiB}, used=GiB),
            tg.sample(tg.BASE_TS + 250 * tg.MS, tree={0: GiB + 300 * MiB}, used=2 * GiB),
        ],
    )
    r = report_json(tmp_path, fake_sym)
    near = r["observed"]["near_peak"]
    assert near["offset_ms"] == 150.0 and near["traced_bytes"] == GiB
    assert near["untraced_bytes"] == 300 * MiB and "nearest that did" in near["note"]


def test_a_reading_racing_the_wrapper_is_not_untraced(tmp_path, fake_sym):
    # NVML counts an allocation from inside the driver call, the trace from when the wrapper
    # stamps it (after the call; a free before it): a reading made in between must not count
    # the allocation as untraced. The context (300 MiB) is what is untraced throughout.
    ms = tg.MS
    samples = [
        # t before the allocation's stamp (100 ms); NVML read at 99-101 ms already saw it
        dict(
            tg.sample(tg.BASE_TS + 95 * ms, tree={0: GiB + 300 * MiB}, used=2 * GiB),
            nvml_t=[tg.BASE_TS + 99 * ms, tg.BASE_TS + 101 * ms],
        ),
        dict(
            tg.sample(tg.BASE_TS + 200 * ms, tree={0: GiB + 300 * MiB}, used=2 * GiB),
            nvml_t=[tg.BASE_TS + 200 * ms, tg.BASE_TS + 201 * ms],
        ),
        # stamped freed at 300 ms, the driver still held it when NVML was read at 300.5 ms
        dict(
            tg.sample(tg.BASE_TS + 300 * ms + ms // 4, tree={0: GiB + 300 * MiB}, used=2 * GiB),
            nvml_t=[tg.BASE_TS + 300 * ms + ms // 2, tg.BASE_TS + 300 * ms + ms // 2],
        ),
        dict(
            tg.sample(tg.BASE_TS + 400 * ms, tree={0: 300 * MiB}, used=GiB),
            nvml_t=[tg.BASE_TS + 400 * ms, tg.BASE_TS + 401 * ms],
        ),
    ]
    _small_run(tmp_path, samples)
    o = report_json(tmp_path, fake_sym)["observed"]
    assert o["max"]["untraced_max_bytes"] == 300 * MiB
    assert o["max"]["untraced_bytes"] == 300 * MiB
    assert o["near_peak"]["untraced_bytes"] == 300 * MiB
    # a sample without nvml_t (an older sampler) is set beside the trace at its own time
    for s in samples:
        del s["nvml_t"]
    old = tmp_path / "old"
    old.mkdir()
    _small_run(old, samples)
    o = report_json(old, fake_sym)["observed"]
    assert o["max"]["untraced_max_bytes"] == GiB + 300 * MiB


def _exits_holding(d):
    """pid 1 allocates 1 GiB at 100 ms and exits holding it at 400 ms"""
    w = tg.TraceWriter(d / "1.0.ctrace", pid=1)
    w.alloc(tg.BASE_TS + 100 * tg.MS, GiB, 0x1)
    w.close(end_ts=tg.BASE_TS + 400 * tg.MS)


def test_a_process_gone_is_not_untraced_while_the_driver_tears_it_down(tmp_path, fake_sym):
    # the program exits holding 1 GiB (its exit record at 400 ms); NVML still lists the pid
    # while the driver gives the memory back: that sample is not "1.3 GiB untraced"
    ms = tg.MS
    _exits_holding(tmp_path)

    def sample(t, tree):
        s = dict(
            tg.sample(tg.BASE_TS + t * ms, tree={0: tree}, used=tree + GiB),
            nvml_t=[tg.BASE_TS + t * ms, tg.BASE_TS + t * ms + ms // 2],
        )
        s["tree_device_pids"] = {"0": {"1": tree}}
        return s

    samples = [sample(200, GiB + 300 * MiB), sample(450, GiB + 300 * MiB)]
    tg.write_run(tmp_path, samples=samples, start_ns=tg.BASE_TS)
    o = report_json(tmp_path, fake_sym)["observed"]
    assert o["max"]["untraced_max_bytes"] == 300 * MiB, o["max"]
    # without the per-process figures (an older sampler), the old reading
    old = tmp_path / "old"
    old.mkdir()
    _exits_holding(old)
    for s in samples:
        del s["tree_device_pids"]
    tg.write_run(old, samples=samples, start_ns=tg.BASE_TS)
    o = report_json(old, fake_sym)["observed"]
    assert o["max"]["untraced_max_bytes"] == GiB + 300 * MiB


def test_damaged_per_process_figures_are_skipped(tmp_path, fake_sym):
    # a samples file edited or damaged by hand: figures that are not numbers are passed over
    ms = tg.MS
    _exits_holding(tmp_path)
    s = dict(tg.sample(tg.BASE_TS + 450 * ms, tree={0: GiB}, used=GiB), nvml_t="soon")
    s["tree_device_pids"] = {"0": {"1": "many", "2": 5 * MiB}, "1": "x"}
    tg.write_run(tmp_path, samples=[s], start_ns=tg.BASE_TS)
    o = report_json(tmp_path, fake_sym)["observed"]
    assert o["max"]["tree_device_bytes"] == 5 * MiB, o["max"]
