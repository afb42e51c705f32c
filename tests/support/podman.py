"""Real containers for the tests, without a registry: Podman (with runc) and an image imported
from a tarball of host files (the simulated driver, the test programs, a shell, and the
libraries they load).

    need_podman()            fail when root, podman or runc is missing
    podman fixture (session) a Podman: its containers.conf, the image, run()/popen()/kill()

Podman is pointed at a containers.conf of its own (CONTAINERS_CONF): runc (crun fails on this
kind of machine's hybrid cgroups), cgroupfs, file events, ulimits within `ulimit -H` (above the
hard limit a start fails), and the test image as the infra image (`podman kube play` needs a
pause container; the image's CMD is `sleep infinity`). A container sees the simulated GPU of a
state file through a bind mount, and the host's /proc at /host/proc (CUDASIM_HOST_PROC), so
that the simulated NVML names processes by host pids as the real one does.
"""

from __future__ import annotations

import hashlib
import itertools
import os
import re
import resource
import shutil
import subprocess
import tarfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from . import children

if TYPE_CHECKING:
    from .sim_fixtures import Sim

IMAGE_REPO = "localhost/cudatrace-test"
BIN = "/usr/local/bin"
SIMLIB = "/usr/lib/cudasim"
PRELOADS = "/usr/local/lib"
HOST_PROC = "/host/proc"
STATE = "/sim/state"
HOST_TOOLS = ("sh", "sleep", "cat", "env", "ls")


def need_podman() -> None:
    why = None
    if os.geteuid() != 0:
        why = "real containers with CDI devices need root (rootful Podman)"
    else:
        for tool in ("podman", "runc"):
            if not shutil.which(tool):
                why = f"no {tool} (apt-get install podman runc)"
                break
    if why is None:
        return
    pytest.fail(
        why + " (run the tests as root with tools/install-test-deps.sh's packages, as .ci/run does)"
    )


def _limit(which: int, cap: int) -> int:
    hard = resource.getrlimit(which)[1]
    return cap if hard == resource.RLIM_INFINITY else min(cap, hard)


def _deps(binary: Path) -> list[Path]:
    """The shared libraries binary loads (ldd), the loader included."""
    out = subprocess.run(["ldd", str(binary)], capture_output=True, text=True).stdout
    return [Path(p) for p in re.findall(r"(/\S+) \(0x", out)]


def _libgcc_s() -> Path:
    tag = {"x86_64": "x86-64", "aarch64": "AArch64"}.get(os.uname().machine, "?")
    out = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True).stdout
    for line in out.splitlines():
        if line.strip().startswith("libgcc_s.so.1 ") and tag in line:
            return Path(line.rsplit("=> ", 1)[1].strip())
    raise AssertionError("no libgcc_s.so.1 on this machine (ldconfig -p)")


def _add(tar: tarfile.TarFile, src: Path, dest: str, seen: set[str]) -> None:
    if dest in seen:
        return
    seen.add(dest)
    info = tar.gettarinfo(str(Path(src).resolve()), arcname=dest.lstrip("/"))
    info.uid = info.gid = 0
    info.uname = info.gname = "root"
    info.mode = 0o755
    with open(Path(src).resolve(), "rb") as f:
        tar.addfile(info, f)


def build_tarball(sim: Sim, out: Path) -> Path:
    """The image's root file system: tools, test programs, the simulated driver, their libs."""
    files: list[tuple[Path, str]] = []
    for tool in HOST_TOOLS:
        files.append((Path(shutil.which(tool) or f"/bin/{tool}"), f"/bin/{tool}"))
    for name, path in sorted(sim.progs.items()):
        if path is not None and name != "static_prog":
            files.append((path, f"{BIN}/{name}"))
    files.append((sim.libinterpose, f"{PRELOADS}/libinterpose.so"))
    for lib in ("libcuda.so.1", "libnvidia-ml.so.1"):
        files.append((sim.lib / lib, f"{SIMLIB}/{lib}"))
    # libgcc_s: the unwinder that names a denial's call site (glibc's backtrace loads it too;
    # application images have it, a tarball of C programs would not)
    gcc_s = Path(os.path.realpath(_libgcc_s()))
    files.append((gcc_s, str(_libgcc_s())))
    # libpthread.so.0, libdl.so.2: empty since glibc 2.34, still in every glibc package (and
    # NVIDIA's libcuda needs them); the preload library names them, for older glibc images
    libc = next(d for d in _deps(Path(shutil.which("sh") or "/bin/sh")) if d.name == "libc.so.6")
    for stub in ("libpthread.so.0", "libdl.so.2"):
        files.append((libc.with_name(stub), str(libc.with_name(stub))))
    libs: list[tuple[Path, str]] = []
    for src, _ in files:
        libs += [(d, str(d)) for d in _deps(src) if not str(d).startswith(str(sim.lib))]
    with tarfile.open(out, "w") as tar:
        seen: set[str] = set()
        for d in ("bin", "etc", "tmp", "proc", "sys", "dev", "run", "sim", HOST_PROC.lstrip("/")):
            info = tarfile.TarInfo(d)
            info.type = tarfile.DIRTYPE
            info.mode = 0o1777 if d == "tmp" else 0o755
            tar.addfile(info)
        for src, dest in files + libs:
            _add(tar, src, dest, seen)
    return out


class Podman:
    def __init__(self, conf: Path, image: str, work: Path):
        self.conf = conf
        self.image = image
        self.work = work
        self._n = itertools.count()

    def env(self) -> dict[str, str]:
        return dict(os.environ, CONTAINERS_CONF=str(self.conf))

    def cmd(self, *args: object) -> list[str]:
        return ["podman", *map(str, args)]

    def name(self) -> str:
        return f"ct-{os.getpid()}-{next(self._n)}"

    def sim_args(self, state: Path, ctx_bytes: int = 0) -> list[str]:
        """The simulated GPU of state, seen from a container (host pids through /host/proc).
        An empty file is a new state: the first process to map it lays it out."""
        state.touch(mode=0o666, exist_ok=True)
        args = ["-v", f"{state}:{STATE}", "-e", f"CUDASIM_STATE={STATE}"]
        args += ["-v", f"/proc:{HOST_PROC}:ro", "-e", f"CUDASIM_HOST_PROC={HOST_PROC}"]
        if ctx_bytes:
            args += ["-e", f"CUDASIM_CTX_BYTES={ctx_bytes}"]
        return args

    def run_args(self, *args: object, name: str | None = None) -> list[str]:
        return self.cmd("run", "--rm", "--network=none", "--name", name or self.name(), *args)

    def run(
        self, *args: object, timeout: float = 120, **kw: Any
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            self.run_args(*args),
            env=self.env(),
            capture_output=True,
            text=True,
            timeout=timeout,
            **kw,
        )

    def popen(self, *args: object, name: str) -> subprocess.Popen[str]:
        return children.popen(
            self.run_args(*args, name=name),
            env=self.env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    def podman(
        self, *args: object, timeout: float = 120, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        r = subprocess.run(
            self.cmd(*args), env=self.env(), capture_output=True, text=True, timeout=timeout
        )
        if check and r.returncode != 0:
            raise AssertionError(f"podman {' '.join(map(str, args))}: {r.stderr}")
        return r

    def remove(self, name: str) -> None:
        self.podman("rm", "-f", "-t", "0", name, check=False)


def write_conf(path: Path, infra_image: str) -> Path:
    nofile = _limit(resource.RLIMIT_NOFILE, 1024)
    nproc = _limit(resource.RLIMIT_NPROC, 4096)
    path.write_text(
        "[containers]\n"
        f'default_ulimits = ["nofile={nofile}:{nofile}", "nproc={nproc}:{nproc}"]\n'
        "[engine]\n"
        'runtime = "runc"\n'
        'cgroup_manager = "cgroupfs"\n'
        'events_logger = "file"\n'
        f'infra_image = "{infra_image}"\n'
    )
    return path


@pytest.fixture(scope="session")
def podman(sim: Sim, tmp_path_factory: pytest.TempPathFactory) -> Podman:
    need_podman()
    work = tmp_path_factory.mktemp("podman")
    work.chmod(0o755)
    tarball = build_tarball(sim, work / "rootfs.tar")
    tag = hashlib.sha256(tarball.read_bytes()).hexdigest()[:16]
    image = f"{IMAGE_REPO}:{tag}"
    conf = write_conf(work / "containers.conf", image)
    pm = Podman(conf, image, work)
    if pm.podman("image", "exists", image, check=False).returncode != 0:
        pm.podman(
            "import",
            "--change",
            f"ENV PATH={BIN}:/bin",
            "--change",
            f"ENV LD_LIBRARY_PATH={SIMLIB}",
            "--change",
            'CMD ["/bin/sleep", "infinity"]',
            tarball,
            image,
        )
    return pm
