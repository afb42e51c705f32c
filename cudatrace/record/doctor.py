"""`cudatrace doctor [CMD]`: what a run would see on this machine, as data (present/doctor.py
writes the text). Every probe is read here, nothing is assumed: the CUDA driver and NVML (their
versions, or why there are none), integrated or discrete devices, the ledger directory and its
permissions, the container and PID namespace this runs in, and whether CMD can be entered by the
preload library (static binary, setuid, the CUDA runtime linked statically or shared).
"""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path

from .. import settings
from ..record_types import (
    Doctor,
    DoctorCommand,
    DoctorDriver,
    DoctorElf,
    DoctorLedger,
    DoctorNamespace,
    DoctorNvml,
)
from .launcher import preload_ignored

INIT_PID_NS = 0xEFFFFFFC  # the kernel's initial pid namespace (PROC_PID_INIT_INO)


def probe_driver() -> DoctorDriver:
    from .cudadrv import Driver, version_text

    d = Driver()
    integ = [x.get("integrated") for x in d.devices if "integrated" in x]
    return {
        "available": d.available,
        "why": d.why or None,
        "version": d.version,
        "version_text": version_text(d.version),
        "devices": d.devices,
        "integrated": (
            "integrated"
            if integ and all(integ)
            else ("mixed" if any(integ) else ("discrete" if integ else None))
        ),
    }


def probe_nvml() -> DoctorNvml:
    from ..nvml import Nvml

    nv = Nvml()
    out: DoctorNvml = {
        "available": nv.available,
        "why": nv.why or None,
        "driver": nv.driver,
        "devices": len(nv.handles),
        "memory": [],
        "per_process": None,
        "memory_supported": None,
    }
    if nv.available:
        try:
            out["memory"] = nv.memory()
            out["per_process"] = any(m for m in nv.processes().values())
        finally:
            nv.shutdown()
    out["memory_supported"] = any("total" in m for m in out["memory"]) if out["memory"] else None
    return out


def probe_ledger() -> DoctorLedger:
    from .ledger import LedgerError, ledger_dir

    env = os.environ.get(settings.name("LEDGER_DIR"))
    out: DoctorLedger = {"env": env, "path": None, "exists": False, "ok": False, "error": None}
    try:
        p = ledger_dir(create=False)
        out["path"] = str(p)
    except LedgerError as e:
        out["error"] = str(e)
        return out
    try:
        st = os.lstat(p)
    except FileNotFoundError:
        out["ok"] = True  # made (0700) by the first run with a budget
        out["note"] = "does not exist yet: the first run with a budget makes it (mode 0700)"
        return out
    out["exists"] = True
    out["uid"] = st.st_uid
    out["mode"] = "%04o" % (st.st_mode & 0o7777)
    out["ok"] = True
    out["fs"] = _fs_type(str(p))
    try:
        out["ledgers"] = sorted(n for n in os.listdir(p) if n.endswith(".ledger"))
    except OSError as e:
        out["ledgers"] = []
        out["error"] = f"cannot list it: {e.strerror}"
    return out


def _fs_type(path: str) -> str | None:
    """The file system type of the mount that holds path (/proc/self/mounts)."""
    best, kind = "", None
    try:
        with open("/proc/self/mounts") as f:
            for line in f:
                parts = line.split()
                if len(parts) >= 3 and (
                    path == parts[1] or path.startswith(parts[1].rstrip("/") + "/")
                ):
                    if len(parts[1]) >= len(best):
                        best, kind = parts[1], parts[2]
    except OSError:
        return None
    return kind


def probe_namespace() -> DoctorNamespace:
    def ns(pid: int | str) -> int | None:
        try:
            return os.stat(f"/proc/{pid}/ns/pid").st_ino
        except OSError:
            return None

    me, init = ns("self"), ns(1)
    out: DoctorNamespace = {
        "pidns": me,
        "pidns_of_pid1": init,
        "initial_pidns": me == INIT_PID_NS if me else None,
        "pid": os.getpid(),
        "uid": os.geteuid(),
        "container": None,
        "cgroup": None,
    }
    for marker, kind in (("/.dockerenv", "docker"), ("/run/.containerenv", "podman")):
        if os.path.exists(marker):
            out["container"] = kind
    try:
        cg = Path("/proc/self/cgroup").read_text().strip().splitlines()
        out["cgroup"] = cg[-1].split(":", 2)[-1] if cg else None
        if out["container"] is None:
            for word in ("docker", "kubepods", "libpod", "containerd", "lxc"):
                if any(word in line for line in cg):
                    out["container"] = word
                    break
    except OSError:
        pass
    if out["container"] is None and me and me != INIT_PID_NS:
        out["container"] = "a pid namespace"
    return out


# ---- can CMD be entered ----------------------------------------------------------------------


def probe_command(argv0: str, depth: int = 0) -> DoctorCommand:
    out: DoctorCommand = {"argv0": argv0, "path": None, "ok": False, "problems": [], "kind": None}
    path = argv0 if os.sep in argv0 else shutil.which(argv0)
    if not path or not os.path.exists(path):
        out["problems"].append("not found")
        return out
    out["path"] = path = os.path.realpath(path)
    st = os.stat(path)
    if preload_ignored(st):  # the same rule as `run`: only when exec changes the ids
        out["problems"].append("setuid/setgid: the loader ignores LD_PRELOAD for it")
    elif st.st_mode & (stat.S_ISUID | stat.S_ISGID):
        out["notes"] = ["setuid/setgid, but to the caller's own ids: entered like any other"]
    if not os.access(path, os.X_OK):
        out["problems"].append("not executable")
    try:
        with open(path, "rb") as f:
            head = f.read(256)
    except OSError as e:
        out["problems"].append(f"unreadable: {e.strerror}")
        return out
    if head.startswith(b"#!"):
        out["kind"] = "script"
        words = head[2:].split(b"\n", 1)[0].decode(errors="replace").split()
        if words:
            interp = words[0]
            if Path(interp).name == "env" and len(words) > 1:
                interp = words[1]
            if depth < 3:
                out["interpreter"] = probe_command(interp, depth + 1)
                out["problems"] += ["interpreter: " + p for p in out["interpreter"]["problems"]]
    elif head[:4] == b"\x7fELF":
        elf = _elf(path)  # its keys in its order (a TypedDict's update takes only its own type)
        out["kind"], out["static"], out["needed"] = elf["kind"], elf["static"], elf["needed"]
        out["cudart"], out["driver"], out["machine"] = elf["cudart"], elf["driver"], elf["machine"]
        if out["static"]:
            out["problems"].append("statically linked: LD_PRELOAD cannot enter it")
    else:
        out["kind"] = "unknown"
        out["problems"].append("neither an ELF binary nor a script")
    out["ok"] = not out["problems"]
    return out


def _elf(path: str) -> DoctorElf:
    from elftools.elf.dynamic import DynamicSection
    from elftools.elf.elffile import ELFFile
    from elftools.elf.sections import SymbolTableSection

    out: DoctorElf = {"kind": "elf", "static": False, "needed": [], "cudart": None, "driver": None}
    with open(path, "rb") as f:
        elf = ELFFile(f)
        out["machine"] = elf["e_machine"]
        out["static"] = not any(seg["p_type"] == "PT_INTERP" for seg in elf.iter_segments())
        # a section of another type under the name (NOBITS in a debug-info file) is not read
        dyn = elf.get_section_by_name(".dynamic")
        if isinstance(dyn, DynamicSection):
            # pyelftools sets a DT_NEEDED tag's .needed with setattr: mypy cannot see it
            out["needed"] = [t.needed for t in dyn.iter_tags() if t.entry.d_tag == "DT_NEEDED"]  # type: ignore[attr-defined]
        defined = set()
        for name in (".dynsym", ".symtab"):
            sec = elf.get_section_by_name(name)
            if not isinstance(sec, SymbolTableSection):
                continue
            for sym in sec.iter_symbols():
                if (
                    sym.name in ("cudaMalloc", "cudaGetDeviceCount", "__cudaRegisterFatBinary")
                    and sym["st_shndx"] != "SHN_UNDEF"
                ):
                    defined.add(sym.name)
        ro = elf.get_section_by_name(".rodata")
        dlopens_driver = bool(ro is not None and b"libcuda.so.1" in ro.data())
    out["cudart"], out["driver"] = _runtime_and_driver(out["needed"], defined, dlopens_driver)
    return out


def _runtime_and_driver(
    needed: list[str], cudart_defined: set[str], names_driver: bool
) -> tuple[str | None, str | None]:
    """(how the CUDA runtime is linked, how the driver is reached): the runtime is static only
    when the binary defines its functions (cudaMalloc ...); a program that names libcuda.so.1
    without them loads the driver itself (dlopen), with no runtime at all."""
    shared = next((n for n in needed if n.startswith("libcudart.so")), None)
    if shared:
        cudart: str | None = f"shared ({shared})"
    elif cudart_defined:
        cudart = "static (linked in; it loads libcuda.so.1 itself)"
    else:
        cudart = None
    if "libcuda.so.1" in needed:
        driver: str | None = "linked (-lcuda)"
    elif names_driver and not cudart:
        driver = 'loaded by the program itself (dlopen("libcuda.so.1"))'
    elif names_driver or cudart:
        driver = "loaded at run time"
    else:
        driver = None
    return cudart, driver


# ---- what to do ------------------------------------------------------------------------------


def advice(r: Doctor) -> list[str]:
    out = []
    drv, nv, led, ns = r["driver"], r["nvml"], r["ledger"], r["namespace"]
    if not drv["available"]:
        out.append(
            "No CUDA driver here: a run traces nothing until the program finds one "
            "(install the NVIDIA driver, or in a container pass the GPU: docker --gpus all, "
            "podman --device nvidia.com/gpu=all)."
        )
        out.append(
            "No GPU? `cudatrace run --simulated -- CMD` runs CMD on cudatrace's simulated CUDA "
            "driver (a program using libcuda.so.1: C, or Python through ctypes), and "
            "`cudatrace demo` shows a whole session on it."
        )
    if drv.get("integrated") in ("integrated", "mixed"):
        out.append(
            "Integrated (unified-memory) device: NVML has no memory figures here; reports "
            "compare the trace with /proc/meminfo and the tree's RSS/PSS, pinned host "
            "memory counts against a budget, and --budget N% is a share of the device's "
            "total as the driver reports it."
        )
    elif not nv["available"] and drv["available"]:
        out.append(
            "No NVML: reports show no observed device figures and budgets cannot count "
            "CUDA contexts (%s)." % (nv["why"] or "unavailable")
        )
    elif nv.get("per_process") is False:
        out.append(
            "NVML lists no process figures now (none uses the GPU, or this pid namespace "
            "cannot see them): contexts are counted only where NVML lists the process."
        )
    if not led["ok"]:
        out.append(
            "The ledger directory is refused: {}. Give one you own with mode 0700: "
            "--ledger-dir DIR or CUDATRACE_LEDGER_DIR.".format(led["error"])
        )
    if ns.get("container"):
        out.append(
            "Running in {}: to share a --group budget with other containers, bind-mount "
            "one host directory (mode 0700, owned by the uid the programs run as) into "
            "each and pass it with --ledger-dir (docs/budgets.md).".format(ns["container"])
        )
    cmd = r.get("command")
    if cmd:
        if cmd["ok"]:
            interp = cmd.get("interpreter")
            rt = cmd.get("cudart") or (interp.get("cudart") if interp else None)
            how = (
                "; CUDA runtime " + rt
                if rt
                else (
                    "; it loads libcuda.so.1 itself"
                    if "dlopen" in (cmd.get("driver") or "")
                    else ""
                )
            )
            out.append("{} can be entered{}.".format(cmd["argv0"], how))
        else:
            for p in cmd["problems"]:
                if "setuid" in p:
                    out.append("{} is setuid: run a copy without the bit.".format(cmd["argv0"]))
                elif "statically linked" in p:
                    out.append(
                        "{} is static: nothing can be traced; rebuild it dynamically "
                        "linked (the CUDA runtime may stay static).".format(cmd["argv0"])
                    )
                else:
                    out.append("{}: {}.".format(cmd["argv0"], p))
    return out


def diagnose(cmd: list[str] | None = None) -> Doctor:
    r: Doctor = {
        "driver": probe_driver(),
        "nvml": probe_nvml(),
        "ledger": probe_ledger(),
        "namespace": probe_namespace(),
        "command": probe_command(cmd[0]) if cmd else None,
        "advice": [],
    }
    r["advice"] = advice(r)
    return r
