"""The watch's rules (cudatrace/record/watch.py) on views built by hand: a member's tolerance is
NVML's granularity, and the stated 64 MiB margin only where a context is counted (a context
that can grow unseen); a member whose context the agent has not counted yet is not judged
alone; a process that maps the library and holds no more than a context, or was first seen a
moment ago, has not joined yet;
a group over its budget names the member that holds the most its ledger never saw it
allocate, none under warn."""

from __future__ import annotations

from cudatrace.record.watch import GRANULE, JOIN_GRACE_S, MARGIN, Watch

MiB = 1 << 20


def member(held, context=0, limit=0, slot=0, on_exceed="fail", ledger="g"):
    return {"group": ledger, "ledger": ledger, "path": f"/l/{ledger}.ledger", "slot": slot,
            "device": 0, "held": held, "allocations": held - context, "context": context,
            "limit": limit, "on_exceed": on_exceed, "share": ""}  # fmt: skip


def proc(pid, used, m=None, shim=False):
    return {"pid": pid, "gpu": 0, "bytes": used, "command": f"p{pid}",
            "fence": "member" if m else "unfenced", "member": m, "container": "", "shim": shim}  # fmt: skip


def report(*procs, per_process=True):
    ms = [p["member"] for p in procs if p["member"]]
    dev = {"gpu": 0, "uuid": "GPU-x", "name": "", "per_process": per_process, "reason": None,
           "why": None, "listed": True, "used": None, "total": None, "source": None,
           "ledgers": 0, "context": max((m["context"] for m in ms), default=0),
           "fenced": bool(ms), "processes": list(procs)}  # fmt: skip
    return {"known": True, "why": None, "devices": [dev], "findings": [], "placements": [],
            "not_visible": 0, "tolerance": 0}  # fmt: skip


def judge(rep, w=None, pending=lambda p: False):
    w = w or Watch()
    w.remember(rep)
    return sorted((f["kind"], f["pid"]) for f in w.judge(rep, pending))


def test_tolerance_is_the_granule_without_a_context_and_the_margin_with_one():
    assert judge(report(proc(1, 3 * MiB, member(1 * MiB)))) == []  # 2 MiB: the granule
    assert judge(report(proc(1, 3 * MiB + 1, member(1 * MiB)))) == [("outside_ledger", 1)]
    with_ctx = member(300 * MiB, context=290 * MiB)
    assert judge(report(proc(1, 300 * MiB + MARGIN, with_ctx))) == []
    assert judge(report(proc(1, 300 * MiB + MARGIN + 1, with_ctx))) == [("outside_ledger", 1)]
    assert MARGIN == 64 * MiB and GRANULE == 2 * MiB  # docs/budgets.md's stated margin


def test_a_context_not_counted_yet_is_not_judged_alone():
    rep = report(proc(1, 301 * MiB, member(1 * MiB)))
    assert judge(rep, pending=lambda p: True) == []
    assert judge(rep) == [("outside_ledger", 1)]  # no agent counts it: outside the ledger


def test_unfenced_only_on_a_fenced_gpu_and_a_joining_process_holds_at_most_a_context():
    ctx = member(400 * MiB, context=300 * MiB)
    assert judge(report(proc(2, 64 * MiB))) == []  # alone on its GPU
    assert judge(report(proc(1, 400 * MiB, ctx), proc(2, 64 * MiB))) == [("unfenced", 2)]
    joining = proc(2, 300 * MiB, shim=True)
    w = Watch()
    assert judge(report(proc(1, 400 * MiB, ctx), joining), w) == []
    joining["bytes"] = 400 * MiB  # more than any context counted: joining, for JOIN_GRACE_S
    assert judge(report(proc(1, 400 * MiB, ctx), joining), w) == []
    w.first_seen[2] -= JOIN_GRACE_S
    assert judge(report(proc(1, 400 * MiB, ctx), joining), w) == [("unfenced", 2)]
    joining["bytes"] = 300 * MiB  # back to a context's size: still not judged
    assert judge(report(proc(1, 400 * MiB, ctx), joining), w) == []
    unknown = proc(2, None)  # NVML lists it without a figure: still without a fence
    assert judge(report(proc(1, 400 * MiB, ctx), unknown)) == [("unfenced", 2)]


def test_a_group_over_budget_names_who_the_ledger_did_not_see():
    a = proc(1, 400 * MiB, member(400 * MiB, context=300 * MiB, limit=1024 * MiB, slot=0))
    b = proc(2, 700 * MiB, member(700 * MiB, context=300 * MiB, limit=1024 * MiB, slot=1))
    w = Watch()
    judge(report(a, b), w)  # both within the budget by the ledger: nothing
    # b's context, as the agent counts it, absorbs 400 MiB taken around the library
    b2 = proc(2, 1100 * MiB, member(1100 * MiB, context=700 * MiB, limit=1024 * MiB, slot=1))
    got = w.judge(report(a, b2))
    assert [(f["kind"], f["pid"]) for f in got] == [("group_over_budget", 2)]
    assert (got[0]["bytes"], got[0]["counted"]) == (1500 * MiB, 1024 * MiB)


def test_a_group_under_warn_or_with_a_context_pending_has_no_one_to_stop():
    a = proc(1, 900 * MiB, member(900 * MiB, context=300 * MiB, limit=512 * MiB, on_exceed="warn"))
    (f,) = Watch().judge(report(a))
    assert f["kind"] == "group_over_budget" and f["pid"] == 0
    b = proc(1, 900 * MiB, member(900 * MiB, context=300 * MiB, limit=512 * MiB))
    (f,) = Watch().judge(report(b), pending=lambda p: True)
    assert f["pid"] == 0


def test_no_figure_no_judgement():
    rep = report(proc(1, None, member(1 * MiB, limit=2 * MiB)), per_process=False)
    assert judge(rep) == []
