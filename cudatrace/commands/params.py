"""The parameter types of the command line: a value with a syntax (a path to write, a size, a
time, a moment, a budget spec, `--budget 12 GiB` as two words) read once, at parsing, into what the command's body takes; a
value that does not parse raises OptionError (printed by cli.Main as every other error). And
--ledger-dir, whose value acts as soon as it is parsed."""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from .. import settings
from ..errors import CudatraceError, OptionError

F = TypeVar("F", bound=Callable[..., Any])  # a click command, as decorated


class OutputPath(click.Path):
    """A path to write (-o, --html, ...): never empty (an empty name would write into the
    current directory, or a file named nothing)."""

    def __init__(self, **kw: Any) -> None:
        kw.setdefault("path_type", Path)
        super().__init__(**kw)

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, str) and not value.strip():
            raise OptionError(f"{_name(param)}: an empty path names no file or directory")
        return super().convert(value, param, ctx)


class Parsed(click.ParamType, ABC):
    """A value read by a parser of a floor below, imported when a value comes (the command
    line loads without it): what it refuses is an OptionError naming the option and the value.
    A value already read (a default) is taken as it is."""

    @abstractmethod
    def parse(self, value: str) -> Any:
        """The value read (a subclass's parser); a CudatraceError that says why when refused."""

    def refused(self, name: str, value: str, why: CudatraceError) -> str:
        return f"{name} {value}: {why}"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if not isinstance(value, str):
            return value
        try:
            return self.parse(value)
        except CudatraceError as e:
            raise OptionError(self.refused(_name(param), value, e)) from None


class MomentSpec(Parsed):
    """--at: peak, end or TIME seconds since the start; the spec itself is kept (it is echoed
    in reports and JSON), checked here once."""

    name = "moment"

    def parse(self, value: str) -> str:
        from ..units import parse_moment

        parse_moment(value)
        return value

    def refused(self, name: str, value: str, why: CudatraceError) -> str:
        return f"{name} {why}"  # the moment's error names it


class Duration(Parsed):
    """A time ('30s', '2min', '1500ms', '2.5') -> float seconds."""

    name = "time"

    def parse(self, value: str) -> float:
        from ..units import parse_time

        return parse_time(value)


class DeviceSize(Parsed):
    """--sim-memory SIZE -> bytes: a size with its unit (16GiB, 512MiB); at least 1 MiB, so that
    a unit left out ('16') is said rather than taken as 16 bytes."""

    name = "size"

    def parse(self, value: str) -> int:
        from ..units import UnitError, parse_size

        n = parse_size(value)
        if n < 1 << 20:
            raise UnitError(f"{n} bytes is no device; give a unit (16GiB, 512MiB)")
        return n


class BudgetSpec(Parsed):
    """--budget SPEC, checked before anything runs; the launcher resolves the SPEC itself on
    this machine (a share of free memory is measured at start)."""

    name = "spec"

    def parse(self, value: str) -> str:
        from ..record.budget import parse_budget  # only a run with a budget

        parse_budget(value)
        return value


# a size's units as a word of their own (`--budget 12 GiB`): units.SIZE_UNITS's, written out so
# that the command line loads without units' regular expressions (tests/unit check they agree)
SIZE_UNIT_WORDS = ("b", "k", "kib", "kb", "m", "mib", "mb", "g", "gib", "gb", "t", "tib", "tb")


def split_unit(args: list[str]) -> list[str]:
    """`--budget 12 GiB`: a bare number followed by a unit as a word of its own (which would
    otherwise start the command) is read as one value, `12 GiB`. Before the command only."""
    out = list(args)
    for i, a in enumerate(out):
        if a == "--":
            break
        if a == "--budget":
            j, value = i + 1, out[i + 1] if i + 1 < len(out) else ""
        elif a.startswith("--budget="):
            j, value = i, a[len("--budget=") :]
        else:
            continue
        if value.strip().isdigit() and j + 1 < len(out) and out[j + 1].lower() in SIZE_UNIT_WORDS:
            out[j] += " " + out.pop(j + 1)
        break
    return out


class SizeWordCommand(click.Command):
    """A command whose --budget may be given as `12 GiB` (split_unit)."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        return super().parse_args(ctx, split_unit(args))


def _name(param: click.Parameter | None) -> str:
    return param.opts[0] if param is not None and param.opts else "value"


# ---- the ledger directory (run, status, doctor) ----------------------------------------------


def _use_ledger_dir(ctx: click.Context, param: click.Parameter, value: Path | None) -> Path | None:
    """--ledger-dir: the one setting the C of both sides reads (CUDATRACE_LEDGER_DIR), set as
    soon as it is parsed."""
    if value is not None:
        os.environ[settings.name("LEDGER_DIR")] = str(Path(value).absolute())
    return value


def ledger_dir_option(f: F) -> F:
    return click.option(
        "--ledger-dir",
        metavar="DIR",
        type=click.Path(file_okay=False, path_type=Path),
        callback=_use_ledger_dir,
        expose_value=False,
        help="Where budget ledgers live (default $CUDATRACE_LEDGER_DIR, else "
        "/dev/shm/cudatrace-UID): a directory containers share by a bind mount to share a "
        "--group (docs/budgets.md).",
    )(f)
