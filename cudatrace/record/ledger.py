"""The budget ledger from Python: the C of native/common/ledger.c (through cffi), group paths, and the
data `cudatrace status` shows (present/status.py renders it).

Python never reads the ledger file itself: every read and write goes through the same C
functions the shim runs inside traced processes (libcudatrace_tools.so), so the two cannot
disagree about the layout or the rules. What only reads (`status`, `metrics`, the node agent,
the checks of a directory) opens a ledger with `Ledger.read`: a pread copy, never a mapping, so
a file a tenant truncates, grows, garbles or replaces is refused with the reason, never a
SIGBUS. A group in a shared directory is one part per user (<group>@<uid>.ledger): `status`
shows them as one group (merge_parts).
"""

from __future__ import annotations

import datetime as _dt
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from .. import native
from ..closing import Closing
from ..errors import CudatraceError

if TYPE_CHECKING:
    from ..native_types import ToolsLib
from ..record_types import LedgerSnapshot, UnusableLedger

PRIVATE_PREFIX = "@run-"  # private (per-run) ledgers: "@run-<launcher pid>-<random>.ledger"
PRIVATE_RE = re.compile(re.escape(PRIVATE_PREFIX) + r"(\d+)(-[0-9a-f]+)?")
_PART_RE = re.compile(r"([A-Za-z0-9_.-]+)@(\d{1,10})")  # a user's part: <group>@<uid>.ledger
SUFFIX = ".ledger"
_ERRLEN = 512
_PATHLEN = 4096


class LedgerError(CudatraceError, RuntimeError):
    """A ledger that cannot be opened or used; the message says why."""


def _tools() -> tuple[Any, ToolsLib]:
    return native.tools()


def _const(name: str) -> int:
    return int(getattr(_tools()[1], name))


def _check(rc: int, what: str) -> int:
    if rc < 0:
        ffi, lib = _tools()
        raise LedgerError(f"{what}: {ffi.string(lib.ct_ledger_strerror(rc)).decode()}")
    return rc


# ---- where ledgers live ------------------------------------------------------------------------


def ledger_dir(create: bool = False) -> Path:
    """The directory of group ledgers (see ct_ledger_dir). With create=False it may not exist
    yet; refusals (a symlink, another owner, loose permissions) raise LedgerError."""
    ffi, lib = _tools()
    buf = ffi.new("char[]", _PATHLEN)
    err = ffi.new("char[]", _ERRLEN)
    rc = lib.ct_ledger_dir(buf, _PATHLEN, 1 if create else 0, err, _ERRLEN)
    if rc == lib.CT_LEDGER_ENOENT and not create and buf[0] != b"\0":
        return Path(ffi.string(buf).decode())
    if rc != 0:
        raise LedgerError(ffi.string(err).decode() or "no ledger directory")
    return Path(ffi.string(buf).decode())


def valid_group(name: str) -> bool:
    """Group names are [A-Za-z0-9_.-]{1,64}, not starting with '.' (hidden from status) or '-' (an option)."""
    if not isinstance(name, str):
        return False
    ffi, lib = _tools()
    try:
        b = name.encode()
    except UnicodeEncodeError:
        return False
    return b"\0" not in b and bool(lib.ct_ledger_valid_group(b))


def group_path(group: str, create_dir: bool = False) -> Path:
    """<ledger dir>/<group>.ledger (the directory is made with create_dir)."""
    if not valid_group(group):
        raise LedgerError(
            f"invalid budget group name {group!r}: use 1 to 64 of A-Z a-z 0-9 _ . -, not "
            "starting with '.' or '-'"
        )
    ffi, lib = _tools()
    buf = ffi.new("char[]", _PATHLEN)
    err = ffi.new("char[]", _ERRLEN)
    rc = lib.ct_ledger_group_path(
        group.encode(), buf, _PATHLEN, 1 if create_dir else 0, err, _ERRLEN
    )
    if rc != 0 and not (rc == lib.CT_LEDGER_ENOENT and not create_dir):
        raise LedgerError(ffi.string(err).decode() or f"no ledger path for group {group!r}")
    return Path(ffi.string(buf).decode())


def private_path(pid: int | None = None, create_dir: bool = True) -> Path:
    """A new name for the ledger of one `cudatrace run` without --group:
    <ledger dir>/@run-<pid>-<random>.ledger. The pid is for people (it means nothing outside
    the launcher's pid namespace: two launchers in two containers may share it); the random
    part keeps them apart."""
    return ledger_dir(create=create_dir) / (
        "%s%d-%s%s" % (PRIVATE_PREFIX, pid or os.getpid(), os.urandom(8).hex(), SUFFIX)
    )


def shared_dir(path: str | Path) -> bool:
    """Whether the directory holding path is a shared ledger directory (sticky, root's: the
    ledgers of several users' jobs, docs/budgets.md)."""
    return bool(_tools()[1].ct_ledger_shared_dir(os.fsencode(str(path))))


def list_ledgers(directory: Path | None = None) -> list[Path]:
    """Ledger files in the directory (groups and private runs), sorted by name."""
    d = directory if directory is not None else ledger_dir(create=False)
    try:
        names = sorted(os.listdir(d))
    except FileNotFoundError:
        return []
    except OSError as e:
        raise LedgerError(f"cannot list {d}: {e.strerror}") from None
    return [d / n for n in names if n.endswith(SUFFIX) and not n.startswith(".")]


def part_of(path: Path) -> tuple[str, int | None]:
    """(the group or private ledger's name, the uid of a user's part or None) of a ledger file:
    <group>@<uid>.ledger is uid's part of group, anything else its own name."""
    n = path.name[: -len(SUFFIX)] if path.name.endswith(SUFFIX) else path.name
    m = _PART_RE.fullmatch(n)
    if m and valid_group(m.group(1)):
        return m.group(1), int(m.group(2))
    return n, None


def group_files(paths: list[Path]) -> list[list[Path]]:
    """Ledger files by group (a group's parts together), in the order of their first file."""
    out: dict[str, list[Path]] = {}
    for p in paths:
        out.setdefault(part_of(p)[0], []).append(p)
    return list(out.values())


def list_groups() -> list[str]:
    names = (part_of(p)[0] for p in list_ledgers())
    return list(dict.fromkeys(n for n in names if not n.startswith(PRIVATE_PREFIX)))


def display_name(path: Path) -> str:
    n = part_of(path)[0]
    m = PRIVATE_RE.fullmatch(n)
    return f"run of pid {m.group(1)} (no group)" if m else f"group {n}"


# ---- a ledger ---------------------------------------------------------------------------------

# the ledger's over-budget mode, named as --on-exceed names it ("deny" is accepted as before)
_MODES = {"fail": 0, "deny": 0, "warn": 1}


def _mode_name(v: int) -> str:
    return {0: "fail", 1: "warn"}.get(int(v), "mode %d" % v)


def share_name(key: int) -> str | None:
    """A member's share as stored in the ledger (its name packed little-endian), or None."""
    if not key:
        return None
    return int(key).to_bytes(8, "little").rstrip(b"\0").decode("ascii", errors="replace")


def _iso(ns: int) -> str | None:
    if not ns:
        return None
    return _dt.datetime.fromtimestamp(ns / 1e9).isoformat(timespec="seconds")


class Ledger(Closing):
    """An open ledger (a process-local handle on the shared file)."""

    def __init__(self, handle: Any, path: Path, created: bool = False) -> None:
        self._h = handle
        self.path = Path(path)
        self.created = created

    # -- opening
    @classmethod
    def open(cls, path: str | Path, create: bool = False) -> Ledger:
        """As a member: mapped, and only a ledger of this uid's own (ct_ledger_open)."""
        ffi, lib = _tools()
        err = ffi.new("char[]", _ERRLEN)
        h = lib.ct_ledger_open(os.fsencode(str(path)), 1 if create else 0, err, _ERRLEN)
        if h == ffi.NULL:
            raise LedgerError(ffi.string(err).decode() or f"cannot open {path}")
        return cls(h, Path(path))

    @classmethod
    def read(cls, path: str | Path) -> Ledger:
        """To read it (anyone's): each snapshot a checked pread copy, never a mapping
        (ct_ledger_open_reader). Members' calls are refused on it."""
        ffi, lib = _tools()
        err = ffi.new("char[]", _ERRLEN)
        h = lib.ct_ledger_open_reader(os.fsencode(str(path)), err, _ERRLEN)
        if h == ffi.NULL:
            raise LedgerError(ffi.string(err).decode(errors="replace") or f"cannot read {path}")
        return cls(h, Path(path))

    @classmethod
    def create(
        cls,
        path: str | Path,
        limits: Mapping[int, int] | None = None,
        on_exceed: str = "fail",
        count_host: bool = False,
        group: str = "",
    ) -> Ledger:
        """Open path, creating it with these settings if it does not exist (.created says)."""
        ffi, lib = _tools()
        cfg = ffi.new("struct ct_ledger_config *")
        ndev = lib.CT_LEDGER_MAX_DEVICES
        for dev, n in (limits or {}).items():
            if not 0 <= int(dev) < ndev:
                raise LedgerError("device %s: the ledger counts devices 0 to %d" % (dev, ndev - 1))
            if not 0 <= int(n) < 1 << 64:
                raise LedgerError(f"device {dev}: bad limit {n!r}")
            cfg.limit[int(dev)] = int(n)
        if on_exceed not in _MODES:
            raise LedgerError("on_exceed must be fail or warn")
        cfg.on_exceed = _MODES[on_exceed]
        cfg.flags = lib.CT_LEDGER_F_COUNT_HOST if count_host else 0
        g = (group or "").encode()[:63]
        ffi.memmove(cfg.group, g, len(g))
        created = ffi.new("int32_t *")
        err = ffi.new("char[]", _ERRLEN)
        h = lib.ct_ledger_create(os.fsencode(str(path)), cfg, created, err, _ERRLEN)
        if h == ffi.NULL:
            raise LedgerError(ffi.string(err).decode() or f"cannot create {path}")
        return cls(h, Path(path), bool(created[0]))

    def close(self) -> None:
        h, self._h = self._h, None
        if h is not None:
            _tools()[1].ct_ledger_close(h)

    @property
    def h(self) -> Any:  # the struct ct_ledger * of cffi
        if self._h is None:
            raise LedgerError(f"ledger {self.path} is closed")
        return self._h

    # -- membership and accounting (mostly for tests: the shim does this in C)
    def join(self, pid: int | None = None, start_ticks: int = 0) -> int:
        return _check(_tools()[1].ct_ledger_join(self.h, pid or os.getpid(), start_ticks), "join")

    def leave(self) -> bool:
        return _tools()[1].ct_ledger_leave(self.h) == 0

    @property
    def slot(self) -> int:
        return _tools()[1].ct_ledger_slot(self.h)

    def reserve(self, dev: int, nbytes: int) -> bool:
        return (
            _check(
                _tools()[1].ct_ledger_reserve(
                    self.h, dev, nbytes, _tools()[0].NULL, _tools()[0].NULL
                ),
                "reserve",
            )
            == 1
        )

    def set_share(self, name: str | None, limit: int) -> None:
        """Count this handle's memberships in share `name` (<= 8 of A-Za-z0-9_.-), whose
        members together may hold at most `limit` bytes on each device."""
        rc = _tools()[1].ct_ledger_set_share(self.h, (name or "").encode(), int(limit))
        if rc != 0:
            raise LedgerError(f"invalid share name {name!r}: use 1 to 8 of A-Z a-z 0-9 _ . -")

    def adopt(self, limits: Mapping[int, int] | None) -> str | None:
        """The group rule (ct_ledger_adopt), as a member: the group's budget becomes `limits`
        (bytes per device; None: whatever it has) or LedgerError says why not (another budget
        with live members, none at all, another member deciding). Returns the note when this
        replaced a memberless group's budget, else None."""
        ffi, lib = _tools()
        want = ffi.NULL
        if limits is not None:
            want = ffi.new("uint64_t[]", lib.CT_LEDGER_MAX_DEVICES)
            for d, n in limits.items():
                want[int(d)] = int(n)
        replaced = ffi.new("int32_t *")
        err = ffi.new("char[]", _ERRLEN)
        rc = lib.ct_ledger_adopt(self.h, want, replaced, err, _ERRLEN)
        text = ffi.string(err).decode(errors="replace")
        if rc != 0:
            raise LedgerError(text or ffi.string(lib.ct_ledger_strerror(rc)).decode())
        return text if replaced[0] else None

    def force(self, dev: int, nbytes: int) -> bool:
        return _check(_tools()[1].ct_ledger_force(self.h, dev, nbytes), "force") == 1

    def release(self, dev: int, nbytes: int) -> bool:
        return _check(_tools()[1].ct_ledger_release(self.h, dev, nbytes), "release") == 1

    def reclaim(self) -> int:
        return _check(_tools()[1].ct_ledger_reclaim(self.h), "reclaim")

    def other_parts(self) -> int:
        """The other users' parts of this member's group (a shared directory), 0 elsewhere."""
        return int(_tools()[1].ct_ledger_other_parts(self.h))

    # -- settings and queries
    def limit(self, dev: int) -> int:
        return int(_tools()[1].ct_ledger_limit(self.h, dev))

    def limits(self) -> dict[int, int]:
        n = _tools()[1].CT_LEDGER_MAX_DEVICES
        return {d: v for d in range(n) if (v := self.limit(d))}

    def set_limit(self, dev: int, nbytes: int) -> None:
        _check(_tools()[1].ct_ledger_set_limit(self.h, dev, nbytes), "set_limit")

    def in_use(self, dev: int) -> int:
        return int(_tools()[1].ct_ledger_in_use(self.h, dev))

    def held(self, dev: int) -> int:
        return int(_tools()[1].ct_ledger_held(self.h, dev))

    @property
    def on_exceed(self) -> str:
        return _mode_name(_check(_tools()[1].ct_ledger_on_exceed(self.h), "on_exceed"))

    @on_exceed.setter
    def on_exceed(self, mode: str) -> None:
        if mode not in _MODES:
            raise LedgerError("on_exceed must be fail or warn")
        _check(_tools()[1].ct_ledger_set_on_exceed(self.h, _MODES[mode]), "set_on_exceed")

    @property
    def count_host(self) -> bool:
        lib = _tools()[1]
        return bool(_check(lib.ct_ledger_flags(self.h), "flags") & lib.CT_LEDGER_F_COUNT_HOST)

    @count_host.setter
    def count_host(self, on: bool) -> None:
        lib = _tools()[1]
        f = _check(lib.ct_ledger_flags(self.h), "flags")
        f = (f | lib.CT_LEDGER_F_COUNT_HOST) if on else (f & ~lib.CT_LEDGER_F_COUNT_HOST)
        _check(lib.ct_ledger_set_flags(self.h, f), "set_flags")

    def snapshot(self) -> LedgerSnapshot:
        """Everything `cudatrace status` shows, as plain JSON-able data."""
        ffi, lib = _tools()
        v = ffi.new("struct ct_ledger_view *")
        rc = lib.ct_ledger_snapshot(self.h, v)
        if rc < 0:
            why = ffi.string(lib.ct_ledger_damage(self.h)).decode(errors="replace")
            raise LedgerError(
                why or f"snapshot of {self.path}: {ffi.string(lib.ct_ledger_strerror(rc)).decode()}"
            )
        ndev = lib.CT_LEDGER_MAX_DEVICES
        alive_names = {
            lib.CT_LEDGER_ALIVE: "alive",
            lib.CT_LEDGER_DEAD: "dead",
            lib.CT_LEDGER_UNKNOWN: "unknown",
        }
        devices = []
        for d in range(ndev):
            row = {
                "device": d,
                "limit": int(v.limit[d]),
                "in_use": int(v.in_use[d]),
                "dead_held": int(v.dead_held[d]),
                "peak": int(v.peak[d]),
                "denials": int(v.denials[d]),
                "over": int(v.over[d]),
            }
            if any(row[k] for k in ("limit", "in_use", "dead_held", "peak", "denials", "over")):
                devices.append(row)
        members = []
        contexts: dict[int, int] = {}
        for i in range(v.nmembers):
            m = v.members[i]
            per = {}
            for d in range(ndev):
                row = {
                    "held": int(m.held[d]),
                    "peak": int(m.peak[d]),
                    "denials": int(m.denials[d]),
                    "over": int(m.over[d]),
                    "context": int(m.context[d]),
                }
                if any(row.values()):
                    per[d] = row
            state = alive_names.get(int(m.alive), "unknown")
            for d, row in per.items():  # held = allocations + the CUDA context
                row["allocations"] = max(0, row["held"] - row["context"])
                if state != "dead":
                    contexts[d] = contexts.get(d, 0) + row["context"]
            members.append(
                {
                    "slot": int(m.slot),
                    "pid": int(m.pid),
                    "state": state,
                    "other_pidns": bool(m.other_pidns),
                    "pidns": int(m.pidns),
                    "start_ticks": int(m.start_ticks),
                    "joined": _iso(m.joined_ns),
                    "share": share_name(int(m.share)),
                    "share_limit": int(m.share_limit),
                    "devices": per,
                    "uid": int(v.owner),
                }
            )
        for row in devices:
            row["contexts"] = contexts.get(row["device"], 0)
            row["allocations"] = max(0, row["in_use"] - row["contexts"])
        snap = {
            "path": str(self.path),
            "name": display_name(self.path),
            "group": ffi.string(v.group).decode(errors="replace"),
            "private": self.path.name.startswith(PRIVATE_PREFIX),
            "version": int(v.version),
            "uid": int(v.uid),
            "owner": int(v.owner),
            "created": _iso(v.created_ns),
            "on_exceed": _mode_name(v.on_exceed),
            "count_host": bool(v.flags & lib.CT_LEDGER_F_COUNT_HOST),
            "reclaimed": int(v.reclaimed),
            "devices": devices,
            "members": members,
        }
        return cast(LedgerSnapshot, snap)  # tests/unit/test_record_types.py holds it


# ---- `cudatrace run`: the ledger of a run (run_ledger.py opens it) -----------------------------


class RunLedger:
    """The ledger `cudatrace run` hands to its process tree (CUDATRACE_LEDGER=path)."""

    def __init__(self, ledger: Ledger, private: bool):
        self.ledger = ledger
        self.path = ledger.path
        self.private = private

    def summary(self) -> LedgerSnapshot | UnusableLedger:
        try:
            return self.ledger.snapshot()
        except LedgerError as e:
            return {"path": str(self.path), "error": str(e)}

    def finish(self) -> None:
        """Close; a private ledger is removed (a group's stays for its other members)."""
        self.ledger.close()
        if self.private:
            try:
                os.unlink(self.path)
            except OSError:
                pass
