"""The device each event names (shim.c current_device, live.c): a thread that switches contexts
between devices (set, push/pop, create) gets each allocation on its context's device, and a
free names the device of the allocation it ends, whatever context is current when it runs. The
shim keeps one (context -> device) answer per thread and asks the driver again for a new
context; these shapes check it never serves a stale one. A stream-ordered allocation comes from
the pool of its stream's device, which need not be the current context's (shim.c
stream_device)."""

from __future__ import annotations

import sys

from cudatrace.analyze.read.trace import C, iter_events, read_dir

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


def allocs_and_frees(ct, tmp_path, name: str, body: str) -> tuple[dict, list]:
    """Run CONTEXTS + body on two simulated devices (no stacks); it must print "done". Returns
    its allocation events by address and its free events."""
    prog = tmp_path / name
    prog.write_text(CONTEXTS + body)
    r = ct.run([sys.executable, prog], "-q", "--stack-depth", "0", sim_opts={"devices": 2})
    assert r.returncode == 0 and "done" in r.stdout, r.stdout + r.stderr
    K = C()
    events = [e for t in read_dir(r.out).traces for e in iter_events(t)]
    allocs = {e["addr"]: e for e in events if e["op"] == K["CT_OP_ALLOC"]}
    return allocs, [e for e in events if e["op"] == K["CT_OP_FREE"]]


def test_each_event_names_its_device(ct, tmp_path):
    allocs, frees = allocs_and_frees(ct, tmp_path, "switch.py", PROG)
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


# pools: cuMemAllocFromPoolAsync allocates where its pool lives, whatever context is current and
# whatever stream it is ordered on (shim.c pool_device: noted where each pool is made or named)
POOL_PROG = r"""
class Loc(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]

class Props(ctypes.Structure):
    _fields_ = [("allocType", ctypes.c_int), ("handleTypes", ctypes.c_int), ("location", Loc),
                ("win32", ctypes.c_void_p), ("maxSize", ctypes.c_size_t),
                ("usage", ctypes.c_ushort), ("reserved", ctypes.c_ubyte * 54)]

DEVICE, HOST, PINNED, MANAGED = 1, 2, 1, 2
def created(loc_type, loc_id):
    p, pool = Props(), ctypes.c_void_p()
    p.allocType, p.location = PINNED, Loc(loc_type, loc_id)
    assert cu.cuMemPoolCreate(ctypes.byref(pool), ctypes.byref(p)) == 0
    return pool

def named(fn, *args):
    pool = ctypes.c_void_p()
    assert fn(ctypes.byref(pool), *args) == 0
    return pool

assert cu.cuCtxSetCurrent(ctx[1]) == 0
s1 = ctypes.c_void_p()
assert cu.cuStreamCreate(ctypes.byref(s1), 0) == 0
assert cu.cuCtxSetCurrent(ctx[0]) == 0
MiB = 1 << 20
pools = [  # (pool, MiB: device d -> 10*d + k; 50 + k: pinned host; 70 + 10*d + k: managed)
    (created(DEVICE, 1), 11),
    (named(cu.cuDeviceGetDefaultMemPool, 1), 12),
    (named(cu.cuDeviceGetMemPool, 1), 13),
    (named(cu.cuMemGetDefaultMemPool, ctypes.byref(Loc(DEVICE, 1)), PINNED), 14),
    (named(cu.cuMemGetMemPool, ctypes.byref(Loc(DEVICE, 0)), PINNED), 1),
    (created(HOST, 0), 51),
    (named(cu.cuMemGetDefaultMemPool, ctypes.byref(Loc(DEVICE, 1)), MANAGED), 81),
]
out = []
for pool, mib in pools:
    for stream in (None, s1):  # device 0 current; the NULL stream, then device 1's stream
        p = ctypes.c_uint64()
        r = cu.cuMemAllocFromPoolAsync(ctypes.byref(p), ctypes.c_size_t(mib * MiB), pool, stream)
        assert r == 0, r
        out.append((p, stream))
for p, stream in out:
    assert cu.cuMemFreeAsync(p, stream) == 0
print("done")
"""


def test_a_pools_allocation_is_where_the_pool_lives(ct, tmp_path):
    """Each allocation from a pool is on the pool's device (created for device 1, device 1's
    default or current pool, a location's), with device 0 current and on the NULL stream or
    device 1's; a host pool's is pinned host memory, a managed pool's managed memory; each free
    names its allocation's device. Before the pools were noted every one read device 0 (or the
    stream's) as stream-ordered device memory."""
    allocs, frees = allocs_and_frees(ct, tmp_path, "pools.py", POOL_PROG)
    assert len(allocs) == 14 and len(frees) == 14
    K = C()
    for e in allocs.values():
        mib = e["size"] >> 20
        host, managed = 50 < mib < 60, mib > 70
        kind = "CT_KIND_HOST" if host else "CT_KIND_MANAGED" if managed else "CT_KIND_ASYNC"
        assert e["kind"] == K[kind], e
        if not host:  # pinned host memory is the current context's, as cuMemHostAlloc's
            assert e["device"] == (mib % 70) // 10, e
    for f in frees:
        assert f["device"] == allocs[f["addr"]]["device"], f


POOL_BUDGET_PROG = r"""
class Loc(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]

assert cu.cuCtxSetCurrent(ctx[0]) == 0
for loc, size in ((Loc(1, 1), 8 << 20), (Loc(2, 0), 64 << 20)):  # device 1's pool, the host's
    pool, p = ctypes.c_void_p(), ctypes.c_uint64()
    assert cu.cuMemGetDefaultMemPool(ctypes.byref(pool), ctypes.byref(loc), 1) == 0
    r = cu.cuMemAllocFromPoolAsync(ctypes.byref(p), ctypes.c_size_t(size), pool, None)
    print("result", loc.type, r)
"""


def test_a_pools_allocation_is_charged_where_the_pool_lives(ct, tmp_path):
    """Under --budget 0=1GiB,1=4MiB with device 0 current: 8 MiB from device 1's pool is denied on
    device 1; 64 MiB from the host's pool is pinned host memory, not counted on a discrete
    device (as cuMemHostAlloc's): allowed."""
    prog = tmp_path / "pool_budget.py"
    prog.write_text(CONTEXTS + POOL_BUDGET_PROG)
    r = ct.run([sys.executable, prog], "-q", "--budget", "0=1GiB,1=4MiB", sim_opts={"devices": 2})
    assert "result 1 2" in r.stdout, r.stdout + r.stderr  # CUDA_ERROR_OUT_OF_MEMORY
    assert "on device 1" in r.stderr, r.stderr
    assert "result 2 0" in r.stdout, r.stdout + r.stderr


VMM_HOST_PROG = r"""
class Prop(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("handleTypes", ctypes.c_int), ("loctype", ctypes.c_int),
                ("id", ctypes.c_int), ("meta", ctypes.c_void_p), ("flags", ctypes.c_ubyte * 8)]

assert cu.cuCtxSetCurrent(ctx[0]) == 0
for loctype, loc_id, mib in ((3, 1, 64), (1, 1, 2)):  # host NUMA node 1; device 1
    h = ctypes.c_uint64()
    r = cu.cuMemCreate(ctypes.byref(h), ctypes.c_size_t(mib << 20),
                       ctypes.byref(Prop(1, 0, loctype, loc_id)), ctypes.c_ulonglong(0))
    print("create", loctype, r)
    if r == 0:
        assert cu.cuMemRelease(h) == 0
print("done")
"""


def test_physical_memory_on_a_host_numa_node_is_pinned_host_memory(ct, tmp_path):
    """cuMemCreate at a host NUMA node makes pinned host memory: its event is CT_KIND_HOST, not
    device memory "on device <node>", and a discrete device's budget does not count it (64 MiB
    under 0=4MiB,1=4MiB allowed); at device 1 it is device 1's."""
    prog = tmp_path / "vmm_host.py"
    prog.write_text(CONTEXTS + VMM_HOST_PROG)
    r = ct.run([sys.executable, prog], "-q", "--stack-depth", "0", "--budget", "0=4MiB,1=4MiB",
               sim_opts={"devices": 2})  # fmt: skip
    assert "create 3 0" in r.stdout and "create 1 0" in r.stdout, r.stdout + r.stderr
    K = C()
    allocs = [e for t in read_dir(r.out).traces for e in iter_events(t)
              if e["op"] == K["CT_OP_ALLOC"]]  # fmt: skip
    assert [(e["size"] >> 20, e["kind"]) for e in allocs] == [
        (64, K["CT_KIND_HOST"]), (2, K["CT_KIND_VMM"])]  # fmt: skip
    assert allocs[1]["device"] == 1


REUSE_PROG = r"""
def alloc_on_created(dev, mib):
    c = ctypes.c_void_p()
    assert cu.cuCtxCreate_v2(ctypes.byref(c), 0, dev) == 0  # current from now on
    p = ctypes.c_uint64()
    assert cu.cuMemAlloc_v2(ctypes.byref(p), ctypes.c_size_t(mib << 20)) == 0
    assert cu.cuMemFree_v2(p) == 0
    assert cu.cuCtxDestroy_v2(c) == 0
    return c.value

first = alloc_on_created(0, 1)
second = alloc_on_created(1, 11)  # the destroyed context's handle, now device 1's
print("reused", first == second)
"""


def test_a_context_handle_given_again_is_asked_again(ct, tmp_path):
    """A thread allocates in a context of device 0, destroys it, creates one on device 1 that the
    driver gives the same handle (the simulator reuses a destroyed context's), and allocates: the
    allocation is device 1's. The shim's per-thread answer "this context is on device 0" is
    dropped by the destroy (it moves the contexts' epoch) instead of serving the new context."""
    prog = tmp_path / "reuse.py"
    prog.write_text(CONTEXTS + REUSE_PROG)
    r = ct.run([sys.executable, prog], "-q", "--stack-depth", "0", sim_opts={"devices": 2})
    assert "reused True" in r.stdout, r.stdout + r.stderr
    K = C()
    allocs = [e for t in read_dir(r.out).traces for e in iter_events(t)
              if e["op"] == K["CT_OP_ALLOC"]]  # fmt: skip
    assert [(e["size"] >> 20, e["device"]) for e in allocs] == [(1, 0), (11, 1)], allocs


MANY_POOLS_PROG = r"""
class Loc(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]

class Props(ctypes.Structure):
    _fields_ = [("allocType", ctypes.c_int), ("handleTypes", ctypes.c_int), ("location", Loc),
                ("win32", ctypes.c_void_p), ("maxSize", ctypes.c_size_t),
                ("usage", ctypes.c_ushort), ("reserved", ctypes.c_ubyte * 54)]

def created(dev):
    p, pool = Props(), ctypes.c_void_p()
    p.allocType, p.location = 1, Loc(1, dev)
    assert cu.cuMemPoolCreate(ctypes.byref(pool), ctypes.byref(p)) == 0
    return pool

assert cu.cuCtxSetCurrent(ctx[0]) == 0
for _ in range(1100):  # more pools over the process's life than the shim's table holds at once
    assert cu.cuMemPoolDestroy(created(0)) == 0
pool, p = created(1), ctypes.c_uint64()
r = cu.cuMemAllocFromPoolAsync(ctypes.byref(p), ctypes.c_size_t(8 << 20), pool, None)
print("result", r)
"""


def test_a_new_pool_after_many_is_charged_where_it_lives(ct, tmp_path):
    """After 1,100 pools made and destroyed, a new pool of device 1 still charges device 1 (its
    4 MiB budget denies 8 MiB, device 0 current, the NULL stream): cuMemPoolDestroy frees the
    pool's place in the shim's table. Before, the table filled at 1,024 and the new pool's
    allocation went to the stream's device (device 0, allowed) and was recorded there."""
    prog = tmp_path / "many_pools.py"
    prog.write_text(CONTEXTS + MANY_POOLS_PROG)
    r = ct.run([sys.executable, prog], "-q", "--budget", "0=1GiB,1=4MiB", sim_opts={"devices": 2})
    assert "result 2" in r.stdout, r.stdout + r.stderr  # CUDA_ERROR_OUT_OF_MEMORY
    assert "of 8.00 MiB on device 1" in r.stderr, r.stderr
    K = C()
    denied = [e for t in read_dir(r.out).traces for e in iter_events(t)
              if e["op"] == K["CT_OP_DENY"]]  # fmt: skip
    assert [e["device"] for e in denied] == [1], denied
