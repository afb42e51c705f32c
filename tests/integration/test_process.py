"""Processes: threads, crashes, fork/exec, exit status, signals, and commands that cannot be traced."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from cudatrace.analyze.read.trace import C, TraceError, iter_events, read_dir, read_trace
from cudatrace.errors import RUN_FAILED
from support import children


def ops(t, name):
    k = C()[name]
    return [e for e in iter_events(t) if e["op"] == k]


def test_shim_loads_with_bind_now_into_non_python_process(native_built):
    shim = native_built / "libcudatrace.so"
    for extra in ({}, {"CUDATRACE_DIR": "/nonexistent/dir"}):
        env = dict(os.environ, LD_PRELOAD=str(shim), LD_BIND_NOW="1", **extra)
        r = subprocess.run(
            ["/bin/sh", "-c", "echo loaded"], env=env, capture_output=True, text=True
        )
        assert r.returncode == 0 and r.stdout.strip() == "loaded", r.stderr
        assert "error" not in r.stderr.lower()
    # and it needs nothing but libc, libdl and libpthread
    deps = subprocess.run(["ldd", str(shim)], capture_output=True, text=True).stdout
    for line in deps.splitlines():
        name = line.split()[0]
        assert any(k in name for k in ("libc.so", "libdl", "libpthread", "ld-linux", "vdso")), line
    assert "python" not in deps


def test_bind_now_traced_program(ct, sim):
    env = ct.env()
    env["LD_BIND_NOW"] = "1"
    r = ct.run([sim.progs["route_link"]], env=env)
    assert r.returncode == 0, r.stderr
    t = read_dir(r.out).traces[0]
    assert len(ops(t, "CT_OP_ALLOC")) > 5


def test_threads_exact_counts(ct, sim):
    r = ct.run([sim.progs["threads"], 16, 10000, 4096], "--stack-depth", "8", timeout=300)
    assert r.returncode == 0, r.stderr
    td = read_dir(r.out)
    t = td.traces[0]
    assert t.complete and t.end.dropped == 0
    assert t.gaps == 0  # chunk crossings are padded, never read as holes
    allocs, frees = ops(t, "CT_OP_ALLOC"), ops(t, "CT_OP_FREE")
    assert len(allocs) == 160000 and len(frees) == 160000
    assert all(e["result"] == 0 and e["size"] == 4096 for e in allocs)
    assert len({e["tid"] for e in allocs}) == 16
    # every free matches a live allocation: nothing lost, nothing invented
    from cudatrace.analyze.replay.model import build

    m = build(td)
    assert m.unmatched_frees == 0 and m.end_bytes == 0


def test_sigkill_leaves_readable_trace(ct, sim):
    out = ct.new_dir()
    p = children.popen(
        [
            sys.executable,
            "-m",
            "cudatrace",
            "run",
            "-o",
            str(out),
            "-q",
            "--",
            str(sim.progs["hold"]),
            "7",
            "1048576",
        ],
        env=ct.env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    for line in children.lines(p):
        if line.strip() == "ready":
            break
    else:
        raise AssertionError("hold never said ready")
    traces = list(out.glob("*.ctrace"))
    assert len(traces) == 1
    pid = int(traces[0].name.split(".")[0])
    os.kill(pid, signal.SIGKILL)
    p.communicate(timeout=60)
    assert p.returncode == 128 + signal.SIGKILL
    t = read_trace(traces[0])
    assert not t.complete and t.status == "truncated"
    allocs = ops(t, "CT_OP_ALLOC")
    assert len(allocs) == 7 and all(e["size"] == 1048576 for e in allocs)
    assert "truncated" in t.describe()


def test_fork_exec_chain_one_trace_per_process(ct, sim):
    r = ct.run([sim.progs["forkexec"], 2])
    assert r.returncode == 0, r.stderr + r.stdout
    td = read_dir(r.out)
    by_pid = {t.pid: t for t in td.traces}
    assert len(td.traces) >= 3
    root = [t for t in td.traces if t.ppid == os.getpid() or t.ppid not in by_pid]
    assert root
    # every other trace's parent is a traced process
    linked = [t for t in td.traces if t.ppid in by_pid]
    assert len(linked) == len(td.traces) - len(root)
    for t in td.traces:
        assert t.complete, t.describe()
        assert len(ops(t, "CT_OP_ALLOC")) >= 1


@pytest.mark.parametrize(
    "args,status", [(["0"], 0), (["3"], 3), (["--signal", "9"], 137), (["--signal", "15"], 143)]
)
def test_exit_status_passes_through(ct, sim, args, status):
    r = ct.run([sim.progs["exitcode"], *args])
    assert r.returncode == status, r.stderr


def test_signal_is_forwarded_and_summary_still_printed(ct, sim):
    out = ct.new_dir()
    p = children.popen(
        [
            sys.executable,
            "-m",
            "cudatrace",
            "run",
            "-o",
            str(out),
            "--",
            str(sim.progs["exitcode"]),
            "--sleep",
        ],
        env=ct.env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    time.sleep(1.0)
    p.send_signal(signal.SIGTERM)
    stdout, stderr = p.communicate(timeout=60)
    assert "got signal 15" in stdout
    assert p.returncode == 0x40 + 15
    assert "trace in" in stderr and "full report: cudatrace report" in stderr


def test_missing_command(ct):
    r = ct.cli("run", "-o", ct.new_dir(), "--", "no-such-command-xyz")
    assert r.returncode == 127
    assert "no-such-command-xyz: command not found" in r.stderr


def test_static_binary_refused(ct, sim):
    if sim.progs.get("static_prog") is None:
        pytest.fail("static libc missing: cannot build the static test program")
    r = ct.run([sim.progs["static_prog"]])
    assert r.returncode == RUN_FAILED
    assert "statically linked" in r.stderr
    assert not list(r.out.glob("*.ctrace"))


def test_setuid_binary_refused(ct, sim, tmp_path):
    prog = tmp_path / "suid_prog"
    prog.write_bytes(sim.progs["exitcode"].read_bytes())
    if os.geteuid() == 0:
        os.chown(prog, 65534, 65534)  # setuid to another user: the loader drops LD_PRELOAD
        os.chmod(prog, 0o4755)
    else:
        os.chmod(prog, 0o2755)  # setgid: the same for any user
    r = ct.run([prog, "0"])
    assert r.returncode == RUN_FAILED and "setuid" in r.stderr
    assert not list(r.out.glob("*.ctrace"))


def test_refuses_to_overwrite_without_force(ct, sim):
    out = ct.new_dir()
    assert ct.run([sim.progs["exitcode"], "0"], out=out).returncode == 0
    r = ct.run([sim.progs["exitcode"], "0"], out=out)
    assert r.returncode == RUN_FAILED and "--force" in r.stderr
    r = ct.run([sim.progs["exitcode"], "0"], "--force", out=out)
    assert r.returncode == 0


def test_default_output_dir_is_named_after_command(ct, sim, tmp_path):
    r = ct.cli("run", "--", sim.progs["route_link"], cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    dirs = list(tmp_path.glob("cudatrace-route_link-*"))
    assert len(dirs) == 1 and list(dirs[0].glob("*.ctrace"))
    assert str(dirs[0].name) in r.stderr


def test_dlsym_rtld_next_keeps_caller_semantics(ct, sim):
    """Another preload library after ours using dlsym(RTLD_NEXT) must still find the next
    definition after itself (the shim's dlsym hands RTLD_NEXT to glibc by a tail call)."""
    env = ct.env()
    env["LD_PRELOAD"] = str(sim.libnext)  # the launcher puts the shim before it
    r = ct.run([sim.progs["dlsym_next"]], env=env)
    assert r.returncode == 0, r.stderr + r.stdout
    assert "ok" in r.stdout


def test_truncated_and_corrupt_files(ct, sim, tmp_path):
    r = ct.run([sim.progs["route_link"]])
    src = next(r.out.glob("*.ctrace"))
    data = src.read_bytes()
    full = read_trace(src)
    end = data.index(b"\xa3\xc7\x08\x00")  # the END record
    # cut in the middle of the records: read as far as it goes, say it is truncated
    cut = tmp_path / "cut.ctrace"
    cut.write_bytes(data[: end * 2 // 3])
    t = read_trace(cut)
    assert t.status == "truncated"
    assert 0 < len(t.events) < len(full.events)
    # a hole of zeros (a writer killed between reserving and publishing: its last record) is
    # skipped
    holed = bytearray(data)
    rec_off = data.rindex(b"\xa3\xc7\x03\x00", 256, end)  # an API record
    rec_size = int.from_bytes(data[rec_off + 4 : rec_off + 8], "little")
    holed[rec_off : rec_off + rec_size] = b"\0" * rec_size
    hp = tmp_path / "hole.ctrace"
    hp.write_bytes(bytes(holed))
    t = read_trace(hp)
    assert t.gaps == 1 and len(t.events) == len(full.events)
    # a thread's block of events: what its `used` count had published when the process died is
    # read, nothing after it (a torn event is never seen), and nothing is taken for corrupt
    blk = data.rindex(b"\xa3\xc7\x12\x00", 256, end)
    used = int.from_bytes(data[blk + 8 : blk + 12], "little")
    assert used > 0
    cut_block = bytearray(data)
    cut_block[blk + 8 : blk + 12] = (0).to_bytes(4, "little")
    cb = tmp_path / "unpublished.ctrace"
    cb.write_bytes(bytes(cut_block))
    t = read_trace(cb)
    assert t.bad_events == 0 and t.gaps == 0 and 0 < len(t.events) < len(full.events)
    # not a trace at all
    bad = tmp_path / "bad.ctrace"
    bad.write_bytes(b"hello world" * 100)
    with pytest.raises(TraceError, match="not a cudatrace trace"):
        read_trace(bad)
    empty = tmp_path / "empty.ctrace"
    empty.write_bytes(b"")
    with pytest.raises(TraceError, match="empty"):
        read_trace(empty)
    # the CLI reports a corrupt path clearly
    r2 = ct.cli("report", bad)
    assert r2.returncode == 2 and "bad.ctrace" in r2.stderr


EXEC_SELF = r"""
#include <unistd.h>
typedef unsigned long long CUdeviceptr;
int cuInit(unsigned);
int cuMemAlloc_v2(CUdeviceptr *, unsigned long);
int main(int argc, char **argv)
{
    CUdeviceptr p;
    cuInit(0);
    if (cuMemAlloc_v2(&p, 3u << 20))
        return 1;
    if (argc > 1)                      /* the first image: exec a second one, same pid */
        execl("/proc/self/exe", argv[0], (char *)0);
    return 0;
}
"""


def test_image_replaced_by_exec_is_not_called_truncated(ct, sim, tmp_path):
    (tmp_path / "e.c").write_text(EXEC_SELF)
    exe = tmp_path / "exec_self"
    subprocess.run(
        ["cc", "-o", str(exe), str(tmp_path / "e.c"), f"-L{sim.lib}", "-lcuda"], check=True
    )
    r = ct.run([exe, "again"])
    assert r.returncode == 0, r.stderr
    td = read_dir(r.out)
    assert sorted((t.pid, t.exec_index) for t in td.traces) == [
        (td.traces[0].pid, 0),
        (td.traces[0].pid, 1),
    ]
    first, second = sorted(td.traces, key=lambda t: t.exec_index)
    assert first.status == "exec" and first.complete and "replaced by exec" in first.describe()
    assert second.status == "complete"
    assert len(ops(first, "CT_OP_ALLOC")) == 1 and len(ops(second, "CT_OP_ALLOC")) == 1
