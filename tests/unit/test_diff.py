"""`cudatrace diff`: sites matched by names across runs loaded at different addresses."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from cudatrace.analyze.documents.analysis import Analysis
from cudatrace.analyze.documents.diff import SCHEMA, diff
from cudatrace.cli import main
from cudatrace.commands.diff import run_diff
from cudatrace.errors import CudatraceError
from cudatrace.present.diff import render_text
from support import tracegen as tg
from support.fixture_elf import elf, fake_sym  # noqa: F401  (fixtures)
from support.schemas import validate

MiB = tg.MiB
MS = tg.MS
T = tg.BASE_TS


@pytest.fixture(scope="module")
def sym(fake_sym):
    return fake_sym


def run(d, elf, base, plan):
    """plan: [(function, size, count, freed_at_end)]; everything is live together at 1 s (the
    peak), then the freed ones go."""
    fr = tg.Frames(elf, base=base)
    w = tg.TraceWriter(d / "1000.0.ctrace", pid=1000, argv=["app"])
    fr.write_modules(w)
    t = T
    addr = 0x7E0000000000
    frees = []
    for fn, size, count, freed in plan:
        leaf = w.stack(fr.stack(fn, "main"))
        for _ in range(count):
            t += MS
            w.alloc(t, size, addr, stack=leaf)
            if freed:
                frees.append(addr)
            addr += 1 << 32
    for a in frees:
        t += MS
        w.free(t, a)
    w.close()
    tg.write_run(d, argv=["app"], samples=[])
    return fr


@pytest.fixture(scope="module")
def runs(tmp_path_factory, elf):
    a = tmp_path_factory.mktemp("a")
    b = tmp_path_factory.mktemp("b")
    fa = run(
        a,
        elf,
        0,
        [
            ("alloc_activations", 100 * MiB, 4, True),
            ("load_weights", 500 * MiB, 2, False),
            ("make_workspace", 300 * MiB, 1, True),
            ("query_memory", 10 * MiB, 1, False),
        ],
    )
    # B: another load address (ASLR, another build): the same functions, other addresses
    fb = run(
        b,
        elf,
        0x100000,
        [
            ("alloc_activations", 100 * MiB, 6, True),
            ("load_weights", 500 * MiB, 1, False),
            ("grow_cache", 64 * MiB, 2, False),
            ("query_memory", 10 * MiB, 1, False),
        ],
    )
    assert fa.ip("load_weights") != fb.ip("load_weights")
    return a, b


def test_diff_labels_and_order(runs, sym):
    a, b = runs
    d = diff(Analysis(a, symbolizer=sym), Analysis(b, symbolizer=sym))
    got = [
        (
            s["label"].split(" ")[0],
            s["status"],
            s["peak"]["delta_bytes"],
            s["peak"]["delta_count"],
            s["end"]["delta_bytes"],
        )
        for s in d["sites"]
    ]
    assert got == [
        ("load_weights", "shrunk", -500 * MiB, -1, -500 * MiB),
        ("make_workspace", "gone", -300 * MiB, -1, 0),
        ("alloc_activations", "grown", 200 * MiB, 2, 0),
        ("grow_cache", "new", 128 * MiB, 2, 128 * MiB),
        ("query_memory", "same", 0, 0, 0),
    ]
    t = d["totals"]
    assert t["peak_bytes"] == {"a": 1710 * MiB, "b": 1238 * MiB, "delta": -472 * MiB}
    assert t["end_bytes"] == {"a": 1010 * MiB, "b": 638 * MiB, "delta": -372 * MiB}
    assert t["allocs"] == {"a": 8, "b": 10, "delta": 2}
    assert d["status_counts"] == {"grown": 1, "shrunk": 1, "new": 1, "gone": 1, "same": 1}
    s = {x["label"].split(" ")[0]: x for x in d["sites"]}
    assert s["alloc_activations"]["run"] == {
        "a_bytes": 400 * MiB,
        "b_bytes": 600 * MiB,
        "a_count": 4,
        "b_count": 6,
        "delta_count": 2,
    }
    assert s["grow_cache"]["peak"]["a_bytes"] == 0 and s["make_workspace"]["peak"]["b_bytes"] == 0


def test_diff_without_symbols_matches_by_module_offset(runs):
    a, b = runs
    d = diff(Analysis(a, symbolize=False), Analysis(b, symbolize=False))
    st = sorted(x["status"] for x in d["sites"])
    assert st == ["gone", "grown", "new", "same", "shrunk"]
    assert all("+0x" in x["label"] for x in d["sites"])


def test_diff_same_run_is_all_same(runs, sym):
    a, _ = runs
    d = diff(Analysis(a, symbolizer=sym), Analysis(a, symbolizer=sym))
    assert {x["status"] for x in d["sites"]} == {"same"}
    assert d["totals"]["peak_bytes"]["delta"] == 0


def test_diff_text(runs, sym):
    a, b = runs
    text = render_text(diff(Analysis(a, symbolizer=sym), Analysis(b, symbolizer=sym)))
    for s in (
        "cudatrace diff",
        "peak",
        "1.67 GiB",
        "1.21 GiB",
        "-472.0 MiB",
        "live at exit",
        "1 grown, 1 shrunk, 1 new, 1 gone, 1 same",
        "shrunk",
        "load_weights",
        "+200.0 MiB",
        "grow_cache",
        "gone",
    ):
        assert s in text, s
    lines = text.splitlines()
    first = next(i for i, x in enumerate(lines) if x.strip().startswith("status"))
    assert "load_weights" in lines[first + 1]
    # each column of the site table has a name of its own
    heads = lines[first].split("  ")
    heads = [h.strip() for h in heads if h.strip()]
    assert len(heads) == len(set(heads)) == 9, heads
    assert heads[3] == "peak change" and heads[7] == "exit change", heads


# The schema is the file the package ships (cudatrace/schemas/diff-1.json).


def test_cli_diff_json(runs, sym, monkeypatch):
    a, b = runs
    monkeypatch.setattr(
        "cudatrace.analyze.documents.analysis.make_symbolizer", lambda progress=False: sym
    )
    res = CliRunner().invoke(main, ["diff", str(a), str(b), "--json", "--top", "3"])
    assert res.exit_code == 0, res.output
    d = json.loads(res.output)
    validate(d)
    assert d["schema"] == SCHEMA == "cudatrace.diff/1"
    assert len(d["sites"]) == 3 and d["more_sites"] == 2
    res = CliRunner().invoke(main, ["diff", str(a), str(b), "--depth", "2"])
    assert res.exit_code == 0 and "load_weights" in res.output


def test_cli_diff_missing(runs, tmp_path):
    a, _ = runs
    res = CliRunner().invoke(main, ["diff", str(a), str(tmp_path / "nope")])
    assert res.exit_code == 2 and "nope" in res.output
    with pytest.raises(CudatraceError) as e:
        run_diff(tmp_path / "nope", a)
    assert e.value.status == 2
