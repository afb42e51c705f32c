"""The text report's shape: the answer first (the peak and the sites live then, before the
run's details), colour on a terminal only (never with NO_COLOR), and the notes that say when an
option changed nothing (--depth)."""

from __future__ import annotations

import io
import json

import pytest
from click.testing import CliRunner

from cudatrace.analyze.documents.analysis import Analysis
from cudatrace.analyze.documents.report import build_report
from cudatrace.cli import main
from cudatrace.present.report import render_text
from cudatrace.present.text import use_colour
from support import tracegen as tg
from support.fixture_elf import elf, fake_sym  # noqa: F401  (fixtures)


@pytest.fixture(scope="module")
def report(tmp_path_factory, elf):
    d = tmp_path_factory.mktemp("run") / "trace"
    tg.write_scenario(d, elf=elf)
    return d


def _lines(d, sym, **kw) -> list[str]:
    return render_text(build_report(Analysis(d, symbolizer=sym), **kw), width=200).splitlines()


def _first(lines: list[str], start: str) -> int:
    return next(i for i, x in enumerate(lines) if x.startswith(start))


def test_the_answer_comes_first(report, fake_sym):
    L = _lines(report, fake_sym)
    peak = _first(L, "Peak: ")
    sites = _first(L, "Device memory live at the peak")
    top = _first(L, "  4.00 GiB   57.1%")
    run = _first(L, "The run:")
    observed = _first(L, "Traced versus observed")
    # the title and the command, then the peak, then who held it: within the first screen
    assert peak == 3 and sites < 10 and top == sites + 2, L[:12]
    # failures and what was never freed come with the answer, before how the run went
    assert sites < _first(L, "Failed allocations") < _first(L, "Never freed") < run < observed
    assert _first(L, "  processes   2 traced") == run + 1


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_colour_on_a_terminal_only(report, fake_sym, monkeypatch):
    monkeypatch.delenv("NO_COLOR", raising=False)
    monkeypatch.setenv("TERM", "xterm-256color")
    assert use_colour(_Tty()) and not use_colour(io.StringIO())
    monkeypatch.setenv("NO_COLOR", "1")
    assert not use_colour(_Tty())
    monkeypatch.delenv("NO_COLOR")
    monkeypatch.setenv("TERM", "dumb")
    assert not use_colour(_Tty())

    r = build_report(Analysis(report, symbolizer=fake_sym))
    plain, coloured = render_text(r, width=200), render_text(r, width=200, colour=True)
    assert "\x1b[" not in plain
    assert "\x1b[1mPeak: 7.00 GiB of device memory live at 1.750 s\x1b[0m" in coloured
    assert "\x1b[1;31mBudget denials: 1\x1b[0m" in coloured
    # the same text under the styles: nothing but escapes was added
    assert (
        coloured.replace("\x1b[1m", "")
        .replace("\x1b[1;36m", "")
        .replace("\x1b[1;31m", "")
        .replace("\x1b[2m", "")
        .replace("\x1b[33m", "")
        .replace("\x1b[0m", "")
        == plain
    )


def test_report_into_a_pipe_has_no_colour(report, monkeypatch):
    monkeypatch.delenv("NO_COLOR", raising=False)
    r = CliRunner().invoke(main, ["report", str(report)])
    assert r.exit_code == 0, r.output
    assert "Peak: 7.00 GiB" in r.output and "\x1b[" not in r.output


def test_depth_that_splits_nothing_says_so(report, fake_sym):
    notes = build_report(Analysis(report, symbolizer=fake_sym), depth=3)["warnings"]
    assert any(n.startswith("--depth 3: no call site splits at this depth") for n in notes), notes
    assert not any(
        n.startswith("--depth")
        for n in build_report(Analysis(report, symbolizer=fake_sym))["warnings"]
    )


def test_html_on_stdout_is_the_only_output(report, tmp_path):
    r = CliRunner().invoke(main, ["report", str(report), "--html", "-"])
    assert r.exit_code == 0, r.output
    assert r.output.startswith("<!DOCTYPE html>") and r.output.rstrip().endswith("</html>")
    assert r.output.count("<!DOCTYPE html>") == 1 and "HTML report written" not in r.output
    for extra in (["--json"], ["--svg", "-"], ["--tree"]):
        r = CliRunner().invoke(main, ["report", str(report), "--html", "-", *extra])
        assert r.exit_code == 2 and "standard output" in r.output, (extra, r.output)
    # a file and the JSON on stdout: JSON and nothing else
    r = CliRunner().invoke(
        main, ["report", str(report), "--html", str(tmp_path / "p.html"), "--json"]
    )
    assert r.exit_code == 0 and json.loads(r.output)["schema"] == "cudatrace.report/1"


def test_diff_html_on_stdout_is_the_only_output(report):
    r = CliRunner().invoke(main, ["diff", str(report), str(report), "--html", "-"])
    assert r.exit_code == 0, r.output
    assert r.output.startswith("<!DOCTYPE html>") and "cudatrace diff\n" not in r.output
    r = CliRunner().invoke(main, ["diff", str(report), str(report), "--html", "-", "--json"])
    assert r.exit_code == 2 and "--html and --json both write to standard output" in r.output


def test_dev_stdout_is_refused_with_the_way_to_stdout(report):
    r = CliRunner().invoke(main, ["report", str(report), "--html", "/dev/stdout"])
    assert r.exit_code == 2, r.output
    assert "/dev/stdout is a symbolic link" in r.output and "write `-` for standard output" in (
        r.output
    )
