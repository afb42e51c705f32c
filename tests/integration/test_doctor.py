"""`cudatrace doctor` on the simulated driver: versions, integrated or discrete, the ledger
directory, the namespace, and whether a command can be entered."""

from __future__ import annotations

import json
import os
import shutil
import stat

from support import children


def doctor(ct, env, *args):
    r = ct.cli("doctor", *args, env=env)
    return r, (json.loads(ct.cli("doctor", "--json", *args, env=env).stdout))


def test_doctor_discrete(ct, sim, tmp_path):
    d = tmp_path / "ledgers"
    d.mkdir(mode=0o700)
    env = ct.env(devices=2, total_bytes=8 << 30)
    env["CUDATRACE_LEDGER_DIR"] = str(d)
    r, js = doctor(ct, env, sim.progs["hold"])
    assert r.returncode == 0, r.stderr
    assert "CUDA driver   13.0 (2 devices)" in r.stdout, r.stdout
    assert "cudasim discrete device 1, 8.00 GiB, discrete" in r.stdout
    assert "NVML          580.159.01, 2 devices; memory figures: yes" in r.stdout
    assert (
        f"ledger dir    {d} (from CUDATRACE_LEDGER_DIR): uid {os.geteuid()}, mode 0700" in r.stdout
    )
    assert js["driver"]["integrated"] == "discrete"
    assert js["command"]["ok"] and js["command"]["driver"] == "linked (-lcuda)"
    assert "can be entered" in r.stdout


def test_doctor_integrated(ct, sim, tmp_path):
    env = ct.env(integrated=True)
    env["CUDATRACE_LEDGER_DIR"] = str(tmp_path / "missing")
    r, js = doctor(ct, env)
    assert "integrated (unified memory)" in r.stdout
    assert "memory figures: not supported" in r.stdout
    assert js["driver"]["integrated"] == "integrated"
    assert "Integrated (unified-memory) device" in r.stdout
    assert "does not exist yet" in r.stdout


def test_doctor_refusals(ct, sim, tmp_path):
    bad = tmp_path / "open-dir"
    bad.mkdir()
    os.chmod(bad, 0o755)
    env = ct.env()
    env["CUDATRACE_LEDGER_DIR"] = str(bad)
    suid = tmp_path / "suid-hold"
    shutil.copy(sim.progs["hold"], suid)
    os.chown(suid, 65534 if os.geteuid() != 65534 else 0, -1)  # another owner: ids change
    os.chmod(suid, 0o4755)
    os.chmod(tmp_path, 0o755)
    r, js = doctor(ct, env, suid)
    assert r.returncode == 1
    assert "ledger dir    REFUSED" in r.stdout and "group/other permissions" in r.stdout
    assert "setuid" in r.stdout and "run a copy without the bit" in r.stdout
    script = tmp_path / "run.sh"
    script.write_text("#!/bin/sh\nexec true\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    r, js = doctor(ct, env, script)
    assert r.returncode == 0 and js["command"]["kind"] == "script"
    assert js["command"]["interpreter"]["kind"] == "elf"
    if sim.progs.get("static_prog"):
        r, js = doctor(ct, env, sim.progs["static_prog"])
        assert r.returncode == 1 and "STATIC" in r.stdout and "is static" in r.stdout


def test_setuid_to_the_callers_own_ids_is_entered(ct, sim, tmp_path):
    # issue 21 item 13: the loader ignores LD_PRELOAD only when exec changes the ids (AT_SECURE);
    # a setuid binary owned by the caller runs as the caller, and doctor and run agree on it
    mine = tmp_path / "suid-mine"
    shutil.copy(sim.progs["hold"], mine)
    os.chmod(mine, 0o4755)
    r, js = doctor(ct, ct.env(), mine)
    assert r.returncode == 0, r.stdout
    assert js["command"]["ok"] and "can be entered" in r.stdout and "CANNOT" not in r.stdout
    assert "None" not in r.stdout
    t = ct.run([mine, "--exit-after-ms", "1", "1", "1m"], "-q")
    assert t.returncode == 0, t.stderr
    assert "peak_bytes" in ct.cli("report", t.out, "--json").stdout


def test_doctor_without_a_driver_points_to_the_simulator(ct, tmp_path):
    env = {k: v for k, v in ct.env().items() if k != "LD_LIBRARY_PATH"}  # no driver to find
    r = ct.cli("doctor", env=env)
    assert r.returncode == 0, r.stderr
    assert "CUDA driver   none: libcuda.so.1 not found (no NVIDIA driver installed)" in r.stdout
    assert "No GPU? `cudatrace run --simulated -- CMD` runs CMD on cudatrace's simulated" in (
        r.stdout
    )
    assert "cudatrace demo" in r.stdout


STATIC_RT = r"""
#include <dlfcn.h>
int cudaMalloc(void **p, unsigned long n) { (void)p; (void)n; return 0; }  /* cudart's, linked in */
int main(void) { return dlopen("libcuda.so.1", RTLD_NOW) ? 0 : 1; }
"""


def test_a_program_that_dlopens_the_driver_is_no_static_runtime(ct, sim, tmp_path):
    # route_dlsym loads libcuda.so.1 with dlopen and has no CUDA runtime at all: doctor called
    # it "CUDA runtime: static (linked in; it loads libcuda.so.1 itself)"
    r, js = doctor(ct, ct.env(), sim.progs["route_dlsym"])
    c = js["command"]
    assert c["ok"] and c["cudart"] is None, c
    assert c["driver"] == 'loaded by the program itself (dlopen("libcuda.so.1"))', c
    assert (
        'CUDA runtime: not linked; driver: loaded by the program itself (dlopen("libcuda.so.1"))'
        in r.stdout
    )
    assert "route_dlsym can be entered; it loads libcuda.so.1 itself." in r.stdout, r.stdout
    # a static runtime is one whose functions are in the binary
    (tmp_path / "rt.c").write_text(STATIC_RT)
    prog = tmp_path / "rt"
    children.run(["cc", "-o", prog, tmp_path / "rt.c", "-ldl"], timeout=120, check=True)
    c = doctor(ct, ct.env(), prog)[1]["command"]
    assert c["cudart"] == "static (linked in; it loads libcuda.so.1 itself)", c
    assert c["driver"] == "loaded at run time", c
