"""The option groups the commands share, each defined once (the parameter types that read a
size, a time, a moment or a budget spec once, at parsing: params.py).

An option group is an immutable record (a NamedTuple: cheaper to create than a dataclass, and
every command loads this module) with a class method `options()` returning the click decorator
that adds its options and passes the command one record under the group's name
(`moment`, `outputs`, `settings`; `attribution_options()` builds cudatrace/attribution.py's
record, which the analysis takes as it is). This module imports click and the leaves only."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NamedTuple, cast

import click

from .. import choices, settings
from ..attribution import Attribution
from ..errors import OptionError
from .params import BudgetSpec, DeviceSize, F, MomentSpec, OutputPath

# ---- the mechanism of a group -----------------------------------------------------------------


def option_group(
    name: str, build: Callable[..., Any], options: Sequence[Callable[[Any], Any]]
) -> Callable[[F], F]:
    """A decorator adding `options` (click decorators) to a command and passing the command one
    value, build(**their values), under the keyword `name`. `build` names the values it takes
    by its parameters; each option's destination is one of them."""
    import inspect

    dests = list(inspect.signature(build).parameters)  # a function, or a NamedTuple class

    def decorate(f: F) -> F:
        @functools.wraps(f)
        def command(*args: Any, **kw: Any) -> Any:
            kw[name] = build(**{d: kw.pop(d) for d in dests if d in kw})
            return f(*args, **kw)

        wrapped: Any = command
        for opt in reversed(options):
            wrapped = opt(wrapped)
        return cast(F, wrapped)

    return decorate


# ---- options of one kind ---------------------------------------------------------------------


def choice_option(flag: str, words: Sequence[str], help: str) -> Callable[[F], F]:
    """An option taking one of `words`; the first is its default (shown)."""
    return click.option(
        flag, type=click.Choice(list(words)), default=words[0], show_default=True, help=help
    )


def seconds_option(
    flag: str, default: float, help: str, low: float = 0, high: float | None = None
) -> Callable[[F], F]:
    """An option of SECONDS, a number from low to high (the range and the default shown)."""
    return click.option(
        flag,
        type=click.FloatRange(low, high),
        default=default,
        show_default=True,
        metavar="SECONDS",
        help=help,
    )


def listen_option(default: str, help: str | None = None) -> Callable[[F], F]:
    """--listen HOST:PORT: where a server serves (its default shown)."""
    return click.option(
        "--listen", metavar="HOST:PORT", default=default, show_default=True, help=help
    )


# ---- attribution -----------------------------------------------------------------------------

FOLD_HELP = (
    "Fold functions matching REGEX (full or short name, or module) into the allocator layers, "
    "besides those recognized from the call graph and the library/namespace boundary. "
    "'!REGEX': these functions are not allocators (the fold stops below them). Repeatable."
)


def _attribution(
    depth: int = 1,
    fold_patterns: Sequence[str] = (),
    no_fold: bool = False,
    full_names: bool = False,
    view: str | None = None,
    cuda: bool = False,
) -> Attribution:
    return Attribution(
        depth=depth,
        fold=not no_fold,
        fold_patterns=tuple(fold_patterns),
        full_names=full_names,
        view=view or "hybrid",
        show_cuda_frames=cuda,
    )


def attribution_options(depth: bool = True) -> Callable[[F], F]:
    """The attribution options, passed to the command as one Attribution (cudatrace/
    attribution.py) under `attribution`; without `depth` for a command that writes whole
    stacks (export: there is no site to deepen)."""
    opts: list[Callable[[Any], Any]] = []
    if depth:
        opts.append(
            click.option(
                "--depth",
                default=1,
                show_default=True,
                type=click.IntRange(1, 64),
                help="Frames that make a site (a deeper site splits a shared helper by caller).",
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
    return option_group("attribution", _attribution, opts)


# ---- the moment ------------------------------------------------------------------------------


class Moment(NamedTuple):
    """Which moment of a run (--at) on which device (--device)."""

    at: str = "peak"
    device: int | None = None

    @classmethod
    def options(cls) -> Callable[[F], F]:
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
    def options(
        cls, schema: str, html: str | None = None, svg: str | None = None
    ) -> Callable[[F], F]:
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


def on_exceed_option(help: str) -> Callable[[F], F]:
    """--on-exceed (what the preload library does over budget), its default settings.def's;
    help: what each choice does for this command."""
    return click.option(
        "--on-exceed",
        type=click.Choice(choices.ON_EXCEED),
        default=settings.default_text("ON_EXCEED"),
        show_default=True,
        help=help,
    )


def traces_option(help: str) -> Callable[[F], F]:
    """--traces DIR (repeatable): the runs being traced that `metrics` and `top` read as they
    are written; help: what the command does with them."""
    return click.option(
        "--traces",
        metavar="DIR",
        multiple=True,
        type=click.Path(file_okay=False, path_type=Path),
        help=help,
    )


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

    stack_depth: int = settings.default_int("STACK_DEPTH")
    budget: str | None = None
    group: str | None = None
    on_exceed: str = settings.default_text("ON_EXCEED")
    count_host: bool = False
    virtualize: bool = True
    simulated: int | None = None  # --simulated: the simulated device's bytes

    @staticmethod
    def _build(
        stack_depth: int,
        budget: str | None,
        group: str | None,
        on_exceed: str,
        count_host: bool,
        no_virtualize: bool,
        simulated: bool,
        sim_memory: int | None,
    ) -> RunSettings:
        if sim_memory is not None and not simulated:
            raise OptionError("--sim-memory sizes the simulated device: add --simulated")
        memory: int | None = None
        if simulated:
            from ..simdriver import DEFAULT_MEMORY

            memory = sim_memory or DEFAULT_MEMORY
        return RunSettings(
            stack_depth, budget, group, on_exceed, count_host, not no_virtualize, memory
        )

    def as_dict(self) -> dict[str, Any]:
        """The keywords of record.launcher.RunOptions."""
        return self._asdict()

    @classmethod
    def options(cls) -> Callable[[F], F]:
        return option_group(
            "settings",
            cls._build,
            [
                click.option(
                    "--stack-depth",
                    default=settings.default_int("STACK_DEPTH"),
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
                    f"without one joins under it (waiting up to ${settings.name('GROUP_WAIT')} s, "
                    f"default {settings.default_text('GROUP_WAIT')}, for it to be set); a "
                    "different budget is refused while the group is in use.",
                ),
                on_exceed_option(
                    "Over budget: fail the allocation with out-of-memory; warn and allow it; or "
                    "abort: stop the whole process tree with a non-zero status."
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
