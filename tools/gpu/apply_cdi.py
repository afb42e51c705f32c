#!/usr/bin/env python3
"""apply_cdi.py SPEC DEVICE ROOT -- CMD...: run CMD as a container runtime would with the CDI
device DEVICE of SPEC (a spec `cudatrace cdi` or `cudatrace node` wrote), where no runtime can
run: every directory of the host's / bound into ROOT (a fresh tmpfs; /tmp and /run fresh too), /etc an overlay of the host's (so
nothing of the host changes), /proc of the current pid namespace, and then the device's
containerEdits applied as a runtime applies them: its mounts (bind, read-only where the spec
says, or tmpfs) and its environment; then chroot ROOT and exec CMD.

Run it as root inside `unshare --mount --pid --fork` (tools/gpu/container_budget.sh does): the
mounts live in that mount namespace alone and CMD's pids are those of a new pid namespace, as
in a container. Extra bind mounts of the host: BIND=dir1:dir2 (the output directory, say);
HOST_PROC_AT=dir: the host's /proc there too (the simulated driver's CUDASIM_HOST_PROC).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

OWN = ("proc", "tmp", "run", "etc", "lost+found")  # made fresh (etc: an overlay of the host's)


def sh(*args: str) -> None:
    subprocess.run(args, check=True)


def bind(src: str, dest: Path, ro: bool = False) -> None:
    if Path(src).is_dir():
        dest.mkdir(parents=True, exist_ok=True)
    else:
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.touch(exist_ok=True)
    sh("mount", "--rbind", src, str(dest))
    if ro:
        sh("mount", "-o", "remount,bind,ro", str(dest))


def base_root(root: Path) -> None:
    sh("mount", "--make-rprivate", "/")
    root.mkdir(parents=True, exist_ok=True)
    sh("mount", "-t", "tmpfs", "-o", "mode=755", "tmpfs", str(root))
    for d in sorted(os.listdir("/")):
        if d in OWN:
            continue
        if Path("/", d).is_dir() and not Path("/", d).is_symlink():
            bind(f"/{d}", root / d)
        elif Path("/", d).is_symlink():
            os.symlink(os.readlink(f"/{d}"), root / d)
    over = root / ".etc"
    over.mkdir()
    sh("mount", "-t", "tmpfs", "tmpfs", str(over))
    (over / "up").mkdir()
    (over / "work").mkdir()
    (root / "etc").mkdir()
    sh("mount", "-t", "overlay", "overlay", "-o",
       f"lowerdir=/etc,upperdir={over}/up,workdir={over}/work", str(root / "etc"))  # fmt: skip
    for d in ("proc", "tmp", "run"):
        (root / d).mkdir(exist_ok=True)
    if os.environ.get("HOST_PROC_AT"):  # the host's procfs, before this namespace's covers it
        bind("/proc", root / os.environ["HOST_PROC_AT"].lstrip("/"), ro=True)
    sh("mount", "-t", "proc", "proc", str(root / "proc"))
    sh("mount", "-t", "tmpfs", "-o", "mode=1777", "tmpfs", str(root / "tmp"))
    sh("mount", "-t", "tmpfs", "-o", "mode=755", "tmpfs", str(root / "run"))
    for extra in filter(None, os.environ.get("BIND", "").split(":")):
        bind(extra, root / extra.lstrip("/"))


def apply_edits(edits: dict, root: Path) -> dict[str, str]:
    for m in edits.get("mounts", []):
        dest = root / m["containerPath"].lstrip("/")
        opts = m.get("options", [])
        if m.get("type") == "tmpfs":
            dest.mkdir(parents=True, exist_ok=True)
            sh("mount", "-t", "tmpfs", "-o", ",".join(o for o in opts if o != "bind") or
               "defaults", "tmpfs", str(dest))  # fmt: skip
        else:
            bind(m["hostPath"], dest, ro="ro" in opts)
        print(f"apply_cdi: mount {m['hostPath']} -> {m['containerPath']} {','.join(opts)}",
              file=sys.stderr)  # fmt: skip
    env = {}
    for item in edits.get("env", []):
        k, _, v = item.partition("=")
        env[k] = v
        print(f"apply_cdi: env {item}", file=sys.stderr)
    if edits.get("hooks") or edits.get("deviceNodes"):
        sys.exit("apply_cdi: hooks and device nodes are not applied here")
    return env


def main() -> None:
    if len(sys.argv) < 6 or sys.argv[4] != "--":
        sys.exit("usage: apply_cdi.py SPEC DEVICE ROOT -- CMD...")
    spec = json.loads(Path(sys.argv[1]).read_text())
    name, root, cmd = sys.argv[2], Path(sys.argv[3]), sys.argv[5:]
    devs = [d for d in spec["devices"] if d["name"] == name]
    if not devs:
        sys.exit(f"apply_cdi: no device {name} in {sys.argv[1]}")
    base_root(root)
    env = dict(os.environ)
    env.update(apply_edits(spec.get("containerEdits") or {}, root))
    env.update(apply_edits(devs[0].get("containerEdits") or {}, root))
    os.chroot(root)
    os.chdir("/")
    os.execvpe(cmd[0], cmd, env)


if __name__ == "__main__":
    main()
