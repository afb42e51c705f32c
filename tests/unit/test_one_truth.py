"""One truth across outputs (issue 44): the report's figures agree with what the budget's ledger
and the launcher saw, and its words say what happened."""

from __future__ import annotations

import json
import sys

from click.testing import CliRunner

from cudatrace.analyze.documents.analysis import Analysis
from cudatrace.analyze.documents.report import build_report
from cudatrace.cli import main
from cudatrace.present.html.page import _processes_html
from cudatrace.present.report import render_text
from cudatrace.present.summary import print_summary
from support import tracegen as tg
from support.fixture_elf import elf, fake_sym  # noqa: F401  (fixtures)

GiB, MiB, MS = tg.GiB, tg.MiB, tg.MS


def at(ms: float) -> int:
    return tg.BASE_TS + int(ms * MS)


def report_json(path, sym, **kw) -> dict:
    return json.loads(json.dumps(build_report(Analysis(path, symbolizer=sym), **kw)))


# ---- a process that exits holds its memory until the launcher saw it end ---------------------


def _two_servers(d, seen_ms: float | None) -> None:
    """Server A takes 1.5 GiB and exits holding it (exit record at 100 ms); server B takes 1.5
    GiB at 150 ms, while A is still being torn down: the launcher saw A end at seen_ms."""
    a = tg.TraceWriter(d / "11.0.ctrace", pid=11, argv=["server-a"])
    a.alloc(at(10), 1536 * MiB, 0x1000)
    a.close(end_ts=at(100))
    b = tg.TraceWriter(d / "12.0.ctrace", pid=12, argv=["server-b"])
    b.alloc(at(150), 1536 * MiB, 0x2000)
    b.close(end_ts=at(300))
    exits = (
        []
        if seen_ms is None
        else [{"pid": 11, "start_ticks": 12345, "exit_monotonic_ns": at(seen_ms)}]
    )
    tg.write_run(d, start_ns=tg.BASE_TS, extra={"exits": exits})


def test_an_exiting_process_holds_its_memory_until_the_launcher_saw_it_end(tmp_path, fake_sym):
    # the ledger counted A's 1.5 GiB until A was gone (200 ms), so B's allocation at 150 ms met
    # "in use 3.00 GiB"; the report dropped A's memory at its exit record: peak 1.50 GiB
    _two_servers(tmp_path, seen_ms=200)
    r = report_json(tmp_path, fake_sym)
    assert r["peak_bytes"] == 3 * GiB and r["peak_time"] == 0.15, (r["peak_bytes"], r["peak_time"])
    assert {s["label"] for s in r["sites"]} and r["total_live_bytes"] == 3 * GiB
    # A's memory ends when the launcher saw A end, not later
    late = report_json(tmp_path, fake_sym, at="0.25")
    assert late["total_live_bytes"] == 1536 * MiB, late["total_live_bytes"]


def test_without_the_launchers_sight_the_exit_record_ends_it(tmp_path, fake_sym):
    _two_servers(tmp_path, seen_ms=None)
    r = report_json(tmp_path, fake_sym)
    assert r["peak_bytes"] == 1536 * MiB


# ---- --at names a moment of the run ----------------------------------------------------------


def _short_run(d, with_run_json: bool = True) -> None:
    """A 46 ms run that exits holding 2.5 GiB."""
    w = tg.TraceWriter(d / "21.0.ctrace", pid=21)
    w.alloc(at(10), 2560 * MiB, 0x1000)
    w.close(end_ts=at(46))
    if with_run_json:
        tg.write_run(d, start_ns=tg.BASE_TS, extra={"end_time": 1_700_000_000.046})


def test_at_after_the_run_is_an_error_not_nothing_live(tmp_path, fake_sym):
    _short_run(tmp_path)
    r = CliRunner().invoke(main, ["report", str(tmp_path), "--at", "99s"])
    assert r.exit_code == 2, r.output
    assert "--at 99s: the run lasted 0.046 s" in r.output and "--at end" in r.output, r.output
    assert "0 B" not in r.output
    # within the run, and at its very end, it answers
    assert report_json(tmp_path, fake_sym, at="0.02")["total_live_bytes"] == 2560 * MiB
    assert report_json(tmp_path, fake_sym, at="0.046")["total_live_bytes"] == 0
    # without run.json the run ends with its last event
    bare = tmp_path / "bare"
    bare.mkdir()
    _short_run(bare, with_run_json=False)
    r = CliRunner().invoke(main, ["report", str(bare), "--at", "1s"])
    assert r.exit_code == 2 and "the run lasted 0.046 s" in r.output, r.output


def test_a_run_shorter_than_one_sample_is_said_so(tmp_path, fake_sym, capsys):
    # it said "the run's allocations came and went between samples" of a 46 ms run sampled
    # every 100 ms: the one sample came after the run
    w = tg.TraceWriter(tmp_path / "21.0.ctrace", pid=21)
    w.alloc(at(10), 2560 * MiB, 0x1000)
    w.close(end_ts=at(46))
    extra = {
        "end_time": 1_700_000_000.046,
        "sampler": {"samples": 1, "interval_ms": 100.0, "nvml": False, "nvml_why": "none here"},
    }
    tg.write_run(tmp_path, start_ns=tg.BASE_TS, samples=[tg.sample(at(120))], extra=extra)
    text = render_text(build_report(Analysis(tmp_path, symbolizer=fake_sym)))
    said = "the run lasted 46 ms, less than one sample interval (100 ms): no sample fell while its memory was live"
    assert said in text, text
    assert "came and went" not in text
    print_summary(tmp_path, 0, sys.stdout)
    assert f"observed: {said}" in capsys.readouterr().out


# ---- one numbering of sites in every table ---------------------------------------------------


def test_the_never_freed_table_keeps_the_numbers_of_the_sites_table(tmp_path, elf, fake_sym):
    # at the peak: load_weights 4 GiB (#1), alloc_activations 2 GiB (#2), grow_cache 1 GiB
    # (#3, never freed); after the peak make_workspace takes 64 MiB and keeps it. The table
    # "Never freed by exit" numbered grow_cache #1 and make_workspace #2.
    fr = tg.Frames(elf)
    w = tg.TraceWriter(tmp_path / "31.0.ctrace", pid=31, exe=str(elf))
    fr.write_modules(w)
    stack = {
        f: w.stack(fr.stack(f, "main"))
        for f in ("load_weights", "alloc_activations", "grow_cache", "make_workspace")
    }
    w.alloc(at(10), 4 * GiB, 0x1000, stack=stack["load_weights"])
    w.alloc(at(20), 2 * GiB, 0x2000, stack=stack["alloc_activations"])
    w.alloc(at(30), GiB, 0x3000, stack=stack["grow_cache"])
    w.free(at(40), 0x1000)
    w.free(at(50), 0x2000)
    w.alloc(at(60), 64 * MiB, 0x4000, stack=stack["make_workspace"])
    w.close(end_ts=at(70))
    r = build_report(Analysis(tmp_path, symbolizer=fake_sym))
    number = {s["label"].split()[0]: s["rank"] for s in r["sites"]}
    assert number == {"load_weights": 1, "alloc_activations": 2, "grow_cache": 3}, number
    never = {s["label"].split()[0]: s["rank"] for s in r["never_freed"]["sites"]}
    assert never == {"grow_cache": 3, "make_workspace": 4}, never
    text = render_text(r)
    assert "#3 grow_cache" in text.split("Never freed by exit")[1], text
    assert "#4 make_workspace" in text.split("Never freed by exit")[1], text


# ---- how a process ended, as the launcher saw it ---------------------------------------------


def test_a_command_killed_by_sigkill_is_said_so(tmp_path, fake_sym):
    # it read "truncated (no clean exit record: killed, crashed or still running)" though the
    # launcher's wait saw signal 9
    w = tg.TraceWriter(tmp_path / "41.0.ctrace", pid=41, ppid=40)
    w.alloc(at(10), GiB, 0x1000)
    w.close(clean=False)
    child = tg.TraceWriter(tmp_path / "42.0.ctrace", pid=42, ppid=41)
    child.alloc(at(12), MiB, 0x2000)
    child.close(clean=False)
    exits = [{"pid": 41, "start_ticks": 12345, "exit_monotonic_ns": at(30)}]
    tg.write_run(
        tmp_path,
        start_ns=tg.BASE_TS,
        extra={"pid": 41, "returncode": -9, "exit_status": 137, "exits": exits},
    )
    r = build_report(Analysis(tmp_path, symbolizer=fake_sym))
    procs = {p["pid"]: p for p in r["processes"]}
    assert procs[41]["signal"] == 9 and "signal" not in procs[42]
    text = render_text(r)
    assert (
        "killed by signal 9 (SIGKILL) at 0.030 s, as the launcher saw it (no exit record)" in text
    ), text
    # its child's end was not seen: no guess
    assert "truncated (no clean exit record: killed, crashed or still running)" in text
    # the HTML page says it in the same words
    assert "killed by signal 9 (SIGKILL) at 0.030 s, as the launcher saw it" in _processes_html(r)


# ---- a folder of separate runs is not one run of many ranks ----------------------------------


def _one_run(d, pid: int, argv: list[str], start_s: float, took_s: float, env=None) -> None:
    """A run of argv launched start_s seconds after the first, lasting took_s, holding 1 GiB."""
    d.mkdir(parents=True)
    info = {f"env.{k}": v for k, v in (env or {}).items()}
    w = tg.TraceWriter(
        d / f"{pid}.0.ctrace",
        pid=pid,
        argv=argv,
        info=info,
        realtime_ns=(1_700_000_000 + int(start_s)) * tg.SEC,
    )
    w.alloc(at(10), GiB, 0x1000 + pid)
    w.close(end_ts=at(took_s * 1000))
    t0 = 1_700_000_000.0 + start_s
    tg.write_run(
        d, argv=argv, start_ns=tg.BASE_TS, extra={"start_time": t0, "end_time": t0 + took_s}
    )


def test_a_folder_of_separate_runs_is_refused_with_each_listed(tmp_path, fake_sym):
    # six runs of different commands, minutes apart, no rank variable: read as "one run of 5
    # ranks" with a peak no run had
    runs = tmp_path / "runs"
    cmds = [["python3", "train.py", f"--batch={b}"] for b in (8, 16, 32)] + [
        ["./server", "--port", "80"],
        ["./bench"],
        ["./server", "--kv", "1GiB"],
    ]
    for i, argv in enumerate(cmds):
        _one_run(runs / f"run{i}", 100 + i, argv, start_s=120.0 * i, took_s=3.0)
    r = CliRunner().invoke(main, ["report", str(runs)])
    assert r.exit_code == 2, r.output
    assert (
        f"{runs} holds 6 trace directories of separate runs, not the ranks of one run" in r.output
    ), r.output
    for i, argv in enumerate(cmds):
        line = next(x for x in r.output.splitlines() if x.strip().startswith(str(runs / f"run{i}")))
        assert " ".join(argv) in line and ", 3.0 s" in line, line
    assert f"cudatrace report {runs / 'run0'}" in r.output
    assert f"cudatrace diff {runs / 'run0'} {runs / 'run1'}" in r.output
    assert "cudatrace sweep --from" in r.output
    # named one by one, the same
    r = CliRunner().invoke(main, ["report", str(runs / "run0"), str(runs / "run3")])
    assert r.exit_code == 2 and "these 2 trace directories of separate runs" in r.output, r.output
    # each run alone reads as it is
    assert report_json(runs / "run3", fake_sym)["peak_bytes"] == GiB


def test_runs_at_one_time_or_with_ranks_are_one_run(tmp_path, fake_sym):
    # two services traced at the same time (co-tenants of one GPU): one picture of both
    both = tmp_path / "cotenants"
    _one_run(both / "a", 201, ["./service-a"], start_s=0.0, took_s=5.0)
    _one_run(both / "b", 202, ["./service-b"], start_s=1.0, took_s=5.0)
    assert report_json(both, fake_sym)["peak_bytes"] == 2 * GiB
    # ranks launched one after the other still carry their rank: read as one run
    ranked = tmp_path / "ranked"
    for r in range(2):
        _one_run(
            ranked / f"r{r}",
            300 + r,
            ["train.py"],
            start_s=60.0 * r,
            took_s=2.0,
            env={"RANK": str(r), "WORLD_SIZE": "2"},
        )
    assert len(report_json(ranked, fake_sym)["ranks"]["ranks"]) == 2
