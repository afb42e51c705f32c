"""`report --html` / `diff --html` in a real browser, `--watch`, and the progress bar.

The pages are rendered from kvpool traces on the simulated driver (as tests/integration/test_kvpool.py
builds them) and loaded in headless Chromium (Debian's package, driven by Playwright from PyPI;
nothing is downloaded). Every request the page makes is routed: anything but file: and data:
URLs fails the test. Without Chromium or Playwright the browser tests FAIL, with what to
install.
Screenshots go to $CUDATRACE_ARTIFACTS when set, else to the test's tmp folder.
"""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from support import children
from support.cli import cudatrace as cli
from support.kvpool import (  # noqa: F401  (kvpool: a fixture)
    LAYERS,
    PAGE,
    WEIGHTS,
    WORKSPACE,
    GiB,
    kvpool,
    thor_env,
    trace,
)
from support.paths import REPO  # noqa: E402


def _tool(name: str):
    """A module of tools/ loaded from its file (tests make no sys.path edits)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, REPO / "tools" / (name + ".py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


# ---- the traces and pages -------------------------------------------------------------------


@pytest.fixture(scope="module")
def pages(sim, kvpool, tmp_path_factory):
    """kvpool traced three ways (the demo's oversized pool, --num-blocks 64, and the oversized
    pool under a 12 GiB budget) and their HTML pages."""
    base = tmp_path_factory.mktemp("html")
    env = thor_env(sim, base)
    runs = {
        "big": trace(env, base / "big", kvpool, "--kv-cache-memory", "1GiB"),
        "small": trace(env, base / "small", kvpool, "--num-blocks", "64"),
        "budget": trace(
            env, base / "budget", kvpool, "--kv-cache-memory", "1GiB", opts=("--budget", "12GiB")
        ),
    }
    for name in ("big", "small"):
        assert runs[name].returncode == 0, runs[name].stderr
    out = {"env": env, "dirs": {k: r.out for k, r in runs.items()}}
    for name in ("big", "budget"):
        p = base / (f"{name}.html")
        r = cli(env, "report", runs[name].out, "--html", p)
        assert r.returncode == 0, r.stderr
        assert f"HTML report written to {p}" in r.stdout
        out[name] = p
    for name, (a, b) in {"diff": ("big", "small"), "diff_rev": ("small", "big")}.items():
        p = base / (f"{name}.html")
        r = cli(env, "diff", runs[a].out, runs[b].out, "--html", p)
        assert r.returncode == 0, r.stderr
        out[name] = p
    return out


def embedded(path: Path) -> dict:
    text = path.read_text()
    m = re.search(r'<script type="application/json" id="ct-data">(.*?)</script>', text, re.S)
    assert m, "no embedded data"
    return json.loads(m.group(1))


# ---- the file itself ------------------------------------------------------------------------


def test_page_is_self_contained(pages):
    for name in ("big", "diff"):
        text = pages[name].read_text()
        assert "<script src" not in text and "<link" not in text, name
        assert "@import" not in text and not re.search(r"url\((?!#)", text), name
        assert not re.search(r"""(src|href)\s*=\s*["']?https?:""", text), name
        assert "default-src 'none'" in text  # the page may load nothing at all
        assert text.count("</script>") == 2  # the data cannot close its script early


def test_numbers_agree_with_report_json(pages):
    r = cli(pages["env"], "report", pages["dirs"]["big"], "--json")
    assert r.returncode == 0, r.stderr
    rep = json.loads(r.stdout)
    data = embedded(pages["big"])
    peak = [m for m in data["run"]["moments"] if m["kind"] == "peak"]
    assert len(peak) == 1
    assert (
        peak[0]["bytes"]
        == rep["total_live_bytes"]
        == rep["peak_bytes"]
        == WEIGHTS + WORKSPACE + LAYERS * GiB
    )
    assert sum(peak[0]["rows"][3::5]) == peak[0]["bytes"]
    assert data["report"]["peak_bytes"] == rep["peak_bytes"]
    assert data["run"]["moments"][data["initial"]]["kind"] == "peak"
    # the KV site as report names it, with its bytes at the peak
    sites = {s[0]: s for s in data["sites"]}
    kv = next(s for s in sites if s.startswith("allocate_layer_kv"))
    assert kv == rep["sites"][0]["label"]
    kv_id = data["sites"].index(sites[kv])
    rows = peak[0]["rows"]
    kv_bytes = sum(
        rows[i + 3] for i in range(0, len(rows), 5) if data["stacks"][rows[i]][0] == kv_id
    )
    assert kv_bytes == rep["sites"][0]["bytes"] == LAYERS * GiB
    # every change of this short run is a moment, the end included
    run = data["run"]
    assert len(run["moments"]) >= run["changes"] and run["moments"][-1]["kind"] == "end"
    assert "every change" in data["aggregation"]


def test_diff_numbers_agree_with_diff_json(pages):
    r = cli(pages["env"], "diff", pages["dirs"]["big"], pages["dirs"]["small"], "--json")
    doc = json.loads(r.stdout)
    data = embedded(pages["diff"])
    assert data["diff"]["totals"] == doc["totals"]
    for side, key in ((0, "a"), (1, "b")):
        peak = next(m for m in data["runs"][side]["moments"] if m["kind"] == "peak")
        assert peak["bytes"] == doc[key]["peak_bytes"]


def test_big_trace_is_aggregated(tmp_path):
    """Thousands of changes and hundreds of stacks: a bounded number of moments, the peak and
    the end among them, the peak's total exact, each stack stored once."""
    from cudatrace.analyze.documents.analysis import Analysis
    from cudatrace.analyze.documents.report import build_report
    from cudatrace.present.html import MAX_MOMENTS, render_report_html
    from support import tracegen as tg

    d = tmp_path / "big"
    d.mkdir()
    w = tg.TraceWriter(d / "1000.0.ctrace", pid=1000)
    w.module("/usr/bin/app", 0x400000, 0x500000)
    leaves = [w.stack([0x401000 + 16 * i, 0x402000 + 16 * (i % 7)]) for i in range(300)]
    ts, live = tg.BASE_TS, []
    for i in range(6000):
        ts += tg.MS
        addr = 0x7F0000000000 + i * 0x100000
        w.alloc(ts, (1 + i % 13) << 20, addr, stack=leaves[i % 300])
        live.append(addr)
        if i % 3 == 2:
            ts += tg.MS
            w.free(ts, live.pop(0))
    w.close(end_ts=ts + tg.MS)
    tg.write_run(d, argv=["app"])
    a = Analysis(d, symbolize=False)
    r = build_report(a)
    text = render_report_html(a, r)
    data = json.loads(re.search(r'id="ct-data">(.*?)</script>', text, re.S).group(1))
    moments = data["run"]["moments"]
    assert len(moments) <= MAX_MOMENTS
    assert data["run"]["changes"] > 5 * MAX_MOMENTS
    kinds = [m["kind"] for m in moments]
    assert "peak" in kinds and kinds[-1] == "end"
    assert next(m for m in moments if m["kind"] == "peak")["bytes"] == r["peak_bytes"]
    assert [m["t"] for m in moments] == sorted(m["t"] for m in moments)
    assert len(data["stacks"]) == 300 and len(data["sites"]) == 300
    assert "equal slices" in data["aggregation"]
    assert "merged" not in data["aggregation"]  # 300 stacks: none merged
    assert len(text) < 2_000_000, len(text)


def test_many_stacks_are_merged_past_the_limit(tmp_path):
    """More live stacks than a moment keeps: the smallest become one row per process and
    device, the totals stay exact, and the page says so."""
    from cudatrace.analyze.documents.analysis import Analysis
    from cudatrace.analyze.documents.report import build_report
    from cudatrace.present.html import MAX_ROWS, OTHER, render_report_html
    from support import tracegen as tg

    d = tmp_path / "wide"
    d.mkdir()
    w = tg.TraceWriter(d / "1000.0.ctrace", pid=1000)
    w.module("/usr/bin/app", 0x400000, 0x500000)
    n = MAX_ROWS + 50
    for i in range(n):
        w.alloc(
            tg.BASE_TS + i * tg.MS,
            (i + 1) << 20,
            0x7F0000000000 + i * (1 << 30),
            stack=w.stack([0x401000 + 16 * i]),
        )
    w.close(end_ts=tg.BASE_TS + (n + 1) * tg.MS)
    tg.write_run(d, argv=["app"])
    a = Analysis(d, symbolize=False)
    r = build_report(a)
    data = json.loads(
        re.search(r'id="ct-data">(.*?)</script>', render_report_html(a, r), re.S).group(1)
    )
    peak = next(m for m in data["run"]["moments"] if m["kind"] == "peak")
    rows = peak["rows"]
    assert len(rows) // 5 == MAX_ROWS + 1
    other = [
        rows[i : i + 5]
        for i in range(0, len(rows), 5)
        if data["frames"][data["stacks"][rows[i]][1][0]][0] == OTHER
    ]
    assert (
        len(other) == 1
        and other[0][4] == 50
        and other[0][3] == sum((i + 1) << 20 for i in range(50))
    )
    assert sum(rows[3::5]) == peak["bytes"] == r["peak_bytes"]
    assert "merged into one" in data["aggregation"]


# ---- in the browser -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def browser():
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.fail("the browser tests need Playwright: pip install 'cudatrace[test]'")
    _sr = _tool("screenshot_report")
    chromium_path, launch = _sr.chromium_path, _sr.launch
    try:
        chromium_path()
    except SystemExit as e:
        pytest.fail(f"{e} (apt-get install chromium)")
    p = sync_playwright().start()
    b = launch(p)
    yield b
    b.close()
    p.stop()


@pytest.fixture
def open_page(browser):
    Page = _tool("screenshot_report").Page
    opened = []

    def go(path, width=1280):
        pg = Page(browser, path, width)
        opened.append(pg)
        return pg

    yield go
    for pg in opened:
        try:
            assert not pg.errors, pg.errors
            assert not pg.requests, pg.requests
        finally:
            pg.close()


def artifacts(tmp_path) -> Path:
    d = os.environ.get("CUDATRACE_ARTIFACTS")
    p = Path(d) if d else tmp_path
    p.mkdir(parents=True, exist_ok=True)
    return p


def flame_state(page):
    t = page.locator("#flame-title")
    return {
        "title": t.inner_text(),
        "bytes": int(t.get_attribute("data-bytes")),
        "moment": int(t.get_attribute("data-moment")),
        "frames": page.locator("#flame .fr").all_inner_texts(),
    }


def test_report_loads_and_shows_kv_site(pages, open_page, tmp_path):
    pg = open_page(pages["big"])
    page = pg.page
    st = flame_state(page)
    assert st["bytes"] == WEIGHTS + WORKSPACE + LAYERS * GiB
    assert "(the peak)" in st["title"] and "29.6 GiB" in st["title"]
    kv = page.locator("#flame .fr[data-name^='allocate_layer_kv']")
    assert kv.count() == 1
    kv.hover()
    tip = page.locator("#tip").inner_text()
    assert "28.0 GiB in 28 allocations" in tip, tip
    # the KV frame spans its share of the width (28 of 29.6 GiB)
    whole = page.locator("#flame .fr.root").bounding_box()["width"]
    share = kv.bounding_box()["width"] / whole
    assert abs(share - LAYERS * GiB / st["bytes"]) < 0.01, share
    # the site table names it first, with its bytes
    first = page.locator("#sites tbody tr.row").first.inner_text()
    assert "allocate_layer_kv" in first and "28.0 GiB" in first, first
    # the timeline: the peak marked, the traced line drawn
    assert page.locator("#timeline circle.peak").count() == 1
    assert page.locator("#timeline path.line-traced").count() == 1
    shot = artifacts(tmp_path) / "report.png"
    page.screenshot(path=str(shot), full_page=True)
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 20000


def test_clicking_the_timeline_changes_the_flame_graph(pages, open_page):
    pg = open_page(pages["big"])
    page = pg.page
    before = flame_state(page)
    data = embedded(pages["big"])
    # an early moment: the weights are loaded, the KV cache not yet
    early = next(i for i, m in enumerate(data["run"]["moments"]) if 0 < m["bytes"] < GiB * 2)
    pg.click_moment(early)
    after = flame_state(page)
    assert after["moment"] == early != before["moment"]
    assert after["bytes"] == data["run"]["moments"][early]["bytes"] < before["bytes"]
    assert page.locator("#flame .fr[data-name^='allocate_layer_kv']").count() == 0
    assert after["frames"] != before["frames"]
    assert page.locator("#timeline rect.mtick.sel").get_attribute("data-i") == str(early)
    # the keyboard steps back to the peak's neighbours; the peak button returns to it
    page.locator("#flame-controls button[data-value='peak']").click()
    assert flame_state(page)["bytes"] == before["bytes"]


def test_search_highlights_frames(pages, open_page):
    pg = open_page(pages["big"])
    page = pg.page
    assert page.locator("#flame .fr.match").count() == 0
    page.fill("#search", "load_weights")
    m = page.locator("#flame .fr.match")
    assert m.count() == 1 and m.first.get_attribute("data-name").startswith("load_weights")
    assert "1 frame match" in page.locator("#flame-status").inner_text()
    page.fill("#search", "/^(main|allocate_kv_cache) /")
    names = page.locator("#flame .fr").evaluate_all("es => es.map(e => e.dataset.name)")
    want = [n for n in names if re.match(r"^(main|allocate_kv_cache) ", n)]
    assert len(want) >= 2  # main (each call line) and allocate_kv_cache
    assert page.locator("#flame .fr.match").count() == len(want)
    page.fill("#search", "")
    assert page.locator("#flame .fr.match").count() == 0


def test_zoom_and_sort(pages, open_page):
    pg = open_page(pages["big"])
    page = pg.page
    page.locator("#flame .fr[data-name^='allocate_kv_cache']").click()
    kv = page.locator("#flame .fr[data-name^='allocate_layer_kv']").bounding_box()["width"]
    whole = page.locator("#flame .fr.root").bounding_box()["width"]
    assert kv > 0.98 * whole  # zoomed: the KV frame fills the width
    assert "zoomed in on allocate_kv_cache" in page.locator("#flame-status").inner_text()
    page.locator("#flame .fr.root").click()
    assert page.locator("#flame-status").inner_text() == ""
    # sort the site table by name, then open a row's stack
    page.locator("#sites th", has_text="call site").click()
    labels = page.locator("#sites tbody tr.row td.label").all_inner_texts()
    assert labels == sorted(labels, key=str.lower)
    page.locator("#sites tbody tr.row", has_text="allocate_layer_kv").click()
    stack = page.locator("#sites tr.detail").inner_text()
    assert "allocate_kv_cache" in stack and "main" in stack


def test_flame_and_icicle_views(pages, open_page):
    pg = open_page(pages["big"])
    page = pg.page

    def top(sel: str) -> float:
        return page.locator(sel).bounding_box()["y"]

    root, kv = "#flame .fr.root", "#flame .fr[data-name^='allocate_layer_kv']"
    assert top(root) < top(kv)  # an icicle: the root on top, the allocating frames below
    assert "callers on top" in page.locator("#flame-sub").inner_text().lower()
    page.locator("#flame-controls button[data-value='flame']").click()
    assert top(root) > top(kv)  # a flame graph: the root at the bottom
    assert "callers at the bottom" in page.locator("#flame-sub").inner_text().lower()
    page.locator("#flame-controls button[data-value='icicle']").click()
    assert top(root) < top(kv)


def test_allocator_layers_open_below_a_site(pages, open_page):
    for name in ("big", "diff"):
        pg = open_page(pages[name])
        page = pg.page
        assert page.locator("#flame .fr.layer").count() == 0  # folded: the sites end the stacks
        kv = page.locator("#flame .fr[data-name^='allocate_layer_kv']")
        depth, box = int(kv.get_attribute("data-depth")), kv.bounding_box()
        page.check("#layers")
        layers = page.locator("#flame .fr.layer").evaluate_all(
            "es => es.map(e => [e.dataset.name.split(' ')[0], +e.dataset.depth,"
            " e.getBoundingClientRect().x + window.scrollX])"
        )
        # under the KV site, in its span: the three layers kvpool allocates through, outermost
        # first
        below = [
            n
            for n, d, x in sorted(layers, key=lambda x: x[1])
            if d > depth and box["x"] - 1 <= x < box["x"] + box["width"] - 1
        ]
        assert below == ["tensor_make", "backend_acquire", "device_carve"], (name, layers, box)
        page.uncheck("#layers")
        assert page.locator("#flame .fr.layer").count() == 0


def test_frames_are_keyed_alike_in_report_and_diff(pages, open_page):
    """A function is one frame of the flame graph wherever it called from (main calls the
    weights, the workspace and the KV cache from three lines), in a report as in a diff."""
    names = {}
    for name in ("big", "diff"):
        pg = open_page(pages[name])
        names[name] = pg.page.locator("#flame .fr").evaluate_all(
            "es => es.map(e => e.dataset.name)"
        )
        assert sum(n.startswith("main ") for n in names[name]) == 1, names[name]
    assert set(names["big"]) - {"all"} <= set(names["diff"]), names


def test_budget_page_marks_the_denial(pages, open_page):
    pg = open_page(pages["budget"])
    page = pg.page
    assert page.locator("#timeline path.marker.deny").count() == 1
    assert page.locator("#timeline line.budget").count() == 1
    assert "budget 12.0 GiB" in page.locator("#timeline").inner_text()
    assert "0 / 1" in page.locator(".stat.alert").first.inner_text()
    # the denied site is named, on the page and beside its marker (it was a small triangle)
    stat = page.locator(".stat.alert", has_text="denied by the budget at").inner_text()
    assert "allocate_layer_kv (kvpool.c:318)" in stat, stat
    assert "1 x 1.00 GiB requested via tensor_make" in stat and "budget 12.0 GiB" in stat, stat
    label = page.locator("#timeline text.deny-site").text_content()
    assert label == "denied: allocate_layer_kv (kvpool.c:318)", label


def _same_work(d: Path, before_ms: int) -> None:
    """A run that queries the driver at its start and makes its first allocation before_ms
    later; from there, the same allocations at the same distances."""
    from support import tracegen as tg

    d.mkdir()
    w = tg.TraceWriter(d / "5.0.ctrace", pid=5)
    t = tg.BASE_TS
    w.meminfo(t, free=15 << 30, total=16 << 30)
    t += before_ms * tg.MS
    for i, size in enumerate((GiB, 2 * GiB, GiB)):
        w.alloc(t + i * 20 * tg.MS, size, 0x1000 * (i + 1))
    w.free(t + 80 * tg.MS, 0x2000)
    w.close(end_ts=t + 100 * tg.MS)
    tg.write_run(d, start_ns=tg.BASE_TS)


def test_diff_curves_start_together_at_the_first_allocation(pages, open_page, tmp_path):
    # A spends 500 ms on the driver before its first allocation, B 10 ms: aligned on their first
    # events the same curve was drawn twice, 490 ms apart, and never overlaid
    _same_work(tmp_path / "a", 500)
    _same_work(tmp_path / "b", 10)
    page_path = tmp_path / "diff.html"
    r = cli(pages["env"], "diff", tmp_path / "a", tmp_path / "b", "--html", page_path)
    assert r.returncode == 0, r.stderr
    runs = embedded(page_path)["runs"]
    assert [x["first_alloc"] for x in runs] == [0.5, 0.01], [x["first_alloc"] for x in runs]
    page = open_page(page_path).page
    a = page.locator("#timeline path.line-a").get_attribute("d")
    b = page.locator("#timeline path.line-b").get_attribute("d")
    # one curve: the same steps at the same places (A's line begins earlier, at 0 bytes)
    assert a and a.split("H", 1)[1] == b.split("H", 1)[1], (a, b)
    assert "first allocation" in page.locator("#timeline").text_content()


def test_diff_loads_and_shows_grown_and_shrunk(pages, open_page, tmp_path):
    pg = open_page(pages["diff"])
    page = pg.page
    t = page.locator("#flame-title")
    assert int(t.get_attribute("data-a")) == WEIGHTS + WORKSPACE + LAYERS * GiB
    assert int(t.get_attribute("data-b")) == WEIGHTS + WORKSPACE + LAYERS * 64 * PAGE
    row = page.locator("#sites tbody tr.row", has_text="allocate_layer_kv")
    assert row.locator(".badge.shrunk").count() == 1
    kv = page.locator("#flame .fr[data-name^='allocate_layer_kv']")
    rgb = [
        int(x)
        for x in re.findall(r"\d+", kv.evaluate("e => getComputedStyle(e).backgroundColor"))[:3]
    ]
    assert rgb[2] > rgb[0] + 60, rgb  # blue: shrunk
    shot = artifacts(tmp_path) / "diff.png"
    page.screenshot(path=str(shot), full_page=True)
    assert shot.stat().st_size > 20000

    pg2 = open_page(pages["diff_rev"])
    page2 = pg2.page
    row = page2.locator("#sites tbody tr.row", has_text="allocate_layer_kv")
    assert row.locator(".badge.grown").count() == 1
    kv = page2.locator("#flame .fr[data-name^='allocate_layer_kv']")
    rgb = [
        int(x)
        for x in re.findall(r"\d+", kv.evaluate("e => getComputedStyle(e).backgroundColor"))[:3]
    ]
    assert rgb[0] > rgb[2] + 60, rgb  # red: grown
    page2.fill("#search", "load_weights")
    assert page2.locator("#flame .fr.match").count() == 1


# ---- --watch --------------------------------------------------------------------------------


def test_watch_renders_until_the_run_ends(sim, kvpool, tmp_path):
    """`report --watch` on a run still being traced: renders while it holds its memory, then
    one last render once run.json says the run ended, and exits 0."""
    env = thor_env(sim, tmp_path)
    out = tmp_path / "live"
    run = children.popen(
        [
            sys.executable,
            "-m",
            "cudatrace",
            "run",
            "-q",
            "-o",
            str(out),
            "--",
            str(kvpool),
            "--num-blocks",
            "64",
            "--hold",
            "3",
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 30
        while not list(out.glob("*.ctrace")) and time.monotonic() < deadline:
            time.sleep(0.05)
        w = cli(env, "report", out, "--watch", timeout=90)
    finally:
        run.wait(timeout=60)
    assert w.returncode == 0, w.stderr
    heads = [l for l in w.stdout.splitlines() if l.startswith("==== cudatrace report --watch")]
    assert len(heads) >= 2, w.stdout
    assert "still going" in heads[0]
    assert heads[-1].endswith("the run ended with exit status 0: last render"), heads[-1]
    assert sum("last render" in h for h in heads) == 1
    assert "allocate_layer_kv" in w.stdout


def test_watch_options(pages):
    env = pages["env"]
    r = cli(env, "report", pages["dirs"]["big"], "--watch", "--json")
    assert r.returncode == 2 and "--watch shows the text report" in r.stderr
    r = cli(env, "status", "--watch", "--json")
    assert r.returncode == 2 and "--watch shows text" in r.stderr
    r = cli(env, "report", pages["dirs"]["big"], "--watch")  # ended: one render
    assert r.returncode == 0 and r.stdout.count("==== cudatrace report --watch") == 1


def test_watch_loop_stops_on_ctrl_c():
    from cudatrace.present.watch import loop

    out = io.StringIO()
    n = []

    def render():
        n.append(1)
        if len(n) == 3:
            raise KeyboardInterrupt
        return "frame %d\n" % len(n)

    assert loop(render, lambda done, why: "head", interval=0, out=out) == 2  # renders shown
    assert out.getvalue().count("==== head") == 2


# ---- progress -------------------------------------------------------------------------------


class _Tty(io.StringIO):
    def isatty(self):
        return True


def test_progress_bar_is_clicks_on_a_terminal_only(monkeypatch):
    from cudatrace import progress

    s = _Tty()
    b = progress.Bar("symbolizing libfoo.so", 4, stream=s)
    b.delay = 0
    b.step()
    b.total = 8  # the symbolizer grows its total as it goes
    for _ in range(7):
        b.step()
    b.close()
    text = s.getvalue()
    assert "symbolizing libfoo.so" in text and "8/8" in text and "100%" in text, text
    monkeypatch.setattr(progress, "stderr_is_tty", lambda: False)
    assert isinstance(progress.bar("x", 3), progress.NoBar)
    monkeypatch.setattr(progress, "stderr_is_tty", lambda: True)
    assert isinstance(progress.bar("x", 3), progress.Bar)
    quiet = _Tty()
    b = progress.Bar("fast", 3, stream=quiet)  # work done within the delay draws nothing
    b.step(3)
    b.close()
    assert quiet.getvalue() == ""


def test_symbolizer_takes_the_progress_factory(pages, tmp_path, monkeypatch):
    """Analysis(progress=True) hands the symbolizer cudatrace.progress.bar."""
    from cudatrace import progress
    from cudatrace.analyze.documents.analysis import Analysis

    made = []

    def factory(label, total):
        made.append(label)
        return progress.NoBar(label, total)

    monkeypatch.setattr(progress, "bar", factory)
    monkeypatch.setenv("CUDATRACE_CACHE", str(tmp_path / "fresh-cache"))
    a = Analysis(pages["dirs"]["big"], progress=True)
    a.sites(a.model.groups_at_peak())
    assert any(l.startswith("symbolizing ") and "kvpool" in l for l in made), made
