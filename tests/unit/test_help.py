"""`--help`: every option of every command explained, required ones marked, defaults shown;
`cudatrace --help` lists each command once, in a whole sentence; shell completion works as
README.md says."""

from __future__ import annotations

import click
import pytest
from click.testing import CliRunner

from cudatrace.cli import COMMANDS, SECTIONS, main


def _command(name: str) -> click.Command:
    cmd = main.get_command(click.Context(main), name)
    assert cmd is not None
    return cmd


def _options(name: str) -> list[click.Option]:
    return [p for p in _command(name).params if isinstance(p, click.Option) and p.name != "help"]


@pytest.mark.parametrize("name", list(COMMANDS))
def test_every_option_is_explained(name):
    bare = [o.opts[-1] for o in _options(name) if not (o.help or "").strip()]
    assert not bare, f"{name}: options without help: {bare}"


@pytest.mark.parametrize("name", list(COMMANDS))
def test_defaults_are_shown(name):
    hidden = [
        o.opts[-1]
        for o in _options(name)
        if not o.is_flag
        and not o.multiple
        and o.default not in (None, False)
        and not isinstance(o.default, type(click.Option(["--x"]).default))  # click's UNSET
        and not o.show_default
    ]
    assert not hidden, f"{name}: options whose default --help does not show: {hidden}"


@pytest.mark.parametrize("name", list(COMMANDS))
def test_required_options_are_marked(name):
    text = CliRunner().invoke(main, [name, "--help"]).output
    for o in _options(name):
        if o.required:
            assert "[required]" in text, (name, o.opts)
    if name == "sweep":  # --values is required unless --from replays a recorded sweep
        values = next(o for o in _options(name) if o.name == "values")
        assert "[required, unless --from]" in values.help


def test_commands_are_listed_once_in_whole_sentences():
    r = CliRunner().invoke(main, ["--help"], terminal_width=80)
    assert r.exit_code == 0, r.output
    commands = r.output.split("Tracing a program:\n", 1)[1]
    for name, (_, sentence) in COMMANDS.items():
        assert sentence.endswith(".") and not sentence.endswith("...."), sentence
        assert r.output.count(f"  {name} ") == 1, (name, r.output)
        assert f"  {name.ljust(16)}  {sentence}\n" in commands, (name, commands)
    assert "..." not in commands


def test_commands_are_listed_in_their_sections():
    """`cudatrace --help` lists what a person tracing a program uses apart from what an
    operator runs on nodes and clusters: every command in one section, in COMMANDS' order."""
    assert list(SECTIONS.values()) == ["run", "status"]
    out = CliRunner().invoke(main, ["--help"], terminal_width=80).output
    tracing, operators = out.split("Tracing a program:\n", 1)[1].split(
        "Nodes and clusters (operators):\n"
    )
    for name in ("run", "report", "diff", "sweep", "doctor", "demo"):
        assert f"\n  {name} " in "\n" + tracing and f"  {name} " not in operators, name
    for name in ("node", "cdi", "webhook", "dra-plugin", "manifests", "slurm-taskprolog"):
        assert f"  {name} " in operators and f"  {name} " not in tracing, name
    assert "Commands:" not in out


def test_a_command_help_is_its_own():
    """The sections are the group's: `cudatrace COMMAND --help` is the command's page."""
    out = CliRunner().invoke(main, ["report", "--help"], prog_name="cudatrace").output
    assert out.startswith("Usage: cudatrace report [OPTIONS] PATH...")
    assert "Tracing a program" not in out and "operators" not in out


def test_demo_help_names_every_step():
    text = " ".join(CliRunner().invoke(main, ["demo", "--help"]).output.split())
    for step in ("traces it", "reports", "diffs", "--budget 12GiB", "sweeps --kv-cache-memory"):
        assert step in text, (step, text)


def test_shell_completion_completes_commands_and_options():
    env = {"_CUDATRACE_COMPLETE": "bash_source"}
    script = CliRunner().invoke(main, [], prog_name="cudatrace", env=env).output
    assert "_cudatrace_completion()" in script and "complete " in script
    env = {"_CUDATRACE_COMPLETE": "bash_complete", "COMP_WORDS": "cudatrace rep", "COMP_CWORD": "1"}
    assert "plain,report" in CliRunner().invoke(main, [], prog_name="cudatrace", env=env).output
    env["COMP_WORDS"], env["COMP_CWORD"] = "cudatrace run --sim", "2"
    out = CliRunner().invoke(main, [], prog_name="cudatrace", env=env).output.split()
    assert "plain,--simulated" in out and "plain,--sim-memory" in out, out
