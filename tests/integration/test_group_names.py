"""Issue 11 #13: a group whose name starts with '.' would be hidden from `cudatrace status`:
refused."""

from __future__ import annotations


def test_dot_group_refused(ct, sim, tmp_path):
    d = tmp_path / "ledgers"
    d.mkdir(mode=0o700)
    env = ct.env()
    env["CUDATRACE_LEDGER_DIR"] = str(d)
    r = ct.run([sim.progs["route_link"]], "--group", ".hidden", "--budget", "1GiB", env=env)
    assert r.returncode == 2, r.stderr
    assert "invalid budget group name" in r.stderr and "'.'" in r.stderr
    assert not list(d.iterdir())
