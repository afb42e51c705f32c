"""The ledger `cudatrace run` joins (record/launcher.py): its group's, set under the group's lock
by the first run that names a budget, joined by the others under the group rule (ct_ledger_adopt)
or waited for; or a private one of a new name, and the private ledgers no run holds any more
removed."""

from __future__ import annotations

import fcntl
import os
import stat
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from .. import native, settings
from ..record_types import BudgetInfo
from ..units import format_bytes
from .ledger import (
    PRIVATE_RE,
    SUFFIX,
    Ledger,
    LedgerError,
    RunLedger,
    group_path,
    ledger_dir,
    list_ledgers,
    private_path,
)

LOCK_WAIT_S = 30.0  # a launcher waits this long for its group's lock, then says who holds it


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True


def remove_stale_private(directory: Path | None = None) -> list[Path]:
    """Remove private ledgers that no launcher and no live member holds. Their launcher holds a
    lock on the file (ct_ledger_hold) and so does every member; the kernel drops them when the
    process dies, in whatever pid namespace it ran, so a ledger of a run in another container
    that shares the directory is never taken for a stale one. Where the file system has no such
    locks, only an old-style "@run-<pid>" ledger of a dead pid of this namespace is removed.
    Read, never mapped; only this user's own files."""
    removed = []
    for p in list_ledgers(directory):
        m = PRIVATE_RE.fullmatch(p.name[: -len(SUFFIX)])
        if not m:
            continue
        try:
            if p.lstat().st_uid != os.geteuid():
                continue
            with Ledger.read(p) as led:
                held = native.tools()[1].ct_ledger_in_use_by_anyone(led.h)
                if held == 1:
                    continue
                if held < 0 and (m.group(2) or _pid_alive(int(m.group(1)))):
                    continue
                if any(x["state"] != "dead" for x in led.snapshot()["members"]):
                    continue
        except (LedgerError, OSError):
            continue
        try:
            os.unlink(p)
            removed.append(p)
        except OSError:
            pass
    return removed


def _limits_text(limits: Mapping[int, int]) -> str:
    vals = {v for v in limits.values()}
    if len(vals) == 1 and len(limits) >= 8:
        return f"{format_bytes(next(iter(vals)))} on every device"
    return ", ".join("%s on device %d" % (format_bytes(v), d) for d, v in sorted(limits.items()))


class GroupLock:
    """flock on <dir>/<group>.lock (in a shared directory <group>@<uid>.lock: each user's own)
    while a launcher reads and sets a group's budget: two runs starting at once cannot both find
    it unset. Only launchers take it, for milliseconds; the shim in the target never does. A
    lock file of another user, or one held longer than LOCK_WAIT_S, is refused with the reason,
    never waited on for ever."""

    def __init__(self, ledger_path: Path):
        self.path = ledger_path.with_name(ledger_path.name[: -len(SUFFIX)] + ".lock")

    def __enter__(self) -> GroupLock:
        deadline = time.monotonic() + LOCK_WAIT_S
        while True:
            fd = self._open()
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() >= deadline:
                        os.close(fd)
                        raise LedgerError(
                            f"{self.path} has been locked for {LOCK_WAIT_S:g} s by another "
                            "launcher; try again, or remove it if no cudatrace run is starting"
                        ) from None
                    time.sleep(0.01)
            try:  # a reset may have removed the file while we waited: lock the one there now
                same = os.stat(self.path, follow_symlinks=False).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
            if same:
                self.fd = fd
                return self
            os.close(fd)

    def remove(self) -> None:
        try:
            os.unlink(self.path)
        except OSError:
            pass

    def _open(self) -> int:
        """Open the lock file, making it (0600) when missing; never through a link, never one of
        another user (in a shared directory each user has its own: a file of that name that is
        another's was put there to block this one)."""
        flags = os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
        for _ in range(8):
            try:
                fd = os.open(self.path, flags)
            except FileNotFoundError:
                try:
                    fd = os.open(self.path, flags | os.O_CREAT | os.O_EXCL, 0o600)
                except FileExistsError:
                    continue
            except OSError as e:
                raise LedgerError(f"cannot open {self.path}: {e.strerror}") from None
            st = os.fstat(fd)
            if stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid():
                return fd
            os.close(fd)
            raise LedgerError(
                f"{self.path} is not a lock file of yours (uid {st.st_uid}, mode "
                f"{st.st_mode & 0o7777:04o}); remove it (as its owner or root)"
            )
        raise LedgerError(f"cannot open {self.path}")

    def __exit__(self, *exc: object) -> None:
        os.close(self.fd)


def _group_ledger(
    group: str,
    limits: Mapping[int, int],
    on_exceed: str,
    count_host: bool,
    set_limits: bool,
    info: BudgetInfo,
) -> Ledger | None:
    """One attempt, under the group's lock. None: the group has no budget yet (and this run
    names none)."""
    path = group_path(group, create_dir=True)
    wanted = {d: n for d, n in limits.items() if n}
    with GroupLock(path):
        exists = path.exists() or path.is_symlink()
        if not set_limits:
            if not exists:
                return None
            led = Ledger.open(path)
            if not led.limits():
                led.close()
                return None
            return led
        led = Ledger.create(path, limits, on_exceed, count_host, group)
        if (led.created or led.limits() == wanted) and not led.other_parts():
            return led
        try:
            note = _adopt(led, limits)
        except LedgerError as e:
            led.close()
            raise LedgerError(
                f"{e}. Give the same --budget, or none to join the group under its budget (or "
                "wait until its members end)"
            ) from None
        if note:
            info["note"] = note.replace("it is now", "this run sets")
        led.on_exceed = on_exceed
        led.count_host = count_host
        return led


def _adopt(led: Ledger, limits: Mapping[int, int]) -> str | None:
    """The group rule, decided by the C every member follows (ct_ledger_adopt): the launcher is
    a member while it decides, so the preload library of a process that starts meanwhile sees
    it, and gives up its slot when done."""
    led.join()
    try:
        return led.adopt(limits)
    finally:
        led.leave()


def open_run_ledger(
    limits: Mapping[int, int],
    group: str | None,
    on_exceed: str = "fail",
    count_host: bool = False,
    set_limits: bool = True,
    notify: Callable[[str], object] | None = None,
) -> tuple[RunLedger, BudgetInfo]:
    """The ledger for one run: the group's, or a private one. Returns (RunLedger, info for
    run.json).

    A group's budget is never absent or silently different from what a run asked for: the first
    run that names a budget sets it (under a lock, so runs started at once agree); a run naming
    the same budget joins; a run naming another is refused while the group has live members; a
    run naming none joins a group that has one, and otherwise waits up to GROUP_WAIT seconds
    (settings.def: CUDATRACE_GROUP_WAIT, and its default) for a run that sets it, then is
    refused."""
    info: BudgetInfo = {"group": group}
    if group is not None:
        wait = settings.number("GROUP_WAIT")
        deadline = time.monotonic() + wait
        told = False
        while True:
            led = _group_ledger(group, limits, on_exceed, count_host, set_limits, info)
            if led is not None:
                break
            if time.monotonic() >= deadline:
                raise LedgerError(
                    f"group {group} has no budget: start the run that sets it (cudatrace run --group {group} "
                    "--budget SPEC -- ...) first, or give this run --budget"
                )
            if not told and notify is not None:
                notify(
                    f"group {group} has no budget yet; waiting up to {wait:g} s for a run with --budget "
                    "to set it"
                )
                told = True
            time.sleep(0.1)
        if told and notify is not None:
            notify(f"group {group}: budget {_limits_text(led.limits())}")
        run = RunLedger(led, private=False)
    else:
        remove_stale_private()
        for _ in range(8):  # a fresh name: never another launcher's file (any namespace)
            led = Ledger.create(private_path(create_dir=True), limits, on_exceed, count_host, "")
            if led.created:
                break
            led.close()
        else:
            raise LedgerError(f"cannot make a private ledger of a new name in {ledger_dir()}")
        native.tools()[1].ct_ledger_hold(led.h)  # ours while we run (remove_stale_private)
        run = RunLedger(led, private=True)
    info["path"] = str(run.path)
    info["created"] = led.created
    info["limits"] = {str(d): n for d, n in sorted(led.limits().items())}
    info["on_exceed"] = led.on_exceed
    info["count_host"] = led.count_host
    return run, info
