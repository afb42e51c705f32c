"""Shares of a group (ct_ledger_set_share) and shared ledger directories (sticky, root's or
ours: the ledgers of several users' jobs), through the ledger's C (docs/budgets.md)."""

from __future__ import annotations

import os

import pytest

from cudatrace import native
from cudatrace.record.ledger import Ledger, LedgerError, group_path, ledger_dir

GiB = 1 << 30


def _reserve_rc(led: Ledger, dev: int, n: int) -> int:
    ffi, lib = native.tools()
    return lib.ct_ledger_reserve(led.h, dev, n, ffi.NULL, ffi.NULL)


def test_shares_within_a_group(tmp_path):
    d = tmp_path / "l"
    d.mkdir(mode=0o700)
    p = d / "gpu0.ledger"
    a = Ledger.create(p, {0: 8 * GiB}, group="gpu0")
    b = Ledger.open(p)
    c = Ledger.open(p)
    a.set_share("41", 2 * GiB)
    b.set_share("42", 6 * GiB)
    a.join()  # the same process joins three times: each handle its own slot (pid checks aside)
    b.join(pid=os.getppid())
    c.join(pid=1)  # no share: counted against the group alone
    assert a.reserve(0, 2 * GiB)
    assert _reserve_rc(a, 0, 1) == 2  # CT_LEDGER_DENIED_SHARE: over its share, not the group
    assert b.reserve(0, 5 * GiB)
    assert _reserve_rc(c, 0, 2 * GiB) == 0  # the group's 8 GiB: 7 in use
    assert c.reserve(0, 1 * GiB)
    assert _reserve_rc(b, 0, 1) == 0  # the group is full although 42's share is not
    a.release(0, 2 * GiB)
    assert b.reserve(0, 1 * GiB) and _reserve_rc(b, 0, 1) == 2
    snap = a.snapshot()
    shares = {m["share"]: m for m in snap["members"]}
    assert shares["41"]["share_limit"] == 2 * GiB and shares["42"]["devices"][0]["held"] == 6 * GiB
    assert shares[None]["share_limit"] == 0
    with pytest.raises(LedgerError):
        a.set_share("toolongname", 1)
    assert snap["devices"][0]["denials"] == 4
    for h in (a, b, c):
        h.leave()
        h.close()


def test_shared_directory(tmp_path, monkeypatch):
    if os.geteuid() != 0:
        pytest.fail("chown to another uid needs root (CI runs as root)")
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    monkeypatch.setenv("CUDATRACE_LEDGER_DIR", str(shared))
    assert ledger_dir() == shared  # root's and sticky: accepted although group/other-writable
    # a group there is one part per user, its own (0644: the others read it, only it writes)
    assert group_path("g") == shared / f"g@{os.geteuid()}.ledger"
    led = Ledger.create(group_path("g"), {0: GiB}, group="g")
    assert group_path("g").stat().st_mode & 0o7777 == 0o644
    led.close()
    os.chown(group_path("g"), 65534, 65534)  # another user's file: never mapped by this uid
    with pytest.raises(LedgerError, match="owned by uid 65534, not by you"):
        Ledger.open(group_path("g"))
    os.chown(group_path("g"), 0, 0)
    group_path("g").chmod(0o666)  # nor one other users may write (they could truncate it)
    with pytest.raises(LedgerError, match="writable by other users"):
        Ledger.open(group_path("g"))
    read = Ledger.read(group_path("g"))  # a reader takes anyone's: a copy, never mapped
    assert read.snapshot()["devices"][0]["limit"] == GiB
    read.close()
    # a sticky directory of a third user is no shared directory, nor is a non-sticky one
    for mode, owner in ((0o1777, 65534), (0o777, 0)):
        other = tmp_path / f"other{mode:o}{owner}"
        other.mkdir()
        other.chmod(mode)
        os.chown(other, owner, owner)
        monkeypatch.setenv("CUDATRACE_LEDGER_DIR", str(other))
        with pytest.raises(LedgerError, match="refusing"):
            ledger_dir()
        (other / "x.ledger").write_bytes(b"")
        os.chown(other / "x.ledger", 65534, 65534)
        with pytest.raises(LedgerError, match="owned by uid 65534"):
            Ledger.open(other / "x.ledger")
