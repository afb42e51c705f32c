"""`cudatrace sweep` on the simulated driver, and the law fitting (cudatrace/analyze/documents/laws.py).

kvpool (examples/kv-pool) allocates one KV pool per layer of num_blocks x 64 KiB: a sweep of
--num-blocks must give allocate_layer_kv the law 28 x 64 KiB = 1.75 MiB per block, intercept 0,
the weights and the workspace flat; a sweep of --kv-cache-memory with --expect 1 flags the pool
(28x the flag: the defect) and not the weights. Servers (tests/progs/hold, and a Python program
that allocates through the simulated libcuda and answers HTTP) are stopped by --stop-after and
--until-url.
"""

from __future__ import annotations

import json
import math
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
from fractions import Fraction
from pathlib import Path

import pytest
from click.testing import CliRunner

from cudatrace.analyze.documents import laws
from support import children
from support.kvpool import (  # noqa: F401  (kvpool: a fixture)
    LAYERS,
    PAGE,
    WEIGHTS,
    WORKSPACE,
    GiB,
    MiB,
    kvpool,
    thor_env,
)
from support.paths import REPO  # noqa: E402

# ---- the law math ----------------------------------------------------------------------------


def test_affine_exact_is_exact():
    law = laws.classify([64, 128, 256], [LAYERS * PAGE * b for b in (64, 128, 256)])
    assert law.kind == "affine" and law.tested and law.detail == "exact"
    assert law.affine.slope == LAYERS * PAGE and law.affine.intercept == 0
    assert law.affine.r2 == 1.0 and law.affine.stderr == 0.0
    j = law.affine.as_json()
    assert j["slope"] == 1835008 and isinstance(j["slope"], int) and j["intercept"] == 0
    y, se = law.affine.predict(512)
    assert y == LAYERS * PAGE * 512 and se == 0.0


def test_affine_with_intercept_and_fraction_slope():
    law = laws.classify([1, 2, 3, 4], [10 + Fraction(1, 3) * x for x in (1, 2, 3, 4)])
    assert law.kind == "affine" and law.affine.exact
    assert math.isclose(law.affine.slope, 1 / 3) and math.isclose(law.affine.intercept, 10)


def test_affine_noisy_gives_r2_and_prediction_error():
    xs = [1, 2, 3, 4, 5]
    ys = [100 * MiB * x + e for x, e in zip(xs, (3 * MiB, -2 * MiB, 0, 1 * MiB, -2 * MiB))]
    law = laws.classify(xs, ys)
    assert law.kind == "affine" and not law.affine.exact and "within" in law.detail
    assert abs(law.affine.slope - 100 * MiB) < 2 * MiB
    assert 0.99 < law.affine.r2 < 1.0
    y, se = law.affine.predict(10)
    assert se is not None and se > 0
    # farther from the data, wider
    assert law.affine.predict(100)[1] > se
    # by hand: s^2 = SSres / (n - 2), se = s sqrt(1 + 1/n + (x - mean)^2 / Sxx)
    a, b = law.affine.intercept, law.affine.slope
    res = [y_ - (a + b * x) for x, y_ in zip(xs, ys)]
    s = math.sqrt(sum(r * r for r in res) / 3)
    assert math.isclose(se, s * math.sqrt(1 + 1 / 5 + (10 - 3) ** 2 / 10), rel_tol=1e-9)


def test_flat():
    assert laws.classify([1, 2, 4], [5 * MiB] * 3).kind == "flat"
    law = laws.classify([1, 2, 4], [100 * MiB, 100 * MiB + 1, 100 * MiB - 3])
    assert law.kind == "flat" and "within" in law.detail


def test_small_exact_growth_under_a_big_constant_is_not_flat():
    """The peak of 100 GiB of weights and a KV pool growing 8 MiB a step: affine, not flat."""
    law = laws.classify([1, 2, 3], [100 * GiB + 8 * MiB * x for x in (1, 2, 3)])
    assert law.kind == "affine" and law.affine.slope == 8 * MiB


def test_powers_of_two():
    # rounded up to a power of two: 3 -> 4, 5 -> 8, 6 -> 8, 9 -> 16 (MiB)
    law = laws.classify([3, 5, 6, 9], [4 * MiB, 8 * MiB, 8 * MiB, 16 * MiB])
    assert law.kind == "powers_of_two", law
    assert law.points == [(3, 4 * MiB), (5, 8 * MiB), (6, 8 * MiB), (9, 16 * MiB)]
    assert law.affine is not None  # the line is still there, for its slope


def test_steps():
    law = laws.classify([1, 2, 3, 4, 5], [10, 10, 25, 25, 25])
    assert law.kind == "steps" and "2 distinct levels" in law.detail


def test_power_law_quadratic():
    law = laws.classify([1, 2, 4, 8], [3 * x * x for x in (1, 2, 4, 8)])
    assert law.kind == "power", law
    assert math.isclose(law.power.exponent, 2, rel_tol=1e-9) and "quadratic" in law.detail
    y, se, how = law.predict(16)
    assert math.isclose(y, 3 * 256, rel_tol=1e-9) and how == "power law"


def test_irregular():
    law = laws.classify([1, 2, 3, 4], [10, 50, 5, 40])
    assert law.kind == "irregular" and "no simple law" in law.detail


def test_one_and_two_points():
    assert laws.classify([], []).kind == "none"
    one = laws.classify([4], [7])
    assert one.kind == "one_point" and one.affine is None and not one.tested
    two = laws.classify([1, 2], [10, 30])
    assert two.kind == "affine" and not two.tested
    assert two.affine.slope == 20 and two.affine.intercept == -10
    y, se = two.affine.predict(3)
    assert y == 50 and se is None  # two points: no uncertainty
    assert two.affine.stderr is None


def test_fit_singular_is_none():
    assert laws.fit_affine([2, 2, 2], [1, 2, 3]) is None
    assert laws.fit([[1, 1], [1, 1]], [1, 2]) is None


def test_grid_product_law():
    pts = [(a, b) for a in (2, 4) for b in (64, 128, 256)]
    ys = [PAGE * a * b + 7 * MiB for a, b in pts]
    g = laws.fit_grid(pts, ys, ["layers", "blocks"])
    j = g.as_json()
    assert g.model == "multilinear" and j["exact"]
    assert j["terms"] == [
        {"knobs": [], "coefficient": 7 * MiB},
        {"knobs": ["layers", "blocks"], "coefficient": PAGE},
    ]
    assert j["slope"] == {"layers": 0, "blocks": 0} and j["intercept"] == 7 * MiB
    y, se = g.predict((8, 512))
    assert y == PAGE * 8 * 512 + 7 * MiB and se == 0.0
    assert g.partial_slope(1, (4, 64)) == PAGE * 4


def test_grid_additive_when_products_undetermined():
    pts = [(1, 1), (2, 1), (1, 2)]  # an L, not a grid: no product term
    g = laws.fit_grid(pts, [3 + 2 * a + 5 * b for a, b in pts], ["a", "b"])
    assert g.model == "additive" and g.lsq.exact
    assert g.coefficient((0,)) == 2 and g.coefficient((1,)) == 5 and g.intercept == 3


# ---- the command: fixtures -------------------------------------------------------------------


def sweep(env, *args, timeout=300, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "cudatrace", "sweep", *map(str, args)],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        **kw,
    )


def _ok(r):
    return f"exit {r.returncode}\nstdout:\n{r.stdout}\nstderr:\n{r.stderr}"


def site(doc, function):
    got = [
        s for s in doc["sites"] if s["label"].startswith(function + " ") or s["label"] == function
    ]
    assert len(got) == 1, [s["label"] for s in doc["sites"]]
    return got[0]


@pytest.fixture(scope="module")
def blocks(sim, kvpool, tmp_path_factory):
    """kvpool swept over --num-blocks 64,128,256: the per-layer pool's law."""
    base = tmp_path_factory.mktemp("sweep-blocks")
    env = thor_env(sim, base)
    r = sweep(
        env,
        "--values",
        "64,128,256",
        "-o",
        base / "sw",
        "--json",
        "--predict",
        "1024",
        "--",
        kvpool,
        "--num-blocks",
        "{}",
    )
    assert r.returncode == 0, _ok(r)
    r.doc = json.loads(r.stdout)
    r.base = base
    r.env = env
    return r


# ---- a per-layer size: the laws --------------------------------------------------------------


def test_json_schema_as_documented(blocks):
    """The document is valid under the schema the package ships (cudatrace/schemas/
    sweep-1.json), with a prediction, and docs/sweep-json.md names the schema's keys."""
    from cudatrace import schemas
    from support.schemas import validate

    assert blocks.doc["prediction"] is not None
    validate(blocks.doc)
    spec = schemas.load("cudatrace.sweep/1")
    defs = spec["$defs"]
    keys = list(spec["properties"]) + list(defs["fit"]["properties"])
    keys += list(defs["law"]["properties"])
    keys += list(defs["prediction"]["properties"]["budget"]["properties"])
    doc = (REPO / "docs" / "sweep-json.md").read_text()
    for key in keys:
        assert f"`{key}`" in doc or f"`{key}[]`" in doc, key


def test_kv_site_law_is_layers_times_unit(blocks):
    doc = blocks.doc
    assert doc["schema"] == "cudatrace.sweep/1"
    assert doc["values"] == [64, 128, 256]
    kv = site(doc, "allocate_layer_kv")
    assert kv["bytes"] == [LAYERS * PAGE * b for b in (64, 128, 256)]
    assert kv["count"] == [LAYERS] * 3
    assert kv["fit"]["slope"] == LAYERS * PAGE  # 1.75 MiB per block, exactly
    assert kv["fit"]["intercept"] == 0 and kv["fit"]["r2"] == 1.0 and kv["fit"]["exact"]
    assert kv["law"]["kind"] == "affine" and kv["law"]["tested"]
    assert "1.75 MiB per block" in kv["law"]["text"]
    assert kv["contradicts_expectation"] is False and doc["expect"] is None


def test_weights_and_workspace_are_flat(blocks):
    for fn, size in (("load_weights", WEIGHTS), ("reserve_workspace", WORKSPACE)):
        s = site(blocks.doc, fn)
        assert s["bytes"] == [size] * 3
        assert s["fit"]["slope"] == 0 and s["fit"]["intercept"] == size
        assert s["law"]["kind"] == "flat"


def test_peak_law(blocks):
    p = blocks.doc["peak"]
    assert p["label"] == "peak"
    assert p["bytes"] == [WEIGHTS + WORKSPACE + LAYERS * PAGE * b for b in (64, 128, 256)]
    assert p["fit"] == {
        "slope": LAYERS * PAGE,
        "intercept": WEIGHTS + WORKSPACE,
        "r2": 1.0,
        "n": 3,
        "stderr": 0.0,
        "exact": True,
    }


def test_runs_are_recorded(blocks):
    runs = blocks.doc["runs"]
    assert [r["value"] for r in runs] == [64, 128, 256]
    for r, b in zip(runs, (64, 128, 256)):
        assert r["included"] and r["ended"]["how"] == "exited" and r["ended"]["status"] == 0
        assert r["ended"]["text"] == "exited 0"
        assert Path(r["directory"]).name == "num-blocks=%d" % b
        assert list(Path(r["directory"]).glob("*.ctrace"))
        assert r["peak_bytes"] == WEIGHTS + WORKSPACE + LAYERS * PAGE * b
        assert "num_blocks = %d" % b in Path(r["output"]).read_text()  # its output, kept
    on_disk = json.loads((blocks.base / "sw" / "sweep.json").read_text())
    assert on_disk["peak"] == blocks.doc["peak"]


def test_prediction_and_budget(blocks):
    p = blocks.doc["prediction"]
    assert p["extrapolated"] and p["value"] == 1024
    assert p["peak"]["bytes"] == WEIGHTS + WORKSPACE + LAYERS * PAGE * 1024
    assert p["peak"]["stderr"] == 0.0  # 3 points on a line: exact
    assert p["sites"][0]["label"].startswith("allocate_layer_kv")
    assert p["sites"][0]["bytes"] == LAYERS * PAGE * 1024
    b = p["budget"]
    assert b["bytes"] >= p["peak"]["bytes"] * 1.1 and b["bytes"] <= p["peak"]["bytes"] * 1.3
    assert b["bytes"] % MiB == 0 and "10% headroom" in b["reason"]
    from cudatrace.record.budget import parse_size

    assert parse_size(b["spec"]) == b["bytes"]


def test_text_output(blocks, kvpool):
    r = sweep(
        blocks.env,
        "--values",
        "64,128,256",
        "-o",
        blocks.base / "sw-text",
        "--predict",
        "1024",
        "--",
        kvpool,
        "--num-blocks",
        "{}",
    )
    assert r.returncode == 0, _ok(r)
    out = r.stdout
    line = next(l for l in out.splitlines() if l.strip().startswith("allocate_layer_kv"))
    assert "1.75 MiB per block + 0 B" in line and "exact, 3 points" in line
    assert any(
        l.strip().startswith("load_weights") and "flat at 1.30 GiB" in l for l in out.splitlines()
    )
    assert "Predicted at --num-blocks 1024" in out
    assert "budget for a co-tenant box: --budget" in out
    assert "1/3  64: exited 0, peak" in r.stderr


def test_from_fits_a_recorded_sweep_again(blocks, tmp_path):
    moved = tmp_path / "moved"
    shutil.copytree(blocks.base / "sw", moved)  # a sweep moved elsewhere still reads
    r = sweep(blocks.env, "--from", moved, "--expect", "64KiB", "--json")
    assert r.returncode == 0, _ok(r)
    doc = json.loads(r.stdout)
    assert doc["values"] == blocks.doc["values"] and doc["peak"]["fit"] == blocks.doc["peak"]["fit"]
    kv = site(doc, "allocate_layer_kv")
    assert kv["fit"] == site(blocks.doc, "allocate_layer_kv")["fit"]
    assert (
        kv["contradicts_expectation"] and "28x the expected 64.0 KiB per block" in kv["expectation"]
    )
    assert all(Path(x["directory"]).parent == moved for x in doc["runs"])
    assert json.loads((moved / "sweep.json").read_text())["expect"] is None  # not rewritten
    from cudatrace.sweep import SweepError, sweep_dict

    d = sweep_dict(moved, expect="64KiB")  # the same dict, for the HTML report
    assert d["peak"] == doc["peak"] and d["sites"] == doc["sites"]
    with pytest.raises(SweepError):
        sweep_dict(tmp_path)
    r = sweep(blocks.env, "--from", moved, "--values", "1,2")
    assert r.returncode == 2 and "give no --values and no command" in r.stderr
    r = sweep(blocks.env, "--from", tmp_path / "nothing")
    assert r.returncode == 2 and "--from" in r.stderr


def test_existing_sweep_is_not_overwritten(blocks, kvpool):
    before = (blocks.base / "sw" / "sweep.json").read_text()
    r = sweep(
        blocks.env,
        "--values",
        "64,128,256",
        "-o",
        blocks.base / "sw",
        "--",
        kvpool,
        "--num-blocks",
        "{}",
    )
    assert r.returncode == 2 and "already holds a sweep" in r.stderr and "--force" in r.stderr
    assert (blocks.base / "sw" / "sweep.json").read_text() == before


# ---- --expect: the defect --------------------------------------------------------------------


def test_expect_flags_per_layer_pool_not_weights(sim, kvpool, tmp_path):
    env = thor_env(sim, tmp_path)
    r = sweep(
        env,
        "--values",
        "64MiB,128MiB,256MiB",
        "--expect",
        "1",
        "-o",
        tmp_path / "sw",
        "--json",
        "--",
        kvpool,
        "--kv-cache-memory={}",
    )
    assert r.returncode == 0, _ok(r)
    doc = json.loads(r.stdout)
    assert doc["knobs"][0]["flag"] == "--kv-cache-memory" and doc["knobs"][0]["unit"] == "bytes"
    kv = site(doc, "allocate_layer_kv")
    assert kv["fit"]["slope"] == LAYERS and kv["fit"]["intercept"] == 0
    assert kv["contradicts_expectation"] is True
    assert kv["expectation"].startswith("allocate_layer_kv") and "28x the flag" in kv["expectation"]
    assert doc["peak"]["contradicts_expectation"] is True
    for fn in ("load_weights", "reserve_workspace"):
        s = site(doc, fn)
        assert s["contradicts_expectation"] is False and s["expectation"] is None
    # text: one sentence per flagged law
    r = sweep(
        env,
        "--values",
        "64MiB,128MiB,256MiB",
        "--expect",
        "1",
        "-o",
        tmp_path / "sw2",
        "--",
        kvpool,
        "--kv-cache-memory",
        "{}",
    )
    assert r.returncode == 0, _ok(r)
    flagged = [l for l in r.stdout.splitlines() if l.strip().startswith("! ")]
    assert len(flagged) == 2, r.stdout
    assert any("allocate_layer_kv" in l and "grows 28x the flag" in l for l in flagged)
    assert not any("load_weights" in l for l in flagged)
    assert "28.0 MiB per MiB of --kv-cache-memory (28x)" in r.stdout
    # the page highlights the same verdicts
    page, doc = html_of(env, tmp_path / "sw", tmp_path / "e.html", "--expect", "1")
    assert page.count('<p class="verdict bad">') == 2
    kv = html_section(page, site(doc, "allocate_layer_kv")["label"])
    assert kv.startswith(' class="series flagged"') and "grows 28x the flag" in kv
    assert '<p class="verdict good">within --expect</p>' in html_section(
        page, site(doc, "load_weights")["label"]
    )


def test_expect_matching_the_fix_flags_nothing(sim, kvpool, tmp_path):
    env = thor_env(sim, tmp_path)
    r = sweep(
        env,
        "--values",
        "64MiB,128MiB,256MiB",
        "--expect",
        "1",
        "-o",
        tmp_path / "sw",
        "--json",
        "--",
        kvpool,
        "--fixed-sizing",
        "--kv-cache-memory",
        "{}",
    )
    assert r.returncode == 0, _ok(r)
    doc = json.loads(r.stdout)
    assert not any(s["contradicts_expectation"] for s in [doc["peak"]] + doc["sites"])
    kv = site(doc, "allocate_layer_kv")
    assert 0.98 < kv["fit"]["slope"] < 1.02  # whole blocks: about the flag


# ---- a grid ----------------------------------------------------------------------------------


def test_grid_of_two_knobs(sim, kvpool, tmp_path):
    env = thor_env(sim, tmp_path)
    r = sweep(
        env,
        "--values",
        "layers=2,4",
        "--values",
        "blocks=64,128,256",
        "-o",
        tmp_path / "g",
        "--json",
        "--predict",
        "layers=8,blocks=512",
        "--expect",
        "blocks=64KiB",
        "--",
        kvpool,
        "--layers",
        "{layers}",
        "--num-blocks={blocks}",
    )
    assert r.returncode == 0, _ok(r)
    doc = json.loads(r.stdout)
    assert [k["flag"] for k in doc["knobs"]] == ["--layers", "--num-blocks"]
    assert doc["values"] == [{"layers": a, "blocks": b} for a in (2, 4) for b in (64, 128, 256)]
    assert len(doc["runs"]) == 6 and all(r_["included"] for r_ in doc["runs"])
    assert sorted(Path(r_["directory"]).name for r_ in doc["runs"])[0] == "layers=2,blocks=128"
    kv = site(doc, "allocate_layer_kv")
    assert kv["bytes"] == [PAGE * a * b for a in (2, 4) for b in (64, 128, 256)]
    assert kv["fit"]["model"] == "multilinear" and kv["fit"]["exact"]
    assert kv["fit"]["terms"] == [
        {"knobs": [], "coefficient": 0},
        {"knobs": ["layers", "blocks"], "coefficient": PAGE},
    ]
    w = site(doc, "load_weights")
    assert w["law"]["kind"] == "flat" and not w["contradicts_expectation"]
    assert doc["expect"] == {"blocks": 65536.0}
    assert kv["contradicts_expectation"] and kv["expectation"] == (
        kv["label"] + " grows 4x the expected 64.0 KiB per block (256.0 KiB "
        "per block at layers=4): sized per layer, or once for each of 4 things?"
    )
    assert doc["peak"]["fit"]["intercept"] == WEIGHTS + WORKSPACE
    assert doc["prediction"]["peak"]["bytes"] == WEIGHTS + WORKSPACE + PAGE * 8 * 512
    r = sweep(
        env,
        "--values",
        "layers=2,4",
        "--values",
        "blocks=64,128,256",
        "-o",
        tmp_path / "g2",
        "--",
        kvpool,
        "--layers",
        "{layers}",
        "--num-blocks={blocks}",
    )
    assert r.returncode == 0, _ok(r)
    assert "64.0 KiB x --layers x --num-blocks + 0 B" in r.stdout, r.stdout
    # the page of a grid: one chart per law, one series per value of the second knob
    page, doc = html_of(env, tmp_path / "g", tmp_path / "g.html", "--expect", "blocks=64KiB")
    assert page.count("<svg") == 1 + len(doc["sites"])
    kv = html_section(page, site(doc, "allocate_layer_kv")["label"])
    for b in (64, 128, 256):
        assert f"--num-blocks={b}</text>" in kv
    assert kv.count("<polyline") == 3 and 'class="fit"' not in kv
    assert '<p class="verdict bad">! ' in kv and "grows 4x the expected" in kv
    assert html_bytes(kv) == [PAGE * a * b for a in (2, 4) for b in (64, 128, 256)]


# ---- a run failing at one value --------------------------------------------------------------


def test_run_failing_under_budget_is_reported_and_left_out(sim, kvpool, tmp_path):
    env = thor_env(sim, tmp_path)
    r = sweep(
        env,
        "--values",
        "32,64,128,4096",
        "--budget",
        "2GiB",
        "-o",
        tmp_path / "sw",
        "--json",
        "--",
        kvpool,
        "--num-blocks",
        "{}",
    )
    assert r.returncode == 0, _ok(r)
    doc = json.loads(r.stdout)
    bad = doc["runs"][3]
    assert not bad["included"] and bad["ended"]["how"] == "failed_under_budget"
    assert bad["ended"]["denied"] >= 1 and bad["ended"]["status"] != 0
    assert "budget exceeded" in bad["ended"]["message"]
    assert "failed under the budget" in bad["ended"]["text"]
    assert all(r_["included"] for r_ in doc["runs"][:3])
    kv = site(doc, "allocate_layer_kv")
    assert kv["bytes"][3] is None and doc["peak"]["bytes"][3] is None
    assert kv["fit"]["n"] == 3 and kv["fit"]["slope"] == LAYERS * PAGE and kv["fit"]["exact"]
    r = sweep(
        env,
        "--values",
        "32,64,128,4096",
        "--budget",
        "2GiB",
        "-o",
        tmp_path / "sw2",
        "--",
        kvpool,
        "--num-blocks",
        "{}",
    )
    assert r.returncode == 0, _ok(r)
    assert "4/4  4096: failed under the budget" in r.stderr and "left out" in r.stderr
    assert "4096: cudatrace: budget exceeded" in r.stdout
    page, doc = html_of(env, tmp_path / "sw", tmp_path / "left.html")
    left = page.split("Runs left out of the laws", 1)[1].split("</ul>", 1)[0]
    assert "<b>4096</b>: failed under the budget" in left and "budget exceeded" in left
    assert "<b>32</b>" not in left
    assert page.count("<svg") == 1 + len(doc["sites"])


def test_run_exiting_nonzero_is_left_out(sim, kvpool, tmp_path):
    """kvpool refuses --num-blocks 0 (exit 2): reported and left out; one good run: no law."""
    env = thor_env(sim, tmp_path)
    r = sweep(
        env, "--values", "0,64", "-o", tmp_path / "sw", "--json", "--", kvpool, "--num-blocks", "{}"
    )
    assert r.returncode == 1, _ok(r)
    doc = json.loads(r.stdout)
    assert doc["runs"][0]["ended"] == dict(doc["runs"][0]["ended"], how="exited", status=2)
    assert not doc["runs"][0]["included"] and doc["runs"][1]["included"]
    assert "fewer than two runs finished well: no law" in doc["notes"]
    assert doc["peak"]["law"]["kind"] == "one_point"


def test_runs_not_started_or_without_trace_are_left_out(sim, tmp_path):
    env = thor_env(sim, tmp_path)
    (tmp_path / "hold1").symlink_to(sim.progs["hold"])
    (tmp_path / "hold3").symlink_to(sim.progs["hold"])
    r = sweep(
        env,
        "--values",
        "1,2,3",
        "-o",
        tmp_path / "sw",
        "--json",
        "--",
        tmp_path / "hold{}",
        "--exit-after-ms",
        "0",
        "--free",
        "2",
        "{}MiB",
    )
    assert r.returncode == 0, _ok(r)
    doc = json.loads(r.stdout)
    e = doc["runs"][1]["ended"]
    assert e["how"] == "not_started" and "no such file" in e["text"], e
    assert [x["included"] for x in doc["runs"]] == [True, False, True]
    assert doc["peak"]["bytes"] == [2 * MiB, None, 6 * MiB]
    # a run whose trace is gone (here: the command deletes it)
    r = sweep(
        env,
        "--values",
        "1,2",
        "-o",
        tmp_path / "sw2",
        "--json",
        "--",
        "sh",
        "-c",
        'rm -f "$CUDATRACE_DIR"/*.ctrace; : {}',
    )
    assert r.returncode == 1, _ok(r)
    doc = json.loads(r.stdout)
    for x in doc["runs"]:
        assert x["ended"]["how"] == "no_trace" and not x["included"]
        assert "no readable trace file" in x["ended"]["text"] or "no trace" in x["ended"]["text"]
    # a command that dies of a signal, or exits 130 by itself
    r = sweep(
        env,
        "--values",
        "9,130",
        "-o",
        tmp_path / "sw4",
        "--json",
        "--",
        "sh",
        "-c",
        "[ {} = 9 ] && kill -9 $$; exit {}",
    )
    assert r.returncode == 1, _ok(r)
    doc = json.loads(r.stdout)
    a, b = doc["runs"]
    assert a["ended"]["how"] == "signaled" and a["ended"]["signal"] == "SIGKILL"
    assert a["ended"]["text"] == "died of SIGKILL" and not a["included"]
    assert b["ended"]["how"] == "exited" and b["ended"]["text"] == "exited 130"
    # a command that never uses CUDA: zeros, and a note naming the driver it never loaded
    r = sweep(env, "--values", "1,2", "-o", tmp_path / "sw3", "--json", "--", "true", "{}")
    assert r.returncode == 0, _ok(r)
    doc = json.loads(r.stdout)
    said = f"no run used the CUDA driver ({sim.lib / 'libcuda.so.1'}): the command never loaded it"
    assert doc["peak"]["bytes"] == [0, 0] and any(n.startswith(said) for n in doc["notes"]), doc
    # one that loads the driver and allocates nothing: the note of before
    r = sweep(
        env,
        "--values",
        "1,2",
        "-o",
        tmp_path / "sw5",
        "--json",
        "--",
        sim.progs["hold"],
        "--exit-after-ms",
        "0",
        "0",
        "{}",
    )
    doc = json.loads(r.stdout)
    assert any("did the command use the GPU" in n for n in doc["notes"]), doc["notes"]


# ---- servers: --stop-after and --until-url ---------------------------------------------------


def test_stop_after_stops_a_server(sim, tmp_path):
    env = thor_env(sim, tmp_path)
    r = sweep(
        env,
        "--values",
        "1MiB,2MiB,3MiB",
        "--stop-after",
        "1s",
        "-o",
        tmp_path / "sw",
        "--json",
        "--",
        sim.progs["hold"],
        "4",
        "{}",
        timeout=120,
    )
    assert r.returncode == 0, _ok(r)
    doc = json.loads(r.stdout)
    for run in doc["runs"]:
        e = run["ended"]
        assert e["how"] == "stopped" and e["why"] == "time" and e["signal"] == "SIGINT", e
        assert e["status"] == 0 and run["included"]  # hold exits 0 on SIGINT
        assert e["text"] == "stopped after 1s (SIGINT)"
    assert doc["peak"]["fit"]["slope"] == 4 and doc["peak"]["fit"]["intercept"] == 0
    assert site(doc, "hold_alloc")["bytes"] == [4 * MiB, 8 * MiB, 12 * MiB]


def test_interrupted_sweep_reports_what_it_has(sim, tmp_path):
    """SIGINT to the sweep during a run (no terminal: the launcher forwards it): that run is
    'interrupted', the sweep stops there and still prints its result."""
    import time

    env = thor_env(sim, tmp_path)
    out = tmp_path / "sw"
    p = children.popen(
        [
            sys.executable,
            "-m",
            "cudatrace",
            "sweep",
            "--values",
            "1MiB,2MiB,3MiB",
            "-o",
            str(out),
            "--json",
            "--",
            str(sim.progs["hold"]),
            "1",
            "{}",
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    log = out / "value=1MiB" / "output.log"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not (log.exists() and "ready" in log.read_text()):
        time.sleep(0.05)
    assert "ready" in log.read_text()
    p.send_signal(signal.SIGINT)
    stdout, stderr = p.communicate(timeout=60)
    assert p.returncode == 1, stderr
    doc = json.loads(stdout)
    assert len(doc["runs"]) == 1
    e = doc["runs"][0]["ended"]
    assert (
        e["how"] == "interrupted"
        and e["signal"] == "SIGINT"
        and e["text"] == "interrupted (SIGINT)"
    )
    assert "interrupted: 1 of 3 runs done" in doc["notes"]
    assert not (out / "value=2MiB").exists()


STUBBORN = textwrap.dedent("""\
    import ctypes, signal, sys, time
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    cu = ctypes.CDLL("libcuda.so.1")
    assert cu.cuInit(0) == 0
    p = ctypes.c_ulonglong()
    assert cu.cuMemAlloc_v2(ctypes.byref(p), ctypes.c_size_t(int(sys.argv[1]) << 20)) == 0
    print("ready", flush=True)
    while True:
        time.sleep(1)
    """)


def test_stubborn_server_is_killed(sim, tmp_path):
    prog = tmp_path / "stubborn.py"
    prog.write_text(STUBBORN)
    env = thor_env(sim, tmp_path)
    # 3 s: the program has ignored SIGINT and SIGTERM and allocated by then, even on a busy box
    r = sweep(
        env,
        "--values",
        "1,2",
        "--stop-after",
        "3s",
        "--grace",
        "0.3s",
        "-o",
        tmp_path / "sw",
        "--json",
        "--",
        sys.executable,
        prog,
        "{}",
        timeout=120,
    )
    assert r.returncode == 0, _ok(r)
    doc = json.loads(r.stdout)
    for run in doc["runs"]:
        assert run["ended"]["how"] == "killed" and run["ended"]["signal"] == "SIGKILL"
        assert run["included"] and "SIGINT and SIGTERM did not stop it" in run["ended"]["text"]
    assert doc["peak"]["bytes"] == [MiB, 2 * MiB]


SERVER = textwrap.dedent("""\
    # a server: answers HTTP at once, allocates LATE (after 0.6 s), then serves until SIGINT
    import ctypes, http.server, sys, threading, time
    port, mib = int(sys.argv[1]), int(sys.argv[2])

    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"ok")

        def log_message(self, *a):
            pass

    srv = http.server.HTTPServer(("127.0.0.1", port), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    cu = ctypes.CDLL("libcuda.so.1")
    assert cu.cuInit(0) == 0
    time.sleep(0.6)
    ptrs = []
    for i in range(3):
        p = ctypes.c_ulonglong()
        assert cu.cuMemAlloc_v2(ctypes.byref(p), ctypes.c_size_t(mib << 20)) == 0
        ptrs.append(p)
    print("allocated", flush=True)
    try:
        while True:
            time.sleep(0.1)
    except KeyboardInterrupt:
        print("stopped by SIGINT", flush=True)
    """)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_until_url_waits_for_answer_and_settled_memory(sim, tmp_path):
    prog = tmp_path / "server.py"
    prog.write_text(SERVER)
    port = free_port()
    env = thor_env(sim, tmp_path)
    r = sweep(
        env,
        "--values",
        "2,4,8",
        "--until-url",
        "http://127.0.0.1:%d/health" % port,
        "--settle",
        "1.5s",
        "-o",
        tmp_path / "sw",
        "--json",
        "--",
        sys.executable,
        prog,
        port,
        "{}",
        timeout=180,
    )
    assert r.returncode == 0, _ok(r)
    doc = json.loads(r.stdout)
    for run, mib in zip(doc["runs"], (2, 4, 8)):
        e = run["ended"]
        assert e["how"] == "stopped" and e["why"] == "url" and e["signal"] == "SIGINT", e
        assert e["settled"] and e["live_bytes"] == 3 * mib * MiB
        assert e["text"] == "stopped: URL answered at {:.1f}s, memory settled 1.5s (SIGINT)".format(
            e["answered_after"]
        )
        assert run["included"]
        assert "stopped by SIGINT" in Path(run["output"]).read_text()
    # the late allocations count: stopped after memory settled, not at the first answer
    assert doc["peak"]["bytes"] == [3 * m * MiB for m in (2, 4, 8)]
    assert doc["peak"]["fit"]["slope"] == 3 * MiB and doc["peak"]["fit"]["intercept"] == 0
    assert doc["stop"]["url"].endswith("/health") and doc["stop"]["settle"] == 1.5
    r = sweep(
        env,
        "--values",
        "2,4",
        "--until-url",
        "http://127.0.0.1:%d/health" % port,
        "--settle",
        "0.5s",
        "-o",
        tmp_path / "sw2",
        "--",
        sys.executable,
        prog,
        port,
        "{}",
        timeout=180,
    )
    assert r.returncode == 0, _ok(r)
    assert (
        "each run stopped once http://127.0.0.1:%d/health answers and traced memory stays "
        "the same for 0.5s" % port in r.stdout
    )
    assert "2/2  4: stopped: URL answered at" in r.stderr


def test_until_url_never_answering_times_out(sim, tmp_path):
    port = free_port()
    env = thor_env(sim, tmp_path)
    r = sweep(
        env,
        "--values",
        "1MiB,2MiB",
        "--until-url",
        "http://127.0.0.1:%d/" % port,
        "--url-timeout",
        "0.5s",
        "-o",
        tmp_path / "sw",
        "--json",
        "--",
        sim.progs["hold"],
        "1",
        "{}",
        timeout=120,
    )
    assert r.returncode == 1, _ok(r)
    doc = json.loads(r.stdout)
    for run in doc["runs"]:
        assert run["ended"]["how"] == "url_timeout" and not run["included"]
        assert "did not answer in 0.5s" in run["ended"]["text"]


# ---- bad input -------------------------------------------------------------------------------


def cli(*args):
    from cudatrace.cli import main

    return CliRunner().invoke(main, ["sweep", *map(str, args)])


@pytest.mark.parametrize(
    "args,message",
    [
        (["--values", "1,2", "--", "true", "--size", "8"], "the command has no {}"),
        (["--", "true", "{}"], "--values is required"),
        (["--values", "1,,2", "--", "true", "{}"], "an empty value"),
        (["--values", "1", "--", "true", "{}"], "one value gives no law"),
        (["--values", "1,fp16", "--", "true", "{}"], "'fp16' is not a number or a size"),
        (["--values", "1,2,1", "--", "true", "{}"], "1 is repeated"),
        (["--values", "1GiB,2", "--", "true", "{}"], "mixes sizes (512MiB) and plain numbers"),
        (["--values", "1,2", "--values", "3,4", "--", "true", "{}"], "2 unnamed --values lists"),
        (["--values", "1,2", "--values", "b=3,4", "--", "true", "{}", "{b}"], "not both"),
        (["--values", "a=1,2", "--values", "a=3,4", "--", "true", "{a}"], "a=... given twice"),
        (["--values", "a=1,2", "--values", "b=3,4", "--", "true", "{a}"], "the command has no {b}"),
        (["--values", "a=1,2", "--", "true", "{a}", "{c}"], "has {c} but no --values c=..."),
        (["--values", "a=1,2", "--", "true", "{a}", "{}"], "write {a} instead"),
        (
            [
                "--values",
                "1,2",
                "--stop-after",
                "1s",
                "--until-url",
                "http://x/",
                "--",
                "true",
                "{}",
            ],
            "give one",
        ),
        (["--values", "1,2", "--stop-after", "soon", "--", "true", "{}"], "--stop-after soon"),
        (
            ["--values", "1,2", "--until-url", "localhost:80", "--", "true", "{}"],
            "http:// or https://",
        ),
        (["--values", "1,2", "--expect", "lots", "--", "true", "{}"], "--expect lots"),
        (
            [
                "--values",
                "a=1,2",
                "--values",
                "b=1,2",
                "--expect",
                "c=1",
                "--",
                "true",
                "{a}",
                "{b}",
            ],
            "write NAME=SLOPE with NAME one of a, b",
        ),
        (["--values", "1MiB,2MiB", "--predict", "4", "--", "true", "{}"], "write it with its unit"),
        (
            [
                "--values",
                "a=1,2",
                "--values",
                "b=1,2",
                "--predict",
                "a=4",
                "--",
                "true",
                "{a}",
                "{b}",
            ],
            "no value for b",
        ),
        (["--values", "1,2", "--", "/nonexistent/prog", "{}"], "no such file"),
        (["--values", "1,2", "--budget", "12 parsecs", "--", "true", "{}"], "--budget"),
    ],
)
def test_bad_input_is_refused_clearly(tmp_path, args, message):
    out = tmp_path / "sw"
    r = cli(*args[: args.index("--")], "-o", out, *args[args.index("--") :])
    assert r.exit_code in (2, 127), (r.exit_code, r.output, r.stderr)
    assert message in r.stderr, r.stderr
    assert not out.exists()  # nothing run, nothing written


def test_knob_nouns_and_flags():
    from cudatrace.sweep import Knob, bind_command, parse_knobs

    cases = {
        "--num-blocks": "block",
        "--layers": "layer",
        "--batches": "batch",
        "--n-experts": "expert",
        "--block-count": "block",
        "--batch-size": None,
        "--kv-cache-memory": None,
        "--max-tokens": None,
        "--class": None,
    }
    for flag, noun in cases.items():
        assert Knob("", ["1", "2"], [1, 2], None, flag).noun() == noun, flag
    knobs = parse_knobs(["1,2"])
    bind_command(knobs, ["prog", "--size={}"])
    assert knobs[0].flag == "--size" and knobs[0].key == "size"
    knobs = parse_knobs(["1,2"])
    bind_command(knobs, ["prog", "{}"])
    assert knobs[0].flag is None and knobs[0].label == "the value"


# ---- the text of laws that are not affine (sweep_json on measured runs, no process) -----------


def fake_sweep(values, series, knob_flag="--ctx", expect=None, predict=None):
    """sweep_json over runs already measured: series {label: [bytes per value]}."""
    from cudatrace.sweep import Plan, bind_command, parse_knobs, sweep_json

    knobs = parse_knobs([",".join(values)])
    bind_command(knobs, ["srv", knob_flag, "{}"])
    plan = Plan(knobs, ["srv", knob_flag, "{}"], Path("/nonexistent/sweep"))
    runs = []
    for i, v in enumerate(values):
        sites = {
            (("srv", fn, "srv.c"),): {
                "label": fn + " (srv.c:1)",
                "key": "srv:" + fn,
                "bytes": ys[i],
                "count": 1,
            }
            for fn, ys in series.items()
        }
        runs.append(
            {
                "combo": (i,),
                "command": ["srv", knob_flag, v],
                "directory": f"/d/{v}",
                "output": f"/d/{v}/output.log",
                "included": True,
                "seconds": 1.0,
                "ended": {"how": "exited", "status": 0},
                "measured": {
                    "peak_bytes": sum(ys[i] for ys in series.values()),
                    "peak_time": 0.5,
                    "allocs": 1,
                    "denied": 0,
                    "sites": sites,
                },
            }
        )
    point = (float(predict),) if predict is not None else None
    return sweep_json(plan, runs, expect, point, predict)


def test_text_shows_points_of_laws_that_are_not_affine():
    from cudatrace.present.sweep import render

    doc = fake_sweep(
        ["1000", "3000", "5000", "6000", "9000"],
        {
            "round_up_pool": [x * MiB for x in (1, 4, 8, 8, 16)],  # 2^ceil(log2 x/1000) MiB
            "bucketed": [16 * MiB, 16 * MiB, 32 * MiB, 32 * MiB, 32 * MiB],
            "attention_scores": [x * x * 4 for x in (1000, 3000, 5000, 6000, 9000)],
            "weights": [512 * MiB] * 5,
        },
        predict="12000",
    )
    by = {s["label"].split(" ")[0]: s for s in doc["sites"]}
    assert by["round_up_pool"]["law"]["kind"] == "powers_of_two"
    assert by["bucketed"]["law"]["kind"] == "steps"
    assert by["attention_scores"]["law"]["kind"] == "power"
    assert math.isclose(by["attention_scores"]["law"]["power"]["exponent"], 2, rel_tol=1e-6)
    assert by["weights"]["law"]["kind"] == "flat"
    text = render(doc)
    line = next(l for l in text.splitlines() if l.strip().startswith("round_up_pool"))
    assert "NOT AFFINE" in line and "powers of two" in line
    assert "1000: 1.00 MiB, 3000: 4.00 MiB, 5000: 8.00 MiB, 6000: 8.00 MiB, 9000: 16.0 MiB" in line
    line = next(l for l in text.splitlines() if l.strip().startswith("attention_scores"))
    assert "to the power 2.00 (quadratic?)" in line
    p = doc["prediction"]
    a = next(s for s in p["sites"] if s["label"].startswith("attention_scores"))
    assert a["how"] == "power law" and abs(a["bytes"] - 4 * 12000**2) < 1000
    r = next(s for s in p["sites"] if s["label"].startswith("round_up_pool"))
    assert "may miss a step" in r["how"]
    # the peak is not affine: predicted as the sum of the sites' laws
    assert p["peak"]["how"] == "the sum of the sites' laws"
    assert abs(p["peak"]["bytes"] - sum(s["bytes"] for s in p["sites"])) <= len(p["sites"])


def test_expect_on_a_plain_knob_and_two_point_prediction():
    from cudatrace.present.sweep import render

    doc = fake_sweep(
        ["8", "16"],
        {"act": [8 * 3 * MiB, 16 * 3 * MiB], "w": [MiB, MiB]},
        knob_flag="--batch",
        expect=float(2 * MiB),
        predict="32",
    )
    act = next(s for s in doc["sites"] if s["label"].startswith("act"))
    assert act["contradicts_expectation"]
    assert act["expectation"] == (
        "act (srv.c:1) grows 1.5x the expected 2.00 MiB per 1 of "
        "--batch (3.00 MiB per 1 of --batch): something more than the "
        "knob sizes it?"
    )
    assert not next(s for s in doc["sites"] if s["label"].startswith("w "))[
        "contradicts_expectation"
    ]
    p = doc["prediction"]
    assert p["peak"]["bytes"] == 32 * 3 * MiB + MiB and p["peak"]["stderr"] is None
    assert any("only 2 points" in n for n in p["notes"])
    assert "25% headroom: two points" in p["budget"]["reason"]
    text = render(doc)
    assert "(2 points: a line always fits two, untested)" in text
    assert "only 2 points: a law through them has no uncertainty to give" in text


# ---- --html: the charts of the laws ----------------------------------------------------------


def html_of(env, directory: Path, page: Path, *args) -> tuple[str, dict]:
    """`sweep --from DIR --html PAGE --json`: the page's text and the sweep's dict."""
    r = sweep(env, "--from", directory, "--html", page, "--json", *args)
    assert r.returncode == 0, _ok(r)
    assert f"charts in {page}" in r.stderr
    return page.read_text(), json.loads(r.stdout)


def html_section(page: str, label: str) -> str:
    """The <section> of one law, found by its escaped heading."""
    import html

    got = [s for s in page.split("<section")[1:] if f"<h2>{html.escape(label)}</h2>" in s]
    assert len(got) == 1, label
    return got[0].split("</section>", 1)[0]


def html_bytes(section: str) -> list[int]:
    """The bytes of each run in a section's table, in the order of the runs."""
    import re

    table = section.split("<table>", 1)[1]
    return [int(b) for b in re.findall(r'<td class="num" data-bytes="(\d+)"', table)]


def test_html_page_of_the_laws(blocks, tmp_path):
    sw = blocks.base / "sw"
    page, doc = html_of(blocks.env, sw, tmp_path / "laws.html")
    assert doc == json.loads((sw / "sweep.json").read_text()) | {"prediction": None}
    assert page.startswith("<!DOCTYPE html>")
    assert page.count("<svg") == 1 + len(doc["sites"]) and len(doc["sites"]) >= 3
    low = page.lower()
    assert "http" not in low and "<script" not in low and "<link" not in low
    assert "@import" not in low and "url(" not in low
    kv = site(doc, "allocate_layer_kv")
    sec = html_section(page, kv["label"])
    assert kv["law"]["text"] in sec and "1.75 MiB per block" in sec
    assert 'class="fit"' in sec and "<polyline" not in sec and "dashed line: the fitted law" in sec
    # the numbers of the page are those of sweep.json, for every law
    for s in [doc["peak"], *doc["sites"]]:
        label = "the peak (all sites)" if s is doc["peak"] else s["label"]
        sec = html_section(page, label)
        assert html_bytes(sec) == s["bytes"], label
        assert sorted(
            int(b) for b in __import__("re").findall(r'<circle[^>]*data-bytes="(\d+)"', sec)
        ) == sorted(s["bytes"])
    for v in ("64", "128", "256"):
        assert f'text-anchor="middle">{v}</text>' in page
    assert "Runs left out" not in page and "verdict" not in page.split("<section", 1)[1]
    # a page that cannot be written: said, and the text still printed
    r = sweep(blocks.env, "--from", sw, "--html", tmp_path / "no" / "x.html")
    assert r.returncode == 2 and "--html" in r.stderr and "no such directory" in r.stderr


def test_html_escapes_what_the_trace_says():
    from cudatrace.present import sweep_html

    knob = {
        "name": "v",
        "placeholder": "{}",
        "flag": "--n",
        "unit": None,
        "noun": None,
        "values": ["1", "2", "4"],
        "numbers": [1, 2, 4],
    }
    law = {"kind": "steps", "tested": True, "detail": "steps", "points": [], "text": "a <b> law"}
    evil = {
        "label": "f<int>(</section><script>alert(1)</script>)",
        "key": "k",
        "bytes": [1, 5, 9],
        "fit": {"slope": 2, "intercept": 0, "r2": 0.9, "n": 3, "stderr": None, "exact": False},
        "law": law,
        "contradicts_expectation": False,
        "expectation": None,
    }
    runs = [
        {
            "value": n,
            "text": t,
            "included": True,
            "ended": {"how": "exited", "status": 0, "text": "exited 0"},
        }
        for n, t in zip(knob["numbers"], knob["values"])
    ]
    doc = {
        "command": ["./x", "<&>"],
        "directory": "/tmp/<d>",
        "knobs": [knob],
        "runs": runs,
        "expect": None,
        "peak": dict(evil, label="peak", key=None),
        "sites": [evil],
        "more_sites": 0,
        "prediction": None,
        "notes": ["<note>"],
    }
    page = sweep_html.render(doc)
    assert "<script" not in page and "<b>" not in page and "<note>" not in page
    assert "f&lt;int&gt;(&lt;/section&gt;&lt;script&gt;" in page
    assert page.count("<svg") == 2 and page.count("<polyline") == 2
    assert "points joined, not a fitted line: the law is steps" in page


def test_html_page_loads_without_errors_or_requests(blocks, tmp_path):
    """In Chromium (headless, as tests/integration/test_html.py launches it): no console error,
    no request but the file itself."""
    from playwright.sync_api import sync_playwright
    from test_html import _tool

    path = tmp_path / "laws.html"
    html_of(blocks.env, blocks.base / "sw", path)
    sr = _tool("screenshot_report")
    with sync_playwright() as p:
        b = sr.launch(p)
        try:
            pg = sr.Page(b, path)
            try:
                assert pg.page.locator("svg").count() == 1 + len(blocks.doc["sites"])
                assert pg.page.locator("section.series circle").count() >= 3
                box = pg.page.locator("svg").first.bounding_box()
                assert box["width"] > 300 and box["height"] > 150
                assert not pg.errors, pg.errors
                assert not pg.requests, pg.requests
            finally:
                pg.close()
        finally:
            b.close()
