"""`cudatrace top`'s parts without a terminal: the view drawn from a snapshot (present/top.py)
at every width, with a height, after keys; the snapshot's pieces that read files (the latest
denials of a denials.jsonl, the trace directories a process maps, the runs' sites as typed);
the gatherer on a ledger directory without NVML."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from cudatrace import procfs
from cudatrace.analyze.documents import live
from cudatrace.analyze.documents.live import OTHER
from cudatrace.present.top import HELP, View, render
from cudatrace.record import denials
from cudatrace.record.top import Gatherer
from cudatrace.record_types import TopSnapshot

MiB = 1 << 20
LONG = (
    "eng::inference::attention::paged::KVCacheManager::reserve_blocks(unsigned long, int) "
    "(kv_cache_manager.cpp:1234)"
)


def _proc(pid, gpu, n, group="", counted=None, fence="member", run="", command="server"):
    return {"pid": pid, "gpu": gpu, "bytes": n, "command": command, "fence": fence,
            "group": group, "counted": counted, "container": "", "run": run}  # fmt: skip


def snapshot() -> TopSnapshot:
    return {
        "time": 1_700_000_000.0,
        "host": "gpu-box-17.example.internal",
        "nvml": {"known": True, "why": None},
        "devices": [
            {
                "gpu": 0,
                "uuid": "GPU-aaaa",
                "name": "NVIDIA H100 80GB HBM3",
                "used": 40 << 30,
                "total": 80 << 30,
                "source": "nvml",
                "per_process": True,
                "why": None,
                "ledgers": 3 << 30,
                "processes": [
                    _proc(101, 0, 2 << 30, "inference-team-a", 2 << 30, run="/t/run-a"),
                    _proc(202, 0, 30 << 30, fence="unfenced", command="python3"),
                    _proc(303, 0, 1 << 30, "inference-team-a", 1 << 30),
                    _proc(404, 0, None, fence="not_visible", command=""),
                ],
            },
            {
                "gpu": 1,
                "uuid": "GPU-bbbb",
                "name": "NVIDIA H100 80GB HBM3",
                "used": 5 << 30,
                "total": 80 << 30,
                "source": "nvml",
                "per_process": True,
                "why": None,
                "ledgers": 0,
                "processes": [_proc(505, 1, 5 << 30, fence="unfenced")],
            },
        ],  # fmt: skip
        "groups": [
            {
                "name": "inference-team-a",
                "path": "/dev/shm/x/inference-team-a.ledger",
                "on_exceed": "fail",
                "devices": [
                    {
                        "device": 0,
                        "gpu": 0,
                        "limit": 4 << 30,
                        "in_use": 3 << 30,
                        "peak": 3 << 30,
                        "denials": 2,
                    }
                ],
                "members": [
                    {
                        "pid": 101,
                        "state": "alive",
                        "held": 2 << 30,
                        "denials": 2,
                        "command": "server",
                        "run": "/t/run-a",
                    },
                    {
                        "pid": 303,
                        "state": "alive",
                        "held": 1 << 30,
                        "denials": 0,
                        "command": "server",
                        "run": "",
                    },
                ],
                "unfenced": [202],
            },
            {
                "name": "run of pid 999",
                "path": "/dev/shm/x/run-999.ledger",
                "on_exceed": "warn",
                "devices": [],
                "members": [],
                "unfenced": [],
            },
        ],  # fmt: skip
        "runs": [
            {
                "run": "run-a",
                "path": "/t/run-a",
                "command": "server",
                "devices": [
                    {
                        "device": 0,
                        "gpu": "0",
                        "live": 2 << 30,
                        "sites": [
                            {"label": LONG, "bytes": 1536 * MiB},
                            {"label": "eng::Model::load() (model.cpp:88)", "bytes": 400 * MiB},
                            {"label": OTHER, "bytes": 112 * MiB},
                        ],
                    }
                ],
            },
        ],  # fmt: skip
        "denials": [
            {
                "wall_time": 1_700_000_000.0,
                "pid": 101,
                "group": "inference-team-a",
                "label": LONG,
                "api": "cuMemAlloc_v2",
                "bytes": 2 << 30,
                "count": 2,
                "device": 0,
                "limit": 4 << 30,
                "in_use": 3 << 30,
                "run": "/t/run-a",
            },
            {
                "wall_time": None,
                "pid": 303,
                "group": "inference-team-a",
                "label": None,
                "api": "",
                "bytes": None,
                "count": 1,
                "device": None,
                "limit": None,
                "in_use": None,
                "run": "",
            },
        ],  # fmt: skip
        "findings": [],
        "errors": [],
    }


def _pids(lines: list[str]) -> list[int]:
    out = []
    for x in lines:
        w = x.split()
        if w and w[0].isdigit() and len(w) > 1 and ("GiB" in x or "N/A" in x):
            out.append(int(w[0]))
    return out


@pytest.mark.parametrize("width", [30, 40, 60, 80, 100, 160])
def test_every_line_fits_the_width(width):
    lines = render(snapshot(), View(), width)
    too_wide = [x for x in lines if len(x) > width]
    assert not too_wide, "\n".join(too_wide)
    text = "\n".join(lines)
    for pid in (101, 202, 303, 404, 505):  # every process is there, whatever the width
        assert str(pid) in text
    for head in ("BUDGET GROUPS", "TOP SITES", "LATEST DENIALS"):
        assert head in text
    # a site's function is kept while its namespaces give way; at 100 columns its file:line
    assert "KVCacheManager::reserve_blocks" in text or width < 60
    assert "(kv_cache_manager.cpp:1234)" in text or width < 100


def test_narrow_tables_leave_columns_out_before_cutting():
    wide = render(snapshot(), View(), 160)
    narrow = render(snapshot(), View(), 44)
    assert any(x.split()[:6] == ["PID", "NVML", "LEDGER", "GROUP", "RUN", "COMMAND"] for x in wide)
    head = next(x for x in narrow if x.split()[:1] == ["PID"])
    assert "RUN" not in head.split() and "COMMAND" in head, head


def test_without_a_width_nothing_is_cut():
    text = "\n".join(render(snapshot(), View()))
    assert LONG in text  # a pipe: the site's whole name
    assert "N/A" in text and "(not visible)" in text and "UNFENCED" in text
    assert "pid 303 (inference-team-a): 1 denied; no launcher kept the site" in text


def test_a_short_screen_gives_the_processes_up_first():
    lines = render(snapshot(), View(), 120, 16)
    assert len(lines) <= 16
    text = "\n".join(lines)
    assert "more lines (d: one device)" in text
    for head in ("BUDGET GROUPS", "TOP SITES", "LATEST DENIALS"):
        assert head in text, text


def test_sort_keys():
    s = snapshot()
    by_memory = _pids(render(s, View(), 120))
    assert by_memory == [202, 101, 303, 404, 505]  # N/A last
    v = View().key("p", s)
    assert v.sort == "pid" and _pids(render(s, v, 120)) == [101, 202, 303, 404, 505]
    v = v.key("r", s)
    assert _pids(render(s, v, 120)) == [404, 303, 202, 101, 505]
    v = v.key("l", s)  # a new key: not reversed
    assert v == View(sort="counted") and _pids(render(s, v, 120))[:2] == [101, 303]
    assert View().key("x", s) == View()
    assert "sort: pid, reversed" in render(s, View(sort="pid", reverse=True), 120)[0]


def test_device_and_group_keys_step_and_wrap():
    s = snapshot()
    v = View()
    seen = []
    for _ in range(4):
        v = v.key("d", s)
        seen.append(v.device)
    assert seen == [0, 1, None, 0]
    assert View().key("D", s).device == 1
    one = render(s, View(device=1), 120)
    assert _pids(one) == [505] and "BUDGET GROUPS" not in "\n".join(one)
    g = View().key("g", s)
    assert g.group == "inference-team-a"
    text = "\n".join(render(s, g, 120))
    assert _pids(text.splitlines()) == [202, 101, 303]  # its members and the unfenced on its GPU
    assert "member pid 101 server: 2.00 GiB, 2 denied" in text
    assert View().key("G", s).group == "run of pid 999"
    assert View(group="run of pid 999").key("g", s).group is None


def test_what_a_process_names_itself_never_drives_the_terminal():
    s = snapshot()
    s["devices"][0]["processes"][0]["command"] = "evil\x1b[2J\x07"
    s["runs"][0]["devices"][0]["sites"][0]["label"] = "f\x1b]0;title\x07 (a.c:1)"
    text = "\n".join(render(s, View(), 120))
    assert "\x1b" not in text and "\x07" not in text


def test_without_nvml_and_before_the_first_snapshot():
    s = snapshot()
    s["nvml"] = {"known": False, "why": "no NVIDIA driver here (libnvidia-ml.so.1 not found)"}
    s["devices"] = []
    text = "\n".join(render(s, View(), 100))
    assert "NVML: no NVIDIA driver here (libnvidia-ml.so.1 not found): no device figures" in text
    assert "BUDGET GROUPS" in text and "TOP SITES" in text
    assert render(None, View(), 30) == [
        "cudatrace top: reading the",
        "  devices, ledgers and traces",
        "  ...",
    ]
    assert len(HELP) <= 100


def test_recent_denials_read_from_the_tail(tmp_path):
    lines = [json.dumps({"pid": 1, "label": f"site{i}", "wall_time": float(i),
                         "pad": "x" * 200}) for i in range(2000)]  # fmt: skip
    lines.insert(1990, "not json")
    (tmp_path / denials.DENIALS_FILE).write_text("\n".join(lines) + "\n")
    got = denials.recent(tmp_path, 3)
    assert [d["label"] for d in got] == ["site1999", "site1998", "site1997"]
    assert len(denials.recent(tmp_path, 10_000)) < 2000  # the tail only
    assert denials.recent(tmp_path / "none", 3) == []


def test_trace_dirs_of_a_process(tmp_path):
    (tmp_path / "42").mkdir()
    (tmp_path / "42" / "maps").write_text(
        "7f00-7f10 rw-s 00000000 fe:00 11 /runs/a b/42.0.ctrace\n"
        "7f10-7f20 rw-s 00000000 fe:00 11 /runs/a b/42.0.ctrace\n"
        "7f20-7f30 r--p 00000000 fe:00 12 /runs/other/42.0.ctrace\n"  # private: not a writer's
        "7f30-7f40 rw-s 00000000 fe:00 13 /runs/gone/42.0.ctrace (deleted)\n"
        "7f40-7f50 rw-s 00000000 fe:00 14 /dev/shm/cudatrace-0/g.ledger\n"
    )
    assert procfs.trace_dirs(42, str(tmp_path)) == ["/runs/a b"]
    assert procfs.trace_dirs(43, str(tmp_path)) == []


def test_the_runs_sites_typed_largest_first_other_last(monkeypatch):
    fig = {"run": "r", "path": "/r", "command": "c", "devices": [
        {"device": 0, "gpu": "GPU-x", "live": 7, "sites": {"a": 4, OTHER: 1, "b": 2}}]}  # fmt: skip
    monkeypatch.setattr(live, "figures", lambda p, top, symbolizer=None: fig)
    run = live._top_run(Path("/r"), 5, None)
    assert [s["label"] for s in run["devices"][0]["sites"]] == ["a", "b", OTHER]


def test_a_snapshot_of_ledgers_without_nvml(tmp_path, monkeypatch):
    from cudatrace.record.ledger import Ledger

    d = tmp_path / "ledgers"
    d.mkdir(mode=0o700)
    monkeypatch.setenv("CUDATRACE_LEDGER_DIR", str(d))
    led = Ledger.create(d / "g1.ledger", {0: 64 * MiB}, group="g1")
    try:
        led.join()
        assert led.reserve(0, 8 * MiB) and not led.reserve(0, 60 * MiB)
        g = Gatherer(nvml=False)
        snap = g.snapshot()
        g.close()
    finally:
        led.leave()
        led.close()
    assert snap["nvml"] == {"known": False, "why": "NVML not read"} and snap["devices"] == []
    (grp,) = snap["groups"]
    assert grp["name"] == "g1" and grp["devices"][0]["in_use"] == 8 * MiB
    assert [m["pid"] for m in grp["members"]] == [os.getpid()]
    assert grp["members"][0]["command"] and grp["members"][0]["run"] == ""
    # the member's denial is counted; no launcher kept its site
    ((den,),) = [snap["denials"]]
    assert (den["pid"], den["label"], den["count"], den["group"]) == (os.getpid(), None, 1, "g1")
