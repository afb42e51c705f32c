"""The commands floor: option groups defined once and shared, values parsed once at the
command line, one error voice (cudatrace: MESSAGE, the error's status), export attributed as
report is."""

from __future__ import annotations

import pytest
from click.testing import CliRunner
from test_fold import ALLOC, NameSymbolizer, write_engine

from cudatrace.attribution import Attribution
from cudatrace.cli import main
from cudatrace.commands.export import run_export
from cudatrace.commands.options import Moment, _attribution
from cudatrace.errors import RUN_FAILED, CudatraceError
from support import tracegen as tg


def cli(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


@pytest.mark.parametrize(
    "args, said",
    [
        (["report", "{d}", "--at", "soon"], "cudatrace: --at 'soon' is not peak, end or a time"),
        (["export", "{d}", "--format", "folded", "-o", "{o}", "--at", "1m"], "cudatrace: --at"),
        (["run", "--budget", "8X", "--", "true"], "cudatrace: --budget 8X: "),
        (
            ["sweep", "--grace", "5x", "--values", "1,2", "--", "echo", "{}"],
            "cudatrace: --grace 5x",
        ),
        (["report", "{d}/nope"], "cudatrace: {d}/nope: no such trace directory or file"),
        (["export", "{d}", "--format", "svg", "-o", "{o}"], "cudatrace: unknown export format"),
        (["status", "--reset"], "cudatrace: status --reset needs a GROUP"),
    ],
)
def test_errors_are_said_once_with_their_status(tmp_path, args, said):
    d = tmp_path / "t"
    tg.write_scenario(d)
    sub = {"{d}": str(d), "{o}": str(tmp_path / "out")}

    def fill(x):
        for k, v in sub.items():
            x = x.replace(k, v)
        return x

    r = cli(*[fill(a) for a in args])
    # run passes CMD's status through: its own errors have a status apart (docs/exit-codes.md)
    assert r.exit_code == (RUN_FAILED if args[0] == "run" else 2), r.output
    assert r.output.startswith(fill(said)), r.output
    assert r.output.count("cudatrace:") == 1 and "Error:" not in r.output
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "args, status, meant",
    [
        (["run", "--simulatd", "--", "true"], RUN_FAILED, "--simulated"),
        (["run", "--budjet", "3GiB", "true"], RUN_FAILED, "--budget"),
        (["run", "-x", "--", "true"], RUN_FAILED, None),
        (["sweep", "--valuse", "1,2", "--", "echo", "{}"], 2, "--values"),
        (["doctor", "--jsn", "true"], 2, "--json"),
    ],
)
def test_an_unknown_option_before_the_command_is_a_typo_not_the_command(args, status, meant):
    # it was run as the command: "cudatrace: --simulatd: command not found", exit 127
    r = cli(*args)
    assert r.exit_code == status, r.output
    assert f"No such option '{args[1]}'" in r.output, r.output
    if meant:
        assert f"'{meant}'" in r.output.split("Did you mean", 1)[1], r.output
    assert "command not found" not in r.output


def test_what_follows_the_command_is_the_commands_own(tmp_path):
    r = cli("run", "-q", "-o", tmp_path / "t", "sh", "-c", "exit 3", "--budjet")
    assert r.exit_code == 3, r.output


def test_every_reporting_command_takes_the_attribution_options():
    flags = {"--fold", "--no-fold", "--full-names", "--python-only", "--native-only"}
    for name in ("report", "diff", "export", "sweep"):
        cmd = main.get_command(None, name)
        have = {o for p in cmd.params for o in p.opts}
        assert flags <= have, (name, flags - have)
        assert ("--depth" in have) == (name != "export"), name  # export writes whole stacks


def test_option_groups_build_one_value():
    assert _attribution(2, ("x",), True, True, "python", True) == Attribution(
        depth=2,
        fold=False,
        fold_patterns=("x",),
        full_names=True,
        view="python",
        show_cuda_frames=True,
    )
    assert _attribution() == Attribution()


def folded(d, out, sym, **attribution) -> dict[tuple, int]:
    """stack (function names, outermost first) -> bytes, of a folded export."""
    run_export(d, "folded", out, Moment(), Attribution(**attribution), symbolizer=sym, quiet=True)
    rows = [line.rsplit(" ", 1) for line in out.read_text().splitlines()]
    return {tuple(f.split(" (")[0] for f in stack.split(";")): int(n) for stack, n in rows}


def test_export_is_attributed_as_report_is(tmp_path):
    """--no-fold and --fold reach the exported stacks: the allocator layers of a written
    engine are folded by default, kept with --no-fold, and a named function folds too."""
    d = tmp_path / "t"
    fr = write_engine(d)
    sym = NameSymbolizer(fr)
    plain = folded(d, tmp_path / "a.folded", sym)
    raw = folded(d, tmp_path / "b.folded", sym, fold=False)
    forced = folded(d, tmp_path / "c.folded", sym, fold_patterns=("kv_buffer",))
    assert sum(plain.values()) == sum(raw.values()) == sum(forced.values())
    assert {s[-1] for s in plain} == {"kv_buffer", "load_weights", "workspace", "build_table"}
    assert all(s[-3:] == tuple(reversed(ALLOC)) for s in raw), raw
    assert "kv_buffer" not in {s[-1] for s in forced} and "init_kv" in {s[-1] for s in forced}
    with pytest.raises(CudatraceError) as e:
        run_export(d, "folded", tmp_path / "x", Moment(), Attribution(fold_patterns=("(",)))
    assert e.value.status == 2 and "--fold" in str(e.value)


@pytest.mark.parametrize("where", ["click.Group.make_context", "the command's body"])
def test_ctrl_c_exits_130(monkeypatch, where):
    # a SIGINT while the command line was read gave click's "Aborted!" and status 1: for `run`,
    # a status CMD never had
    import click

    from cudatrace.commands import report

    def interrupted(*a, **kw):
        raise KeyboardInterrupt

    if where.startswith("click"):
        monkeypatch.setattr(click.Group, "make_context", interrupted)
    else:
        monkeypatch.setattr(report, "run_report", interrupted)
    r = CliRunner().invoke(main, ["report", "."])
    assert r.exit_code == 130, r.output
    assert "cudatrace: interrupted" in r.output and "Aborted!" not in r.output
