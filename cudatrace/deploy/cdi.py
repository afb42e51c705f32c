"""Container Device Interface specs whose devices are budgets (`cudatrace cdi`), and the host
directories they mount.

Two specs, one per kind: `<vendor>/budget` (a size: `podman run --device
cudatrace.dev/budget=8GiB`, each container its own budget) and `<vendor>/group` (a named group
of the config: containers given it share one budget). Every device carries all its edits (the
preload library read-only, /etc/ld.so.preload or LD_PRELOAD, its fence record read-only at
/etc/cudatrace/fence, its ledger directory, the environment): a container takes one cudatrace
device (given two, Podman 4.3 applies the last one's edits). The records are files of the
install root, `<root>/fences/<vendor>-<kind>-<name>` (root's, 0644), written with the specs.

Each spec says the lowest `cdiVersion` its features need (min_version: the rules of the CDI
specification's versions), so runtimes that read older versions take it: Podman 4.3 reads up
to 0.5.0 and passes over newer specs without a word. A size device's name begins with a digit
and its tmpfs mount has a type: 0.5.0; a group spec needs only 0.3.0.

The files are `<cdi dir>/<vendor>-budget.json` and `<vendor>-group.json`, each written whole
(a temporary file renamed into place) and removed when it would have no device.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Iterable, Mapping
from pathlib import Path

from .. import fence_record
from ..errors import CudatraceError
from .install import SHIM_DIR, Installed
from .objects import CdiEdits, CdiMount, CdiSpec
from .plan import CONTAINER_LEDGER_DIR, LEDGER_TMPFS_SIZE, VENDOR, Fence, record

CDI_DIRS = ("/etc/cdi", "/var/run/cdi")  # where runtimes read specs (Podman 4.3: only these)
EARLIEST = (0, 3, 0)  # the oldest version runtimes still take
KINDS = ("budget", "group")
GROUPS_DIR = "groups"  # <state>/groups/<name>: a named group's ledger directory
FENCES_DIR = "fences"  # <root>/fences/<vendor>-<kind>-<name>: a device's sealed record


class CdiError(CudatraceError):
    """A spec that cannot be written; the message says why."""


# ---- the lowest version a spec needs ------------------------------------------------------


def _edits(spec: CdiSpec) -> list[CdiEdits]:
    return [spec.get("containerEdits") or {}] + [
        d.get("containerEdits") or {} for d in spec.get("devices", [])
    ]


def min_version(spec: CdiSpec) -> str:
    """The lowest cdiVersion whose features cover spec: 0.4.0 a mount's type; 0.5.0 a device
    name not beginning with a letter, a device node's hostPath; 0.6.0 annotations, a dot in the
    kind's class; 0.7.0 additional GIDs, Intel RDT."""
    need = EARLIEST
    edits = _edits(spec)
    if any(m.get("type") for e in edits for m in e.get("mounts", [])):
        need = max(need, (0, 4, 0))
    if any(not d["name"][:1].isalpha() for d in spec.get("devices", [])) or any(
        n.get("hostPath") for e in edits for n in e.get("deviceNodes", [])
    ):
        need = max(need, (0, 5, 0))
    cls = spec.get("kind", "").partition("/")[2]
    if spec.get("annotations") or any(d.get("annotations") for d in spec.get("devices", [])):
        need = max(need, (0, 6, 0))
    if "." in cls:
        need = max(need, (0, 6, 0))
    if any(e.get("additionalGids") or e.get("intelRdt") for e in edits):
        need = max(need, (0, 7, 0))
    return "%d.%d.%d" % need


# ---- the spec -------------------------------------------------------------------------------


def group_dir(state: Path, name: str) -> Path:
    return Path(state).absolute() / GROUPS_DIR / name


def record_file(root: Path, vendor: str, kind: str, name: str) -> Path:
    """Where a device's sealed record is on the host."""
    return Path(root).absolute() / FENCES_DIR / f"{vendor}-{kind}-{name}"


def device_edits(
    fence: Fence,
    inst: Installed,
    preload: str,
    state: Path,
    record_host: Path,
    ledger_host: Path | None = None,
) -> CdiEdits:
    """The containerEdits of one budget device: its sealed record (record_host, on the host)
    read-only where the preload library reads it. A group's ledger directory is its directory
    under state, or ledger_host when given (a DRA claim's: dra.py)."""
    ro = ["ro", "nosuid", "nodev", "bind"]
    mounts: list[CdiMount] = [
        {"hostPath": str(inst.dir), "containerPath": str(inst.dir), "options": ro},
        {"hostPath": str(record_host), "containerPath": fence_record.path(), "options": ro},
    ]
    if preload == "file":
        mounts.append(
            {"hostPath": str(inst.preload), "containerPath": "/etc/ld.so.preload", "options": ro}
        )
    if fence.group:
        mounts.append(
            {
                "hostPath": str(ledger_host or group_dir(state, fence.group)),
                "containerPath": CONTAINER_LEDGER_DIR,
                "options": ["rw", "nosuid", "nodev", "noexec", "bind"],
            }
        )
    else:  # the container's own: a tmpfs of its own (root's, sticky: any uid inside may use it)
        mounts.append(
            {
                "hostPath": "tmpfs",
                "containerPath": CONTAINER_LEDGER_DIR,
                "type": "tmpfs",
                "options": ["nosuid", "nodev", "noexec", "mode=1777", f"size={LEDGER_TMPFS_SIZE}"],
            }
        )
    env = fence_record.render(record(fence), inst.env_preload if preload == "env" else None).env
    return {"env": [f"{k}={v}" for k, v in env], "mounts": mounts}


def build_specs(
    fences: list[Fence], inst: Installed, state: Path, preload: str = "file", vendor: str = VENDOR
) -> dict[str, CdiSpec]:
    """kind -> spec, for the kinds that have devices."""
    out: dict[str, CdiSpec] = {}
    for kind in KINDS:
        devs = [f for f in fences if f.kind == kind]
        names = [f.name for f in devs]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise CdiError(f"{kind} {dup[0]!r} is given twice")
        if not devs:
            continue
        spec: CdiSpec = {
            "cdiVersion": "",
            "kind": f"{vendor}/{kind}",
            "devices": [
                {
                    "name": f.name,
                    "containerEdits": device_edits(
                        f, inst, preload, state, record_file(inst.root, vendor, kind, f.name)
                    ),
                }
                for f in devs
            ],
        }
        spec["cdiVersion"] = min_version(spec)
        out[kind] = spec
    return out


# ---- files ----------------------------------------------------------------------------------


def spec_path(cdi_dir: Path, vendor: str, kind: str) -> Path:
    return Path(cdi_dir) / f"{vendor}-{kind}.json"


def write_specs(specs: Mapping[str, CdiSpec], cdi_dir: Path, vendor: str = VENDOR) -> list[Path]:
    """Write each kind's spec whole; remove the file of a kind without devices. Returns the
    paths written."""
    d = Path(cdi_dir)
    try:
        d.mkdir(mode=0o755, parents=True, exist_ok=True)
    except OSError as e:
        raise CdiError(f"cannot make the CDI directory {d}: {e.strerror or e}") from None
    written = []
    for kind in KINDS:
        path = spec_path(d, vendor, kind)
        if kind not in specs:
            try:
                path.unlink()
            except FileNotFoundError:
                pass
            except OSError as e:
                raise CdiError(f"cannot remove {path}: {e.strerror or e}") from None
            continue
        write_spec(path, specs[kind])
        written.append(path)
    return written


def write_spec(path: Path, spec: CdiSpec) -> None:
    """Write one spec file whole (fence_record.write_whole; left as it is when it already says
    the same)."""
    text = json.dumps(spec, indent=2) + "\n"
    try:
        if path.is_file() and not path.is_symlink() and path.read_text() == text:
            return
        fence_record.write_whole(path, text)  # its temporary file not *.json: runtimes skip it
    except OSError as e:
        raise CdiError(f"cannot write {path}: {e.strerror or e}") from None


def referenced_idents(root: Path, cdi_dirs: Iterable[str] = CDI_DIRS) -> set[str]:
    """The installs (install.py ids) that spec files in cdi_dirs point at."""
    pre = str(Path(root).absolute() / SHIM_DIR) + "/"
    out: set[str] = set()
    for d in cdi_dirs:
        try:
            names = os.listdir(d)
        except OSError:
            continue
        for n in names:
            if not n.endswith(".json"):
                continue
            try:
                text = Path(d, n).read_text()
            except OSError:
                continue
            at = text.find(pre)
            while at >= 0:
                out.add(text[at + len(pre) :].split("/", 1)[0].split('"', 1)[0])
                at = text.find(pre, at + 1)
    return out


def write_records(fences: list[Fence], root: Path, vendor: str = VENDOR) -> list[Path]:
    """Write each device's sealed record (root's, 0644, in <root>/fences, 0755), and remove
    the records of this vendor's devices no longer offered. Returns the records written."""
    base = Path(root).absolute() / FENCES_DIR
    try:
        for d in (Path(root).absolute(), base):
            d.mkdir(mode=0o755, exist_ok=True)
            if d.is_symlink():
                raise CdiError(f"{d} is a symbolic link; refusing to use it")
        os.chmod(base, 0o755)
    except OSError as e:
        raise CdiError(f"cannot make {base}: {e.strerror or e}") from None
    written = []
    for f in fences:
        p = record_file(root, vendor, f.kind, f.name)
        try:
            fence_record.write(p, fence_record.render(record(f)).text)
        except fence_record.FenceRecordError as e:
            raise CdiError(str(e)) from None
        written.append(p)
    for p in base.glob(f"{vendor}-*"):
        if p not in written and any(p.name.startswith(f"{vendor}-{k}-") for k in KINDS):
            p.unlink(missing_ok=True)
    return written


# ---- the ledger directories of named groups -------------------------------------------------


def ensure_group_dirs(state: Path, fences: list[Fence]) -> list[Path]:
    """Make <state>/groups/<name> for each named group: root's, mode 1777 (a shared ledger
    directory: the containers' processes may run as any uid; docs/budgets.md). Returns those
    made now."""
    base = Path(state).absolute() / GROUPS_DIR
    made = []
    try:
        base.mkdir(mode=0o755, parents=True, exist_ok=True)
        for f in fences:
            if not f.group:
                continue
            p = base / f.group
            if p.is_symlink():
                raise CdiError(f"{p} is a symbolic link; refusing to use it")
            if not p.is_dir():
                p.mkdir(mode=0o755)
                made.append(p)
            os.chmod(p, 0o1777)
            shared_mark(p)
    except OSError as e:
        raise CdiError(f"cannot make the group directories in {base}: {e.strerror or e}") from None
    return made


def shared_mark(d: Path) -> None:
    """Root's mark in a shared ledger directory it made (docs/budgets.md, "Shared ledger
    directories"): the environment contract takes the directory only with it."""
    mark = d / fence_record.shared_mark()
    if mark.is_symlink():
        mark.unlink()
    if not mark.is_file():
        mark.touch(mode=0o444)


def stale_group_dirs(state: Path, names: set[str]) -> list[Path]:
    """Group directories under state whose group is not in names."""
    base = Path(state).absolute() / GROUPS_DIR
    try:
        return sorted(
            base / n for n in os.listdir(base) if n not in names and not n.startswith(".")
        )
    except OSError:
        return []


def ledger_dir_idle(path: Path) -> bool:
    """Whether a group's ledger directory can go: no process uses a ledger there (each user's
    part of the group read, never mapped: record/ledger_status.py dir_idle). Raises
    record.ledger.LedgerError when it cannot tell."""
    from ..record.ledger_status import dir_idle

    return dir_idle(path)


def remove_group_dir(path: Path) -> None:
    """Remove a group's directory (its ledger, lock, and anything else there): moved aside
    first, so a container starting now fails on the missing mount rather than seeing half."""
    aside = path.with_name(f".gone-{path.name}-{time.monotonic_ns()}")
    os.rename(path, aside)
    shutil.rmtree(aside, ignore_errors=True)


# ---- a node's side, at once -------------------------------------------------------------------


def prepare(
    offered: list[Fence],
    root: Path,
    state: Path,
    cdi_dir: Path | None,
    vendor: str = VENDOR,
    preload: str = "file",
    shim: Path | None = None,
) -> tuple[Installed, dict[str, CdiSpec], list[Path]]:
    """Install the preload library, make the named groups' directories, write the specs (to
    cdi_dir; None: only built). Returns (install, specs by kind, files written)."""
    from .install import install

    inst = install(root, shim)
    ensure_group_dirs(state, offered)
    specs = build_specs(offered, inst, state, preload, vendor)
    if cdi_dir is not None:  # the records first: a spec never names a record not written
        write_records(offered, root, vendor)
    written = write_specs(specs, cdi_dir, vendor) if cdi_dir is not None else []
    return inst, specs, written
