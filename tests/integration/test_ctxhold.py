"""The hold around a device's first context figure (native/shim/ctxhold.c) through its C harness,
tests/ctxhold/ctxhold_test.c: the shim's own ctxhold.c linked into a C test that runs its threads
in lock-step (the harness's table of the clock, NVML and the waits stops each at every step), so
that each interleaving is a script; the invariants are checked after every step.

Each race fix of round 4 (and each race the harness found since) has a case, and each case is
shown to fail without its fix: REVERTS takes the fix's logic back out of a copy of ctxhold.c,
the harness is built from the copy, and its case must fail for the reason the fix names. A
change of ctxhold.c that moves that logic updates REVERTS (the test says which one no longer
applies). The sanitizer builds run in tests/integration/test_sanitizers.py.
"""

from __future__ import annotations

import pytest

from support import ctxhold
from support.paths import CTXHOLD_C


@pytest.fixture(scope="module")
def objs(tmp_path_factory):
    """the harness's other sources, compiled once for every build of ctxhold.c here"""
    return ctxhold.objects(tmp_path_factory.mktemp("ctxhold_objs"), ctxhold.PLAIN)


@pytest.fixture(scope="module")
def harness(tmp_path_factory, objs):
    exe = tmp_path_factory.mktemp("ctxhold") / "ctxhold_test"
    return ctxhold.build(exe, ctxhold.PLAIN, objs=objs)


@pytest.mark.parametrize("case", ctxhold.CASES)
def test_case(harness, tmp_path, case):
    r = ctxhold.run(harness, tmp_path, case)
    assert r.returncode == 0 and r.stdout.strip() == f"ok {case}", r.stdout + r.stderr


def test_random_schedules(harness, tmp_path):
    """1000 random lock-step schedules of 4 threads allocating and freeing: every invariant at
    every step (the figure counted is the context where one was counted)."""
    r = ctxhold.run(harness, tmp_path, "shuffle", "1000")
    assert r.returncode == 0 and r.stdout.strip() == "ok shuffle", r.stdout + r.stderr


# case -> (the fix's commit or what it holds, [(text of ctxhold.c, the text without the fix)],
# the rules its case must then find broken: ctxhold_test.c's "violation (RULE)")
REVERTS = {
    # an allocation that comes while the thread that claimed the first measurement has not yet
    # set the hold waits too: before, a deadline of 0 held nothing
    "order": (
        "f339e62",
        [
            (
                "if ((until && now >= until) || now >= limit)",
                "if (!until || now >= until || now >= limit)",
            )
        ],
        ["hold", "budget"],
    ),
    # allocations wait for the first figure as long as it is read (10 s at most), sleeping after
    # a few yields: before, the hold was 1 s and spent yielding (the 1 s the fix added after a
    # reading that found no context stays: the case does not reach it)
    "slow": (
        "09cf58a",
        [
            (
                "__atomic_store_n(&d->measure_until, now + CTX_MEASURE_NS, __ATOMIC_RELEASE);",
                "__atomic_store_n(&d->measure_until, now + CTX_HOLD_NS, __ATOMIC_RELEASE);",
            ),
            ("if ((*waits)++ < CTX_YIELDS)", "if ((*waits)++ || 1)"),
        ],
        ["sleep", "hold"],
    ),
    # the first figure, read low while calls that slipped past the hold reserved, is read again
    # once they ended: before, the first reading stood
    "reread": (
        "781666d",
        [
            (
                "found == 1 && !exact && again < CTX_FIRST_TRIES",
                "0 && again < CTX_FIRST_TRIES",
            )
        ],
        ["budget", "figure"],
    ),
    # frees wait while a device's first context figure is read: before, they did not
    "frees": (
        "ffaaebb",
        [
            (
                "while (__atomic_load_n(&ct_budget_ctx_first, __ATOMIC_ACQUIRE) && ops->now() < until)",
                "while (0 && ops->now() < until)",
            )
        ],
        ["frees", "budget", "figure"],
    ),
    # the figure is in the ledger before the allocations held for it go: before (as the code
    # came from budget.c), the state was published first
    "publish": (
        "the figure in the ledger first",
        [
            (
                "    int take = ctx != mine && (exact || ctx > mine);\n",
                "    if (__atomic_load_n(&d->state, __ATOMIC_ACQUIRE) != CT_CTX_MEASURED)\n"
                "        move(dev, d, CT_CTX_MEASURED);\n"
                "    int take = ctx != mine && (exact || ctx > mine);\n",
            )
        ],
        ["budget"],
    ),
    # a reading claimed after one that found no context has a deadline of its own: before (one
    # deadline for both), the claim's moment showed the expired 1 s of the unlisted state
    "reclaim": (
        "a deadline per state",
        [
            (
                "s == CT_CTX_UNLISTED ? &d->unlisted_until : &d->measure_until",
                "__atomic_load_n(&d->measure_until, __ATOMIC_ACQUIRE) ? &d->measure_until"
                " : &d->unlisted_until",
            )
        ],
        ["hold", "budget"],
    ),
}


@pytest.mark.parametrize("case", sorted(REVERTS))
def test_each_case_fails_without_its_fix(objs, tmp_path, case):
    fix, edits, rules = REVERTS[case]
    text = CTXHOLD_C.read_text()
    for old, new in edits:
        assert text.count(old) == 1, (
            f"the revert of {fix} no longer applies to ctxhold.c ({old!r}): write its logic's"
            " revert again"
        )
        text = text.replace(old, new)
    reverted = tmp_path / "ctxhold.c"
    reverted.write_text(text)
    flags = [f for f in ctxhold.PLAIN if f != "-Werror"]
    exe = ctxhold.build(tmp_path / "ctxhold_test", flags, reverted, objs)
    r = ctxhold.run(exe, tmp_path, case)
    assert r.returncode == 1 and f"FAIL {case}:" in r.stdout, r.stdout + r.stderr
    summary = r.stdout.strip().splitlines()[-1]
    for rule in rules:
        assert f"violation ({rule})" in r.stdout and f"{rule} " in summary, (rule, r.stdout)
    # the fixed build passes the same case (test_case): the difference is the fix
