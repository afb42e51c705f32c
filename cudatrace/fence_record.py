"""The fence record: what fences a process, as native/include/fence.def declares it.

One record says what fences a process (its group, budget, ledger directory, share, what happens
over budget or when fencing fails, whom it belongs to). Every integration renders it with one
function, `render`: the text an operator's integration seals where the workload cannot write it
(a read-only file the CDI spec or the claim mounts at `PATH` in a container, a Slurm job's file
in `JOBS_DIR` a root Prolog writes), and the environment that goes with it (the preload library
through LD_PRELOAD, in one order, and the same fence in the environment contract's variables,
docs/budgets.md "Budgets without the launcher"). The preload library reads the record itself
(native/shim/fence.c, with the same table) and lets the environment only make it stricter;
`cudatrace run` by a user for their own program keeps the environment contract alone.

`find` is the preload library's search for the record of this process, in Python (`cudatrace
run` inside a sealed fence keeps it: record/fence.py); `parse` reads a record's text with the
library's rules.
"""

from __future__ import annotations

import errno
import functools
import os
import re
import stat
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from pathlib import Path

from . import settings
from .errors import CudatraceError


class FenceRecordError(CudatraceError):
    """A fence record that cannot be made or read; the message says why."""


@dataclass(frozen=True)
class Field:
    ident: str  # FENCE_<ID>
    key: str  # the record's key
    kind: str  # CT_FK_*
    setting: str | None  # the settings.def ID of the environment contract's variable
    meaning: str


_STRING = r'"(?:[^"\\]|\\.)*"'
_FIELD = re.compile(
    rf"^CT_FENCE_FIELD\(\s*(\w+),\s*({_STRING}),\s*(CT_FK_\w+),\s*(\w+),\s*((?:{_STRING}\s*)+)\)",
    re.M,
)
_DEFINE = re.compile(r"^#define (CT_FENCE_\w+) +(\d+|" + _STRING + ")", re.M)


def _c_string(text: str) -> str:
    return "".join(re.sub(r"\\(.)", r"\1", p[1:-1]) for p in re.findall(_STRING, text))


@functools.lru_cache(maxsize=1)
def _declared() -> tuple[dict[str, Field], dict[str, str | int]]:
    path = settings.definition_file().with_name("fence.def")
    try:
        text = path.read_text()
    except OSError as e:
        raise FenceRecordError(f"cannot read {path}: {e.strerror or e}") from None
    out = {}
    for m in _FIELD.finditer(text):
        ident, key, kind, setting, meaning = m.groups()
        out[ident] = Field(ident, _c_string(key), kind, None if setting == "NONE" else setting,
                           _c_string(meaning))  # fmt: skip
    consts: dict[str, str | int] = {}
    for name, value in _DEFINE.findall(text):
        consts[name] = int(value) if value.isdigit() else _c_string(value)
    return out, consts


def declared() -> dict[str, Field]:
    """{ID: Field} of native/include/fence.def, in its order."""
    return _declared()[0]


def constant(name: str) -> str | int:
    """A #define of fence.def: constant("CT_FENCE_PATH") == "/etc/cudatrace/fence"."""
    return _declared()[1][name]


VERSION = 1
MAGIC = "cudatrace-fence"


def path() -> str:
    """Where a container's record is (mounted read-only): CT_FENCE_PATH."""
    return str(constant("CT_FENCE_PATH"))


def jobs_dir() -> str:
    """Where a Slurm job's record is, by job id: CT_FENCE_JOBS_DIR."""
    return str(constant("CT_FENCE_JOBS_DIR"))


def shared_mark() -> str:
    """The file root puts in a shared ledger directory it made (CT_FENCE_SHARED_MARK)."""
    return str(constant("CT_FENCE_SHARED_MARK"))


def markdown_table() -> str:
    """The record's fields (docs/budgets.md, "The sealed fence"): key, the environment
    contract's variable naming the same thing, meaning."""
    rows = ["| key | in the environment contract | meaning |", "|---|---|---|"]
    for f in declared().values():
        var = f"`{settings.declared()[f.setting].name}`" if f.setting else "(the record's alone)"
        meaning = f.meaning.replace("|", "\\|")
        rows.append(f"| `{f.key}` | {var} | {meaning} |")
    return "\n".join(rows) + "\n"


# ---- the record ------------------------------------------------------------------------------

# the dataclass attribute of each field ID
_ATTR = {
    "GROUP": "group",
    "LEDGER": "ledger",
    "BUDGET": "budget",
    "LEDGER_DIR": "ledger_dir",
    "LEDGER_DIR_MAKE": "ledger_dir_make",
    "SHARE": "share",
    "SHARE_BUDGET": "share_budget",
    "SHARE_LABEL": "share_label",
    "ON_EXCEED": "on_exceed",
    "ON_FENCE_ERROR": "on_fence_error",
    "COUNT_HOST": "count_host",
    "COUNT_CONTEXTS": "count_contexts",
    "FENCE_ERROR": "fence_error",
    "UID": "uid",
    "OWNER": "owner",
}


@dataclass(frozen=True)
class FenceRecord:
    """One fence (fence.def's fields; None: not in the record). budget and share_budget are
    bytes: budget "N" for every device and/or "DEV=N" items, share_budget one amount."""

    group: str | None = None
    ledger: str | None = None
    budget: str | None = None
    ledger_dir: str | None = None
    ledger_dir_make: bool | None = None
    share: str | None = None
    share_budget: int | None = None
    share_label: str | None = None
    on_exceed: str | None = None
    on_fence_error: str | None = None
    count_host: bool | None = None
    count_contexts: bool | None = None
    fence_error: str | None = None
    uid: int | None = None
    owner: str | None = None

    def values(self) -> dict[str, str]:
        """{field ID: text} of the fields it has, each checked (FenceRecordError)."""
        out = {}
        for ident, f in declared().items():
            v = getattr(self, _ATTR[ident])
            if v is None:
                continue
            text = ("1" if v else "0") if isinstance(v, bool) else str(v)
            _check_value(f, text, "")
            out[ident] = text
        _check_fields(out, "")
        return out

    def with_error(self, why: str) -> FenceRecord:
        """The same fence, saying that the integration could not set it up (fence-error)."""
        return replace(self, fence_error=_one_line(why))


def _one_line(text: str) -> str:
    return " ".join("".join(c if c.isprintable() else " " for c in text).split())[:1000]


_CHOICES = {
    "CT_FK_FLAG": ("0", "1"),
    "CT_FK_EXCEED": ("fail", "warn", "abort"),
    "CT_FK_ON_ERROR": ("refuse", "warn"),
}


def _must(kind: str, v: str) -> str | None:
    """What a value of kind must be when v is not one (fence.c's bad_value), else None."""
    from . import native

    ffi, lib = native.tools()
    if kind in _CHOICES:
        return None if v in _CHOICES[kind] else ", ".join(_CHOICES[kind][:-1]) + " or " + (
            _CHOICES[kind][-1])  # fmt: skip
    if kind in ("CT_FK_GROUP", "CT_FK_SHARE"):
        share = kind == "CT_FK_SHARE"
        if lib.ct_ledger_valid_group(v.encode(errors="surrogateescape")) and not (
            share and len(v) > 8
        ):
            return None
        return f"a {'share' if share else 'group'} name (1 to {8 if share else 64} of A-Z a-z 0-9 _ . -)"
    if kind == "CT_FK_BUDGET":
        ok = lib.ct_ledger_parse_budget(v.encode(), ffi.new("uint64_t[16]"), ffi.NULL, 0) == 0
        return None if ok else "a budget in bytes (N, or DEV=N items)"
    if kind == "CT_FK_AMOUNT":
        ok = lib.ct_ledger_parse_size(v.encode(), ffi.new("uint64_t *"), ffi.NULL, 0) == 0
        return None if ok else "bytes"
    if kind == "CT_FK_PATH":
        return None if v.startswith("/") and len(v) < 1000 else "an absolute path"
    if kind == "CT_FK_UID":
        return None if v.isdigit() and len(v) <= 10 else "a uid (a number)"
    return None


def _check_value(f: Field, v: str, where: str) -> None:
    if not v:
        raise FenceRecordError(f"{where}{f.key!r} has no value")
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in v):
        raise FenceRecordError(f"{where}{f.key!r} holds a control character")
    bad = _must(f.kind, v)
    if bad:
        shown = f"'{v}'" if len(v) <= 48 else f"'{v[:40]}...' ({len(v)} bytes)"  # fence.c's
        raise FenceRecordError(f"{where}{f.key}={shown} is not {bad}")


def _check_fields(v: Mapping[str, str], where: str) -> None:
    why = None
    if ("GROUP" in v) == ("LEDGER" in v):
        why = "names neither a group nor a ledger, or both: give one"
    elif "BUDGET" not in v:
        why = "has no budget"
    elif "GROUP" in v and "LEDGER_DIR" not in v:
        why = "names a group without its ledger-dir"
    elif ("SHARE" in v) != ("SHARE_BUDGET" in v):
        why = "gives share and share-budget apart: both or neither"
    elif "LEDGER_DIR_MAKE" in v and "LEDGER_DIR" not in v:
        why = "gives ledger-dir-make without ledger-dir"
    if why:
        raise FenceRecordError(f"{where}the fence record {why}")


def preload(shim: str, existing: str = "") -> str:
    """LD_PRELOAD with the preload library first (once), the process's own after it, in their
    order: the one order of every integration (the library's dlsym is then the first a
    program reaches, whatever else it preloads)."""
    parts = [p for p in existing.replace(":", " ").split() if p and p != shim]
    return " ".join([shim, *parts])


@dataclass(frozen=True)
class Rendered:
    """A record as every integration gives it: text (the sealed file) and env (the
    environment, in order: LD_PRELOAD when the library goes through it, then the environment
    contract's variables naming the same fence)."""

    text: str
    env: list[tuple[str, str]]

    def env_dict(self) -> dict[str, str]:
        return dict(self.env)


def render(rec: FenceRecord, shim: str | None = None, existing_preload: str = "") -> Rendered:
    """The one rendering of a fence for every integration (launcher, Slurm, CDI, the admission
    webhook, the DRA plugin). shim: the preload library's path when LD_PRELOAD loads it (None:
    /etc/ld.so.preload does); existing_preload: the process's own LD_PRELOAD, kept after it."""
    values = rec.values()
    lines = [f"{MAGIC} {VERSION}"]
    env: list[tuple[str, str]] = []
    if shim:
        env.append(("LD_PRELOAD", preload(shim, existing_preload)))
    for ident, f in declared().items():
        if ident not in values:
            continue
        lines.append(f"{f.key}={values[ident]}")
        if f.setting:  # declared in settings.def (tests/unit/test_fence_render.py checks)
            env.append((settings.declared()[f.setting].name, values[ident]))
    text = "\n".join(lines) + "\n"
    if len(text.encode()) > int(constant("CT_FENCE_MAX")):
        raise FenceRecordError(f"the fence record is longer than {constant('CT_FENCE_MAX')} bytes")
    return Rendered(text, env)


def parse(text: str, where: str = "") -> FenceRecord:
    """A record's text read with the preload library's rules (native/shim/fence.c). Raises
    FenceRecordError."""
    if len(text.encode(errors="surrogateescape")) > int(constant("CT_FENCE_MAX")):
        raise FenceRecordError(f"{where}the fence record is longer than 4096 bytes")
    if "\0" in text:
        raise FenceRecordError(f"{where}the fence record holds a NUL byte")
    if not text:
        raise FenceRecordError(f"{where}the fence record is empty")
    if not text.endswith("\n"):
        raise FenceRecordError(f"{where}the fence record is cut short (no line feed at its end)")
    lines = text[:-1].split("\n")
    if lines[0] != f"{MAGIC} {VERSION}":
        first = repr(lines[0][:60])
        if lines[0].startswith(MAGIC + " "):
            raise FenceRecordError(
                f"{where}line 1: {first} is a version this preload library does not read "
                f"(it reads {VERSION})"
            )
        raise FenceRecordError(f"{where}line 1: {first} is not '{MAGIC} {VERSION}'")
    by_key = {f.key: f for f in declared().values()}
    values: dict[str, str] = {}
    for n, line in enumerate(lines[1:], 2):
        if not line or line.startswith("#"):
            continue
        key, eq, v = line.partition("=")
        f = by_key.get(key)
        if not eq or f is None:
            raise FenceRecordError(f"{where}line {n}: {key[:60]!r} is no key of a fence record")
        if f.ident in values:
            raise FenceRecordError(f"{where}line {n}: {key!r} is given twice")
        _check_value(f, v, f"{where}line {n}: ")
        values[f.ident] = v
    _check_fields(values, where)
    kw: dict[str, object] = {}
    for ident, v in values.items():
        attr = _ATTR[ident]
        kind = declared()[ident].kind
        kw[attr] = (v == "1") if kind == "CT_FK_FLAG" else v
        if kind == "CT_FK_UID":
            kw[attr] = int(v)
        elif ident == "SHARE_BUDGET":
            kw[attr] = _bytes(v)
    return FenceRecord(**kw)  # type: ignore[arg-type]


def _bytes(v: str) -> int:
    """An amount in the ledger's grammar (ct_ledger_parse_size), checked before."""
    from . import native

    ffi, lib = native.tools()
    out = ffi.new("uint64_t *")
    lib.ct_ledger_parse_size(v.encode(), out, ffi.NULL, 0)
    return int(out[0])


def limit(rec: FenceRecord) -> int:
    """The bytes a process of the fence may hold at most on a device: its share's, else the
    least of its budget's devices."""
    if rec.share_budget is not None:
        return rec.share_budget
    from . import native

    ffi, lib = native.tools()
    lim = ffi.new("uint64_t[16]")
    lib.ct_ledger_parse_budget((rec.budget or "").encode(), lim, ffi.NULL, 0)
    return min((int(x) for x in lim if x), default=0)


def shared_dir_problem(directory: str) -> str | None:
    """Why a ledger directory cannot be used under the environment contract (the preload
    library's rule, native/shim/budget.c): a shared one (sticky, writable by others) that root
    did not make for ledgers (no root's shared_mark() in it). None: it can."""
    try:
        st = os.lstat(directory)
    except OSError:
        return None  # the ledger says what is wrong with a missing one
    if not (stat.S_ISDIR(st.st_mode) and st.st_mode & stat.S_ISVTX and st.st_mode & 0o022):
        return None
    try:
        mark = os.lstat(os.path.join(directory, shared_mark()))
        if stat.S_ISREG(mark.st_mode) and mark.st_uid == 0:
            return None
    except OSError:
        pass
    return (
        f"ledger directory {directory} is a shared one (sticky, writable by others) that root "
        f"did not make for ledgers (no root's {shared_mark()} in it); use a directory of your "
        f'own (mode 0700), or, as root, touch DIR/{shared_mark()} (docs/budgets.md, "Shared '
        'ledger directories")'
    )


# ---- the record of this process: where the preload library looks (native/shim/fence.c) ------


@dataclass(frozen=True)
class Found:
    """The record that applies to this process: where, and what it says (None with error:
    why it cannot be used; the preload library then refuses the process's CUDA)."""

    path: str
    record: FenceRecord | None
    error: str | None = None


@functools.lru_cache(maxsize=1)
def _root_uids() -> tuple[int, ...]:
    """The uids the host's root may show as (fence.c): 0, and outside the initial user namespace
    the overflow uid of an unmapped owner."""
    try:
        if Path("/proc/self/uid_map").read_text().split() == ["0", "0", "4294967295"]:
            return (0,)
        return (0, int(Path("/proc/sys/kernel/overflowuid").read_text()))
    except (OSError, ValueError):
        return (0, 65534)


def _roots(st: os.stat_result) -> bool:
    return st.st_uid in _root_uids()


def _open_nofollow(p: str) -> tuple[int, bool]:
    """(fd, safe) as the library opens a record: never through a link; safe when every
    directory and the file are root's and writable by no one else (a sticky directory may
    be). OSError as open raises it."""
    dfd = os.open("/", os.O_RDONLY | os.O_DIRECTORY)
    st = os.fstat(dfd)
    safe = _roots(st) and not st.st_mode & 0o022
    parts = [x for x in p.split("/") if x]
    try:
        for i, comp in enumerate(parts):
            last = i == len(parts) - 1
            flags = os.O_NOFOLLOW | os.O_RDONLY | (os.O_NONBLOCK if last else os.O_DIRECTORY)
            fd = os.open(comp, flags, dir_fd=dfd)
            os.close(dfd)
            dfd = fd
            st = os.fstat(fd)
            open_ok = not st.st_mode & 0o022 or (not last and st.st_mode & stat.S_ISVTX)
            safe = safe and _roots(st) and bool(open_ok)
    except OSError:
        os.close(dfd)
        raise
    return dfd, safe


def read(p: str) -> Found | None:
    """The record at p checked as the library checks it; None when there is none."""
    try:
        fd, safe = _open_nofollow(p)
    except FileNotFoundError:
        return None
    except NotADirectoryError:
        return None
    except OSError as e:
        said = (
            "is reached through a symbolic link"
            if e.errno == errno.ELOOP
            else f"cannot be read: {e}"
        )
        return Found(p, None, f"the fence record {p} {said}")
    try:
        st = os.fstat(fd)
        ro = bool(os.fstatvfs(fd).f_flag & os.ST_RDONLY)
        why: str | None = None
        if not stat.S_ISREG(st.st_mode):
            why = "is not a regular file"
        elif not _roots(st) or st.st_mode & 0o022:
            why = "is not root's, or others may write it"
        elif not ro and not safe:
            why = "could be rewritten by the workload"
        data = os.read(fd, int(constant("CT_FENCE_MAX")) + 1) if why is None else b""
    finally:
        os.close(fd)
    if why:
        return Found(p, None, f"the fence record {p} {why}")
    try:
        return Found(p, parse(data.decode(errors="surrogateescape"), f"{p}: "))
    except FenceRecordError as e:
        return Found(p, None, str(e))


def cgroup_job(text: str) -> str | None:
    """The job of a /proc/self/cgroup text: its first component job_<id> (Slurm's
    task/cgroup layouts, cgroup v1 and v2)."""
    m = re.search(r"/job_(\d{1,20})(?=/|$)", text, re.M)
    return m.group(1) if m else None


def find(environ: Mapping[str, str] | None = None) -> Found | None:
    """The sealed record of this process, by the preload library's rules: a container's
    (PATH), else a Slurm job's (the job of its cgroup, else SLURM_JOB_ID's, else the strictest
    of its real uid's); a record of another uid is refused. Never a place the environment
    names."""
    env = os.environ if environ is None else environ
    found = read(path())
    if found is not None:
        return found
    jobs = jobs_dir()
    if not os.path.lexists(jobs):
        return None
    try:
        job = cgroup_job(Path("/proc/self/cgroup").read_text())
    except OSError:
        job = None
    named = env.get("SLURM_JOB_ID", "")
    for jid in [j for j in (job, named) if j and j.isdigit() and len(j) <= 20]:
        found = read(f"{jobs}/{jid}")
        if found is None:
            continue
        if found.record is not None and found.record.uid != os.getuid():
            return Found(found.path, None, f"the fence record {found.path} is another user's job's")
        return found
    return _own_record(jobs)


def _own_record(jobs: str) -> Found | None:
    best: tuple[int, str] | None = None
    try:
        names = sorted(n for n in os.listdir(jobs) if n.isdigit())
    except OSError:
        return None
    for n in names:
        f = read(f"{jobs}/{n}")
        if f is not None and f.record is not None and f.record.uid == os.getuid():
            key = (limit(f.record), f.path)
            best = key if best is None or key < best else best
    return read(best[1]) if best else None


assert {f.name for f in fields(FenceRecord)} == set(_ATTR.values())


def write_whole(target: Path, text: str) -> None:
    """Write a file an integration keeps (a fence record, a CDI spec) whole: a temporary file
    beside it (.NAME.PID.tmp, never through a link) synced and renamed into place, mode 0644:
    written as root, so the workload can read it and not write it. OSError as it comes, the
    temporary file removed."""
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, target)
    except OSError:
        try:
            tmp.unlink()
        except OSError:
            pass
        raise


def write(p: str | os.PathLike[str], text: str) -> None:
    """Write a record whole (write_whole)."""
    target = Path(p)
    try:
        write_whole(target, text)
    except OSError as e:
        raise FenceRecordError(
            f"cannot write the fence record {target}: {e.strerror or e}"
        ) from None
