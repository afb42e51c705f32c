"""cudatrace/record_types.py is the data record/ builds: a ledger's snapshot and `status`'s
data, the unfenced processes, the doctor's probes. Each class is held against what the
functions build here: every key the data has is declared, every required key is there, and
nested objects are held against their own classes."""

from __future__ import annotations

import os
import sys
import typing

import pytest

from cudatrace import record_types as rt
from cudatrace.record import doctor, fence
from cudatrace.record.ledger import Ledger
from cudatrace.record.ledger_status import status_json

MiB = 1 << 20


def _typeddict(tp: object) -> type | None:
    """The TypedDict of an annotation (X, X | None, list[X], dict[K, X]), or None."""
    if isinstance(tp, type) and typing.is_typeddict(tp):
        return tp
    for arg in typing.get_args(tp):
        found = _typeddict(arg)
        if found is not None:
            return found
    return None


def mismatches(value: object, cls: type, where: str = "") -> list[str]:
    """Where value (built data) and cls (a TypedDict) disagree on keys, recursively."""
    assert isinstance(value, dict), f"{where or cls.__name__}: not an object: {value!r}"
    hints = typing.get_type_hints(cls)
    out = [f"{where}.{k}: not declared in {cls.__name__}" for k in sorted(set(value) - set(hints))]
    out += [
        f"{where}.{k}: required by {cls.__name__}, missing"
        for k in sorted(cls.__required_keys__ - set(value))  # type: ignore[attr-defined]
    ]
    for k, v in value.items():
        inner = _typeddict(hints.get(k))
        if inner is None or v is None:
            continue
        shapes = {typing.get_origin(a) for a in (hints[k], *typing.get_args(hints[k]))}
        if list in shapes:  # list[X]
            items = dict(enumerate(v))
        elif dict in shapes:  # dict[K, X]
            items = v
        else:  # X (or X | None): the value is the TypedDict itself
            out += mismatches(v, inner, f"{where}.{k}")
            continue
        for i, x in items.items():
            out += mismatches(x, inner, f"{where}.{k}[{i}]")
    return out


@pytest.fixture
def ledger(tmp_path, monkeypatch):
    d = tmp_path / "ledgers"
    d.mkdir(mode=0o700)
    monkeypatch.setenv("CUDATRACE_LEDGER_DIR", str(d))
    led = Ledger.create(d / "g.ledger", {0: 100 * MiB, 2: 10 * MiB}, group="g")
    led.join()
    assert led.reserve(0, 60 * MiB)
    assert not led.reserve(0, 60 * MiB)  # a denial
    yield led
    led.leave()
    led.close()


def test_a_ledger_snapshot_is_its_class(ledger):
    snap = ledger.snapshot()
    assert snap["members"] and snap["devices"]
    assert mismatches(snap, rt.LedgerSnapshot) == []


def test_status_is_its_class(ledger):
    st = status_json()
    assert st["ledgers"]
    assert mismatches(st, rt.Status) == []


def test_unfenced_is_its_class(ledger):
    assert mismatches(fence.unfenced(status_json()["ledgers"]), rt.Unfenced) == []


def test_the_doctor_is_its_class():
    r = doctor.diagnose([sys.executable])
    assert r["command"] is not None and r["command"]["kind"] in ("elf", "script")
    assert mismatches(r, rt.Doctor) == []
    script = doctor.probe_command(os.path.join(os.path.dirname(sys.executable), "pip"))
    assert script["kind"] == "script" and "interpreter" in script
    assert mismatches(script, rt.DoctorCommand) == []


def test_a_difference_is_seen(ledger):
    snap = dict(ledger.snapshot(), extra=1)
    del snap["uid"]
    snap["members"][0]["devices"][0]["stray"] = 2
    assert mismatches(snap, rt.LedgerSnapshot) == [
        ".extra: not declared in LedgerSnapshot",
        ".uid: required by LedgerSnapshot, missing",
        ".members[0].devices[0].stray: not declared in MemberDevice",
    ]


def test_a_runs_budget_is_its_class(tmp_path, monkeypatch):
    from cudatrace.record.budget import setup_ledger

    d = tmp_path / "ledgers"
    d.mkdir(mode=0o700)
    monkeypatch.setenv("CUDATRACE_LEDGER_DIR", str(d))
    for group in ("g", None):  # a group's ledger, a private one
        run, info = setup_ledger("64M", group)
        try:
            assert info["limits"] and info["spec"] == "64M"
            assert mismatches(info, rt.BudgetInfo) == []
        finally:
            run.finish()


def test_a_fenced_runs_budget_is_its_class(tmp_path):
    from cudatrace.record.run_budget import join

    env = {"CUDATRACE_GROUP": "job7", "CUDATRACE_SHARE": "s7", "CUDATRACE_SHARE_BUDGET": "1G",
           "CUDATRACE_LEDGER_DIR": str(tmp_path)}  # fmt: skip
    ledger, info = join("64M", None, "fail", False, env, lambda what, p: None)
    assert ledger is None  # nobody made the group's ledger
    assert info is not None and info["source"] == "environment" and info["share_limit"] == 64 << 20
    assert mismatches(info, rt.BudgetInfo) == []


def test_run_json_is_its_class(tmp_path, monkeypatch):
    import json

    from cudatrace.record import launcher

    d = tmp_path / "ledgers"
    d.mkdir(mode=0o700)
    monkeypatch.setenv("CUDATRACE_LEDGER_DIR", str(d))
    opts = launcher.RunOptions(cmd=["true"], out_dir=tmp_path / "t", budget="64M", quiet=True,
                               simulated=1 << 30)  # fmt: skip
    status, out = launcher.run(opts)
    assert status == 0 and out is not None
    info = json.loads((out / "run.json").read_text())
    assert info["budget"] and info["sampler"] and info["ledger_final"] and "simulated" in info
    assert mismatches(info, launcher.RunInfo) == []
