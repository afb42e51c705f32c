"""Rough edges of `cudatrace report`: malformed launcher files, group runs without a budget,
control characters from a trace, the error prefix."""

from __future__ import annotations

import io
import json

import pytest

from cudatrace.commands.options import Moment
from cudatrace.commands.report import run_report
from support import tracegen as tg


@pytest.fixture
def scen(tmp_path):
    tg.write_scenario(tmp_path / "s")
    return tmp_path / "s"


def report(path, at="peak"):
    out = io.StringIO()
    run_report(path, moment=Moment(at=at), out=out)
    return 0, out.getvalue()


def test_bad_samples_are_not_blamed_on_at(scen, capsys):
    with open(scen / "samples.jsonl", "a") as f:
        f.write('{"t": "soon", "pids": [1]}\n[]\n{"t": 5, "devices": "many"}\n"x"\n')
    rc, text = report(scen, at="2.0s")
    err = capsys.readouterr().err
    assert rc == 0, err
    assert "--at" not in err
    assert "4 malformed line(s) of samples*.jsonl" in text


@pytest.mark.parametrize(
    "content", ["null", "[1, 2]", '{"argv": "rm -rf /", "start_monotonic_ns": "x"}']
)
def test_run_json_of_the_wrong_shape(scen, capsys, content):
    (scen / "run.json").write_text(content)
    rc, text = report(scen)
    err = capsys.readouterr().err
    assert rc == 0, err
    assert "run.json" in text
    assert "Traceback" not in err


def test_group_run_without_budget_shows_no_raw_dict(tmp_path):
    tg.write_scenario(tmp_path / "s", budget=None)
    run = json.loads((tmp_path / "s" / "run.json").read_text())
    run["budget"] = {"group": "gz", "path": "/dev/shm/cudatrace-0/gz.ledger", "limits": {}}
    run["group"] = "gz"
    (tmp_path / "s" / "run.json").write_text(json.dumps(run))
    rc, text = report(tmp_path / "s")
    assert rc == 0
    line = next(x for x in text.splitlines() if x.strip().startswith("budget"))
    assert "{" not in line and "group gz" in line, line


def test_control_characters_from_a_trace_are_escaped(tmp_path):
    d = tmp_path / "s"
    d.mkdir()
    w = tg.TraceWriter(
        d / "7.0.ctrace",
        pid=7,
        exe="/bin/\x1b[31mred",
        argv=["app", "\x1b]0;owned\x07", "two words"],
    )
    w.alloc(w.start_ns + 1000, 1 << 20, 0x7000000)
    w.close()
    rc, text = report(d)
    assert rc == 0
    assert "\x1b" not in text and "\x07" not in text
    assert "\\x1b[31mred" in text
    assert "'two words'" in text  # argv shell-quoted


def test_status_errors_use_the_common_prefix_and_status(tmp_path, monkeypatch):
    from click.testing import CliRunner

    from cudatrace.cli import main

    d = tmp_path / "ledgers"
    d.mkdir(mode=0o700)
    monkeypatch.setenv("CUDATRACE_LEDGER_DIR", str(d))
    r = CliRunner().invoke(main, ["status", "nosuch"])
    assert r.exit_code == 2
    assert r.output.startswith("cudatrace: no budget group 'nosuch'"), r.output
    assert "Error:" not in r.output


def test_denial_and_failure_lines_state_each_request_size(tmp_path):
    d = tmp_path / "s"
    d.mkdir()
    w = tg.TraceWriter(d / "7.0.ctrace", pid=7)
    s = w.stack([0x401000])
    for i in range(2):
        w.deny(w.start_ns + 1000 + i, 40 << 20, limit=64 << 20, in_use=32 << 20, stack=s)
        w.alloc(w.start_ns + 2000 + i, 40 << 20, 0, result=2, stack=s)
    w.close()
    rc, text = report(d)
    assert rc == 0
    assert "2 x 40.00 MiB requested" in text or "2 x 40.0 MiB requested" in text, text
    assert "80.0" not in text, text


@pytest.mark.parametrize("backend", ["c", "python"])
def test_release_of_an_imported_vmm_handle_is_not_an_unmatched_free(tmp_path, backend):
    from cudatrace.analyze.read.trace import read_dir
    from support.replay_oracle import build_with

    d = tmp_path / "s"
    d.mkdir()
    w = tg.TraceWriter(d / "7.0.ctrace", pid=7)
    w.event(w.start_ns + 1000, "cuMemImportFromShareableHandle", size=2 << 20, addr=0x55)
    w.event(w.start_ns + 2000, "cuMemRelease", addr=0x55)
    w.close()
    m = build_with(read_dir(d), backend)
    assert m.counts["unmatched_frees"] == 0 and m.counts["unimports"] == 1
    if backend == "c":
        rc, text = report(d)
        assert "matched no traced allocation" not in text


def test_implausible_peak_is_flagged(tmp_path):
    d = tmp_path / "s"
    d.mkdir()
    w = tg.TraceWriter(d / "7.0.ctrace", pid=7)
    w.meminfo(w.start_ns + 500, free=15 << 30, total=16 << 30)
    w.alloc(w.start_ns + 1000, 94 << 40, 0x7000000)  # a corrupt size: 94 TiB
    w.close()
    rc, text = report(d)
    assert rc == 0
    # (the temporary path holds the test's name: look for the note itself)
    assert "implausible: the traced peak on device 0, 94.0 TiB" in text, text
    assert "16.0 GiB (the device's total)" in text, text


def test_plausible_peak_is_not_flagged(tmp_path):
    d = tmp_path / "s"
    d.mkdir()
    w = tg.TraceWriter(d / "7.0.ctrace", pid=7)
    w.meminfo(w.start_ns + 500, free=15 << 30, total=16 << 30)
    w.alloc(w.start_ns + 1000, 4 << 30, 0x7000000)
    w.close()
    rc, text = report(d)
    assert rc == 0 and "implausible:" not in text


def test_at_past_the_end_says_so_in_its_heading(scen):
    rc, text = report(scen, at="9s")
    assert rc == 0
    head = next(x for x in text.splitlines() if x.startswith("Device memory live at 9.000 s"))
    assert "after the last event" in head, head
