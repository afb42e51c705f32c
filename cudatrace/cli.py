"""The cudatrace command line: the group and the list of its commands.

Each command lives in its own module of `commands/` (its click function and its body); this
module names them and loads only the one invoked, so that `cudatrace run` starts with click,
`commands/options.py` and `commands/run.py` alone (tests/integration/test_startup.py).

Errors: a command raises `CudatraceError` (errors.py); `Main.invoke` catches it once, prints
`cudatrace: MESSAGE` on stderr and exits with its status (`run`'s own errors with a status of
their own, apart from CMD's: docs/exit-codes.md). A command returns its exit status (None or 0
for success).
"""

from __future__ import annotations

import errno
import importlib
import os
import sys

import click

from . import __version__
from .errors import RUN_FAILED, RUN_STATUSES, CudatraceError

# name -> module of commands/ (the click function has the command's name)
COMMANDS = {
    "run": "run",
    "report": "report",
    "diff": "diff",
    "export": "export",
    "sweep": "sweep",
    "status": "status",
    "doctor": "doctor",
    "demo": "demo",
    "metrics": "metrics",
    "slurm-taskprolog": "slurm",
}


class Main(click.Group):
    """The `cudatrace` group: commands loaded when used; one place where errors are said."""

    def list_commands(self, ctx):
        return list(COMMANDS)

    def get_command(self, ctx, name):
        if name not in COMMANDS:
            return None
        module = importlib.import_module(f".commands.{COMMANDS[name]}", __package__)
        return getattr(module, name.replace("-", "_"))

    def invoke(self, ctx):
        try:
            status = super().invoke(ctx)
            sys.stdout.flush()  # a full disk or a closed pipe on stdout is said here, once
        except click.ClickException as e:  # click's own: a bad option value, a missing argument
            e.exit_code = _own_status(ctx, e.exit_code)
            raise
        except CudatraceError as e:
            click.echo(f"cudatrace: {e}", err=True)
            ctx.exit(_own_status(ctx, e.status))
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


@click.group(cls=Main, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="cudatrace")
def main():
    """See, explain and bound GPU memory in programs you did not write.

    \b
    cudatrace run -- CMD ...      trace every device allocation of CMD and its children
    cudatrace report DIR          who held the memory at the peak, by call site
    cudatrace diff A B            what changed between two runs
    cudatrace export DIR ...      the trace as pprof, flame graph, speedscope, memory_viz, Perfetto
    cudatrace sweep --values ...  how each site grows with a flag: laws, predictions
    cudatrace status [GROUP]      budgets in force and who uses them
    cudatrace doctor [CMD]        what a run would see on this machine
    cudatrace demo                the KV-pool sizing defect, traced, diffed and stopped
    cudatrace metrics             budgets and traced runs for Prometheus
    cudatrace slurm-taskprolog    Slurm's TaskProlog: a job's share of its GPU as a budget
    """


if __name__ == "__main__":
    main()
