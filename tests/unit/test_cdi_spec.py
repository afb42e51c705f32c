"""CDI specs whose devices are budgets (cudatrace/deploy/cdi.py), the budgets a node offers
(plan.py) and the preload library's install (install.py), without a container runtime."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from cudatrace import native
from cudatrace.deploy import cdi, install, plan

SHIM = native.shim_path()


@pytest.mark.parametrize(
    "spec, version",
    [
        ({"kind": "v.dev/budget", "devices": [{"name": "a"}]}, "0.3.0"),
        ({"kind": "v.dev/budget", "devices": [{"name": "8GiB"}]}, "0.5.0"),
        (
            {
                "kind": "v.dev/g",
                "devices": [
                    {
                        "name": "a",
                        "containerEdits": {
                            "mounts": [
                                {"hostPath": "tmpfs", "containerPath": "/x", "type": "tmpfs"}
                            ]
                        },
                    }
                ],
            },  # fmt: skip
            "0.4.0",
        ),
        (
            {
                "kind": "v.dev/g",
                "containerEdits": {"deviceNodes": [{"path": "/dev/x", "hostPath": "/dev/y"}]},
                "devices": [{"name": "a"}],
            },  # fmt: skip
            "0.5.0",
        ),
        ({"kind": "v.dev/g", "devices": [{"name": "a", "annotations": {"k": "v"}}]}, "0.6.0"),
        ({"kind": "v.dev/g.x", "devices": [{"name": "a"}]}, "0.6.0"),
        (
            {
                "kind": "v.dev/g",
                "devices": [{"name": "a", "containerEdits": {"additionalGids": [5]}}],
            },  # fmt: skip
            "0.7.0",
        ),
    ],
)
def test_min_version_follows_the_specs_features(spec, version):
    assert cdi.min_version(spec) == version


def specs_for(tmp_path: Path, preload: str = "file"):
    fences = [plan.size_fence("8GiB"), plan.Fence("team-a", "team-a", str(40 << 30))]
    inst = install.install(tmp_path / "root", SHIM)
    return inst, cdi.build_specs(fences, inst, tmp_path / "state", preload, "x.cudatrace.dev")


def test_specs_carry_every_edit_per_device_at_the_lowest_version(tmp_path):
    inst, specs = specs_for(tmp_path)
    budget, group = specs["budget"], specs["group"]
    assert budget["cdiVersion"] == "0.5.0" and group["cdiVersion"] == "0.3.0"
    assert budget["kind"] == "x.cudatrace.dev/budget" and group["kind"] == "x.cudatrace.dev/group"
    (dev,) = budget["devices"]
    assert dev["name"] == "8GiB" and "containerEdits" not in budget
    e = dev["containerEdits"]
    assert e["env"] == [
        "CUDATRACE_GROUP=container",
        f"CUDATRACE_BUDGET={8 << 30}",
        "CUDATRACE_LEDGER_DIR=/run/cudatrace/ledger",
        "CUDATRACE_ON_EXCEED=fail",
        "CUDATRACE_ON_FENCE_ERROR=refuse",
    ]
    by_dest = {m["containerPath"]: m for m in e["mounts"]}
    assert (
        by_dest[str(inst.dir)]["hostPath"] == str(inst.dir)
        and "ro" in by_dest[str(inst.dir)]["options"]
    )
    assert by_dest["/etc/ld.so.preload"]["hostPath"] == str(inst.preload)
    assert by_dest["/run/cudatrace/ledger"]["type"] == "tmpfs"
    assert "mode=1777" in by_dest["/run/cudatrace/ledger"]["options"]
    (g,) = group["devices"]
    gm = {m["containerPath"]: m for m in g["containerEdits"]["mounts"]}
    assert gm["/run/cudatrace/ledger"]["hostPath"] == str(tmp_path / "state" / "groups" / "team-a")
    assert f"CUDATRACE_BUDGET={40 << 30}" in g["containerEdits"]["env"]
    assert "CUDATRACE_GROUP=team-a" in g["containerEdits"]["env"]
    # the sealed record of each device, read-only where the preload library reads it
    rec = cdi.record_file(tmp_path / "root", "x.cudatrace.dev", "budget", "8GiB")
    assert by_dest["/etc/cudatrace/fence"] == {
        "hostPath": str(rec), "containerPath": "/etc/cudatrace/fence",
        "options": ["ro", "nosuid", "nodev", "bind"],
    }  # fmt: skip
    assert gm["/etc/cudatrace/fence"]["hostPath"].endswith("/fences/x.cudatrace.dev-group-team-a")
    # every host path comes from the install and the state given: none is written in the code
    text = json.dumps(specs)
    for p in (str(inst.dir), str(tmp_path / "state")):
        assert p in text
    assert inst.preload.read_text() == f"{inst.lib}\n"


def test_the_records_say_what_the_environment_says_and_go_with_their_device(tmp_path):
    """prepare() writes each device's record (root's 0644, what fence_record.render gives for
    the same fence the environment names) before the specs, and removes a record whose device
    is no longer offered."""
    from cudatrace import fence_record

    fences = [plan.size_fence("8GiB"), plan.Fence("team-a", "team-a", str(40 << 30))]
    root, state, d = tmp_path / "root", tmp_path / "state", tmp_path / "cdi"
    _, specs, _ = cdi.prepare(fences, root, state, d, "x.cudatrace.dev", shim=SHIM)
    for kind, f in (("budget", fences[0]), ("group", fences[1])):
        p = cdi.record_file(root, "x.cudatrace.dev", kind, f.name)
        assert p.stat().st_mode & 0o777 == 0o644 and p.parent.stat().st_mode & 0o777 == 0o755
        rec = fence_record.parse(p.read_text())
        env = dict(x.split("=", 1) for x in specs[kind]["devices"][0]["containerEdits"]["env"])
        assert env == dict(fence_record.render(rec).env)
        assert rec.on_fence_error == "refuse" and rec.owner == f"cudatrace.dev/{kind}={f.name}"
    assert (state / "groups" / "team-a" / ".cudatrace-shared").is_file()  # made for ledgers
    cdi.prepare(fences[:1], root, state, d, "x.cudatrace.dev", shim=SHIM)
    assert sorted(p.name for p in (root / "fences").iterdir()) == ["x.cudatrace.dev-budget-8GiB"]


def test_sandbox_specs_preload_through_the_environment(tmp_path):
    inst, specs = specs_for(tmp_path, "env")
    e = specs["budget"]["devices"][0]["containerEdits"]
    assert f"LD_PRELOAD={inst.dir}/platform/$PLATFORM/libcudatrace.so" in e["env"]
    assert "/etc/ld.so.preload" not in [m["containerPath"] for m in e["mounts"]]


def test_write_specs_whole_and_drops_a_kind_without_devices(tmp_path):
    _, specs = specs_for(tmp_path)
    d = tmp_path / "cdi"
    written = cdi.write_specs(specs, d, "x.cudatrace.dev")
    assert sorted(p.name for p in written) == [
        "x.cudatrace.dev-budget.json",
        "x.cudatrace.dev-group.json",
    ]
    assert json.loads(written[0].read_text()) == specs["budget"]
    assert sorted(os.listdir(d)) == sorted(p.name for p in written)  # no temporary left
    cdi.write_specs({"budget": specs["budget"]}, d, "x.cudatrace.dev")
    assert os.listdir(d) == ["x.cudatrace.dev-budget.json"]


def test_a_device_given_twice_is_refused(tmp_path):
    inst = install.install(tmp_path / "root", SHIM)
    f = plan.size_fence("8GiB")
    with pytest.raises(cdi.CdiError, match="given twice"):
        cdi.build_specs([f, f], inst, tmp_path)


def test_groups_config(tmp_path):
    conf = tmp_path / "groups.conf"
    conf.write_text(
        "# teams\n[team-a]\nbudget = 40GiB\n\n[infer.1]\nbudget = 0=20GiB,1=10GiB  ; per GPU\n"
        "on-exceed = warn\n"
    )
    a, b = plan.read_groups(conf)
    assert (a.name, a.group, a.budget, a.on_exceed) == ("team-a", "team-a", str(40 << 30), "fail")
    assert (b.budget, b.on_exceed) == (f"0={20 << 30},1={10 << 30}", "warn")
    for text, why in [
        ("[t]\nbudget = 60%\n", "give a size"),
        ("[t]\nbudgets = 1GiB\n", "unknown key 'budgets'"),
        ("[t]\n", "no budget"),
        ("[-t]\nbudget = 1GiB\n", "beginning and ending with a letter or digit"),
        ("[t]\nbudget = 1GiB\non-exceed = never\n", "on-exceed 'never'"),
        ("budget = 1GiB\n", "groups config"),
    ]:
        conf.write_text(text)
        with pytest.raises(plan.PlanError, match=why):
            plan.read_groups(conf)


def test_size_devices():
    assert plan.size_fence("1.5GiB").budget == str(3 << 29)
    with pytest.raises(plan.PlanError):
        plan.size_fence("0=8GiB")
    with pytest.raises(plan.PlanError, match="nothing to offer"):
        plan.fences((), None)
    assert plan.fences((), None, required=False) == []


def test_install_is_versioned_idempotent_and_repairs(tmp_path):
    root = tmp_path / "root"
    a = install.install(root, SHIM)
    assert a.ident == install.shim_ident(SHIM) and a.lib.read_bytes() == SHIM.read_bytes()
    assert os.readlink(root / "shim" / "current") == a.ident
    mtime = a.lib.stat().st_mtime_ns
    assert install.install(root, SHIM) == a and a.lib.stat().st_mtime_ns == mtime
    a.lib.write_bytes(b"damaged")  # replaced whole, as another directory
    install.install(root, SHIM)
    assert a.lib.read_bytes() == SHIM.read_bytes()
    assert [i.ident for i in install.installed(root)] == [a.ident]
    other = tmp_path / "other.so"
    other.write_bytes(SHIM.read_bytes() + b"\0")
    b = install.install(root, other)
    assert b.ident != a.ident and os.readlink(root / "shim" / "current") == b.ident


def test_gc_keeps_what_is_mapped_referenced_or_new(tmp_path, monkeypatch):
    root = tmp_path / "root"
    monkeypatch.setattr(install, "KEEP_NEWEST", 1)
    insts = []
    for k in range(4):
        lib = tmp_path / f"lib{k}.so"
        lib.write_bytes(SHIM.read_bytes() + bytes([k]))
        insts.append(install.install(root, lib))
        os.utime(insts[-1].dir, ns=(k * 10**9, k * 10**9))
    proc = tmp_path / "proc"
    (proc / "42").mkdir(parents=True)
    (proc / "42" / "maps").write_text(f"7f00-7f10 r-xp 00000000 08:01 77 {insts[1].lib}\n")
    removed = install.gc(root, {insts[2].ident}, proc)
    assert removed == [insts[0].ident]  # 1 mapped, 2 referenced, 3 the newest
    assert [i.ident for i in install.installed(root)] == [i.ident for i in insts[1:]]


def test_referenced_idents_from_spec_files(tmp_path):
    inst, specs = specs_for(tmp_path)
    d = tmp_path / "cdi"
    cdi.write_specs(specs, d, "x.cudatrace.dev")
    assert cdi.referenced_idents(tmp_path / "root", [str(d)]) == {inst.ident}


def test_group_directories(tmp_path):
    fences = [plan.Fence("g1", "g1", "1"), plan.size_fence("1GiB")]
    made = cdi.ensure_group_dirs(tmp_path, fences)
    assert made == [tmp_path / "groups" / "g1"]
    assert (tmp_path / "groups" / "g1").stat().st_mode & 0o7777 == 0o1777
    (tmp_path / "groups" / "old").mkdir()
    assert cdi.stale_group_dirs(tmp_path, {"g1"}) == [tmp_path / "groups" / "old"]
    cdi.remove_group_dir(tmp_path / "groups" / "old")
    assert os.listdir(tmp_path / "groups") == ["g1"]
