"""The cudatrace command line: the group and the list of its commands.

Each command lives in its own module of `commands/` (its click function and its body); this
module names them and loads only the one invoked, so that `cudatrace run` starts with click,
`commands/options.py` and `commands/run.py` alone (tests/integration/test_startup.py).

Errors: a command raises `CudatraceError` (errors.py); `Main.invoke` catches it once, prints
`cudatrace: MESSAGE` on stderr and exits with its status (`run`'s own errors with a status of
their own, apart from CMD's: docs/exit-codes.md). A command returns its exit status (None: 0).
"""

from __future__ import annotations

import errno
import importlib
import os
import sys
from typing import Any

import click

from . import __version__
from .errors import INTERRUPTED, RUN_FAILED, RUN_STATUSES, CudatraceError, Signalled

# name -> (module of commands/ (the click function has the command's name), what it does: the
# one line `cudatrace --help` lists it with, whole, without loading the module)
COMMANDS = {
    "run": ("run", "Run a command with its device memory traced (or bounded)."),
    "report": ("report", "Say who held the device memory at the peak, by call site."),
    "diff": ("diff", "Compare two runs: the call sites that grew or shrank."),
    "export": ("export", "Write a trace for other tools: pprof, speedscope, Perfetto."),
    "sweep": ("sweep", "Run at several values of a flag; fit how each site grows."),
    "doctor": ("doctor", "Say what a run would see on this machine, and what to do."),
    "demo": ("demo", "The KV-pool defect, traced, diffed, bounded and swept."),
    "status": ("status", "Show the budgets in force and who uses them."),
    "top": ("top", "Watch the GPUs live: processes, budgets, sites, denials."),
    "metrics": ("metrics", "Serve budgets and traced runs to Prometheus."),
    "slurm-prolog": ("slurm", "Seal a Slurm job's share of its GPU as its budget (root)."),
    "slurm-epilog": ("slurm", "Remove a Slurm job's fence record when it ends (root)."),
    "slurm-taskprolog": ("slurm", "Load the preload library into a Slurm job's tasks."),
    "cdi": ("cdi", "Write CDI specs whose devices are budgets, for containers."),
    "node": ("node", "Run the node agent for containers and Kubernetes."),
    "webhook": ("webhook", "Serve the admission webhook that fences annotated pods."),
    "dra-plugin": ("dra", "Serve the DRA plugin: claims of GPU memory become budgets."),
    "manifests": ("manifests", "Write Kubernetes manifests or a systemd unit for these."),
}

# `cudatrace --help`'s sections, each by its first command: those of a person tracing or
# bounding a program, then those an operator runs on nodes or installs into clusters
SECTIONS = {"Tracing a program": "run", "Nodes and clusters (operators)": "status"}


class Main(click.Group):
    """The `cudatrace` group: commands loaded when used; one place where errors are said."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name not in COMMANDS:
            return None
        module = importlib.import_module(f".commands.{COMMANDS[name][0]}", __package__)
        command: click.Command = getattr(module, name.replace("-", "_"))
        return command

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """The commands in their SECTIONS, whole sentences (click would cut their docstrings)."""
        names, width = list(COMMANDS), max(map(len, COMMANDS))
        at = [names.index(first) for first in SECTIONS.values()] + [len(names)]
        for title, a, b in zip(SECTIONS, at, at[1:]):
            with formatter.section(title):  # one column for the sentences of every section
                formatter.write_dl([(n.ljust(width), COMMANDS[n][1]) for n in names[a:b]])

    def make_context(self, *args: Any, **kw: Any) -> click.Context:
        try:
            return super().make_context(*args, **kw)
        except KeyboardInterrupt:  # while the command line is read
            raise _interrupted() from None

    def invoke(self, ctx: click.Context) -> Any:
        if "libcudatrace" in os.environ.get("LD_PRELOAD", ""):
            from .native import exempt_this_process

            exempt_this_process()  # before anything reads NVML or the driver through the shim
        try:
            status = super().invoke(ctx)
            sys.stdout.flush()  # a full disk or a closed pipe on stdout is said here, once
        except click.ClickException as e:  # click's own: a bad option value, a missing argument
            # click declares exit_code on the class; the instance's own is what it exits with
            e.exit_code = _own_status(ctx, e.exit_code)  # type: ignore[misc]
            raise
        except CudatraceError as e:
            click.echo(f"cudatrace: {e}", err=True)
            ctx.exit(e.status if isinstance(e, Signalled) else _own_status(ctx, e.status))
        except KeyboardInterrupt:
            raise _interrupted() from None
        except OSError as e:
            if e.errno not in (errno.ENOSPC, errno.EPIPE, errno.EDQUOT, errno.EIO, errno.EFBIG):
                raise
            _drop_stdout()
            if e.errno != errno.EPIPE:  # a reader that went away needs no message
                click.echo(f"cudatrace: cannot write the output: {e.strerror or e}", err=True)
            ctx.exit(1)
        if status:
            ctx.exit(status)
        return status


def _interrupted() -> click.exceptions.Exit:
    """Ctrl-C (SIGINT), said once with a shell's status for it, never click's "Aborted!" and 1
    (which `run` would pass off as CMD's status)."""
    click.echo("\ncudatrace: interrupted", err=True)
    return click.exceptions.Exit(INTERRUPTED)


def _own_status(ctx: click.Context, status: int) -> int:
    """The exit status of an error: `run` passes CMD's status through, so its own errors exit
    with statuses apart from a program's (errors.py, docs/exit-codes.md); any other command's
    error keeps its status."""
    if ctx.invoked_subcommand == "run" and status not in RUN_STATUSES:
        return RUN_FAILED
    return status


def _drop_stdout() -> None:
    """After stdout failed: point it at /dev/null, so that the interpreter's last flush at exit
    has nothing to fail on (and prints no traceback)."""
    try:
        fd = os.open(os.devnull, os.O_WRONLY)
        os.dup2(fd, sys.stdout.fileno())
        os.close(fd)
    except (OSError, ValueError):
        pass


@click.group(
    cls=Main,
    context_settings={"help_option_names": ["-h", "--help"]},
    epilog="""\b
Each command's --help explains it and every option.
No GPU: cudatrace demo, or cudatrace run --simulated -- CMD.
Exit statuses: docs/exit-codes.md.
Shell completion (bash; zsh and fish alike, README.md):
  eval "$(_CUDATRACE_COMPLETE=bash_source cudatrace)"
""",
)
@click.version_option(__version__, prog_name="cudatrace")
def main() -> None:
    """See, explain and bound GPU memory in programs you did not write.

    `cudatrace run -- CMD` traces every device allocation of CMD and its children, with its
    call stack, and says who held the memory at the peak; `--budget 8GiB` bounds it.
    """


if __name__ == "__main__":
    main()
