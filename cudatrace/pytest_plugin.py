"""pytest plugin: device memory per test, limits as markers (docs/pytest.md).

Inert unless `--cudatrace` is given or the ini file says `cudatrace = true`. Then, when
cudatrace's shim is not loaded, pytest is executed again under it (same interpreter, argv,
working directory and environment, plus the shim's variables); pytest-xdist workers inherit it.
Each test's call is measured with the in-process API (cudatrace/api.py): its peak above what was
live when it started and what it left live at its end. The markers

    @pytest.mark.limit_gpu_memory("2 GiB")
    @pytest.mark.limit_gpu_leaks("16 MiB", warmups=1)

fail a test that goes over, naming the sites (Python file:line, bytes, count) from the process's
own trace. Sizes are read by the command line's parser (cudatrace/units.py). Markers are read
when the test runs, so those on unittest.TestCase methods and those other plugins add
(add_marker, pytest_collection_modifyitems) count. The JSON file follows cudatrace/outputs.py.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
import tempfile
from collections.abc import Generator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pytest

from . import procfs, settings, tracedir
from .outputs import OutputError, check_output, write_output
from .units import SIZE_UNITS, UnitError, format_bytes, parse_size

if TYPE_CHECKING:
    from .api import SiteUse, Tracker

# the environment of the pytest executed again under the shim (settings.def): PYTEST_REEXEC
# set there; PYTEST_TMPDIR a trace directory the plugin made (removed at the end), PYTEST_OWNER
# the pid that removes it (the main pytest process)
PROPERTY = "cudatrace"  # the user property each measured test's report carries
DRIVER_PROPERTY = "cudatrace-driver"  # whether a CUDA driver was loaded where the test ran

MARKERS = (
    "limit_gpu_memory(size): fail the test when its device-memory peak above what was live at "
    "its start exceeds size ('2 GiB', '512MB'); active with --cudatrace",
    "limit_gpu_leaks(size, warmups=0): fail the test when it leaves more than size of device "
    "memory live at its end, after running it warmups times first; active with --cudatrace",
)


def no_driver_hint() -> list[str]:
    """What the end of a run says when no test's process loaded a CUDA driver (every figure is
    then 0 B): how to run the suite on cudatrace's simulated driver."""
    return [
        "cudatrace: no CUDA driver was loaded in the tests' processes: every figure above is 0 B.",
        "  Without a GPU, run the suite on cudatrace's simulated driver (examples/kv-pool/"
        "README.md):",
        "    python3 -c 'from cudatrace import simdriver; simdriver.build(\"/tmp/sim/lib\")'",
        "    LD_LIBRARY_PATH=/tmp/sim/lib CUDASIM_STATE=/tmp/sim/device.state "
        "pytest --cudatrace ...",
    ]


def pytest_addoption(parser: pytest.Parser) -> None:
    g = parser.getgroup("cudatrace", "device memory per test (cudatrace)")
    g.addoption(
        "--cudatrace",
        action="store_true",
        default=None,
        help="measure device memory per test and check the limit_gpu_* markers (runs pytest "
        "under cudatrace's shim, executing it again when the shim is not loaded)",
    )
    g.addoption(
        "--cudatrace-top",
        type=int,
        default=5,
        metavar="N",
        help="list the N tests with the highest device-memory peaks at the end (0: none)",
    )
    g.addoption(
        "--cudatrace-json", metavar="FILE", help="write each test's figures to FILE as JSON"
    )
    g.addoption(
        "--cudatrace-dir",
        metavar="DIR",
        help="keep the traces in DIR (for `cudatrace report DIR`); by default a temporary "
        "directory, removed at the end",
    )
    parser.addini("cudatrace", type="bool", default=False, help="enable --cudatrace")


def enabled(config: pytest.Config) -> bool:
    opt = config.getoption("cudatrace")
    return bool(opt) if opt is not None else bool(config.getini("cudatrace"))


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    for m in MARKERS:
        config.addinivalue_line("markers", m)
    if not enabled(config):
        return
    from . import api

    if not hasattr(config, "workerinput"):
        _check_json(config)
    if not api.active():
        reexec(config)  # returns only by raising
    config.pluginmanager.register(Plugin(config), "cudatrace-measure")


def _check_json(config: pytest.Config) -> None:
    """--cudatrace-json is written at the end: what cannot be written is said before any test
    runs (a link, a directory, a missing directory); the path is kept absolute, as tests may
    change the working directory."""
    path = config.getoption("cudatrace_json")
    if path is None:
        return
    try:
        check_output(path)
    except OutputError as e:
        raise pytest.UsageError(f"cudatrace: --cudatrace-json: {e}") from None
    if path != "-":
        config.option.cudatrace_json = os.path.join(str(config.invocation_params.dir), path)


def _trace_dir(path: str) -> str:
    """--cudatrace-dir's directory, made when missing: refused when it is not a directory or
    already holds traces (as `cudatrace run -o` refuses them), named absolutely."""
    out = os.path.abspath(path)
    held = []
    try:
        if os.path.lexists(out) and not os.path.isdir(out):
            raise pytest.UsageError(
                f"cudatrace: --cudatrace-dir {path}: exists and is not a directory"
            )
        if os.path.isdir(out):
            held = [n for n in os.listdir(out) if n.endswith(".ctrace")] + [
                n for n in tracedir.LAUNCHER_FILES if os.path.lexists(os.path.join(out, n))
            ]
        else:
            os.makedirs(out)
    except OSError as e:
        raise pytest.UsageError(
            f"cudatrace: --cudatrace-dir {path}: cannot create it: {e.strerror or e}"
        ) from None
    if held:
        raise pytest.UsageError(
            f"cudatrace: --cudatrace-dir {path} already holds traces ({', '.join(sorted(held)[:3])}"
            f"{' ...' if len(held) > 3 else ''}); name a new or empty directory"
        )
    if not os.access(out, os.W_OK | os.X_OK):
        raise pytest.UsageError(f"cudatrace: --cudatrace-dir {path}: not writable")
    return out


# ---- executing pytest again under the shim -------------------------------------------------
def _command(config: pytest.Config) -> list[str]:
    """The interpreter's own argv (options, -m pytest or the script), then pytest's arguments;
    raises UsageError where this pytest was not started from a command line."""
    args = list(config.invocation_params.args)
    if list(sys.argv[1:]) != args:
        raise pytest.UsageError(
            "cudatrace: --cudatrace cannot load the shim into a pytest started from Python "
            "(pytest.main): run it as `cudatrace run -- python -m pytest --cudatrace ...`"
        )
    orig = getattr(sys, "orig_argv", None)  # Python 3.10+: interpreter options kept
    if orig and (not args or list(orig[-len(args) :]) == args):
        return [sys.executable] + list(orig[1:])
    argv0 = sys.argv[0]
    if argv0.endswith(os.path.join("pytest", "__main__.py")):
        return [sys.executable, "-m", "pytest"] + args
    return [sys.executable, argv0] + args


def reexec(config: pytest.Config) -> None:
    if settings.value("PYTEST_REEXEC"):
        raise pytest.UsageError(
            "cudatrace: pytest was executed again under the shim, but the shim is not loaded "
            "(LD_PRELOAD was dropped on the way: a setuid interpreter, or a wrapper that clears "
            "the environment?); run `cudatrace run -- python -m pytest --cudatrace ...`"
        )
    cmd = _command(config)
    from . import native

    try:
        shim = str(native.shim_path())
    except RuntimeError as e:
        raise pytest.UsageError(f"cudatrace: {e}") from None
    env = dict(os.environ)
    out = config.getoption("cudatrace_dir")
    if out:
        out = _trace_dir(out)
    else:
        out = tempfile.mkdtemp(prefix="cudatrace-pytest-")
        env.update(settings.environment(PYTEST_TMPDIR=out, PYTEST_OWNER=os.getpid()))
    # the launcher's variables (record/launcher.py): the shim first in LD_PRELOAD
    env["LD_PRELOAD"] = shim + ((" " + env["LD_PRELOAD"]) if env.get("LD_PRELOAD") else "")
    env.update(settings.environment(DIR=out, PYTEST_REEXEC=True))
    env.setdefault(settings.name("MODE"), settings.default_text("MODE"))
    capman = config.pluginmanager.getplugin("capturemanager")
    if capman is not None:  # give the terminal back before the process image is replaced
        capman.stop_global_capturing()
    sys.stdout.flush()
    sys.stderr.flush()
    os.chdir(config.invocation_params.dir)
    try:
        os.execve(sys.executable, cmd, env)
    except OSError as e:
        raise pytest.UsageError(f"cudatrace: cannot execute {cmd[0]}: {e.strerror}") from None


# ---- markers --------------------------------------------------------------------------------
@dataclass
class Limits:
    memory: int | None = None
    leaks: int | None = None
    warmups: int = 0


_ZERO = re.compile(r"^\s*0+(?:\.0*)?\s*([A-Za-z]*)\s*$")


def _size_arg(mark: pytest.Mark, name: str) -> int:
    if len(mark.args) != 1 or not isinstance(mark.args[0], str):
        raise ValueError(f"{name} takes one size, as a string such as '2 GiB' (got {mark.args!r})")
    text = mark.args[0]
    zero = _ZERO.match(text)
    if zero:  # a limit of nothing: "0", "0 B", "0 MiB" (the unit must still be one)
        unit = zero.group(1)
        if unit and unit.lower() not in SIZE_UNITS:
            raise ValueError(f"{name}: '{text.strip()}': unknown unit '{unit}'")
        return 0
    try:
        return parse_size(text)
    except UnitError as e:
        raise ValueError(f"{name}: {e}") from None


def limits_of(item: pytest.Item) -> Limits:
    """The item's limit_gpu_* markers, read; ValueError saying what is wrong."""
    lim = Limits()
    m = item.get_closest_marker("limit_gpu_memory")
    if m is not None:
        if m.kwargs:
            raise ValueError(
                f"limit_gpu_memory takes no keyword arguments (got {sorted(m.kwargs)})"
            )
        lim.memory = _size_arg(m, "limit_gpu_memory")
    m = item.get_closest_marker("limit_gpu_leaks")
    if m is not None:
        extra = set(m.kwargs) - {"warmups"}
        if extra:
            raise ValueError(f"limit_gpu_leaks takes warmups= only (got {sorted(extra)})")
        lim.leaks = _size_arg(m, "limit_gpu_leaks")
        w = m.kwargs.get("warmups", 0)
        if not isinstance(w, int) or isinstance(w, bool) or w < 0:
            raise ValueError(f"limit_gpu_leaks: warmups must be a whole number >= 0 (got {w!r})")
        lim.warmups = w
    return lim


# ---- measuring ------------------------------------------------------------------------------
def _anchor(item: pytest.Item) -> tuple[str, str] | None:
    fn = getattr(item, "function", None) or getattr(item, "obj", None)
    code = getattr(fn, "__code__", None)
    return (code.co_filename, code.co_name) if code is not None else None


def _bytes(n: int) -> str:
    return f"{format_bytes(n)} ({n:,} B)" if n >= 1024 else format_bytes(n)


def _site_lines(sites: Sequence[SiteUse], root: str, anchor: tuple[str, str] | None) -> list[str]:
    """memray's shape: one line per site with its bytes and count, then its Python stack down
    to the test function (pytest's own frames below it say nothing)."""
    out = []
    for s in sites:
        where = s.where()
        if s.file and root and s.file.startswith(root + os.sep):
            where = os.path.relpath(s.file, root) + f":{s.line}"
        n = "allocation" if s.count == 1 else "allocations"
        fn = f" in {s.function}" if s.function else ""
        out.append(f"    - {_bytes(s.bytes)} in {s.count} {n} at {where}{fn}")
        for func, file, line in s.stack[:16]:
            if file and root and file.startswith(root + os.sep):
                file = os.path.relpath(file, root)
            out.append(f"        {func or '?'}  {file or '?'}:{line if line else '?'}")
            if anchor and func and (func == anchor[1] or func.endswith("." + anchor[1])):
                break
    return out


class Plugin:
    """Registered when --cudatrace is on and the shim is loaded (here or in a worker)."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.results: list[dict] = []
        self.worker = hasattr(config, "workerinput")
        self.driver = False  # a CUDA driver was loaded in this process (or, here, a worker's)
        self.json_error: str | None = None

    @pytest.hookimpl(hookwrapper=True)
    def pytest_pycollect_makeitem(
        self, collector: pytest.Collector, name: str, obj: object
    ) -> Generator[None, Any, None]:
        """A marker written on the test that cannot be read is a collection error."""
        outcome = yield
        res = outcome.get_result()
        items = res if isinstance(res, list) else [res] if res is not None else []
        for it in items:
            if not isinstance(it, pytest.Item):
                continue
            try:
                limits_of(it)
            except ValueError as e:
                outcome.force_exception(collector.CollectError(f"{it.name}: {e}"))
                return

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_setup(self, item: pytest.Item) -> None:
        """The markers as they are when the test runs: unittest.TestCase methods', and those
        added after collection (add_marker, pytest_collection_modifyitems) included."""
        try:
            item.stash[LIMITS] = limits_of(item)
        except ValueError as e:
            pytest.fail(f"{item.name}: {e}", pytrace=False)

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_call(self, item: pytest.Item) -> Generator[None, Any, None]:
        from . import api

        lim = item.stash.get(LIMITS, None) or Limits()
        for _ in range(lim.warmups):
            item.runtest()  # a failing warm-up fails the test as the call would
        t = api.Tracker(anchor=_anchor(item))
        t.__enter__()
        try:
            yield
        finally:
            t.__exit__(None, None, None)
        item.stash[TRACKER] = t
        fig = {
            "peak": t.peak,
            "left": t.left,
            "start_live": t.start_live,
            "end_live": t.end_live,
            "devices": {str(d): {"peak": p, "left": lf} for d, (p, lf) in t.devices.items()},
            "warmups": lim.warmups,
        }
        kids = t.children()
        if kids:
            fig["processes"] = [{"pid": pid, "peak": peak} for pid, peak in kids]
        if lim.memory is not None:
            fig["limit_gpu_memory"] = lim.memory
        if lim.leaks is not None:
            fig["limit_gpu_leaks"] = lim.leaks
        item.stash[FIGURES] = fig

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(
        self, item: pytest.Item, call: pytest.CallInfo[None]
    ) -> Generator[None, Any, None]:
        outcome = yield
        rep = outcome.get_result()
        if rep.when != "call" or FIGURES not in item.stash:
            return
        fig = item.stash[FIGURES]
        if rep.passed:
            text = self._verdict(item, fig)
            if text:
                rep.outcome = "failed"
                rep.longrepr = text
                fig["failed"] = True
        rep.user_properties.append((PROPERTY, fig))
        if not self.driver:  # once seen, a driver stays loaded
            self.driver = fig["peak"] > 0 or procfs.maps_name("libcuda.so")
        rep.user_properties.append((DRIVER_PROPERTY, self.driver))

    def _verdict(self, item: pytest.Item, fig: dict[str, Any]) -> str | None:
        t = item.stash[TRACKER]
        root = str(self.config.rootpath)
        parts = []
        lim = fig.get("limit_gpu_memory")
        if lim is not None and t.peak > lim:
            parts.append(
                f"Test was limited to {_bytes(lim)} of device memory but its allocations "
                f"reached {_bytes(t.peak)} at their peak"
            )
            parts.append("Allocations the test made that were live at its peak:")
            parts += _site_lines(t.sites("peak"), root, t.anchor) or [
                "    (no trace to name them from)"
            ]
        lim = fig.get("limit_gpu_leaks")
        if lim is not None and t.left > lim:
            w = fig["warmups"]
            after = f" (after {w} warm-up run{'s' if w != 1 else ''})" if w else ""
            parts.append(
                f"Test was limited to {_bytes(lim)} of device memory left live but left "
                f"{_bytes(t.left)}{after}"
            )
            parts.append("Allocations the test made and did not free:")
            parts += _site_lines(t.sites("end"), root, t.anchor) or [
                "    (no trace to name them from)"
            ]
        if parts and fig.get("processes"):
            parts.append(_processes_line(fig["processes"]))
        return "\n".join(parts) if parts else None

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.when != "call":
            return
        for k, v in report.user_properties:
            if k == PROPERTY and isinstance(v, dict):
                self.results.append(dict(v, nodeid=report.nodeid))
            elif k == DRIVER_PROPERTY:
                self.driver = self.driver or bool(v)

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        if self.worker:
            return
        tr = terminalreporter
        n = self.config.getoption("cudatrace_top")
        if n > 0 and self.results:
            tr.write_sep("=", "cudatrace: highest device-memory peaks")
            for r in sorted(self.results, key=lambda r: (-r["peak"], r["nodeid"]))[:n]:
                tr.write_line(
                    f"{format_bytes(r['peak']):>11} peak {format_bytes(r['left']):>11} left  "
                    f"{r['nodeid']}"
                )
        others = [r for r in self.results if r.get("processes")]
        if others:
            tr.write_line(
                "cudatrace: tests whose processes allocated device memory (not in their figures, "
                "which count the test's own process):"
            )
            for r in sorted(others, key=lambda r: r["nodeid"]):
                tr.write_line(f"  {r['nodeid']}: {_processes_line(r['processes']).strip()}")
        if self.results and not self.driver:
            for line in no_driver_hint():
                tr.write_line(line)
        kept = None if settings.value("PYTEST_TMPDIR") else settings.value("DIR")
        if kept:
            tr.write_line(f"cudatrace: traces in {kept} (cudatrace report {kept})")
        if self.json_error:
            tr.write_line(f"cudatrace: --cudatrace-json: {self.json_error}", red=True)

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        path = self.config.getoption("cudatrace_json")
        if not path or self.worker:
            return
        doc = {
            "version": 1,
            "tests": sorted(self.results, key=lambda r: r["nodeid"]),
            "trace_dir": settings.value("DIR"),
        }
        try:
            write_output(path, json.dumps(doc, indent=1) + "\n")
        except OutputError as e:
            self.json_error = str(e)
            if session.exitstatus == pytest.ExitCode.OK:
                session.exitstatus = pytest.ExitCode.USAGE_ERROR

    def pytest_unconfigure(self, config: pytest.Config) -> None:
        d = settings.value("PYTEST_TMPDIR")
        if d and settings.value("PYTEST_OWNER") == str(os.getpid()) and not self.worker:
            shutil.rmtree(d, ignore_errors=True)


def _processes_line(procs: list[dict]) -> str:
    each = ", ".join(f"pid {p['pid']} {format_bytes(p['peak'])}" for p in procs)
    n = len(procs)
    return (
        f"    {n} process{'es' if n != 1 else ''} the test started allocated device memory "
        f"meanwhile, not counted in its figures (the most each held at once): {each}"
    )


LIMITS = pytest.StashKey[Limits]()
TRACKER: pytest.StashKey[Tracker] = pytest.StashKey()
FIGURES = pytest.StashKey[dict[str, Any]]()
