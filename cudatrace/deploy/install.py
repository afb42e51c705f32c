"""The preload library installed on a node where CDI specs and patched pods point:

    <root>/shim/<id>/libcudatrace.so     the library (0644)
    <root>/shim/<id>/ld.so.preload       one line: that path (mounted over /etc/ld.so.preload)
    <root>/shim/current -> <id>          the newest install, for people

<id> is `<cudatrace version>-<12 hex digits of the library's SHA-256>`: a new build is a new
directory, so a running container keeps the library it mapped while new specs point at the
new one. A directory appears whole or not at all (built under a temporary name, renamed into
place); one whose library no longer matches its id is replaced the same way. Old ids are
removed by gc() once no process maps them, no spec names them, and they are not among the
newest few.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from .. import __version__, native
from ..errors import CudatraceError

SHIM_DIR = "shim"
PRELOAD_NAME = "ld.so.preload"
CURRENT = "current"
KEEP_NEWEST = 3  # ids gc() keeps whatever else holds them: pods admitted a moment ago


class InstallError(CudatraceError):
    """The preload library cannot be installed; the message says why."""


@dataclass(frozen=True)
class Installed:
    """One installed preload library."""

    root: Path
    ident: str

    @property
    def dir(self) -> Path:
        return self.root / SHIM_DIR / self.ident

    @property
    def lib(self) -> Path:
        return self.dir / native.SHIM_LIB

    @property
    def preload(self) -> Path:
        return self.dir / PRELOAD_NAME


def _digest(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def shim_ident(lib: Path | None = None) -> str:
    """The id of a build of the preload library (default: this package's)."""
    return f"{__version__}-{_digest(lib or native.shim_path())[:12]}"


def _whole(inst: Installed) -> bool:
    try:
        return (
            _digest(inst.lib)[:12] == inst.ident.rsplit("-", 1)[1]
            and inst.preload.read_text() == f"{inst.lib}\n"
        )
    except (OSError, IndexError):
        return False


def _mkdir_root(path: Path) -> None:
    path.mkdir(mode=0o755, parents=True, exist_ok=True)
    if path.is_symlink() or not path.is_dir():
        raise InstallError(f"{path} is not a directory")


def install(root: Path, source: Path | None = None) -> Installed:
    """Install a build of the preload library under root (default: this package's); returns
    where it is. Idempotent: a whole install of the same build is left as it is."""
    src = Path(source) if source is not None else native.shim_path()
    if not src.is_file():
        raise InstallError(f"no preload library at {src}")
    root = Path(root).absolute()
    inst = Installed(root, shim_ident(src))
    base = root / SHIM_DIR
    try:
        _mkdir_root(base)
        if not _whole(inst):
            _build(src, inst, base)
        _point_current(base, inst.ident)
    except OSError as e:
        raise InstallError(f"cannot install the preload library in {base}: {e}") from None
    return inst


def _build(src: Path, inst: Installed, base: Path) -> None:
    tmp = base / f".new-{inst.ident}-{os.getpid()}-{time.monotonic_ns()}"
    tmp.mkdir(mode=0o755)
    try:
        shutil.copyfile(src, tmp / native.SHIM_LIB)
        os.chmod(tmp / native.SHIM_LIB, 0o644)
        (tmp / PRELOAD_NAME).write_text(f"{inst.lib}\n")
        os.chmod(tmp / PRELOAD_NAME, 0o644)
        for name in (native.SHIM_LIB, PRELOAD_NAME):
            fd = os.open(tmp / name, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        old = None
        if inst.dir.exists() or inst.dir.is_symlink():  # damaged: moved aside, then removed
            old = base / f".old-{inst.ident}-{os.getpid()}-{time.monotonic_ns()}"
            os.rename(inst.dir, old)
        try:
            os.rename(tmp, inst.dir)
        except OSError:
            if not _whole(inst):  # another installer's rename came first: fine if whole
                raise
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def _point_current(base: Path, ident: str) -> None:
    link = base / CURRENT
    try:
        if os.readlink(link) == ident:
            return
    except OSError:
        pass
    tmp = base / f".current-{os.getpid()}-{time.monotonic_ns()}"
    os.symlink(ident, tmp)
    os.replace(tmp, link)


def installed(root: Path) -> list[Installed]:
    """Every install under root, oldest first (by the directory's time)."""
    base = Path(root) / SHIM_DIR
    try:
        entries = [e for e in os.scandir(base) if e.is_dir(follow_symlinks=False)]
    except FileNotFoundError:
        return []
    entries = [e for e in entries if not e.name.startswith(".")]
    entries.sort(key=lambda e: (e.stat(follow_symlinks=False).st_mtime_ns, e.name))
    return [Installed(Path(root), e.name) for e in entries]


def mapped_dirs(prefix: Path, proc: Path = Path("/proc")) -> set[str]:
    """Names of the directories right under prefix that some process maps a file of (its
    preload library), from every /proc/<pid>/maps readable here."""
    pre = str(prefix).rstrip("/") + "/"
    out: set[str] = set()
    for pid in os.listdir(proc):
        if not pid.isdigit():
            continue
        try:
            with open(proc / pid / "maps", encoding="utf-8", errors="replace") as f:
                for line in f:
                    i = line.find(pre)
                    if i >= 0:
                        out.add(line[i + len(pre) :].split("/", 1)[0])
        except OSError:
            continue
    return out


def gc(root: Path, referenced: set[str], proc: Path = Path("/proc")) -> list[str]:
    """Remove installs no process maps, no spec references (referenced: ids) and that are not
    among the KEEP_NEWEST newest; returns the ids removed."""
    all_ = installed(root)
    keep = set(referenced) | {i.ident for i in all_[-KEEP_NEWEST:]}
    try:
        keep.add(os.readlink(Path(root) / SHIM_DIR / CURRENT))
    except OSError:
        pass
    doomed = [i for i in all_ if i.ident not in keep]
    if not doomed:
        return []
    busy = mapped_dirs(Path(root).absolute() / SHIM_DIR, proc)
    removed = []
    for inst in doomed:
        if inst.ident in busy:
            continue
        aside = inst.dir.with_name(f".gone-{inst.ident}-{time.monotonic_ns()}")
        try:
            os.rename(inst.dir, aside)  # gone from its name at once, then emptied
        except OSError:
            continue
        shutil.rmtree(aside, ignore_errors=True)
        removed.append(inst.ident)
    return removed
