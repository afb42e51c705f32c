"""The preload library installed on a node where CDI specs and patched pods point:

    <root>/shim/<id>/libcudatrace.so     the library (0644)
    <root>/shim/<id>/ld.so.preload       one line: that path (mounted over /etc/ld.so.preload)
    <root>/shim/<id>/platform/<p>/libcudatrace.so -> ../../libcudatrace.so
                                         what LD_PRELOAD names (env_preload)
    <root>/shim/current -> <id>          the newest install, for people

<id> is `<cudatrace version>-<12 hex digits of the library's SHA-256>`: a new build is a new
directory, so a running container keeps the library it mapped while new specs point at the
new one. A directory appears whole or not at all (built under a temporary name, renamed into
place); one whose library no longer matches its id is replaced the same way. Old ids are
removed by gc() once no process maps them, no spec names them, and they are not among the
newest few.

Every container of the node loads the library through /etc/ld.so.preload, whatever glibc its
image has; one it cannot link (a version it lacks) stops every program of the image at start.
So a library needing a glibc newer than native/Makefile's floor (GLIBC_FLOOR, 2.17) is never
installed: glibc_needs() reads what it needs, install() refuses it, saying which functions.

Through LD_PRELOAD (`--preload env`, sandboxes) the library is named by a path with glibc's
`$PLATFORM`, which glibc's loader expands (to the kernel's AT_PLATFORM, or on Intel x86-64 from
glibc 2.26 on to haswell or xeon_phi: every name has its link) and musl's does not: a musl
program (Alpine) finds no such file and starts unfenced, where the library itself, which musl
cannot link, would stop every program of the image (exit 127). /etc/ld.so.preload names the
library itself: musl never reads that file.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from .. import __version__, native
from ..errors import CudatraceError

SHIM_DIR = "shim"
PRELOAD_NAME = "ld.so.preload"
PLATFORM_DIR = "platform"
# the values of $PLATFORM in glibc's loader on x86-64 and aarch64: AT_PLATFORM, or what glibc
# 2.26 and later choose on Intel x86-64 CPUs (AVX2 and its peers: haswell; Knights Landing's
# AVX-512ER: xeon_phi)
PLATFORMS = ("x86_64", "haswell", "xeon_phi", "aarch64")
CURRENT = "current"
KEEP_NEWEST = 3  # ids gc() keeps whatever else holds them: pods admitted a moment ago


class InstallError(CudatraceError):
    """The preload library cannot be installed; the message says why."""


def glibc_floor() -> str:
    """The oldest glibc the preload library must load on: native/Makefile's GLIBC_FLOOR."""
    src = native.source_dir()
    text = (src / "Makefile").read_text() if src is not None else ""
    m = re.search(r"^GLIBC_FLOOR \?= *([0-9.]+) *$", text, re.M)
    if not m:
        raise InstallError("native/Makefile names no GLIBC_FLOOR (the package is incomplete)")
    return m.group(1)


def _version_key(v: str) -> tuple[int, ...]:
    return tuple(int(x) for x in v.split(".") if x.isdigit())


def glibc_needs(lib: Path) -> dict[str, list[str]]:
    """{glibc version: the functions bound to it} of what lib needs of glibc (its version
    needs: GLIBC_2.34 -> "2.34"), sorted by version."""
    from elftools.common.exceptions import ELFError
    from elftools.elf.elffile import ELFFile
    from elftools.elf.gnuversions import GNUVerNeedSection, GNUVerSymSection
    from elftools.elf.sections import SymbolTableSection

    out: dict[str, list[str]] = {}
    try:
        with open(lib, "rb") as f:
            elf = ELFFile(f)
            names = {}
            for sec in elf.iter_sections():
                if isinstance(sec, GNUVerNeedSection):
                    for _, auxes in sec.iter_versions():
                        for aux in auxes:
                            if aux.name.startswith("GLIBC_"):
                                names[aux["vna_other"]] = aux.name[len("GLIBC_") :]
            versym = next((s for s in elf.iter_sections() if isinstance(s, GNUVerSymSection)), None)
            dynsym = elf.get_section_by_name(".dynsym")
            for ver in names.values():
                out.setdefault(ver, [])
            if versym is not None and isinstance(dynsym, SymbolTableSection):
                for i, sym in enumerate(dynsym.iter_symbols()):
                    v = names.get(versym.get_symbol(i)["ndx"])
                    if v is not None and sym["st_shndx"] == "SHN_UNDEF":
                        out[v].append(sym.name)
    except (OSError, ELFError) as e:
        raise InstallError(f"cannot read the preload library {lib}: {e}") from None
    return {v: sorted(out[v]) for v in sorted(out, key=_version_key)}


def check_floor(lib: Path) -> None:
    """Refuse a library that needs a glibc newer than the floor (InstallError, naming what)."""
    floor = glibc_floor()
    above = {v: fns for v, fns in glibc_needs(lib).items() if _version_key(v) > _version_key(floor)}
    if above:
        what = "; ".join(f"{v} ({', '.join(fns) or '?'})" for v, fns in above.items())
        raise InstallError(
            f"{lib} needs glibc {what}: containers of images with an older glibc (Debian 11 "
            f"and Ubuntu 20.04 have 2.31) could not start any program with it preloaded. "
            f"Install the package's build, or build one with native/Makefile, whose floor is "
            f"glibc {floor} (tools/cross-build-shim for another machine)"
        )


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

    @property
    def env_preload(self) -> str:
        """What LD_PRELOAD names (preload_path)."""
        return preload_path(str(self.dir))


def preload_path(shim_dir: str) -> str:
    """The library of an install directory as LD_PRELOAD names it: through glibc's $PLATFORM,
    so that musl's loader, which cannot link it, passes it by (the module's docstring)."""
    return f"{shim_dir.rstrip('/')}/{PLATFORM_DIR}/$PLATFORM/{native.SHIM_LIB}"


def _platform_links(d: Path) -> list[Path]:
    return [d / PLATFORM_DIR / p / native.SHIM_LIB for p in PLATFORMS]


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
            and all(os.path.samefile(link, inst.lib) for link in _platform_links(inst.dir))
        )
    except (OSError, IndexError):
        return False


def _mkdir_root(path: Path) -> None:
    path.mkdir(mode=0o755, parents=True, exist_ok=True)
    if path.is_symlink() or not path.is_dir():
        raise InstallError(f"{path} is not a directory")


def install(root: Path, source: Path | None = None) -> Installed:
    """Install a build of the preload library under root (default: this package's); returns
    where it is. Idempotent: a whole install of the same build is left as it is. A build that
    needs a glibc newer than the floor is refused (check_floor)."""
    src = Path(source) if source is not None else native.shim_path()
    if not src.is_file():
        raise InstallError(f"no preload library at {src}")
    check_floor(src)
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
        for link in _platform_links(tmp):
            link.parent.mkdir(mode=0o755, parents=True)
            os.symlink(f"../../{native.SHIM_LIB}", link)
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
