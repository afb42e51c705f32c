"""`cudatrace run`: inject the shim into a command and its children.

The launcher never runs inside the target: it prepares the environment (LD_PRELOAD and the
CUDATRACE_* variables the shim reads), starts the command, samples device memory from outside
while it runs, forwards signals, and returns the command's status (128+N for signal N) with the
trace directory; the command line prints the summary (present/summary.py) after that.

Signals: off a terminal (CI, batch systems, a background job) CMD gets a process group of its
own, so a signal sent to the launcher's group reaches CMD once, forwarded. On a terminal whose
foreground we are, CMD stays in our group so that job control works; the terminal's Ctrl-C and
Ctrl-backslash then reach CMD directly and are not forwarded (a SIGTERM sent to that whole group by
hand still arrives twice). SIGUSR2 is the shim's --on-exceed abort only when this run asked for
it and its ledger has seen a denial; otherwise it is forwarded. The kernel sends CMD SIGTERM
if the launcher dies (PR_SET_PDEATHSIG), unless --outlive-launcher.
"""

from __future__ import annotations

import os
import shutil
import signal
import stat
import struct
import subprocess
import sys
import time
from collections.abc import Callable, MutableMapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Optional, TypedDict

from .. import __version__, fence_record, native, settings, tracedir
from ..errors import ABORTED, CANNOT_EXECUTE, NOT_FOUND, RUN_FAILED, CudatraceError, Signalled
from ..procfs import tree_pids
from ..record_types import BudgetInfo, LedgerSnapshot, UnusableLedger
from ..units import format_bytes, shell_quote, wrap_line
from . import run_budget, signals
from .exits import ExitWatcher, ProcessExit
from .files import DirectoryBusy, lock_dir, release_dir, write_json
from .sampler import Sampler, SamplerInfo
from .seal import Sealer, SealInfo

if TYPE_CHECKING:
    from ..simdriver import Simulated
    from .hints import HintsFile
    from .ledger import RunLedger

SIGNALS_FORWARDED = signals.FORWARDED


class LaunchError(CudatraceError):
    """A command that cannot be traced, with the exit status to give back (errors.py: run's
    own statuses, RUN_FAILED unless CMD itself cannot be found or executed)."""

    status = RUN_FAILED


class SimulatedDevice(TypedDict):
    device_bytes: int


class _RunInfoRequired(TypedDict):
    cudatrace_version: str
    argv: list[str]
    executable: str
    cwd: str
    dir: str
    stack_depth: int
    budget: BudgetInfo | None
    group: str | None
    on_exceed: str
    start_monotonic_ns: int
    start_time: float
    launcher_pid: int  # `report --watch` knows the run is over if it is gone


class RunInfo(_RunInfoRequired, total=False):
    """run.json: what was started, how and when; completed as the run goes on (its pid) and
    at its end."""

    simulated: SimulatedDevice  # --simulated: on cudatrace's simulated driver
    pid: int
    exits: list[ProcessExit]
    returncode: int
    exit_status: int
    end_monotonic_ns: int
    end_time: float
    budget_aborted: bool
    sampler: SamplerInfo | None
    sealed: SealInfo | None
    ledger_final: LedgerSnapshot | UnusableLedger


@dataclass
class RunOptions:
    cmd: list[str]
    out_dir: Path | None = None
    stack_depth: int = settings.default_int("STACK_DEPTH")
    quiet: bool = False
    force: bool = False
    budget: str | None = None
    group: str | None = None
    on_exceed: str = settings.default_text("ON_EXCEED")
    count_host: bool = False
    virtualize: bool = True
    outlive_launcher: bool = False  # CMD goes on if the launcher is killed
    sample_ms: int = 100
    extra_env: dict[str, str] = field(default_factory=dict)
    stdout: int | IO[Any] | None = None  # where the command's output goes (None: inherited)
    stderr: int | IO[Any] | None = None
    # on_start(proc, out_dir), once the command has started
    on_start: Callable[[subprocess.Popen[bytes], Path | None], object] | None = None
    signals: list[int] = field(default_factory=list)  # the signals the launcher received
    # called (from a thread, with the trace directory) soon after the budget denied something:
    # the command line hands in present/denials.py, which names the responsible code; the
    # second argument, at the end of a run whose ledger is its own (no --group), is how many
    # denials the ledger counted (else None), so denials no trace holds are said too
    on_denials: run_budget.DenialCallback | None = None
    mode: str = "full"  # "full" | "aggregate" | "none" (--no-trace: nothing written)
    # called with (status, trace directory) once the command has ended, while the run still
    # holds the directory (the summary reads it then: no other run can have replaced it)
    on_end: Callable[[int, Path | None], None] | None = None
    # --simulated: CMD runs on cudatrace's simulated driver, a device of this many bytes
    simulated: int | None = None


def resolve_command(argv0: str) -> str:
    if os.sep in argv0:
        path = argv0
        if not os.path.exists(path):
            raise LaunchError(f"{argv0}: no such file", NOT_FOUND)
    else:
        found = shutil.which(argv0)
        if not found:
            raise LaunchError(f"{argv0}: command not found", NOT_FOUND)
        path = found
    if os.path.isdir(path):
        raise LaunchError(f"{argv0}: is a directory", CANNOT_EXECUTE)
    if not os.access(path, os.X_OK):
        raise LaunchError(f"{argv0}: permission denied (not executable)", CANNOT_EXECUTE)
    return path


def preload_ignored(st: os.stat_result) -> bool:
    """Whether the loader would ignore LD_PRELOAD for this file (secure-execution mode): only
    when exec changes the ids. A setuid binary owned by the caller (or setgid to the caller's
    group) runs with the caller's ids, so it is entered like any other."""
    if not st.st_mode & (stat.S_ISUID | stat.S_ISGID):
        return False
    uid = st.st_uid if st.st_mode & stat.S_ISUID else os.geteuid()
    gid = st.st_gid if st.st_mode & stat.S_ISGID else os.getegid()
    return uid != os.getuid() or gid != os.getgid()


def check_enterable(path: str) -> None:
    """Refuse binaries the preload library cannot enter: static ELF, setuid/setgid."""
    st = os.stat(path)
    if preload_ignored(st):
        raise LaunchError(
            f"{path} is setuid/setgid: the dynamic loader ignores LD_PRELOAD for it, so "
            "nothing could be traced. Run a copy without the setuid bit.",
            RUN_FAILED,
        )
    try:
        with open(path, "rb") as f:
            head = f.read(64)
            if head[:4] != b"\x7fELF":
                if head[:2] != b"#!":
                    # exec() refuses it (ENOEXEC); only a shell would guess an interpreter
                    raise LaunchError(
                        f"{path} has no #! line, so it cannot be executed directly; add "
                        f"one (#!/bin/sh) or name its interpreter: cudatrace run -- sh {path}",
                        CANNOT_EXECUTE,
                    )
                return  # a script: its interpreter is what runs
            if len(head) < 64 or head[4] not in (1, 2) or head[5] not in (1, 2):
                raise LaunchError(
                    "%s starts like an ELF file but is not a valid one "
                    "(%d bytes of header)" % (path, len(head)),
                    CANNOT_EXECUTE,
                )
            is64 = head[4] == 2
            little = head[5] == 1
            e = "<" if little else ">"
            if is64:
                (phoff,) = struct.unpack_from(e + "Q", head, 32)
                phentsize, phnum = struct.unpack_from(e + "HH", head, 54)
            else:
                (phoff,) = struct.unpack_from(e + "I", head, 28)
                phentsize, phnum = struct.unpack_from(e + "HH", head, 42)
            if not phentsize or not phnum:
                raise LaunchError(
                    f"{path} is an ELF file with no program headers: not an executable",
                    CANNOT_EXECUTE,
                )
            f.seek(phoff)
            ph = f.read(phentsize * phnum)
    except OSError as exc:
        raise LaunchError(f"cannot read {path}: {exc}", CANNOT_EXECUTE) from None
    has_interp = any(
        struct.unpack_from(e + "I", ph, i * phentsize)[0] == 3  # PT_INTERP
        for i in range(phnum)
        if (i + 1) * phentsize <= len(ph)
    )
    if not has_interp:
        raise LaunchError(
            f"{path} is statically linked: LD_PRELOAD cannot enter it, so no allocation "
            "could be traced (and a static binary cannot load the CUDA driver anyway).",
            RUN_FAILED,
        )


def prepare_out_dir(opts: RunOptions) -> tuple[Path, bool, int]:
    """The trace directory, whether this run created it (to remove it if CMD never ran), and
    the descriptor of the run's hold on it (files.lock_dir: one run at a time, --force or not)."""
    lock = -1
    try:
        out = opts.out_dir or tracedir.fresh(opts.cmd[0])
        out = out.resolve()
        if out.exists():
            if not out.is_dir():
                raise LaunchError(f"{out} exists and is not a directory")
            lock = _hold(out)
            old = list(out.glob("*.ctrace")) + [
                p
                for p in (out / name for name in tracedir.LAUNCHER_FILES)
                if p.exists() or p.is_symlink()
            ]
            if old and not opts.force:
                raise LaunchError(
                    f"{out} already holds a trace; pass --force to replace "
                    "it, or -o another directory"
                )
            for p in old:
                p.unlink()
            created = False
        else:
            out.mkdir(parents=True)
            created = True
            lock = _hold(out)
        if not os.access(out, os.W_OK | os.X_OK):
            raise LaunchError(f"cannot write the trace directory {out}: permission denied")
    except OSError as e:
        if lock >= 0:
            release_dir(out, lock)
        where = e.filename or opts.out_dir or "the current directory"
        raise LaunchError(f"cannot create the trace directory {where}: {e.strerror or e}") from None
    except LaunchError:
        if lock >= 0:
            release_dir(out, lock)
        raise
    return out, created, lock


def _hold(out: Path) -> int:
    try:
        return lock_dir(out)
    except DirectoryBusy:
        raise LaunchError(
            f"{out} is in use by another cudatrace run (--force replaces a finished trace, "
            "never a running one); choose another -o"
        ) from None


def _remove_created(out: Path, created: bool) -> None:
    """Undo prepare_out_dir when CMD never started: what it made, and the launcher's files."""
    for name in (tracedir.RUN, *tracedir.SAMPLE_FILES, tracedir.LOCK):
        try:
            (out / name).unlink()
        except OSError:
            pass
    if created:
        try:
            out.rmdir()
        except OSError:
            pass


def exit_status(returncode: int) -> int:
    return 128 - returncode if returncode < 0 else returncode


def run(opts: RunOptions) -> tuple[int, Path | None]:
    """Trace opts.cmd to its end. Returns (exit status, trace directory; None under
    --no-trace)."""
    path = resolve_command(opts.cmd[0])
    check_enterable(path)
    shim = native.shim_path()
    if any(c in str(shim) for c in " :\t\n"):
        raise LaunchError(
            f"the preload library's path {str(shim)!r} holds a space or colon, which "
            "LD_PRELOAD cannot express; install cudatrace elsewhere",
            RUN_FAILED,
        )
    no_trace = opts.mode == "none"
    out, created, lock = (None, False, -1) if no_trace else prepare_out_dir(opts)
    sim = None
    try:
        sim = _simulate(opts)
        status, out = _run(opts, path, shim, out, created)
        if opts.on_end is not None:
            opts.on_end(status, out)
        return status, out
    except LaunchError:
        if out is not None:
            _remove_created(out, created)
        raise
    finally:
        if sim is not None:
            sim.close()
        if out is not None and lock >= 0:  # a lock is only taken on a directory
            release_dir(out, lock)


def _simulate(opts: RunOptions) -> Simulated | None:
    """--simulated: the simulated driver built (once, into the cache) and a fresh device of
    opts.simulated bytes set up for this run (simdriver.simulate); None without it."""
    if opts.simulated is None:
        return None
    from ..simdriver import BuildError, simulate

    try:
        return simulate(opts.simulated)
    except BuildError as e:
        raise LaunchError(f"--simulated: {e}") from None


# the launcher's threads beside CMD (_start_helpers): sampler, sealer, exit watcher (or None)
Helpers = tuple[Optional[Sampler], Optional[Sealer], Optional[ExitWatcher]]

# The preload library keeps the trace directory and the ledger path in fixed buffers (no malloc
# inside the target): util.h ct_config.dir[1024], writer.c's path[1200] with "/<pid>.<n>.ctrace".
MAX_SHIM_PATH = 1000


def _check_shim_path(what: str, p: Path) -> None:
    n = len(os.fsencode(str(p)))
    if n > MAX_SHIM_PATH:
        raise LaunchError(
            "the %s %s... is %d bytes long; the preload library holds "
            "paths up to %d bytes: choose a shorter one" % (what, str(p)[:60], n, MAX_SHIM_PATH),
            RUN_FAILED,
        )


def _run(
    opts: RunOptions, path: str, shim: Path, out: Path | None, created: bool
) -> tuple[int, Path | None]:
    if out is not None:  # None: --no-trace
        _check_shim_path("trace directory", out)
    env = _environment(opts, shim, out)
    # Without a terminal whose foreground we are, CMD gets a process group of its own: a signal
    # sent to our group (kill -TERM -PGID, CI runners) then reaches CMD once, forwarded by us,
    # not twice. On a terminal CMD stays in our group, so job control (Ctrl-Z, reading the
    # terminal) works; the terminal's own Ctrl-C/Ctrl-\ reach CMD directly and are not forwarded.
    own_group = not _foreground()
    # The handlers from here on: a signal while the run is set up is noted, never a
    # KeyboardInterrupt that a callback of the setup (cffi's, a finalizer's) may print and drop
    # (a launcher so lost a SIGINT and started CMD, which waited for ever); CMD is then not started.
    fwd = Forwarder(opts, None, own_group)
    fwd.install()
    try:
        ledger, budget_info = run_budget.join(
            opts.budget, opts.group, opts.on_exceed, opts.count_host, env, _check_shim_path
        )
    except run_budget.RunBudgetError as e:
        fwd.restore()
        raise LaunchError(str(e), e.status) from None
    except BaseException:
        fwd.restore()
        raise
    fwd.ledger = ledger
    hints = None

    def unwind() -> None:  # what the setup holds, when CMD is not started after all
        fwd.restore()
        if hints is not None:
            hints.stop()
        if ledger is not None:
            ledger.finish()

    try:
        hints = _hints(opts, path, env, out)
        run_info = _write_run_info(opts, path, out, budget_info, ledger)
        _say_start(opts, out)
    except BaseException:
        unwind()
        raise
    launcher = os.getpid()
    prctl = None if opts.outlive_launcher else _prctl()

    def in_child() -> None:  # after fork, before exec: nothing that allocates much
        if own_group:
            os.setpgid(0, 0)
        if prctl is not None:
            # PR_SET_PDEATHSIG: the kernel sends SIGTERM to CMD when the launcher dies, even by
            # SIGKILL, so CMD never runs on unsupervised (the shim still ends its trace cleanly)
            prctl(1, int(signal.SIGTERM), 0, 0, 0)
            if os.getppid() != launcher:  # the launcher died before prctl took effect
                os.kill(os.getpid(), signal.SIGTERM)

    watcher = None  # counts denials from before the start: the first may come at once
    # also under -q: quiet silences progress and summaries, never why the program failed
    if ledger is not None and opts.on_denials is not None and out is not None:
        watcher = run_budget.DenialWatcher(ledger, out, opts.on_denials, own=ledger.private)
    _stop_if_signalled(fwd, unwind)
    try:
        proc = subprocess.Popen(
            [path] + opts.cmd[1:],
            env=env,
            executable=path,
            preexec_fn=in_child,
            stdout=opts.stdout,
            stderr=opts.stderr,
        )
    except OSError as e:
        unwind()
        raise LaunchError(f"cannot execute {path}: {e.strerror or e}", CANNOT_EXECUTE) from None
    fwd.started(proc)
    run_info["pid"] = proc.pid
    # every thread started from here on (the launcher's, on_start's, and a library's started
    # from theirs) blocks the signals meant for CMD: the main thread takes them (signals.py)
    with signals.blocked():
        sampler, sealer, exits = _start_helpers(opts, proc.pid, out)
        if watcher is not None:
            watcher.start()
    try:  # the handlers stay until run.json holds CMD's end (a signal then is noted, no more)
        try:
            if opts.on_start is not None:
                with signals.blocked():
                    opts.on_start(proc, out)
            rc = signals.wait(proc)
        finally:
            for helper in (sampler, sealer, watcher, exits, hints):
                if helper is not None:
                    helper.stop()
        status = exit_status(rc)
        if fwd.aborted and status == 0:
            status = ABORTED
        helpers = (sampler, sealer, exits)
        _finish(opts, out, run_info, rc, status, fwd.aborted, helpers, ledger)
    finally:
        fwd.restore()
    return status, out


class LaunchStopped(LaunchError, Signalled):
    """A signal to stop came while the run was set up: CMD was not started (128+N)."""


def _stop_if_signalled(fwd: Forwarder, unwind: Callable[[], None]) -> None:
    """Before CMD starts: a signal to stop that came while the run was set up (noted by the
    handlers, pending) stops the run there, CMD never started."""
    early = [x for x in fwd.pending if x != signal.SIGUSR2]
    if early:
        unwind()
        name = signal.Signals(early[0]).name
        raise LaunchStopped(f"{name} before the command started; it was not started", early[0])


class Forwarder:
    """The launcher's handler of the signals it catches (signals.CAUGHT), from before CMD
    starts until run.json holds its end: each is noted in opts.signals and forwarded to CMD
    (held until CMD has started; none once it has ended); SIGUSR2 is the shim's
    --on-exceed abort when this run asked for it and its ledger saw a denial (the tree is then
    stopped); the terminal's own Ctrl-C and Ctrl-\\ are not forwarded to a CMD in our
    foreground group, which got them already."""

    def __init__(self, opts: RunOptions, ledger: RunLedger | None, own_group: bool) -> None:
        self.opts, self.ledger, self.own_group = opts, ledger, own_group
        self.proc: subprocess.Popen[bytes] | None = None
        self.pending: list[int] = []  # signals that came before CMD started
        self.aborted = False
        self._old: dict[int, Any] = {}

    def install(self) -> None:
        for s in signals.CAUGHT:
            self._old[s] = signal.signal(s, self)

    def restore(self) -> None:
        for s, h in self._old.items():
            signal.signal(s, h)
        self._old.clear()

    def started(self, proc: subprocess.Popen[bytes]) -> None:
        self.proc = proc
        for signum in self.pending:
            self(signum, None)
        self.pending.clear()

    def __call__(self, signum: int, frame: object) -> None:
        self.opts.signals.append(signum)
        proc = self.proc
        if proc is None:
            self.pending.append(signum)
            return
        if signum == signal.SIGUSR2 and run_budget.budget_abort(self.opts.on_exceed, self.ledger):
            self.aborted = True  # the shim's --on-exceed abort
            for pid in reversed(tree_pids(proc.pid)):
                try:
                    os.kill(pid, signal.SIGTERM)
                except OSError:
                    pass
            return
        if signum in (signal.SIGINT, signal.SIGQUIT) and not self.own_group and _foreground():
            return
        try:
            proc.send_signal(signum)
        except OSError:
            pass


def _start_helpers(opts: RunOptions, pid: int, out: Path | None) -> Helpers:
    """The launcher's threads beside CMD: the sampler (NVML, /proc) and, for a full trace, the
    sealer (sealed chunks compressed, seal.py) and the exit watcher (when processes that leave no
    exit record ended, exits.py). None for each that does not run."""
    if out is None:
        return None, None, None
    sampler = Sampler(pid, out, opts.sample_ms / 1000.0, bounded=opts.mode == "aggregate")
    sampler.start()
    sealer = Sealer(out) if opts.mode == "full" else None
    if sealer:
        sealer.start()
    exits = ExitWatcher(out) if ExitWatcher.available() else None
    if exits:
        exits.start()
    return sampler, sealer, exits


def _write_run_info(
    opts: RunOptions,
    path: str,
    out: Path | None,
    budget_info: BudgetInfo | None,
    ledger: RunLedger | None,
) -> RunInfo:
    """run.json: what was started, how and when (the reader's facts of the run); returned to
    be completed (pid, exit) as the run goes on."""
    run_info: RunInfo = {
        "cudatrace_version": __version__,
        "argv": opts.cmd,
        "executable": path,
        "cwd": os.getcwd(),
        "dir": str(out),
        "stack_depth": opts.stack_depth,
        "budget": budget_info,
        "group": (budget_info or {}).get("group") or opts.group,
        "on_exceed": opts.on_exceed,
        "start_monotonic_ns": time.monotonic_ns(),
        "start_time": time.time(),
        "launcher_pid": os.getpid(),  # `report --watch` knows the run is over if it is gone
    }
    if opts.simulated is not None:  # --simulated: on cudatrace's simulated driver
        run_info["simulated"] = {"device_bytes": opts.simulated}
    if out is not None:
        try:
            write_json(out / tracedir.RUN, run_info)
        except OSError as e:
            if ledger is not None:
                ledger.finish()
            raise LaunchError(f"cannot write {out / tracedir.RUN}: {e.strerror or e}") from None
    return run_info


def _say_start(opts: RunOptions, out: Path | None) -> None:
    """The one line that says what runs (not under -q)."""
    if opts.quiet:
        return
    if out is None:
        _say(
            f"cudatrace: running {shell_quote(opts.cmd)} under the budget, nothing traced "
            "(--no-trace)"
        )
    else:
        _say(f"cudatrace: tracing {shell_quote(opts.cmd)} -> {out}")
    if opts.simulated is not None:
        _say(
            f"cudatrace: on the simulated CUDA driver: one device of {format_bytes(opts.simulated)}"
            ", no GPU used"
        )
    sys.stderr.flush()


def _say(line: str) -> None:
    """A line of the launcher's own on stderr, wrapped at the width of a terminal there."""
    try:
        tty = sys.stderr.isatty()
    except (AttributeError, ValueError):
        tty = False
    width = shutil.get_terminal_size((120, 24)).columns
    sys.stderr.write("\n".join(wrap_line(line, max(60, width)) if tty else [line]) + "\n")


def _environment(opts: RunOptions, shim: Path, out: Path | None) -> dict[str, str]:
    """CMD's environment: the preload library and the settings it reads (CUDATRACE_*)."""
    env = dict(os.environ)
    env.update(opts.extra_env)
    env["LD_PRELOAD"] = fence_record.preload(str(shim), env.get("LD_PRELOAD", ""))
    env.pop(settings.name("DIR"), None)
    if out is not None:
        env.update(settings.environment(DIR=out))
    env.update(
        settings.environment(
            MODE=opts.mode,
            STACK_DEPTH=opts.stack_depth,
            LAUNCHER_PID=os.getpid(),
            ON_EXCEED=opts.on_exceed,
            COUNT_HOST=opts.count_host,
            VIRTUALIZE=opts.virtualize,
        )
    )
    if opts.quiet and settings.name("QUIET") not in opts.extra_env:
        env.update(settings.environment(QUIET=True))  # extra_env may keep the shim's lines
    return env


def _hints(
    opts: RunOptions, path: str, env: MutableMapping[str, str], out: Path | None
) -> HintsFile | None:
    """A run that can be denied (a budget, a group) hands the shim what only reading the
    binaries tells (record/hints.py: inline frames, a framework's libraries), named by
    CUDATRACE_HINTS. None for a run that cannot be denied; else what stop() removes when
    it is a temporary file (--no-trace)."""
    if opts.budget is None and opts.group is None and not env.get(settings.name("GROUP")):
        return None
    from .hints import HintsFile

    h = HintsFile(out, path, env)
    if h.path is not None:
        env.update(settings.environment(HINTS=h.path))
    return h


def _finish(
    opts: RunOptions,
    out: Path | None,
    run_info: RunInfo,
    rc: int,
    status: int,
    aborted: bool,
    helpers: Helpers,
    ledger: RunLedger | None,
) -> None:
    """After CMD: run.json completed (status, end, sampler and sealer as helpers, the ledger's
    last figures)."""
    sampler, sealer, exits = helpers
    if exits is not None:
        run_info["exits"] = exits.exits()
    run_info["returncode"] = rc
    run_info["exit_status"] = status
    run_info["end_monotonic_ns"] = time.monotonic_ns()
    run_info["end_time"] = time.time()
    run_info["budget_aborted"] = aborted
    run_info["sampler"] = sampler.describe() if sampler else None
    run_info["sealed"] = sealer.describe() if sealer else None
    if ledger is not None:
        run_info["ledger_final"] = ledger.summary()
        ledger.finish()
    if out is not None:
        try:
            write_json(out / tracedir.RUN, run_info)
        except OSError as e:  # a full disk: the command's status still comes back
            sys.stderr.write(f"cudatrace: cannot write {out / tracedir.RUN}: {e.strerror or e}\n")
    if sampler and sampler.error and not opts.quiet:
        sys.stderr.write(f"cudatrace: samples stopped: {sampler.error}\n")


def _prctl() -> Callable[..., int] | None:
    """libc's prctl, looked up before fork (the child only calls it)."""
    import ctypes

    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


def _foreground() -> bool:
    try:
        fd = os.open("/dev/tty", os.O_RDONLY | os.O_NOCTTY)
    except OSError:
        return False
    try:
        return os.tcgetpgrp(fd) == os.getpgrp()
    except OSError:
        return False
    finally:
        os.close(fd)
