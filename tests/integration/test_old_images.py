"""The images people run, given a cudatrace device (`cudatrace cdi`) under real Podman and runc:

- Debian 11 (glibc 2.31, as Ubuntu 20.04 and the CUDA base images built on them), made with
  mmdebstrap from Debian's archive (tests/support/debian_roots.py) and imported as it is: its
  own programs start with the preload library mapped, and the test programs (built against its
  glibc, the simulated driver with them, mounted from the host) run fenced: an
  allocation over the budget refused with the shim's line, the real dlsym found in libdl (the
  pre-2.34 route), through /etc/ld.so.preload and through LD_PRELOAD alike. A library built
  here without the floor stops every program of that image: what this used to do.
- musl (Alpine's C library): a static program and a dynamic one under musl's own loader (both
  built with musl-gcc) start, unfenced: musl never reads /etc/ld.so.preload, and LD_PRELOAD
  names the library through glibc's $PLATFORM, which musl leaves as it is (the plain path stops
  every dynamic musl program: musl cannot link a glibc library).
- aarch64: the cross-built library (aarch64-linux-gnu-gcc against Debian 12's glibc 2.36) in
  Debian 11's arm64 root under qemu: fenced, its dlsym found in libdl under GLIBC_2.17.

Needs root, podman, runc, mmdebstrap, musl-tools, qemu-user, the aarch64 cross compiler and the
network to deb.debian.org (a missing one fails the test, as everywhere in the suite). Run it
under the servers lock (docs/DEVELOPING.md): the specs go to /var/run/cdi under a vendor of
this session's own, removed at the end.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import tarfile
from pathlib import Path
from types import SimpleNamespace

import pytest
from test_container_budgets import CDI_DIR, Node, allocs
from test_routes import traced_ops

from support import cross, debian_roots
from support.cli import checkout_env, cudatrace
from support.paths import PROGS, REPO
from support.podman import Podman, need_podman, write_conf
from support.shared_build import shared_build

MiB = 1 << 20
SIM_DIR = "/opt/cudatrace-sim"  # the old-glibc simulated driver and programs, mounted
MUSL_LOADER = Path("/lib/ld-musl-x86_64.so.1")  # Debian's musl package: Alpine's loader


def _import(pm: Podman, tar: Path, repo: str) -> str:
    digest = hashlib.sha256()
    with open(tar, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    image = f"{repo}:{digest.hexdigest()[:16]}"
    if pm.podman("image", "exists", image, check=False).returncode != 0:
        pm.podman("import", "--change", 'CMD ["/bin/true"]', tar, image, timeout=300)
    return image


def _musl_programs(work: Path) -> dict[str, str]:
    """preload_probe for musl, static and dynamic (musl-gcc: Debian's musl-tools), and the
    image's tarball with musl's loader beside them."""
    out = {}
    for kind, flags in (("static", ["-static"]), ("dynamic", [])):
        exe = work / f"probe-{kind}"
        r = subprocess.run(
            ["musl-gcc", *flags, "-O1", "-o", str(exe), str(PROGS / "preload_probe.c")],
            capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert r.returncode == 0, r.stderr
        out[kind] = str(exe)
    tar = work / "musl.tar"
    with tarfile.open(tar, "w") as t:
        for d in ("bin", "lib", "etc", "tmp", "proc", "sys", "dev", "run"):
            info = tarfile.TarInfo(d)
            info.type, info.mode = tarfile.DIRTYPE, 0o755
            t.addfile(info)
        for src, dest in (
            (MUSL_LOADER.resolve(), MUSL_LOADER.relative_to("/")),
            (Path(out["static"]), Path("bin/probe-static")),
            (Path(out["dynamic"]), Path("bin/probe-dynamic")),
        ):
            info = t.gettarinfo(str(src), arcname=str(dest))
            info.uid = info.gid = 0
            info.mode = 0o755
            with open(src, "rb") as f:
                t.addfile(info, f)
    out["tar"] = str(tar)
    return out


def _unfloored(work: Path) -> str:
    """The preload library built here for this glibc alone (GLIBC_FLOOR=): what every build
    was before the floor."""
    r = subprocess.run(
        [str(REPO / "tools" / "cross-build-shim"), "cc", str(work), "GLIBC_FLOOR="],
        capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    need_podman()
    if not MUSL_LOADER.exists() or not shutil.which("musl-gcc"):
        pytest.fail("no musl-gcc or musl's loader (apt-get install musl-tools: install-test-deps)")
    root = debian_roots.bullseye(tmp_path_factory)
    work = tmp_path_factory.mktemp("old-images")
    work.chmod(0o755)
    musl = shared_build(tmp_path_factory, "musl-image", _musl_programs)
    conf = write_conf(work / "containers.conf", "localhost/none")
    pm = Podman(conf, "", work)
    bullseye = _import(pm, Path(root["tar"]), "localhost/cudatrace-bullseye")
    musl_image = _import(pm, Path(musl["tar"]), "localhost/cudatrace-musl")
    sim = debian_roots.old_sim(tmp_path_factory, "x86_64")
    return SimpleNamespace(
        pm=pm, bullseye=bullseye, musl=musl_image, root=root, sim=sim["libdir"].parent
    )


@pytest.fixture(scope="module")
def node(images, tmp_path_factory):
    base = tmp_path_factory.mktemp("old-node")
    base.chmod(0o755)
    n = Node(base)
    n.env_vendor = n.vendor.replace("cudatrace.dev", "env.cudatrace.dev")
    env = checkout_env()
    for vendor, preload in ((n.vendor, "file"), (n.env_vendor, "env")):
        r = cudatrace(
            env, "cdi", "--root", n.root, "--state", n.state, "--vendor", vendor,
            "--cdi-dir", CDI_DIR, "--budget", "1GiB", "--preload", preload,
        )  # fmt: skip
        assert r.returncode == 0, r.stderr
        assert "images with glibc 2.17 or later" in r.stderr, r.stderr
    yield n
    for v in (n.vendor, n.env_vendor):
        for kind in ("budget", "group"):
            (CDI_DIR / f"{v}-{kind}.json").unlink(missing_ok=True)


def _run(images, node, cmd: list[str], *opts: str, vendor=None, image=None):
    """podman run OPTS IMAGE CMD with a 1 GiB budget device (file or env vendor)."""
    device = f"{vendor or node.vendor}/budget=1GiB"
    return images.pm.run("--device", device, *opts, image or images.bullseye, *cmd)


def _sim(images, state: Path) -> list[str]:
    return [
        "-v", f"{images.sim}:{SIM_DIR}:ro", "-e", f"LD_LIBRARY_PATH={SIM_DIR}/lib",
        *images.pm.sim_args(state),
    ]  # fmt: skip


@pytest.mark.parametrize("preload", ["file", "env"])
def test_debian_11_programs_start_with_the_library_loaded(images, node, preload):
    vendor = node.vendor if preload == "file" else node.env_vendor
    r = _run(images, node, ["/bin/true"], vendor=vendor)
    assert r.returncode == 0 and r.stderr == "", (r.returncode, r.stderr)
    r = _run(images, node, ["/bin/cat", "/proc/self/maps"], vendor=vendor)
    assert r.returncode == 0, r.stderr
    assert f"{node.root}/shim/" in r.stdout and "libcudatrace.so" in r.stdout, r.stdout
    assert "/lib/x86_64-linux-gnu/libc-2.31.so" in r.stdout  # Debian 11's own C library


@pytest.mark.parametrize("preload", ["file", "env"])
def test_debian_11_over_budget_is_refused_with_the_shims_line(images, node, sim, preload):
    vendor = node.vendor if preload == "file" else node.env_vendor
    state = sim.new_state()
    hold = [f"{SIM_DIR}/bin/hold", "--exit-after-ms", "10", "--free", "3", "400m"]
    r = _run(images, node, hold, *_sim(images, state), vendor=vendor)
    assert r.returncode == 1, (r.stdout, r.stderr)
    assert allocs(r.stdout) == ["0", "0", "2"], r.stdout
    (line,) = [l for l in r.stderr.splitlines() if "budget exceeded" in l]
    assert "cuMemAlloc_v2 of 400.00 MiB" in line and "budget 1.00 GiB, in use 800.00 MiB" in line
    assert "at hold_alloc" in line and "CUDA_ERROR_OUT_OF_MEMORY" in line, line
    assert sim.stats(state)[0]["hwm"] == 800 * MiB  # the device held what was granted


def test_debian_11_real_dlsym_is_libdls(images, node, sim, tmp_path):
    """glibc 2.31 has dlsym in libdl.so.2 under GLIBC_2.2.5: the library's search for the real
    one (GLIBC_2.34 first) finds it there, and every route's call is traced."""
    out = tmp_path / "trace"
    out.mkdir()
    r = _run(
        images, node, [f"{SIM_DIR}/bin/route_dlsym"], *_sim(images, sim.new_state()),
        "-v", f"{out}:/trace", "-e", "CUDATRACE_DIR=/trace",
    )  # fmt: skip
    assert r.returncode == 0, (r.stdout, r.stderr)
    t, got = traced_ops(out)
    assert t.info.get("dlsym_version") == "GLIBC_2.2.5", t.info
    assert got and all(e["stack"] for _, _, e in got)


def test_a_library_without_the_floor_stops_every_program(images, node, tmp_path_factory):
    """What the floor prevents: the library built here (glibc 2.36) for this glibc alone, named
    in Debian 11's /etc/ld.so.preload, and /bin/true exits 1 (cudatrace cdi refuses to install
    such a build: tests/unit/test_glibc_floor.py)."""
    lib = Path(shared_build(tmp_path_factory, "unfloored-shim", _unfloored))
    preload = lib.with_name("ld.so.preload")
    preload.write_text("/opt/old/libcudatrace.so\n")
    r = images.pm.run(
        "-v", f"{lib.parent}:/opt/old:ro", "-v", f"{preload}:/etc/ld.so.preload:ro",
        images.bullseye, "/bin/true",
    )  # fmt: skip
    assert r.returncode == 1, (r.returncode, r.stderr)
    assert "version `GLIBC_2.3" in r.stderr and "/opt/old/libcudatrace.so" in r.stderr, r.stderr


@pytest.mark.parametrize("preload", ["file", "env"])
@pytest.mark.parametrize("kind", ["static", "dynamic"])
def test_musl_programs_start_unfenced(images, node, preload, kind):
    vendor = node.vendor if preload == "file" else node.env_vendor
    r = _run(images, node, [f"/bin/probe-{kind}"], vendor=vendor, image=images.musl)
    assert r.returncode == 0, (r.returncode, r.stdout, r.stderr)
    seen = dict(line.split(": ", 1) for line in r.stdout.splitlines())
    assert seen["mapped"] == "no", r.stdout  # unfenced: the library is not in the process
    if preload == "file":  # the file is there; musl's loader never reads it
        assert seen["preload-file"].startswith(f"{node.root}/shim/"), r.stdout
    else:
        assert seen["ld-preload"].endswith("/platform/$PLATFORM/libcudatrace.so"), r.stdout


def test_a_plain_ld_preload_stops_dynamic_musl_programs(images, node):
    """Why LD_PRELOAD names the library through $PLATFORM: the plain path, and musl's loader
    tries to link it, fails, and exits 127 (the static program has no loader)."""
    r = _run(images, node, ["/bin/probe-static"], image=images.musl)
    lib = r.stdout.split("preload-file: ", 1)[1].split("\n", 1)[0]
    assert lib.endswith("/libcudatrace.so"), r.stdout
    r = _run(images, node, ["/bin/probe-dynamic"], "-e", f"LD_PRELOAD={lib}", image=images.musl)
    assert r.returncode == 127 and "symbol not found" in r.stderr, (r.returncode, r.stderr)
    r = _run(images, node, ["/bin/probe-static"], "-e", f"LD_PRELOAD={lib}", image=images.musl)
    assert r.returncode == 0, r.stderr


def test_aarch64_build_runs_fenced_in_debian_11_arm64(tmp_path_factory, tmp_path, monkeypatch):
    """The aarch64 cross-build (aarch64-linux-gnu-gcc, Debian 12's glibc 2.36: the library an
    aarch64 node builds at install) in Debian 11's arm64 root, under qemu: a budget's denial
    names its call site, and the real dlsym is libdl's GLIBC_2.17."""
    from cudatrace.record import budget

    qemu = shutil.which("qemu-aarch64")
    if qemu is None:
        pytest.fail("no qemu-aarch64 (apt-get install qemu-user: tools/install-test-deps.sh)")
    root = Path(debian_roots.bullseye(tmp_path_factory)["root"])
    assert (root / "lib/aarch64-linux-gnu/libc-2.31.so").exists()
    shim, _ = cross.aarch64(tmp_path_factory)
    sim = debian_roots.old_sim(tmp_path_factory, "aarch64")
    d = tmp_path / "ledgers"
    d.mkdir(mode=0o700)
    monkeypatch.setenv("CUDATRACE_LEDGER_DIR", str(d))
    ledger, _ = budget.setup_ledger("1GiB", None)

    def qrun(prog, *args, **env):
        out = tmp_path / f"trace-{prog}"
        out.mkdir()
        env = {"LD_PRELOAD": str(shim), "LD_LIBRARY_PATH": str(sim["libdir"]),
               "LD_BIND_NOW": "1", "CUDATRACE_DIR": str(out), **env}  # fmt: skip
        cmd = [qemu, "-L", str(root)]
        for k, v in env.items():
            cmd += ["-E", f"{k}={v}"]
        r = subprocess.run([*cmd, str(sim[prog]), *args], capture_output=True, text=True,
                           timeout=300)  # fmt: skip
        return r, out

    r, _ = qrun("hold", "--exit-after-ms", "10", "3", "400m", CUDATRACE_LEDGER=str(ledger.path))
    assert allocs(r.stdout) == ["0", "0", "2"], (r.stdout, r.stderr)
    (line,) = [l for l in r.stderr.splitlines() if l.startswith("cudatrace: budget exceeded:")]
    assert "hold_alloc" in line and "budget 1.00 GiB" in line, line
    r, out = qrun("route_dlsym")
    assert r.returncode == 0, r.stderr[-3000:]
    t, got = traced_ops(out)
    assert t.arch == "aarch64" and got
    assert t.info.get("dlsym_version") == "GLIBC_2.17", t.info  # libdl's, in glibc 2.31
