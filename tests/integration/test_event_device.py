"""The device each event names (shim.c current_device, live.c): a thread that switches contexts
between devices (set, push/pop, create) gets each allocation on its context's device, and a
free names the device of the allocation it ends, whatever context is current when it runs. The
shim keeps one (context -> device) answer per thread and asks the driver again for a new
context; these shapes check it never serves a stale one. A stream-ordered allocation comes from
the pool of its stream's device, which need not be the current context's (shim.c
stream_device)."""

from __future__ import annotations

import sys

from cudatrace.analyze.trace import C, iter_events, read_dir

# both programs: the two devices' primary contexts
CONTEXTS = r"""
import ctypes, sys, threading
cu = ctypes.CDLL("libcuda.so.1")
cu.cuInit(0)
ctx = []
for d in range(2):
    c = ctypes.c_void_p()
    assert cu.cuDevicePrimaryCtxRetain(ctypes.byref(c), d) == 0
    ctx.append(c)
"""

PROG = r"""
assert cu.cuCtxSetCurrent(ctx[0]) == 0
s0 = ctypes.c_void_p()
assert cu.cuStreamCreate(ctypes.byref(s0), 0) == 0

def alloc(n):
    p = ctypes.c_uint64()
    assert cu.cuMemAlloc_v2(ctypes.byref(p), ctypes.c_size_t(n)) == 0
    return p.value

def free(p):
    assert cu.cuMemFree_v2(ctypes.c_uint64(p)) == 0

def alloc_async(n, stream):
    p = ctypes.c_uint64()
    assert cu.cuMemAllocAsync(ctypes.byref(p), ctypes.c_size_t(n), stream) == 0
    return p.value

def free_async(p, stream):
    assert cu.cuMemFreeAsync(ctypes.c_uint64(p), stream) == 0

MiB = 1 << 20
def work(base):
    # sizes say which device the allocation must be on: dev d -> (base + 10*d + k) MiB
    assert cu.cuCtxSetCurrent(ctx[0]) == 0
    a = alloc((base + 1) * MiB)
    assert cu.cuCtxSetCurrent(ctx[1]) == 0
    b = alloc((base + 11) * MiB)
    assert cu.cuCtxSetCurrent(ctx[0]) == 0
    free(b)                                  # device 1's memory, freed under device 0
    assert cu.cuCtxPushCurrent_v2(ctx[1]) == 0
    c = alloc((base + 12) * MiB)
    out = ctypes.c_void_p()
    assert cu.cuCtxPopCurrent_v2(ctypes.byref(out)) == 0
    d = alloc((base + 2) * MiB)
    created = ctypes.c_void_p()
    assert cu.cuCtxCreate_v2(ctypes.byref(created), 0, 1) == 0
    e = alloc((base + 13) * MiB)
    free(a)                                  # device 0's, freed under device 1
    for p in (c, d, e):
        free(p)
    # stream-ordered: from the pool of the stream's device, whatever context is current
    assert cu.cuCtxSetCurrent(ctx[1]) == 0
    s1 = ctypes.c_void_p()
    assert cu.cuStreamCreate(ctypes.byref(s1), 0) == 0
    assert cu.cuCtxSetCurrent(ctx[0]) == 0
    f = alloc_async((base + 14) * MiB, s1)   # device 1's stream, device 0 current
    g = alloc_async((base + 3) * MiB, None)  # the NULL stream: the current context's
    h = alloc_async((base + 4) * MiB, ctypes.c_void_p(2))  # CU_STREAM_PER_THREAD: the same
    assert cu.cuCtxSetCurrent(ctx[1]) == 0
    k = alloc_async((base + 5) * MiB, ctypes.c_void_p(s0.value))  # device 0's stream
    for p, st in ((f, s1), (g, None), (h, None), (k, s0)):
        free_async(p, st)

work(0)
t = threading.Thread(target=work, args=(100,))
t.start(); t.join()
print("done")
"""


def test_each_event_names_its_device(ct, tmp_path):
    prog = tmp_path / "switch.py"
    prog.write_text(CONTEXTS + PROG)
    r = ct.run([sys.executable, prog], "-q", "--stack-depth", "0", sim_opts={"devices": 2})
    assert r.returncode == 0 and "done" in r.stdout, r.stdout + r.stderr
    K = C()
    events = [e for t in read_dir(r.out).traces for e in iter_events(t)]
    allocs = {e["addr"]: e for e in events if e["op"] == K["CT_OP_ALLOC"]}
    frees = [e for e in events if e["op"] == K["CT_OP_FREE"]]
    assert len(allocs) == 18 and len(frees) == 18
    for e in allocs.values():
        want = ((e["size"] >> 20) % 100) // 10
        assert e["device"] == want, e
    for f in frees:
        assert f["device"] == allocs[f["addr"]]["device"], f


BUDGET_PROG = r"""
assert cu.cuCtxSetCurrent(ctx[1]) == 0
s1 = ctypes.c_void_p()
assert cu.cuStreamCreate(ctypes.byref(s1), 0) == 0
assert cu.cuCtxSetCurrent(ctx[0]) == 0
p = ctypes.c_uint64()
r = cu.cuMemAllocAsync(ctypes.byref(p), ctypes.c_size_t(8 << 20), s1)
print("result", r)
"""


def test_a_stream_of_another_device_is_charged_to_its_device(ct, tmp_path):
    """The budget reserves a stream-ordered allocation on its stream's device: 8 MiB on device
    1's stream, device 0 current, device 1's budget 4 MiB: denied (reserved on device 0, whose
    budget is 1 GiB, it would pass)."""
    prog = tmp_path / "stream_budget.py"
    prog.write_text(CONTEXTS + BUDGET_PROG)
    r = ct.run([sys.executable, prog], "-q", "--budget", "0=1GiB,1=4MiB", sim_opts={"devices": 2})
    assert "result 2" in r.stdout, r.stdout + r.stderr  # CUDA_ERROR_OUT_OF_MEMORY
    assert "on device 1" in r.stderr, r.stderr
