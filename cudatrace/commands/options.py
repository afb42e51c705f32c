"""The option groups the commands share, each defined once, and the parameter types that read
sizes, times, moments and budget specs once, at parsing.

An option group is an immutable record (a typing.NamedTuple: the one value a command's body
receives, as pprof hands its one options value around) with a class method `options()` that
returns the click decorator adding the group's options to a command. (NamedTuple rather than a
frozen dataclass for start-up: every command loads this module, and a dataclass costs a few
milliseconds to create, a named tuple a fraction of one.) The decorator collects their values into the
dataclass and passes it under the group's name (`attribution`, `moment`, `outputs`, `run`):

    @click.command()
    @Attribution.options()
    @Moment.options()
    def export(path, attribution, moment): ...

A value that does not parse raises `OptionError` ("--at 'soon' is not peak, end or a time ..."),
which the command line prints as every other error (cli.Main). This module imports click and
the leaves only: it is loaded at start-up by every command.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import NamedTuple

import click

from ..errors import OptionError

# = analyze.sites.GROUPINGS, written out so that the command line loads without the analysis
# (tests/unit/test_imports.py checks that the two agree)
GROUPINGS = ("site", "api", "library", "process", "rank")


# ---- parameter types -------------------------------------------------------------------------


class OutputPath(click.Path):
    """A path to write (-o, --html, ...): never empty (an empty name would write into the
    current directory, or a file named nothing)."""

    def __init__(self, **kw):
        kw.setdefault("path_type", Path)
        super().__init__(**kw)

    def convert(self, value, param, ctx):
        if isinstance(value, str) and not value.strip():
            raise OptionError(f"{_name(param)}: an empty path names no file or directory")
        return super().convert(value, param, ctx)


class MomentSpec(click.ParamType):
    """--at: peak, end or TIME seconds since the start; the spec itself is kept (it is echoed
    in reports and JSON), checked here once."""

    name = "moment"

    def convert(self, value, param, ctx):
        from ..units import UnitError, parse_moment

        try:
            parse_moment(value)
        except UnitError as e:
            raise OptionError(f"{_name(param)} {e}") from None
        return value


class Duration(click.ParamType):
    """A time ('30s', '2min', '1500ms', '2.5') -> float seconds."""

    name = "time"

    def convert(self, value, param, ctx):
        if isinstance(value, float):
            return value
        from ..units import UnitError, parse_time

        try:
            return parse_time(value)
        except UnitError as e:
            raise OptionError(f"{_name(param)} {value}: {e}") from None


class DeviceSize(click.ParamType):
    """--sim-memory SIZE -> bytes: a size with its unit (16GiB, 512MiB); at least 1 MiB, so that
    a unit left out ('16') is said rather than taken as 16 bytes."""

    name = "size"

    def convert(self, value, param, ctx):
        if isinstance(value, int):
            return value
        from ..units import UnitError, parse_size

        try:
            n = parse_size(value)
        except UnitError as e:
            raise OptionError(f"{_name(param)} {value}: {e}") from None
        if n < 1 << 20:
            raise OptionError(
                f"{_name(param)} {value}: {n} bytes is no device; give a unit (16GiB, 512MiB)"
            )
        return n


class BudgetSpec(click.ParamType):
    """--budget SPEC, checked before anything runs; the launcher resolves the SPEC itself on
    this machine (a share of free memory is measured at start)."""

    name = "spec"

    def convert(self, value, param, ctx):
        from ..record.budget import BudgetError, parse_budget  # only a run with a budget

        try:
            parse_budget(value)
        except BudgetError as e:
            raise OptionError(f"{_name(param)} {value}: {e}") from None
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

    def parse_args(self, ctx, args):
        return super().parse_args(ctx, split_unit(args))


def _name(param) -> str:
    return param.opts[0] if param is not None and param.opts else "value"


# ---- the mechanism of a group -----------------------------------------------------------------


def option_group(name: str, build, options: list):
    """A decorator adding `options` (click decorators) to a command and passing the command one
    value, build(**their values), under the keyword `name`. `build` names the values it takes
    by its parameters; each option's destination is one of them."""
    import inspect

    dests = list(inspect.signature(build).parameters)  # a function, or a NamedTuple class

    def decorate(f):
        @functools.wraps(f)
        def command(*args, **kw):
            kw[name] = build(**{d: kw.pop(d) for d in dests if d in kw})
            return f(*args, **kw)

        for opt in reversed(options):
            command = opt(command)
        return command

    return decorate


# ---- attribution -----------------------------------------------------------------------------

FOLD_HELP = (
    "Fold functions matching REGEX (full or short name, or module) into the allocator layers, "
    "besides those recognized from the call graph and the library/namespace boundary. "
    "'!REGEX': these functions are not allocators (the fold stops below them). Repeatable."
)


class Attribution(NamedTuple):
    """How allocations are attributed to call sites: every command that reports (report, diff,
    export, sweep) takes these options and means the same by them."""

    depth: int = 1
    fold: bool = True
    fold_patterns: tuple[str, ...] = ()
    full_names: bool = False
    view: str = "hybrid"  # "python", "native" or "hybrid"
    show_cuda_frames: bool = False

    def analysis_options(self) -> dict:
        """The keywords of analyze.analysis.Analysis that this attribution sets."""
        return {
            "show_cuda_frames": self.show_cuda_frames,
            "view": self.view,
            "fold_layers": self.fold,
            "fold_patterns": self.fold_patterns,
            "full_names": self.full_names,
        }

    @staticmethod
    def _build(depth=1, fold_patterns=(), no_fold=False, full_names=False, view=None, cuda=False):
        return Attribution(
            depth=depth,
            fold=not no_fold,
            fold_patterns=tuple(fold_patterns),
            full_names=full_names,
            view=view or "hybrid",
            show_cuda_frames=cuda,
        )

    @classmethod
    def options(cls, depth: bool = True):
        """The attribution options; without `depth` for a command that writes whole stacks
        (export: there is no site to deepen)."""
        opts = []
        if depth:
            opts.append(
                click.option(
                    "--depth",
                    default=1,
                    show_default=True,
                    type=click.IntRange(1, 64),
                    help="Frames that make a site (a deeper site splits a shared helper by "
                    "caller).",
                )
            )
        opts += [
            click.option(
                "--show-cuda-frames",
                "cuda",
                is_flag=True,
                help="Keep the CUDA libraries' own frames (folded by default).",
            ),
            click.option("--fold", "fold_patterns", multiple=True, metavar="REGEX", help=FOLD_HELP),
            click.option(
                "--no-fold",
                is_flag=True,
                help="Do not fold allocator layers: the site is the innermost frame outside CUDA.",
            ),
            click.option(
                "--full-names",
                is_flag=True,
                help="Show whole demangled signatures instead of shortened names.",
            ),
            click.option(
                "--python-only",
                "view",
                flag_value="python",
                help="Python programs: sites and stacks from Python frames alone.",
            ),
            click.option(
                "--native-only",
                "view",
                flag_value="native",
                help="Python programs: native frames alone (the eval loop not replaced).",
            ),
        ]
        return option_group("attribution", cls._build, opts)


# ---- the moment ------------------------------------------------------------------------------


class Moment(NamedTuple):
    """Which moment of a run (--at) on which device (--device)."""

    at: str = "peak"
    device: int | None = None

    @classmethod
    def options(cls):
        return option_group(
            "moment",
            cls,
            [
                click.option(
                    "--at",
                    "at",
                    default="peak",
                    show_default=True,
                    type=MomentSpec(),
                    metavar="peak|end|TIME",
                    help="The moment: the peak, the end, or TIME seconds since the start "
                    "(2.5s, 2.5).",
                ),
                click.option(
                    "--device",
                    type=int,
                    default=None,
                    metavar="N",
                    help="Only device N (its own peak with --at peak; default: every device).",
                ),
            ],
        )


# ---- outputs ---------------------------------------------------------------------------------


class Outputs(NamedTuple):
    """What a command prints (text, or JSON with --json) and the files it also writes. A FILE
    of `-` is standard output: it is then all the command prints (printed_on_stdout)."""

    as_json: bool = False
    html: Path | None = None
    svg: Path | None = None

    def printed_on_stdout(self) -> str | None:
        """The option whose FILE is `-`, when one is (then no text or JSON is printed); refuses
        two things on standard output, where they would be one unreadable stream."""
        dash = [f for f, v in (("--html", self.html), ("--svg", self.svg)) if str(v) == "-"]
        if self.as_json:
            dash.append("--json")
        if len(dash) > 1 and dash != ["--json"]:
            raise OptionError(
                "{} {} write to standard output, where they would be one unreadable stream: "
                "give {} a FILE".format(
                    " and ".join(dash),
                    "both" if len(dash) == 2 else "all",
                    " or ".join(d for d in dash if d != "--json"),
                )
            )
        return dash[0] if dash and dash[0] != "--json" else None

    @classmethod
    def options(cls, schema: str, html: str | None = None, svg: str | None = None):
        """--json (printing `schema`), and --html / --svg FILE where their help is given."""
        opts = [
            click.option(
                "--json",
                "as_json",
                is_flag=True,
                help=f"Print JSON (schema {schema})." if schema else "Machine-readable output.",
            )
        ]
        for flag, text in (("--html", html), ("--svg", svg)):
            if text is not None:
                opts.append(
                    click.option(
                        flag,
                        type=OutputPath(dir_okay=False),
                        default=None,
                        metavar="FILE",
                        help=text,
                    )
                )
        return option_group("outputs", cls, opts)


# ---- a traced run's settings (run, sweep) ----------------------------------------------------

BUDGET_HELP = (
    "Device-memory limit for the whole process tree: a size (8GiB, 512MiB, 1.5GiB; "
    "8G means 8 GiB = 8*2^30 bytes, 8GB means 8*10^9), a share of each device's total "
    "(60%), of its free memory at start (60%free), or per device (0=8GiB,1=4GiB)."
)


SIMULATED_HELP = (
    "Run CMD on cudatrace's simulated CUDA driver instead of a GPU (none needed): a program "
    "that uses the CUDA driver API through libcuda.so.1 (linked, dlopen'ed, or from Python "
    "through ctypes) gets one simulated device. The simulator is built once with the C "
    "compiler into ~/.cache/cudatrace ($CUDATRACE_CACHE)."
)


class RunSettings(NamedTuple):
    """The settings of a traced run about stacks, budgets and the simulated driver: `run` and
    every run of `sweep`."""

    stack_depth: int = 64
    budget: str | None = None
    group: str | None = None
    on_exceed: str = "fail"
    count_host: bool = False
    virtualize: bool = True
    simulated: int | None = None  # --simulated: the simulated device's bytes

    @staticmethod
    def _build(
        stack_depth, budget, group, on_exceed, count_host, no_virtualize, simulated, sim_memory
    ):
        if sim_memory is not None and not simulated:
            raise OptionError("--sim-memory sizes the simulated device: add --simulated")
        if simulated:
            from ..simdriver import DEFAULT_MEMORY

            simulated = sim_memory or DEFAULT_MEMORY
        else:
            simulated = None
        return RunSettings(
            stack_depth, budget, group, on_exceed, count_host, not no_virtualize, simulated
        )

    def as_dict(self) -> dict:
        """The keywords of record.launcher.RunOptions."""
        return self._asdict()

    @classmethod
    def options(cls):
        return option_group(
            "settings",
            cls._build,
            [
                click.option(
                    "--stack-depth",
                    default=64,
                    show_default=True,
                    type=click.IntRange(0, 256),
                    help="Native frames kept per event; 0 disables stacks.",
                ),
                click.option("--budget", metavar="SPEC", type=BudgetSpec(), help=BUDGET_HELP),
                click.option(
                    "--group",
                    metavar="NAME",
                    help="Share the budget with other 'cudatrace run --group NAME' of this user "
                    "(co-tenants). The first run naming a --budget sets the group's; a run "
                    "without one joins under it (waiting up to $CUDATRACE_GROUP_WAIT s, default "
                    "30, for it to be set); a different budget is refused while the group is in "
                    "use.",
                ),
                click.option(
                    "--on-exceed",
                    type=click.Choice(["fail", "warn", "abort"]),
                    default="fail",
                    show_default=True,
                    help="Over budget: fail the allocation with out-of-memory; warn and allow "
                    "it; or abort: stop the whole process tree with a non-zero status.",
                ),
                click.option(
                    "--count-host",
                    is_flag=True,
                    help="Count pinned host memory against the budget (always on integrated "
                    "devices).",
                ),
                click.option(
                    "--no-virtualize",
                    is_flag=True,
                    help="Do not make cuMemGetInfo/NVML report the budget as the device's memory.",
                ),
                click.option("--simulated", is_flag=True, help=SIMULATED_HELP),
                click.option(
                    "--sim-memory",
                    type=DeviceSize(),
                    default=None,
                    metavar="SIZE",
                    help="With --simulated: the simulated device's memory.  [default: 16GiB]",
                ),
            ],
        )


# ---- the ledger directory (run, status, doctor) ----------------------------------------------


def _use_ledger_dir(ctx, param, value):
    """--ledger-dir: the one setting the C of both sides reads (CUDATRACE_LEDGER_DIR), set as
    soon as it is parsed."""
    if value is not None:
        os.environ["CUDATRACE_LEDGER_DIR"] = str(Path(value).absolute())
    return value


def ledger_dir_option(f):
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


# ---- what a node offers containers (cdi, node) -----------------------------------------------


class NodeSetup(NamedTuple):
    """The budgets a node offers containers and where their pieces live: `cdi` and `node`
    (docs/containers.md). The defaults are deploy/plan.py's, written out so that the command
    line loads without it."""

    budgets: tuple[str, ...] = ()
    groups: Path | None = None
    root: Path = Path("/var/lib/cudatrace")
    state: Path = Path("/run/cudatrace")
    cdi_dir: Path | None = Path("/etc/cdi")
    vendor: str = "cudatrace.dev"
    preload: str = "file"
    on_exceed: str = "fail"
    shim: Path | None = None

    @classmethod
    def options(cls, cdi_dir_default: str | None = "/etc/cdi"):
        path = click.Path(path_type=Path)
        return option_group(
            "setup",
            cls,
            [
                click.option(
                    "--budget",
                    "budgets",
                    metavar="SIZE",
                    multiple=True,
                    help="Offer the device <vendor>/budget=SIZE: each container given it has "
                    "its own budget of SIZE (8GiB). Repeatable.",
                ),
                click.option(
                    "--groups",
                    metavar="FILE",
                    type=click.Path(dir_okay=False, path_type=Path),
                    help="Offer the named groups of FILE as <vendor>/group=NAME: the containers "
                    "given a group share its budget (INI: [NAME] budget = 40GiB).",
                ),
                click.option(
                    "--root",
                    metavar="DIR",
                    type=path,
                    default="/var/lib/cudatrace",
                    show_default=True,
                    help="Where the preload library is installed (versioned).",
                ),
                click.option(
                    "--state",
                    metavar="DIR",
                    type=path,
                    default="/run/cudatrace",
                    show_default=True,
                    help="Where named groups' ledger directories live (a tmpfs: made at boot).",
                ),
                click.option(
                    "--cdi-dir",
                    metavar="DIR",
                    type=path,
                    default=cdi_dir_default,
                    show_default=True,
                    help="Where CDI specs are written (/etc/cdi or /var/run/cdi: where runtimes "
                    "read them).",
                ),
                click.option(
                    "--vendor",
                    default="cudatrace.dev",
                    show_default=True,
                    help="The CDI vendor: devices are VENDOR/budget=SIZE and VENDOR/group=NAME.",
                ),
                click.option(
                    "--preload",
                    type=click.Choice(["file", "env"]),
                    default="file",
                    show_default=True,
                    help="How containers load the library: file, through /etc/ld.so.preload "
                    "(an application's own LD_PRELOAD stays); env, through LD_PRELOAD (for "
                    "sandboxes that do not read /etc/ld.so.preload; replaces the "
                    "application's).",
                ),
                click.option(
                    "--on-exceed",
                    type=click.Choice(["fail", "warn", "abort"]),
                    default="fail",
                    show_default=True,
                    help="Over budget (groups may set their own): fail the allocation, warn, "
                    "or abort the process.",
                ),
                click.option(
                    "--shim",
                    metavar="FILE",
                    type=click.Path(dir_okay=False, exists=True, path_type=Path),
                    help="Install this build of the preload library (e.g. one built for an "
                    "older glibc: tools/cross-build-shim) instead of the package's.",
                ),
            ],
        )
