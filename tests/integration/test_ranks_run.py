"""A run of many ranks (docs/ranks.md): 2 hosts x 4 ranks on the simulated driver. A launcher
(a shell script, as torchrun or srun would) starts each host's four ranks with the rank
variables set and the host named through CUDATRACE_HOST; each host is traced by its own
`cudatrace run` into its own directory; one rank allocates more. Then one merged report (text,
--json, --by rank, --html), an export and a diff of two such runs."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest

from cudatrace.analyze.read.trace import read_dir
from support import children
from support.paths import REPO

MiB = 1 << 20

LAUNCHER = """#!/bin/sh
# launcher HOST FIRST BIG N: four ranks FIRST..FIRST+3 of an 8-rank job on HOST; rank BIG
# allocates N buffers of 4 MiB, the others 4 (never freed; each rank holds them until it exits,
# 2.5 s later, so that all eight overlap on a loaded machine: a process's memory ends with it)
host=$1; first=$2; big=$3; nbig=$4
for l in 0 1 2 3; do
  r=$((first + l)); n=4
  [ "$r" = "$big" ] && n=$nbig
  CUDATRACE_HOST=$host RANK=$r LOCAL_RANK=$l WORLD_SIZE=8 CUDA_VISIBLE_DEVICES=$l \\
    "$HOLD" --exit-after-ms 2500 $n 4m > /dev/null &
done
wait
"""


def _launch(ct, sim, base, big, nbig):
    """One 2-host run: base/hostA, base/hostB (the hosts run at once, as a job's hosts do)."""
    script = base.parent / "launcher.sh"
    if not script.exists():
        script.write_text(LAUNCHER)
        script.chmod(0o755)
    env = ct.env()
    env["HOLD"] = str(sim.progs["hold"])
    procs = []
    for host, first in (("hostA", 0), ("hostB", 4)):
        out = base / host
        procs.append(
            children.popen(
                [
                    *(sys.executable, "-m", "cudatrace", "run", "-q", "-o", str(out), "--"),
                    *(str(script), host, str(first), str(big), str(nbig)),
                ],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    for p in procs:
        _, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
    return base


@pytest.fixture(scope="module")
def runs(sim, tmp_path_factory):
    from conftest import CT

    base = tmp_path_factory.mktemp("ranks")
    ct = CT(sim, base)
    one = _launch(ct, sim, base / "one", big=5, nbig=10)  # rank 5: 40 MiB, others 16 MiB
    two = _launch(ct, sim, base / "two", big=2, nbig=6)  # rank 2: 24 MiB
    return ct, one, two


def test_the_shim_records_rank_and_host(runs):
    _, one, _ = runs
    td = read_dir(one / "hostB")
    ranks = sorted(
        (int(t.info["env.RANK"]), t.info["env.LOCAL_RANK"], t.info["env.CUDATRACE_HOST"])
        for t in td.traces
        if "env.RANK" in t.info
    )
    assert ranks == [(4, "0", "hostB"), (5, "1", "hostB"), (6, "2", "hostB"), (7, "3", "hostB")]
    assert all(t.info.get("env.WORLD_SIZE") == "8" for t in td.traces if "env.RANK" in t.info)


def test_merged_report_per_rank_peaks_and_the_outlier(runs):
    ct, one, _ = runs
    r = ct.cli("report", one / "hostA", one / "hostB", env=dict(ct.env(), COLUMNS="200"))
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "Ranks: 8 ranks on 2 hosts (from RANK)" in out
    assert "Peak: 40.0 MiB" in out and "the most one device held" in out
    assert "rank 5 stands out: peak 40.0 MiB, the ranks' median 16.0 MiB" in out
    assert "8 ranks: 7 x 16.0 MiB, rank 5: 40.0 MiB (stands out; median 16.0 MiB)" in out
    for host in ("hostA", "hostB"):
        for dev in range(4):
            assert "device %s:%d peak" % (host, dev) in out

    j = ct.cli("report", one / "hostA", one / "hostB", "--json")
    assert j.returncode == 0, j.stderr
    d = json.loads(j.stdout)
    assert d["schema"] == "cudatrace.report/1"
    rk = d["ranks"]
    assert [x["label"] for x in rk["ranks"]] == ["rank %d" % i for i in range(8)]
    assert {x["label"]: x["peak_bytes"] for x in rk["ranks"]} == {
        "rank %d" % i: (40 if i == 5 else 16) * MiB for i in range(8)
    }
    assert [(x["host"], x["local_rank"], x["devices"]) for x in rk["ranks"]][5] == (
        "hostB",
        1,
        ["1"],
    )
    assert [o["label"] for o in rk["outliers"]] == ["rank 5"]
    assert [x["label"] for x in rk["ranks"] if x["outlier"]] == ["rank 5"]
    # honest: the run's peak is one device's; no device figure exceeds it
    assert d["peak_bytes"] == 40 * MiB == rk["peak"]["peak_bytes"]
    assert len(rk["devices"]) == 8 and max(x["peak_bytes"] for x in rk["devices"]) == 40 * MiB
    assert len(d["devices"]) == 8 and all("host" in x for x in d["devices"])
    assert d["paths"] == [str(one / "hostA"), str(one / "hostB")]


def test_by_rank_html_and_export(runs, tmp_path):
    ct, one, _ = runs
    j = ct.cli("report", one, "--by", "rank", "--at", "end", "--json")  # the folder of hosts
    assert j.returncode == 0, j.stderr
    sites = json.loads(j.stdout)["sites"]
    assert [(s["label"], s["bytes"]) for s in sites][0] == ("rank 5", 40 * MiB)
    assert sorted(s["label"] for s in sites) == ["rank %d" % i for i in range(8)]
    # each rank's physical GPU, as the ranks table names it (not the ordinal 0 every rank sees)
    labels = {s["label"]: s["device_labels"] for s in sites}
    assert labels["rank 5"] == ["1"] and labels["rank 4"] == ["0"], labels
    text = ct.cli("report", one, "--by", "rank", "--at", "end").stdout
    row = text.splitlines()[
        [i for i, ln in enumerate(text.splitlines()) if "#1 rank 5" in ln][0] + 1
    ]
    assert row.rstrip().endswith("device 1"), text

    page = tmp_path / "ranks.html"
    svg = tmp_path / "ranks.svg"
    r = ct.cli("report", one / "hostA", one / "hostB", "--html", page, "--svg", svg)
    assert r.returncode == 0, r.stderr
    assert "all devices together: peak" in svg.read_text()  # a sum, said to be one
    html = page.read_text()
    assert html.count('class="rank-line"') == 8  # a timeline per rank
    assert 'data-rank="rank 5"' in html and "stands out" in html

    folded = tmp_path / "run.folded"
    r = ct.cli("export", one / "hostA", one / "hostB", "--format", "folded", "-o", folded)
    assert r.returncode == 0, r.stderr
    lines = folded.read_text().splitlines()
    assert {ln.split(":")[0] for ln in lines} == {"rank %d" % i for i in range(8)}
    assert sum(int(ln.rsplit(" ", 1)[1]) for ln in lines) == (7 * 16 + 40) * MiB


def test_diff_of_two_merged_runs(runs):
    ct, one, two = runs
    r = ct.cli("diff", one, two, "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["a"]["paths"] == [str(one / "hostA"), str(one / "hostB")]
    assert d["totals"]["peak_bytes"]["a"] == 40 * MiB  # one device's, on each side
    assert d["totals"]["peak_bytes"]["b"] == 24 * MiB
    delta = {x["label"]: x["delta_bytes"] for x in d["ranks"]}
    assert delta == {"rank %d" % i: {2: 8 * MiB, 5: -24 * MiB}.get(i, 0) for i in range(8)}
    site = d["sites"][0]
    assert site["end"]["delta_bytes"] == -16 * MiB and site["status"] == "shrunk"
    page = one.parent / "diff.html"
    t = ct.cli("diff", one, two, "--html", page, env=dict(ct.env(), COLUMNS="200"))
    assert t.returncode == 0, t.stderr
    assert "Ranks (each one's own peak):" in t.stdout
    assert os.path.basename(str(one)) in t.stdout
    html = page.read_text()
    assert "Ranks: each one's own peak in A and B" in html
    assert html.count("<tr class=") == 8 and "+8.00 MiB" in html and "-24.0 MiB" in html


def test_html_page_in_the_browser_stacks_by_rank(runs, tmp_path):
    """The page loads without an error in Chromium, shows the ranks card, and its timeline
    stacks by rank."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.fail("the browser tests need Playwright: pip install 'cudatrace[test]'")
    spec = importlib.util.spec_from_file_location(
        "screenshot_report", REPO / "tools" / "screenshot_report.py"
    )
    sr = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sr)
    try:
        sr.chromium_path()
    except SystemExit as e:
        pytest.fail(f"{e} (apt-get install chromium)")
    ct, one, _ = runs
    page_file = tmp_path / "ranks.html"
    r = ct.cli("report", one, "--html", page_file)
    assert r.returncode == 0, r.stderr
    p = sync_playwright().start()
    b = sr.launch(p)
    try:
        pg = sr.Page(b, page_file)
        page = pg.page
        assert page.locator("#ranks-card svg.rank-line").count() == 8
        assert "rank 5 stands out" in page.locator("#ranks-card").inner_text()
        page.locator("#timeline-controls button[data-value='rank']").click()
        legend = page.locator("#legend").inner_text()
        assert "rank 5" in legend and "rank 0" in legend, legend
        assert not pg.errors, pg.errors
        assert not pg.requests, pg.requests
        pg.close()
    finally:
        b.close()
        p.stop()


def test_html_peak_figures_each_say_their_scope(runs, tmp_path):
    """One peak figure per scope, labelled: the most one device held (the report's peak), and
    all devices together (the timeline's marker says the same figure, in the same words)."""
    from playwright.sync_api import sync_playwright

    spec = importlib.util.spec_from_file_location(
        "screenshot_report", REPO / "tools" / "screenshot_report.py"
    )
    sr = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sr)
    ct, one, _ = runs
    page_file = tmp_path / "ranks.html"
    assert ct.cli("report", one, "--html", page_file).returncode == 0
    rep = json.loads(ct.cli("report", one, "--json").stdout)
    p = sync_playwright().start()
    b = sr.launch(p)
    try:
        pg = sr.Page(b, page_file)
        page = pg.page
        keys = page.locator(".stat .k").evaluate_all("es => es.map(e => e.textContent)")
        values = page.locator(".stat .v").evaluate_all("es => es.map(e => e.textContent)")
        cards = dict(zip(keys, values))
        assert "peak" not in cards, cards  # no figure without its scope
        assert cards["peak of one device"] == _size(rep["peak_bytes"]), cards
        together = cards["peak, all devices together"]

        def timeline_texts() -> list[str]:
            return page.locator("#timeline text").evaluate_all("es => es.map(e => e.textContent)")

        # the peak chosen at first: its moment says whose peak it is
        assert any(
            t.endswith(f"(the peak, all devices together): {together}") for t in timeline_texts()
        ), [t for t in timeline_texts() if "peak" in t]
        page.evaluate("window.cudatrace.pick(0)")  # another moment: the peak's marker shows
        markers = [t for t in timeline_texts() if "peak" in t]
        assert len(markers) == 1, " | ".join(timeline_texts())
        assert markers[0].startswith(f"all devices together: peak {together} at "), markers
        assert not pg.errors, pg.errors
        pg.close()
    finally:
        b.close()
        p.stop()


def _size(n: int) -> str:
    from cudatrace.units import format_bytes

    return format_bytes(n)
