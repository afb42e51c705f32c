"""What `cudatrace status` shows of a directory's ledgers (present/status.py renders it;
`metrics` and the node agent take the same data): every ledger read as a copy (record/ledger.py
Ledger.read: pread, checked, never mapped), a group's users' parts (a shared directory,
docs/budgets.md) merged into one group, what cannot be read listed with the reason; `status
--reset`; whether a directory's ledgers are idle (a named group's, for the node agent)."""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import cast

from .. import native
from ..record_types import LedgerDevice, LedgerMember, LedgerSnapshot, Status, UnusableLedger
from .ledger import (
    PRIVATE_RE,
    SUFFIX,
    Ledger,
    LedgerError,
    display_name,
    group_files,
    group_path,
    ledger_dir,
    list_groups,
    list_ledgers,
    part_of,
)
from .run_ledger import GroupLock


def _target(group: str | None, path: str | Path | None) -> list[list[Path]]:
    """The ledger files to show, by group (a group's parts together)."""
    if path is not None:
        return [[Path(path)]]
    if group is None:
        return group_files(list_ledgers())
    d = ledger_dir(create=False)
    if PRIVATE_RE.fullmatch(group):
        found = [d / (group + SUFFIX)]
    else:
        group_path(group, create_dir=False)  # the name's check
        found = [p for p in list_ledgers(d) if part_of(p)[0] == group]
    found = [p for p in found if p.exists() or p.is_symlink()]
    if not found:
        known = list_groups()
        raise LedgerError(
            "no budget group {!r} (in {}){}".format(
                group, d, "; known groups: " + ", ".join(known) if known else ""
            )
        )
    return [found]


def read_snapshot(path: Path) -> LedgerSnapshot:
    """A ledger's snapshot as a reader takes it (a pread copy, checked: LedgerError says why a
    file that is damaged, cut short, grown or not a file at all is not read)."""
    with Ledger.read(path) as led:
        return led.snapshot()


def _majority(values: list[int]) -> int:
    """The value most parts agree on (ties: the smallest)."""
    counts: dict[int, int] = {}
    for v in values:
        counts[v] = counts.get(v, 0) + 1
    return min(counts, key=lambda v: (-counts[v], v))


def merge_parts(
    snaps: list[LedgerSnapshot],
    labels: Sequence[Mapping[int, tuple[str, str, str]]] | None = None,
) -> LedgerSnapshot:
    """One snapshot of a group from the snapshots of its users' parts (one per uid in a shared
    directory, docs/budgets.md): use summed (each part holds its own uid's members), the budget
    as most parts say it, peaks as the highest any part saw of the group, members together with
    their uid, and slots made distinct (part i's slot s is i * 256 + s; labels, the node agent's
    member labels per part, follow them). A single part is returned as it is."""
    if len(snaps) == 1:
        if labels:
            snaps[0]["member_labels"] = dict(labels[0])
        return snaps[0]
    n = int(native.tools()[1].CT_LEDGER_MAX_MEMBERS)
    first = snaps[0]
    out = cast(LedgerSnapshot, dict(first))
    out["name"] = f"group {first['group']}"
    out["parts"] = [{"path": s["path"], "uid": s.get("owner", s["uid"])} for s in snaps]
    out["reclaimed"] = sum(s["reclaimed"] for s in snaps)
    out["created"] = min((s["created"] for s in snaps if s["created"]), default=None)
    members: list[LedgerMember] = []
    merged_labels: dict[int, tuple[str, str, str]] = {}
    for i, s in enumerate(snaps):
        for m in s["members"]:
            mm = cast(LedgerMember, dict(m))
            mm["slot"] = i * n + m["slot"]
            members.append(mm)
            if labels and m["slot"] in labels[i]:
                merged_labels[mm["slot"]] = labels[i][m["slot"]]
    out["members"] = members
    if labels:
        out["member_labels"] = merged_labels
    rows: dict[int, list[LedgerDevice]] = {}
    for s in snaps:
        for r in s["devices"]:
            rows.setdefault(r["device"], []).append(r)
    devices: list[LedgerDevice] = []
    for dev, rs in sorted(rows.items()):
        row = cast(LedgerDevice, {"device": dev})
        row["limit"] = _majority([r["limit"] for r in rs])
        for k in ("in_use", "dead_held", "denials", "over", "contexts", "allocations"):
            row[k] = sum(r[k] for r in rs)
        row["peak"] = max(r["peak"] for r in rs)
        devices.append(row)
    out["devices"] = devices
    return out


def status_json(group: str | None = None, path: str | Path | None = None) -> Status:
    """{"dir": ..., "ledgers": [snapshot, ...], "errors": [{"path", "error"}]}: every ledger in
    the directory (a group's parts as one), or just the named group (LedgerError if there is no
    such group, or none of its parts can be read), or path. Ledgers are read (pread copies),
    never mapped: one that cannot be read is listed in errors and the others are shown."""
    d = ledger_dir(create=False) if path is None else Path(path).parent
    ledgers: list[LedgerSnapshot] = []
    errors: list[UnusableLedger] = []
    for files in _target(group, path):
        snaps: list[LedgerSnapshot] = []
        errs: list[UnusableLedger] = []
        for p in files:
            try:
                snaps.append(read_snapshot(p))
            except LedgerError as e:
                errs.append({"path": str(p), "error": str(e)})
        if snaps:
            ledgers.append(merge_parts(snaps))
        elif errs and (group is not None or path is not None):
            raise LedgerError(errs[0]["error"])
        errors += errs
    return {"dir": str(d), "ledgers": ledgers, "errors": errors}


def reset_group(group: str) -> Path:
    """`cudatrace status --reset GROUP`: remove a group's ledger (its budget, peaks and denial
    counts) so the next run starts it afresh: every part this user may remove (its own in a
    shared directory; root: all). Refused while a member process of any part is alive: the
    ledger is what holds them to the budget. Returns the path removed (this user's part)."""
    files = _target(group, None)[0]
    mine = group_path(group, create_dir=False)
    with GroupLock(mine) as lock:
        busy: list[LedgerMember] = []
        for p in files:
            try:
                busy += [m for m in read_snapshot(p)["members"] if m["state"] != "dead"]
            except LedgerError:
                continue  # not a ledger any more: nothing of it to keep
        if busy:
            raise LedgerError(
                "{} is in use by pids {}; not reset (end them first)".format(
                    display_name(mine), ", ".join(str(m["pid"]) for m in busy)
                )
            )
        removed = None
        for p in files:
            if os.geteuid() != 0 and p.lstat().st_uid != os.geteuid():
                continue  # another user's part: theirs to remove
            try:
                os.unlink(p)
            except OSError as e:
                raise LedgerError(f"cannot remove {p}: {e.strerror}") from None
            removed = removed or p
        lock.remove()  # the group is gone: so is its lock file (removed while held)
    return removed or mine


def dir_idle(path: Path) -> bool:
    """Whether no process uses a ledger of the directory: none holds a liveness lock of any
    ledger file there, nor is a member alive in one (read, never mapped). A file there that is
    not a ledger (damaged, replaced) has no member this can see, but its locks still count.
    Raises LedgerError when it cannot tell (no OFD locks and a ledger it cannot read)."""
    for p in list_ledgers(path):
        try:
            led = Ledger.read(p)
        except LedgerError:
            if _locked(p):
                return False
            continue
        with led:
            held = native.tools()[1].ct_ledger_in_use_by_anyone(led.h)
            if held == 1:
                return False
            try:
                members = led.snapshot()["members"]
            except LedgerError:
                members = []
            if any(m["state"] != "dead" for m in members):
                return False
            if held < 0 and members:
                raise LedgerError(f"cannot tell whether {p} is in use (no OFD locks)")
    return True


def _locked(p: Path) -> bool:
    """Whether any process holds an OFD lock on a ledger file that cannot be read as one."""
    import fcntl
    import struct

    try:
        fd = os.open(p, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return False
        base = int(native.tools()[1].CT_LEDGER_LOCK_BASE)
        n = int(native.tools()[1].CT_LEDGER_MAX_MEMBERS) + 1
        fl = struct.pack("hhqqii", fcntl.F_WRLCK, os.SEEK_SET, base, n, 0, 0)
        got = fcntl.fcntl(fd, _F_OFD_GETLK, fl)
        return bool(struct.unpack("hhqqii", got)[0] != fcntl.F_UNLCK)
    except OSError:
        return False
    finally:
        os.close(fd)


_F_OFD_GETLK = 36  # fcntl.h (Linux); Python's fcntl module names it from 3.12
