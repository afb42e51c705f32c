"""A run's budget: the ledger `cudatrace run` joins and the denials watched while CMD runs.

`join` gives the ledger of a run with --budget or --group (run_ledger.py makes or joins it) and
names it in CMD's environment; inside an integration's fence (a sealed record, or the
environment of a Slurm job's share) the run keeps that fence: its command counts in the fence's
group, --budget only lowers it (docs/budgets.md, "The sealed fence"). `DenialWatcher` polls the
ledger's denial count for the launcher's callback; `budget_abort` tells the shim's --on-exceed
abort from a user's SIGUSR2.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable, MutableMapping
from pathlib import Path
from typing import TYPE_CHECKING, Optional, cast

from .. import fence_record, settings
from ..errors import RUN_FAILED, CudatraceError
from .denials import append_denials

if TYPE_CHECKING:
    from ..record_types import (
        BudgetInfo,
        DeniedGroup,
        LedgerDevice,
        LedgerSnapshot,
        UnusableLedger,
    )
    from .fence import Fence
    from .ledger import RunLedger

# after a budget denial: (trace directory, denials the run's own ledger counted at its end)
# -> the denials named, kept in denials.jsonl (present/denials.py DenialPrinter)
DenialCallback = Callable[[Path, Optional[int]], Optional[list["DeniedGroup"]]]


class RunBudgetError(CudatraceError):
    """A run's budget that cannot be set up (the launcher says it as its LaunchError)."""

    status = RUN_FAILED


def join(
    budget: str | None,
    group: str | None,
    on_exceed: str,
    count_host: bool,
    env: MutableMapping[str, str],
    check_path: Callable[[str, Path], None],
) -> tuple[RunLedger | None, BudgetInfo | None]:
    """(ledger, budget info) of a run with --budget or --group, its ledger named in env; inside
    an integration's fence (the environment names a group) the fence's; (None, None) without.
    check_path(what, path) raises when the preload library cannot hold the ledger's path."""
    from . import fence

    outer = fence.outer_fence(env)
    if outer is not None:
        return _nested(budget, group, on_exceed, count_host, env, outer)
    if budget is None and group is None:
        return None, None
    # deferred for start-up time: only a run with a budget loads the ledger's C library
    from . import budget as budget_mod
    from .ledger import LedgerError

    problem = fence_record.shared_dir_problem(settings.value("LEDGER_DIR", env) or "")
    if problem:
        raise RunBudgetError(f"budget: {problem}")
    try:
        ledger, budget_info = budget_mod.setup_ledger(
            budget,
            group,
            on_exceed,
            count_host,
            notify=lambda msg: sys.stderr.write(f"cudatrace: {msg}\n"),
        )
    except (budget_mod.BudgetError, LedgerError) as e:
        raise RunBudgetError(f"budget: {e}") from None
    try:
        check_path("ledger path", ledger.path)
    except CudatraceError:
        ledger.finish()
        raise
    env.update(settings.environment(LEDGER=ledger.path))
    # the run's ledger is the fence: nothing else of an outer one applies
    for name in (
        settings.name("BUDGET"),
        settings.name("SHARE"),
        settings.name("SHARE_BUDGET"),
        settings.name("SHARE_LABEL"),
    ):
        env.pop(name, None)
    if budget is not None:  # what the preload library checks the group's budget against
        limits = {int(d): n for d, n in budget_info["limits"].items()}
        env.update(settings.environment(BUDGET=budget_mod.limits_spec(limits)))
    if budget_info.get("note"):
        # the one note that changes what the run may use: printed even with -q
        sys.stderr.write("cudatrace: note: {}\n".format(budget_info["note"]))
    return ledger, budget_info


def _nested(
    budget: str | None,
    group: str | None,
    on_exceed: str,
    count_host: bool,
    env: MutableMapping[str, str],
    outer: Fence,
) -> tuple[RunLedger | None, BudgetInfo]:
    """Inside an integration's fence (a Slurm job's share): the command stays in the fence's
    group, so the others sharing the GPU stay fenced from it; --budget lowers its share."""
    from . import budget as budget_mod
    from . import fence

    info = cast("BudgetInfo", {k: v for k, v in outer.items() if k != "record"})
    note = None
    if outer["source"] == "sealed":
        fence.sealed_env(env, outer, on_exceed, count_host)
    if outer["group"] is None:  # a sealed record that cannot be used: the command is refused
        return None, {**info, "spec": budget, "on_exceed_run": on_exceed}
    try:
        fence.check_group(outer, group)
        if budget is not None:
            limits = budget_mod.resolve_limits(budget_mod.parse_budget(budget))
            info, note = fence.nest(env, info, limits, os.getpid())
    except budget_mod.BudgetError as e:
        raise RunBudgetError(f"budget: {e}", 2) from None
    if note:
        sys.stderr.write(f"cudatrace: note: {note}\n")
    info["spec"] = budget
    info["on_exceed_run"] = on_exceed
    return fence.outer_ledger(outer["group"], outer.get("ledger_dir")), info


def budget_abort(on_exceed: str, ledger: RunLedger | None) -> bool:
    """SIGUSR2 is the shim's --on-exceed abort only when this run asked for it and the ledger
    has seen a denial; any other SIGUSR2 is the user's, and is forwarded."""
    if on_exceed != "abort" or ledger is None:
        return False
    try:
        snap = ledger.summary()
    except Exception:
        return True
    return any(d["denials"] for d in _devices_of(snap))


def _devices_of(snap: LedgerSnapshot | UnusableLedger) -> list[LedgerDevice]:
    """A ledger's devices, none when it could not be read."""
    return cast("LedgerSnapshot", snap)["devices"] if "devices" in snap else []


def _denials(ledger: RunLedger) -> int:
    return sum(d["denials"] for d in _devices_of(ledger.summary()))


class DenialWatcher:
    """Polls the budget ledger's denial count (every 100 ms) while the command runs; when it
    grows, calls back with the trace directory, at most once a second after the first, and
    once more at the end if a denial came after the last call. A callback that fails is not
    called again: it must never hurt the run."""

    def __init__(
        self,
        ledger: RunLedger,
        out: Path,
        callback: DenialCallback,
        interval: float = 0.1,
        spacing: float = 1.0,
        own: bool = False,
    ):
        self.ledger, self.out, self.callback = ledger, out, callback
        self.own = own  # the ledger is this run's alone: its count is this run's denials
        self.interval, self.spacing = interval, spacing
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="cudatrace-denials", daemon=True)
        self._seen = self._first = _denials(ledger)
        self._last_call = 0.0
        self._broken = False

    def start(self) -> None:
        self._thread.start()

    def _check(self, final: bool = False) -> None:
        if self._broken:
            return
        try:
            n = _denials(self.ledger)
        except Exception:
            return
        # at the end, a run's own ledger's count is compared with the traces' (complete now)
        counted = n - self._first if final and self.own and n > self._first else None
        if n == self._seen and counted is None:
            return
        if not final and time.monotonic() - self._last_call < self.spacing:
            return
        self._seen = n
        self._last_call = time.monotonic()
        try:
            append_denials(self.out, self.callback(self.out, counted))
        except Exception as e:  # never let the watcher hurt the run
            self._broken = True
            sys.stderr.write(f"cudatrace: could not attribute a budget denial: {e}\n")

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self._check()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        self._check(final=True)
